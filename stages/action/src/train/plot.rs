//! The loss curve as a PNG, drawn with tiny-skia (no fonts): per-step
//! loss in light grey, its running mean in blue, on a log10 y axis with a
//! tick per decade (long) and per unit within it (short), and ten x ticks
//! (steps). [`PlotInfo`] gives the axis ranges to print beside it.
//! [`plot_lines`] draws a few coloured series on linear axes (an
//! evaluation's success rate against inference delay).

use crate::{Error, Result};
use std::path::Path;
use tiny_skia::{Color, Paint, PathBuilder, Pixmap, Stroke, Transform};

/// Axis ranges of a plot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlotInfo {
    /// Steps on the x axis (0 at the left).
    pub steps: usize,
    /// log10 of the loss at the bottom edge.
    pub y_min_decade: i32,
    /// log10 of the loss at the top edge.
    pub y_max_decade: i32,
}

const W: u32 = 800;
const H: u32 = 480;
const MARGIN: f32 = 40.0;

/// Draw `losses` (one per step) to `path`.
pub fn plot_loss(losses: &[f32], path: &Path) -> Result<PlotInfo> {
    let pos: Vec<f32> = losses
        .iter()
        .copied()
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    if pos.is_empty() {
        return Err(Error::Plot("no positive finite loss to plot".into()));
    }
    let lo = pos.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = pos.iter().copied().fold(0f32, f32::max);
    let y0 = lo.log10().floor() as i32;
    let y1 = (hi.log10().ceil() as i32).max(y0 + 1);
    let mut pm = Pixmap::new(W, H).ok_or_else(|| Error::Plot("cannot allocate".into()))?;
    pm.fill(Color::WHITE);
    let (pw, ph) = (W as f32 - 2.0 * MARGIN, H as f32 - 2.0 * MARGIN);
    let n = losses.len().max(2);
    let px = |i: usize| MARGIN + pw * i as f32 / (n - 1) as f32;
    let py = |v: f32| {
        let f = (v.log10() - y0 as f32) / (y1 - y0) as f32;
        MARGIN + ph * (1.0 - f)
    };
    let paint = |r: u8, g: u8, b: u8| {
        let mut p = Paint::default();
        p.set_color_rgba8(r, g, b, 255);
        p.anti_alias = true;
        p
    };
    let line = |pm: &mut Pixmap, pts: &[(f32, f32)], p: &Paint, width: f32| {
        let mut pb = PathBuilder::new();
        for (k, (x, y)) in pts.iter().enumerate() {
            if k == 0 {
                pb.move_to(*x, *y);
            } else {
                pb.line_to(*x, *y);
            }
        }
        if let Some(path) = pb.finish() {
            let s = Stroke {
                width,
                ..Stroke::default()
            };
            pm.stroke_path(&path, p, &s, Transform::identity(), None);
        }
    };
    let black = paint(0, 0, 0);
    // Grid lines per decade, ticks per unit.
    for dcd in y0..=y1 {
        let y = py(10f32.powi(dcd));
        line(
            &mut pm,
            &[(MARGIN, y), (MARGIN + pw, y)],
            &paint(225, 225, 225),
            1.0,
        );
        line(&mut pm, &[(MARGIN - 10.0, y), (MARGIN, y)], &black, 1.5);
        if dcd < y1 {
            for u in 2..10 {
                let y = py(u as f32 * 10f32.powi(dcd));
                line(&mut pm, &[(MARGIN - 5.0, y), (MARGIN, y)], &black, 1.0);
            }
        }
    }
    for k in 0..=10 {
        let x = MARGIN + pw * k as f32 / 10.0;
        line(
            &mut pm,
            &[(x, MARGIN + ph), (x, MARGIN + ph + 8.0)],
            &black,
            1.5,
        );
    }
    // Raw per-step loss, then its running mean over 2 % of the steps.
    let raw: Vec<(f32, f32)> = losses
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite() && **v > 0.0)
        .map(|(i, v)| (px(i), py(*v)))
        .collect();
    line(&mut pm, &raw, &paint(190, 190, 190), 1.0);
    let win = (losses.len() / 50).max(1);
    let mut smooth = Vec::with_capacity(losses.len());
    let mut acc = 0f64;
    for (i, v) in losses.iter().enumerate() {
        acc += *v as f64;
        if i >= win {
            acc -= losses[i - win] as f64;
        }
        let m = acc / (i + 1).min(win) as f64;
        if m.is_finite() && m > 0.0 {
            smooth.push((px(i), py(m as f32)));
        }
    }
    line(&mut pm, &smooth, &paint(30, 90, 200), 2.5);
    // Axes.
    line(
        &mut pm,
        &[
            (MARGIN, MARGIN),
            (MARGIN, MARGIN + ph),
            (MARGIN + pw, MARGIN + ph),
        ],
        &black,
        2.0,
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    // Opaque pixels: premultiplied RGBA is plain RGBA.
    image::save_buffer(path, pm.data(), W, H, image::ExtendedColorType::Rgba8)
        .map_err(|e| Error::Plot(format!("{}: {e}", path.display())))?;
    Ok(PlotInfo {
        steps: losses.len(),
        y_min_decade: y0,
        y_max_decade: y1,
    })
}

/// One line of [`plot_lines`]: its points `(x, y)` and its colour.
#[derive(Debug, Clone)]
pub struct Series {
    /// Points in data units, drawn in order.
    pub points: Vec<(f32, f32)>,
    /// Line colour, RGB.
    pub rgb: [u8; 3],
}

fn solid(rgb: [u8; 3]) -> Paint<'static> {
    let mut p = Paint::default();
    p.set_color_rgba8(rgb[0], rgb[1], rgb[2], 255);
    p.anti_alias = true;
    p
}

fn polyline(pm: &mut Pixmap, pts: &[(f32, f32)], p: &Paint, width: f32) {
    let mut pb = PathBuilder::new();
    for (k, (x, y)) in pts.iter().enumerate() {
        if k == 0 {
            pb.move_to(*x, *y);
        } else {
            pb.line_to(*x, *y);
        }
    }
    if let Some(path) = pb.finish() {
        let s = Stroke {
            width,
            ..Stroke::default()
        };
        pm.stroke_path(&path, p, &s, Transform::identity(), None);
    }
}

/// Draw `series` on linear axes from 0 to `x_max` (a tick per unit) and
/// from 0 to `y_max` (ten ticks, a grey grid line at each) to `path`, each
/// point marked with a small square. No text: the caller prints what the
/// colours and the axes mean.
pub fn plot_lines(series: &[Series], x_max: f32, y_max: f32, path: &Path) -> Result<()> {
    if !(x_max > 0.0 && y_max > 0.0 && x_max.is_finite() && y_max.is_finite()) {
        return Err(Error::Plot(format!(
            "axis ranges must be positive and finite, got x 0..{x_max}, y 0..{y_max}"
        )));
    }
    let mut pm = Pixmap::new(W, H).ok_or_else(|| Error::Plot("cannot allocate".into()))?;
    pm.fill(Color::WHITE);
    let (pw, ph) = (W as f32 - 2.0 * MARGIN, H as f32 - 2.0 * MARGIN);
    let px = |x: f32| MARGIN + pw * x / x_max;
    let py = |y: f32| MARGIN + ph * (1.0 - y / y_max);
    let black = solid([0, 0, 0]);
    for k in 0..=10 {
        let y = py(y_max * k as f32 / 10.0);
        polyline(
            &mut pm,
            &[(MARGIN, y), (MARGIN + pw, y)],
            &solid([225, 225, 225]),
            1.0,
        );
        polyline(&mut pm, &[(MARGIN - 8.0, y), (MARGIN, y)], &black, 1.5);
    }
    let units = x_max.floor() as usize;
    for k in 0..=units {
        let x = px(k as f32);
        polyline(
            &mut pm,
            &[(x, MARGIN + ph), (x, MARGIN + ph + 8.0)],
            &black,
            1.5,
        );
    }
    for s in series {
        let p = solid(s.rgb);
        let pts: Vec<(f32, f32)> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| (px(x), py(y)))
            .collect();
        polyline(&mut pm, &pts, &p, 2.5);
        for &(x, y) in &pts {
            if let Some(r) = tiny_skia::Rect::from_xywh(x - 4.0, y - 4.0, 8.0, 8.0) {
                pm.fill_rect(r, &p, Transform::identity(), None);
            }
        }
    }
    polyline(
        &mut pm,
        &[
            (MARGIN, MARGIN),
            (MARGIN, MARGIN + ph),
            (MARGIN + pw, MARGIN + ph),
        ],
        &black,
        2.0,
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    image::save_buffer(path, pm.data(), W, H, image::ExtendedColorType::Rgba8)
        .map_err(|e| Error::Plot(format!("{}: {e}", path.display())))?;
    Ok(())
}
