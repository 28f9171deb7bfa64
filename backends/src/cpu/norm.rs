//! Layer norm over the last dim of contiguous f32 host tensors.
//!
//! ## Why
//! candle's CPU layer norm splits its rows over rayon's pool whatever their
//! number: a DINOv2 ViT-S pass at 112 px (65 rows of 384) took 65 us per
//! norm on two Zen 3 cores, 5 % of the pass, mostly the split. Here a row
//! is one pass for the mean, one for the variance (two-pass, as stable as
//! it gets in f32) and one to write; rows go to the pool only from
//! [`PAR_MIN`] values.
//!
//! ## Results across instruction sets
//! The AVX2 path keeps eight running sums and reduces them in a fixed
//! order; the portable path keeps the same eight sums (the same adds and
//! fused multiply-adds, lane by lane) and reduces them in the same order,
//! so both give the same bits. They differ from candle's (one pass of sums
//! and sums of squares) by f32 rounding.

use super::act::has_avx2_fma;
use super::tensors::{cdev, with_f32_slice};
use candle_core::Tensor as CTensor;
use edgeflow_runtime::Result;
use rayon::prelude::*;

/// Values from which rows are split over rayon's pool.
const PAR_MIN: usize = 1 << 16;

/// `(x - mean) / sqrt(var + eps) * g + b` over the last dim of `x`; None
/// unless `x`, `g` and `b` are f32 host tensors, `g` and `b` of the last
/// dim's length (the caller then runs candle).
pub(crate) fn layer_norm(
    x: &CTensor,
    g: &CTensor,
    b: &CTensor,
    eps: f32,
) -> Result<Option<CTensor>> {
    let Some(&n) = x.dims().last() else {
        return Ok(None);
    };
    if n == 0 || g.elem_count() != n || b.elem_count() != n {
        return Ok(None);
    }
    let f32s = [g, b].iter().all(|t| t.dtype() == candle_core::DType::F32);
    if !f32s {
        return Ok(None);
    }
    // `n` values each: copied (a row's worth) rather than borrowed.
    let gs = g.flatten_all()?.to_vec1::<f32>()?;
    let bs = b.flatten_all()?.to_vec1::<f32>()?;
    let y = with_f32_slice(x, |xs| {
        let mut y = vec![0f32; xs.len()];
        let avx2 = has_avx2_fma();
        let row = |(xr, yr): (&[f32], &mut [f32])| norm_row(xr, &gs, &bs, eps, yr, avx2);
        if xs.len() >= PAR_MIN {
            xs.par_chunks(n).zip(y.par_chunks_mut(n)).for_each(row);
        } else {
            xs.chunks(n).zip(y.chunks_mut(n)).for_each(row);
        }
        y
    })?;
    Ok(match y {
        Some(y) => Some(CTensor::from_vec(y, x.shape(), &cdev())?),
        None => None,
    })
}

/// One row (all slices of one length).
fn norm_row(x: &[f32], g: &[f32], b: &[f32], eps: f32, y: &mut [f32], avx2: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: AVX2 and FMA were detected; the kernel reads and writes
        // within the slices, whose lengths it checks.
        unsafe { x86::norm_row(x, g, b, eps, y) };
        return;
    }
    let _ = avx2;
    let n = x.len();
    let main = n / 8 * 8;
    let mut s = [0f32; 8];
    for c in x[..main].chunks_exact(8) {
        for (s, &v) in s.iter_mut().zip(c) {
            *s += v;
        }
    }
    for (i, &v) in x[main..].iter().enumerate() {
        s[i] += v;
    }
    let mean = reduce8(s) / n as f32;
    let mut q = [0f32; 8];
    for c in x[..main].chunks_exact(8) {
        for (q, &v) in q.iter_mut().zip(c) {
            let d = v - mean;
            *q = d.mul_add(d, *q);
        }
    }
    for (i, &v) in x[main..].iter().enumerate() {
        let d = v - mean;
        q[i] = d.mul_add(d, q[i]);
    }
    let inv = 1.0 / (reduce8(q) / n as f32 + eps).sqrt();
    for (((y, &v), &g), &b) in y.iter_mut().zip(x).zip(g).zip(b) {
        *y = (v - mean).mul_add(inv * g, b);
    }
}

/// The eight running sums in the AVX2 path's order:
/// `((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7))`.
fn reduce8(s: [f32; 8]) -> f32 {
    ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::reduce8;
    use std::arch::x86_64::*;

    /// [`super::norm_row`] on eight lanes.
    ///
    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn norm_row(x: &[f32], g: &[f32], b: &[f32], eps: f32, y: &mut [f32]) {
        let n = x.len();
        assert!(g.len() == n && b.len() == n && y.len() == n);
        let main = n / 8 * 8;
        let lanes = |v: __m256| {
            let mut a = [0f32; 8];
            // SAFETY: `a` holds 8 floats.
            unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
            a
        };
        let mut acc = _mm256_setzero_ps();
        for i in (0..main).step_by(8) {
            // SAFETY: i + 8 <= main <= n.
            acc = _mm256_add_ps(acc, unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) });
        }
        let mut s = lanes(acc);
        for (i, &v) in x[main..].iter().enumerate() {
            s[i] += v;
        }
        let mean = reduce8(s) / n as f32;
        let m = _mm256_set1_ps(mean);
        let mut acc = _mm256_setzero_ps();
        for i in (0..main).step_by(8) {
            // SAFETY: as above.
            let d = _mm256_sub_ps(unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) }, m);
            acc = _mm256_fmadd_ps(d, d, acc);
        }
        let mut q = lanes(acc);
        for (i, &v) in x[main..].iter().enumerate() {
            let d = v - mean;
            q[i] = d.mul_add(d, q[i]);
        }
        let inv = 1.0 / (reduce8(q) / n as f32 + eps).sqrt();
        let iv = _mm256_set1_ps(inv);
        for i in (0..main).step_by(8) {
            // SAFETY: i + 8 <= n for all four slices (asserted equal).
            unsafe {
                let d = _mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m);
                let s = _mm256_mul_ps(iv, _mm256_loadu_ps(g.as_ptr().add(i)));
                let v = _mm256_fmadd_ps(d, s, _mm256_loadu_ps(b.as_ptr().add(i)));
                _mm256_storeu_ps(y.as_mut_ptr().add(i), v);
            }
        }
        for i in main..n {
            y[i] = (x[i] - mean).mul_add(inv * g[i], b[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in -1.5..2.5 (an offset mean, as activations have).
    fn values(len: usize, seed: u32) -> Vec<f32> {
        crate::cpu::tests::values(len, seed)
            .into_iter()
            .map(|v| 2.0 * v + 0.5)
            .collect()
    }

    /// Against an f64 two-pass norm, and the AVX2 row equal to the
    /// portable one bit for bit, for row lengths with and without a tail.
    #[test]
    fn matches_f64_and_is_identical_across_isas() {
        for n in [1usize, 5, 8, 13, 384, 387] {
            let rows = 7;
            let x = values(rows * n, 1);
            let (g, b) = (values(n, 2), values(n, 3));
            let eps = 1e-6;
            let xt = CTensor::from_vec(x.clone(), (rows, n), &cdev()).expect("x");
            let gt = CTensor::from_vec(g.clone(), n, &cdev()).expect("g");
            let bt = CTensor::from_vec(b.clone(), n, &cdev()).expect("b");
            let y = layer_norm(&xt, &gt, &bt, eps)
                .expect("runs")
                .expect("f32")
                .flatten_all()
                .expect("flat")
                .to_vec1::<f32>()
                .expect("vec");
            for r in 0..rows {
                let xr = &x[r * n..(r + 1) * n];
                let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
                let inv = 1.0 / (var + eps as f64).sqrt();
                for j in 0..n {
                    let want = (xr[j] as f64 - mean) * inv * g[j] as f64 + b[j] as f64;
                    let got = y[r * n + j] as f64;
                    // Tolerance: f32 sums over at most 387 values.
                    assert!(
                        (got - want).abs() <= 2e-5 * (1.0 + want.abs()),
                        "n {n} row {r} col {j}: {got} vs {want}"
                    );
                }
                if has_avx2_fma() {
                    let mut portable = vec![0f32; n];
                    norm_row(xr, &g, &b, eps, &mut portable, false);
                    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&portable),
                        bits(&y[r * n..(r + 1) * n]),
                        "n {n} row {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn other_dtypes_and_shapes_are_left_to_candle() {
        let x = CTensor::zeros((2, 4), candle_core::DType::F16, &cdev()).expect("x");
        let g = CTensor::ones(4, candle_core::DType::F16, &cdev()).expect("g");
        assert!(layer_norm(&x, &g, &g, 1e-5).expect("runs").is_none());
        let x = CTensor::zeros((2, 4), candle_core::DType::F32, &cdev()).expect("x");
        let g = CTensor::ones(3, candle_core::DType::F32, &cdev()).expect("g");
        assert!(layer_norm(&x, &g, &g, 1e-5).expect("runs").is_none());
    }
}
