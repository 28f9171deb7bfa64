//! Resampling the learned position embeddings to another patch grid, as
//! Hugging Face's `Dinov2Embeddings.interpolate_pos_encoding` does:
//! `torch.nn.functional.interpolate(mode="bicubic", align_corners=False,
//! antialias=False)` on the `[dim, side, side]` grid (the exported ONNX
//! graph's `Resize`: cubic, coefficient -0.75, half-pixel coordinates,
//! edge-clamped taps).

/// Cubic convolution weights of the four taps around a sample at fraction
/// `t` past its floor (Keys' kernel with `a = -0.75`, PyTorch's).
fn cubic_weights(t: f64) -> [f64; 4] {
    const A: f64 = -0.75;
    let near = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// For each output index, the four source indices (clamped to the input)
/// and their weights: half-pixel mapping `src = (i + 0.5) * in / out - 0.5`.
fn taps(input: usize, output: usize) -> Vec<([usize; 4], [f64; 4])> {
    let scale = input as f64 / output as f64;
    (0..output)
        .map(|i| {
            let src = (i as f64 + 0.5) * scale - 0.5;
            let f = src.floor();
            let w = cubic_weights(src - f);
            let idx = std::array::from_fn(|k| {
                let j = f as isize - 1 + k as isize;
                j.clamp(0, input as isize - 1) as usize
            });
            (idx, w)
        })
        .collect()
}

/// Bicubic resize of row-major `grid[side_in_h][side_in_w][dim]` (token
/// layout: one `dim` vector per grid cell) to `out_h` x `out_w` cells,
/// separably (rows, then columns), in f64.
pub(crate) fn resize_grid(
    grid: &[f32],
    in_h: usize,
    in_w: usize,
    dim: usize,
    out_h: usize,
    out_w: usize,
) -> Vec<f32> {
    if (in_h, in_w) == (out_h, out_w) {
        return grid.to_vec();
    }
    let tx = taps(in_w, out_w);
    let ty = taps(in_h, out_h);
    // Along the width first: [in_h][out_w][dim].
    let mut mid = vec![0f64; in_h * out_w * dim];
    for y in 0..in_h {
        for (x, (idx, w)) in tx.iter().enumerate() {
            let o = (y * out_w + x) * dim;
            for (&i, &wk) in idx.iter().zip(w) {
                let s = (y * in_w + i) * dim;
                for (m, g) in mid[o..o + dim].iter_mut().zip(&grid[s..s + dim]) {
                    *m += wk * *g as f64;
                }
            }
        }
    }
    let mut out = vec![0f32; out_h * out_w * dim];
    let mut acc = vec![0f64; dim];
    for (y, (idx, w)) in ty.iter().enumerate() {
        for x in 0..out_w {
            acc.iter_mut().for_each(|a| *a = 0.0);
            for (&i, &wk) in idx.iter().zip(w) {
                let s = (i * out_w + x) * dim;
                for (a, m) in acc.iter_mut().zip(&mid[s..s + dim]) {
                    *a += wk * m;
                }
            }
            let o = (y * out_w + x) * dim;
            for (v, a) in out[o..o + dim].iter_mut().zip(&acc) {
                *v = *a as f32;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_and_identity_is_exact() {
        for t in [0.0, 0.25, 0.5, 0.9] {
            let s: f64 = cubic_weights(t).iter().sum();
            assert!((s - 1.0).abs() < 1e-12);
        }
        assert_eq!(cubic_weights(0.0), [0.0, 1.0, 0.0, 0.0]);
        let g: Vec<f32> = (0..2 * 3 * 4).map(|v| v as f32).collect();
        assert_eq!(resize_grid(&g, 2, 3, 4, 2, 3), g);
    }

    #[test]
    fn constant_grids_stay_constant_and_ramps_stay_symmetric() {
        // Keys' kernel with a = -0.75 keeps constants exactly but not
        // ramps (only a = -0.5 does); a ramp stays increasing and mirror
        // symmetric about the grid's centre. The values themselves are
        // checked against onnxruntime in tests/parity.rs.
        let (n, m) = (37, 16);
        let ramp: Vec<f32> = (0..n * n).map(|i| (i % n) as f32).collect();
        let out = resize_grid(&ramp, n, n, 1, m, m);
        let row = &out[5 * m..6 * m];
        assert!(row.windows(2).all(|w| w[1] > w[0]), "{row:?}");
        for (x, (a, b)) in row.iter().zip(row.iter().rev()).enumerate() {
            assert!((a + b - (n - 1) as f32).abs() < 1e-4, "{x}: {a} + {b}");
        }
        let flat = vec![3.5f32; n * n * 2];
        assert!(resize_grid(&flat, n, n, 2, 6, 8)
            .iter()
            .all(|v| (v - 3.5).abs() < 1e-5));
    }
}
