//! The inverse of a monotonic rational-quadratic spline with linear tails
//! (Durkan et al., "Neural Spline Flows"), as VITS's `transforms.py` computes
//! it, for one element. Computed in f32 in the same order as PyTorch so the
//! resulting durations round the same way.

const MIN_BIN_WIDTH: f32 = 1e-3;
const MIN_BIN_HEIGHT: f32 = 1e-3;
const MIN_DERIVATIVE: f32 = 1e-3;

fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|v| (v - max).exp()).collect();
    let s: f32 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

fn softplus(x: f32) -> f32 {
    // torch.nn.functional.softplus with threshold 20.
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Knot positions from unnormalized bin sizes on `[lo, hi]`.
fn knots(unnormalized: &[f32], min_size: f32, lo: f32, hi: f32) -> Vec<f32> {
    let n = unnormalized.len();
    let sizes: Vec<f32> = softmax(unnormalized)
        .iter()
        .map(|s| min_size + (1.0 - min_size * n as f32) * s)
        .collect();
    let mut cum = Vec::with_capacity(n + 1);
    cum.push(0.0f32);
    let mut acc = 0.0f32;
    for s in &sizes {
        acc += s;
        cum.push(acc);
    }
    let mut out: Vec<f32> = cum.iter().map(|c| (hi - lo) * c + lo).collect();
    out[0] = lo;
    out[n] = hi;
    out
}

/// Inverse spline transform of `y` given one element's `bins` widths,
/// `bins` heights and `bins - 1` inner derivatives (unnormalized), with
/// identity tails outside `[-tail_bound, tail_bound]`.
pub(super) fn inverse_rq_spline(
    y: f32,
    widths: &[f32],
    heights: &[f32],
    derivatives: &[f32],
    tail_bound: f32,
) -> f32 {
    if !(-tail_bound..=tail_bound).contains(&y) {
        return y;
    }
    let bins = widths.len();
    let cumw = knots(widths, MIN_BIN_WIDTH, -tail_bound, tail_bound);
    let cumh = knots(heights, MIN_BIN_HEIGHT, -tail_bound, tail_bound);
    // Boundary derivatives are fixed so the tails join with slope 1.
    let constant = ((1.0f32 - MIN_DERIVATIVE).exp() - 1.0).ln();
    let mut derivs = Vec::with_capacity(bins + 1);
    derivs.push(MIN_DERIVATIVE + softplus(constant));
    derivs.extend(derivatives.iter().map(|&d| MIN_DERIVATIVE + softplus(d)));
    derivs.push(MIN_DERIVATIVE + softplus(constant));

    // searchsorted with eps on the last knot.
    let mut bin = 0usize;
    for (i, &c) in cumh.iter().enumerate() {
        let c = if i == bins { c + 1e-6 } else { c };
        if y >= c {
            bin = i;
        }
    }
    let bin = bin.min(bins - 1);

    let in_cumw = cumw[bin];
    let in_w = cumw[bin + 1] - cumw[bin];
    let in_cumh = cumh[bin];
    let in_h = cumh[bin + 1] - cumh[bin];
    let delta = in_h / in_w;
    let d0 = derivs[bin];
    let d1 = derivs[bin + 1];

    let dy = y - in_cumh;
    let a = dy * (d0 + d1 - 2.0 * delta) + in_h * (delta - d0);
    let b = in_h * d0 - dy * (d0 + d1 - 2.0 * delta);
    let c = -delta * dy;
    let disc = b * b - 4.0 * a * c;
    let root = (2.0 * c) / (-b - disc.max(0.0).sqrt());
    root * in_w + in_cumw
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forward spline, to check the inverse against.
    fn forward(x: f32, w: &[f32], h: &[f32], d: &[f32], tb: f32) -> f32 {
        let bins = w.len();
        let cumw = knots(w, MIN_BIN_WIDTH, -tb, tb);
        let cumh = knots(h, MIN_BIN_HEIGHT, -tb, tb);
        let constant = ((1.0f32 - MIN_DERIVATIVE).exp() - 1.0).ln();
        let mut derivs = vec![MIN_DERIVATIVE + softplus(constant)];
        derivs.extend(d.iter().map(|&v| MIN_DERIVATIVE + softplus(v)));
        derivs.push(MIN_DERIVATIVE + softplus(constant));
        let bin = (0..bins).rev().find(|&i| x >= cumw[i]).unwrap_or(0);
        let (xw, ww) = (cumw[bin], cumw[bin + 1] - cumw[bin]);
        let (yh, hh) = (cumh[bin], cumh[bin + 1] - cumh[bin]);
        let delta = hh / ww;
        let theta = (x - xw) / ww;
        let tt = theta * (1.0 - theta);
        let num = hh * (delta * theta * theta + derivs[bin] * tt);
        let den = delta + (derivs[bin] + derivs[bin + 1] - 2.0 * delta) * tt;
        yh + num / den
    }

    #[test]
    fn inverse_undoes_forward() {
        let w = [0.3, -1.0, 0.5, 2.0, 0.0, 0.1, -0.4, 0.9, 1.2, -2.0];
        let h = [1.0, 0.2, -0.3, 0.0, 0.7, -1.1, 0.4, 0.3, -0.2, 0.6];
        let d = [0.1, -0.5, 0.3, 1.0, -1.0, 0.2, 0.0, 0.4, -0.3];
        for i in -40..=40 {
            let x = i as f32 * 0.12;
            let y = forward(x, &w, &h, &d, 5.0);
            let back = inverse_rq_spline(y, &w, &h, &d, 5.0);
            assert!((back - x).abs() < 1e-4, "x={x} y={y} back={back}");
        }
        assert_eq!(inverse_rq_spline(7.0, &w, &h, &d, 5.0), 7.0);
    }
}
