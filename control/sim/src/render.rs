//! The top-down camera: draws the table, walls, target zones, blocks and
//! pusher with tiny-skia into an RGB8 image.

use tiny_skia::{Color, FillRule, Paint, PathBuilder, Pixmap, Rect, Transform};

use crate::task::{TrueState, BLOCK_HALF, PUSHER_RADIUS, TABLE_HALF, WALL_THICKNESS, ZONE_HALF};

/// Table surface colour, RGB8.
pub const TABLE_RGB: [u8; 3] = [205, 205, 200];
/// Wall colour, RGB8.
pub const WALL_RGB: [u8; 3] = [90, 90, 90];
/// Pusher colour, RGB8.
pub const PUSHER_RGB: [u8; 3] = [25, 25, 25];

/// An RGB8 image, row-major, top row first, 3 bytes per pixel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Width, pixels.
    pub width: u32,
    /// Height, pixels.
    pub height: u32,
    /// `height * width * 3` bytes.
    pub rgb: Vec<u8>,
}

impl Image {
    /// The pixel at column `x`, row `y` (None outside the image).
    pub fn pixel(&self, x: u32, y: u32) -> Option<[u8; 3]> {
        if x >= self.width || y >= self.height {
            return None;
        }
        let i = ((y * self.width + x) * 3) as usize;
        Some([self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]])
    }
}

/// Table frame (metres) to pixel coordinates (continuous, origin at the
/// top-left corner of the image) for a `size` x `size` image.
pub fn table_to_pixel(p: [f32; 2], size: u32) -> [f32; 2] {
    let s = size as f32 / (2.0 * TABLE_HALF);
    [(p[0] + TABLE_HALF) * s, (TABLE_HALF - p[1]) * s]
}

fn paint(rgb: [u8; 3]) -> Paint<'static> {
    let mut p = Paint::default();
    p.set_color_rgba8(rgb[0], rgb[1], rgb[2], 255);
    p.anti_alias = true;
    p
}

/// Draw `s` as seen by a `size` x `size` top-down camera over the table.
pub(crate) fn render(s: &TrueState, size: u32) -> Image {
    // `size` is validated (8..=1024) by PushConfig::validate, so the pixmap
    // always exists; fall back to a blank image rather than panic.
    let Some(mut pm) = Pixmap::new(size, size) else {
        return Image {
            width: size,
            height: size,
            rgb: vec![0; (size as usize).pow(2) * 3],
        };
    };
    let scale = size as f32 / (2.0 * TABLE_HALF);
    let id = Transform::identity();
    pm.fill(Color::from_rgba8(
        WALL_RGB[0],
        WALL_RGB[1],
        WALL_RGB[2],
        255,
    ));
    let inner = WALL_THICKNESS * scale;
    if let Some(r) = Rect::from_ltrb(inner, inner, size as f32 - inner, size as f32 - inner) {
        pm.fill_rect(r, &paint(TABLE_RGB), id, None);
    }
    for z in &s.zones {
        let c = table_to_pixel(z.pos, size);
        let h = ZONE_HALF * scale;
        if let Some(r) = Rect::from_ltrb(c[0] - h, c[1] - h, c[0] + h, c[1] + h) {
            pm.fill_rect(r, &paint(z.colour.rgb()), id, None);
            // Outline width: 0.8 cm, at least one pixel.
            let t = (0.008 * scale).max(1.0);
            if let Some(inner) =
                Rect::from_ltrb(r.left() + t, r.top() + t, r.right() - t, r.bottom() - t)
            {
                pm.fill_rect(inner, &paint(z.colour.fill_rgb()), id, None);
            }
        }
    }
    for b in &s.blocks {
        let (sin, cos) = b.angle.sin_cos();
        let mut pb = PathBuilder::new();
        for (k, (dx, dy)) in [(1.0, 1.0), (-1.0, 1.0), (-1.0, -1.0), (1.0, -1.0)]
            .into_iter()
            .enumerate()
        {
            let lx = dx * BLOCK_HALF;
            let ly = dy * BLOCK_HALF;
            let w = [
                b.pos[0] + cos * lx - sin * ly,
                b.pos[1] + sin * lx + cos * ly,
            ];
            let p = table_to_pixel(w, size);
            if k == 0 {
                pb.move_to(p[0], p[1]);
            } else {
                pb.line_to(p[0], p[1]);
            }
        }
        pb.close();
        if let Some(path) = pb.finish() {
            pm.fill_path(&path, &paint(b.colour.rgb()), FillRule::Winding, id, None);
        }
    }
    let c = table_to_pixel(s.pusher_pos, size);
    if let Some(path) = PathBuilder::from_circle(c[0], c[1], PUSHER_RADIUS * scale) {
        pm.fill_path(&path, &paint(PUSHER_RGB), FillRule::Winding, id, None);
    }
    // Every pixel is opaque (the background is), so premultiplied RGBA is
    // plain RGBA: keep the first three bytes of each pixel.
    let rgb = pm
        .data()
        .chunks_exact(4)
        .flat_map(|px| [px[0], px[1], px[2]])
        .collect();
    Image {
        width: size,
        height: size,
        rgb,
    }
}

#[cfg(test)]
mod tests {
    use crate::{PushConfig, PushSim, PUSHER_RGB, ZONE_HALF};

    use super::*;

    fn px_at(img: &Image, p: [f32; 2]) -> [u8; 3] {
        let c = table_to_pixel(p, img.width);
        img.pixel(c[0] as u32, c[1] as u32).unwrap()
    }

    #[test]
    fn rendering_is_deterministic_and_sized() {
        for size in [96, 224] {
            let mut sim = PushSim::new(PushConfig {
                image_size: size,
                ..Default::default()
            })
            .unwrap();
            sim.reset(4);
            let a = sim.render();
            let b = sim.render();
            assert_eq!(a, b);
            assert_eq!((a.width, a.height), (size, size));
            assert_eq!(a.rgb.len(), (size * size * 3) as usize);
            sim.step([0.0, 0.0]);
            assert_ne!(sim.render(), a, "the pusher moved, so should the picture");
        }
    }

    #[test]
    fn objects_have_their_colours_at_their_centres() {
        let mut sim = PushSim::new(PushConfig::default()).unwrap();
        for seed in 0..10 {
            sim.reset(seed);
            let s = sim.true_state();
            let img = sim.render();
            for b in &s.blocks {
                assert_eq!(
                    px_at(&img, b.pos),
                    b.colour.rgb(),
                    "seed {seed} {:?}",
                    b.colour
                );
            }
            // Zones start clear of blocks (layout rule) and of the pusher
            // unless it happens to start on one.
            for z in &s.zones {
                if crate::task::dist(z.pos, s.pusher_pos) > 0.05 {
                    assert_eq!(px_at(&img, z.pos), z.colour.fill_rgb(), "seed {seed}");
                }
            }
            assert_eq!(px_at(&img, s.pusher_pos), PUSHER_RGB);
            // At 224 px the zone's outline is 3 px wide: its middle is solid.
            let big = render(&s, 224);
            for z in &s.zones {
                if crate::task::dist(z.pos, s.pusher_pos) > 0.07 {
                    let edge = [z.pos[0] - ZONE_HALF + 0.004, z.pos[1]];
                    assert_eq!(px_at(&big, edge), z.colour.rgb(), "seed {seed}");
                    assert_eq!(px_at(&big, z.pos), z.colour.fill_rgb(), "seed {seed}");
                }
            }
            assert_eq!(img.pixel(0, 0), Some(WALL_RGB));
            assert_eq!(px_at(&img, [0.27, 0.27]), TABLE_RGB);
        }
    }
}
