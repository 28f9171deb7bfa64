//! The depthwise convolution (one channel per group).

use super::Conv1dShape;
use rayon::prelude::*;

/// Depthwise convolution (`groups == c_in == c_out`, weights `[c, 1, k]`)
/// with stride `stride`: `y[b, c, t] = bias[c] + sum_j w[c, j] * x[b, c,
/// t*stride + j*d - p]`, with `x` as `[batch, c, t_in]` and `s.c_out ==
/// s.c_in`. At stride 1 each row is a few vectorized multiply-adds over
/// shifted slices; candle runs it as `c` separate im2col convolutions
/// (~0.5 ms for a [192, 193] input, 100x this). Strided rows (a
/// decimating filter: BigVGAN's anti-aliasing downsampler, one channel
/// with the rows as batch) take one short dot product per output, where
/// candle ran an im2col per row (~4 ms for [48, 1, 12011] by a 12-tap
/// filter at stride 2, 30x this). None when the shape is degenerate or
/// the slices do not match it.
pub(crate) fn depthwise(
    s: Conv1dShape,
    stride: usize,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
) -> Option<Vec<f32>> {
    let t_full = s.t_out()?;
    let c = s.c_in;
    if s.c_out != c
        || s.dilation == 0
        || stride == 0
        || x.len() != s.batch * c * s.t_in
        || w.len() != c * s.k
        || bias.is_some_and(|b| b.len() != c)
    {
        return None;
    }
    let t_out = (t_full - 1) / stride + 1;
    let mut y = vec![0f32; s.batch * c * t_out];
    let row = |(r, out): (usize, &mut [f32])| {
        let ch = r % c;
        let b0 = bias.map_or(0.0, |b| b[ch]);
        let src = &x[r * s.t_in..][..s.t_in];
        let taps = &w[ch * s.k..][..s.k];
        if stride == 1 {
            out.fill(b0);
            for (j, &wj) in taps.iter().enumerate() {
                // Output t reads src[t + j*d - p]: t in [lo, hi) stays inside.
                let shift = j * s.dilation;
                let lo = s.padding.saturating_sub(shift).min(t_out);
                let hi = (s.t_in + s.padding).saturating_sub(shift).min(t_out);
                if hi <= lo {
                    continue;
                }
                let first = lo + shift - s.padding;
                for (o, &v) in out[lo..hi].iter_mut().zip(&src[first..]) {
                    *o += wj * v;
                }
            }
            return;
        }
        let span = s.dilation * (s.k - 1);
        for (t, o) in out.iter_mut().enumerate() {
            // Padded position of tap 0; taps add in order j = 0, 1, ...
            // as in the stride-1 path.
            let start = t * stride;
            let mut acc = b0;
            if start >= s.padding && start + span < s.t_in + s.padding {
                let base = start - s.padding;
                for (j, &wj) in taps.iter().enumerate() {
                    acc += wj * src[base + j * s.dilation];
                }
            } else {
                for (j, &wj) in taps.iter().enumerate() {
                    let pos = start + j * s.dilation;
                    if pos >= s.padding && pos - s.padding < s.t_in {
                        acc += wj * src[pos - s.padding];
                    }
                }
            }
            *o = acc;
        }
    };
    if y.len() >= 1 << 16 {
        y.par_chunks_mut(t_out).enumerate().for_each(row);
    } else {
        y.chunks_mut(t_out).enumerate().for_each(row);
    }
    Some(y)
}
