//! Vectorized activations for contiguous f32 host tensors.
//!
//! ## Why
//! candle's `gelu_erf` calls scalar `erff` per element; in Whisper's encoder
//! (GELU after both convolutions and in every MLP, about 11.5 M values per
//! 30 s window) that was about 6% of the run. Its `silu` and `sigmoid`
//! are scalar `exp` too: in LLM decode `silu` of one 1536-value row took
//! 8.5 us (3.2% of SmolLM2's decode, `bench thinker --profile-ops`), five
//! times an elementwise `mul` of the same row.
//!
//! ## How
//! `gelu(x) = x / 2 * (1 + erf(x / sqrt 2))`. With `z = x / sqrt 2`,
//! `1 + erf(z)` is `erfc(|z|)` for `z < 0` and `2 - erfc(|z|)` otherwise, and
//! `erfc(a) = t (a1 + t (a2 + ... t a5)) e^(-a^2)` with `t = 1 / (1 + p a)`
//! (Abramowitz & Stegun 7.1.26: absolute error below 1.5e-7 for `a >= 0`).
//! Only the absolute error of `1 + erf` matters to GELU, so the result is
//! within about `|x| * 1e-7` of the exact value (a few f32 ulp where GELU is
//! not tiny). `erf` is rounded to f32 before the `1 +`, as candle's and
//! CTranslate2's `1 + erf(z)` are: far left the result is exactly 0, not a
//! denormal (which would make the next GEMM many times slower).
//!
//! `sigmoid(x)` is `1 / (1 + e)` for `x >= 0` and `e / (1 + e)` below,
//! with `e = e^-|x|` (never overflows; 0 past |x| = 87.3, where it would
//! be denormal), and `silu(x) = x sigmoid(x)`: within a few f32 ulp of
//! the exact values.
//!
//! `e^v` (`v <= 0`) is Cephes' `expf` polynomial, with `2^n` applied by
//! `vscalefps` on AVX-512F or built in the exponent bits on AVX2. GELU
//! runs sixteen lanes on AVX-512F and eight on AVX2 + FMA; sigmoid and
//! SiLU eight on AVX2 + FMA (AVX-512 machines too). Long inputs are split
//! over rayon's pool, short ones (a decode row) run on the caller's
//! thread. Other machines keep candle's path.

use rayon::prelude::*;

/// Values per rayon task; inputs up to this run on the caller's thread.
const CHUNK: usize = 16 * 1024;

/// `f` over `x` in chunks: on rayon's pool when there is more than one.
fn map_chunks(x: &[f32], f: impl Fn(&[f32], &mut [f32]) + Sync) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    if x.len() <= CHUNK {
        f(x, &mut y);
    } else {
        y.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(yo, xi)| f(xi, yo));
    }
    y
}

/// The snake activation of `x[b, c, t]` (f32) with per-channel `freq[c]`
/// and `gain[c]`: `x + gain * sin^2(freq x)`, or `x + sin^2(freq x) /
/// freq` without `gain` ([`crate::cpu::math::snake_row`]: one pass, where
/// candle's composition took four). Rows are split over rayon's pool in
/// tasks of at least [`CHUNK`] values. None unless all are f32.
pub(crate) fn snake(
    x: &candle_core::Tensor,
    freq: &candle_core::Tensor,
    gain: Option<&candle_core::Tensor>,
) -> edgeflow_runtime::Result<Option<candle_core::Tensor>> {
    use candle_core::DType;
    use std::mem::MaybeUninit;
    let f32s = |t: &candle_core::Tensor| -> edgeflow_runtime::Result<Option<Vec<f32>>> {
        if t.dtype() != DType::F32 {
            return Ok(None);
        }
        Ok(Some(t.flatten_all()?.to_vec1::<f32>()?))
    };
    let Some(freq) = f32s(freq)? else {
        return Ok(None);
    };
    let gain = match gain {
        Some(g) => match f32s(g)? {
            Some(g) => Some(g),
            None => return Ok(None),
        },
        None => None,
    };
    let (_, c, t) = x.dims3()?;
    if freq.len() != c || gain.as_ref().is_some_and(|g| g.len() != c) || t == 0 {
        return Ok(None);
    }
    let x = super::tensors::dense(x)?;
    let y = super::tensors::with_f32_slice(&x, |xs| {
        let n = xs.len();
        let mut y: Vec<f32> = Vec::with_capacity(n);
        let dst = &mut y.spare_capacity_mut()[..n];
        let rows = |(i, d): (usize, &mut [MaybeUninit<f32>]), per: usize| {
            for (r, dr) in d.chunks_mut(t).enumerate() {
                let row = i * per + r;
                let ch = row % c;
                let src = &xs[row * t..][..t];
                super::math::snake_row(src, dr, freq[ch], gain.as_ref().map(|g| g[ch]));
            }
        };
        let per = CHUNK.div_ceil(t).max(1);
        if n > CHUNK {
            dst.par_chunks_mut(per * t)
                .enumerate()
                .for_each(|p| rows(p, per));
        } else {
            rows((0, dst), per);
        }
        // SAFETY: every row of `dst` was written by `snake_row`.
        unsafe { y.set_len(n) };
        y
    })?;
    Ok(match y {
        Some(y) => Some(candle_core::Tensor::from_vec(y, x.shape(), x.device())?),
        None => None,
    })
}

/// Whether this CPU has AVX2 and FMA (the 8-lane kernels' features).
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `gelu_erf` of every value of `x`, or None when this machine has
/// neither AVX-512F nor AVX2 + FMA (the caller then runs candle's scalar
/// path).
pub(crate) fn gelu_erf(x: &[f32]) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected at run time; the kernel reads
            // `xi` and writes `yo`, of equal lengths.
            return Some(map_chunks(x, |xi, yo| unsafe {
                x86::gelu_erf_avx512(xi, yo)
            }));
        }
        if has_avx2_fma() {
            // SAFETY: AVX2 and FMA were detected at run time; as above.
            return Some(map_chunks(x, |xi, yo| unsafe {
                x86::gelu_erf_avx2(xi, yo)
            }));
        }
    }
    let _ = x;
    None
}

/// `silu` (`x sigmoid(x)`) of every value of `x`, or None without AVX2 +
/// FMA (candle's path then).
pub(crate) fn silu(x: &[f32]) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: AVX2 and FMA were detected at run time; the kernel reads
        // `xi` and writes `yo`, of equal lengths.
        return Some(map_chunks(x, |xi, yo| unsafe {
            x86::sigmoid_avx2::<true>(xi, yo)
        }));
    }
    let _ = x;
    None
}

/// `silu(gate) * up` over `rows` rows of `f` values in one pass, or None
/// without AVX2 + FMA: `up` None reads both from `x` (each row gate then
/// up, `2 f` values), else `x` holds the gates and `up` the ups (`f`
/// values a row each). Each row's silu is [`silu`]'s kernel on that row
/// (whose results do not depend on a value's place), then one multiply:
/// the bits of `silu` and a multiply, and a prefill row's bits are its
/// decode's. Rows are split over rayon's pool in tasks of at least
/// [`CHUNK`] values; the output is written once (not cleared first), the
/// silu and the multiply in one pass.
pub(crate) fn swiglu(x: &[f32], up: Option<&[f32]>, rows: usize, f: usize) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        let width = if up.is_some() { f } else { 2 * f };
        if f == 0 || x.len() != rows * width || up.is_some_and(|u| u.len() != rows * f) {
            return None;
        }
        let row = |r: usize, yo: &mut [std::mem::MaybeUninit<f32>]| {
            let (g, u) = match up {
                Some(u) => (&x[r * f..(r + 1) * f], &u[r * f..(r + 1) * f]),
                None => x[r * width..(r + 1) * width].split_at(f),
            };
            // SAFETY: AVX2 and FMA were detected at run time; `g`, `u` and
            // `yo` hold f values each.
            unsafe { x86::swiglu_avx2(g, u, yo) };
        };
        // Not cleared first: every value is written below.
        let mut y: Vec<f32> = Vec::with_capacity(rows * f);
        let dst = &mut y.spare_capacity_mut()[..rows * f];
        let per = CHUNK.div_ceil(f).max(1);
        if rows <= per {
            // Decode's one row: no trip through the pool.
            for (r, yo) in dst.chunks_exact_mut(f).enumerate() {
                row(r, yo);
            }
        } else {
            dst.par_chunks_mut(per * f).enumerate().for_each(|(t, ys)| {
                for (i, yo) in ys.chunks_exact_mut(f).enumerate() {
                    row(t * per + i, yo);
                }
            });
        }
        // SAFETY: each of the `rows` rows of f values was written by
        // `swiglu_avx2`.
        unsafe { y.set_len(rows * f) };
        return Some(y);
    }
    let _ = (x, up, rows, f);
    None
}

/// `sigmoid` of every value of `x`, or None without AVX2 + FMA.
pub(crate) fn sigmoid(x: &[f32]) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: as in `silu`.
        return Some(map_chunks(x, |xi, yo| unsafe {
            x86::sigmoid_avx2::<false>(xi, yo)
        }));
    }
    let _ = x;
    None
}

/// [`sigmoid`] (times `x` when `SILU`) of one value with libm's `exp`:
/// the tests' scalar reference (the vector code runs a slice's tail
/// through its lanes too).
#[cfg(test)]
fn sigmoid_scalar<const SILU: bool>(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let e = if -x.abs() < EXP_MIN {
        0.0
    } else {
        (-x.abs()).exp()
    };
    let s = if x >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    };
    if SILU {
        x * s
    } else {
        s
    }
}

/// The same formula, one value at a time (the tail of a slice, and the
/// tests' check of the vector code).
fn gelu_erf_scalar(x: f32) -> f32 {
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let a = z.abs();
    let t = 1.0 / P.mul_add(a, 1.0);
    let poly = t * A[4]
        .mul_add(t, A[3])
        .mul_add(t, A[2])
        .mul_add(t, A[1])
        .mul_add(t, A[0]);
    let e = poly * (-a * a).max(EXP_MIN).exp();
    let erf = (1.0 - e).copysign(z);
    let one_plus_erf = 1.0 + erf;
    0.5 * x * one_plus_erf
}

/// Abramowitz & Stegun 7.1.26.
const P: f32 = 0.327_591_1;
const A: [f32; 5] = [
    0.254_829_6,
    -0.284_496_74,
    1.421_413_8,
    -1.453_152,
    1.061_405_4,
];

/// Cephes' `expf`: `e^v = 2^n e^r`, `n = round(v log2 e)`, `r = v - n ln 2`
/// with ln 2 in two parts, `e^r = 1 + r + r^2 p(r)`.
const EXP_LN2: [f32; 2] = [0.693_359_4, -2.121_944_4e-4];
/// `p(r)`, highest power first.
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];
/// `e^v` is taken at this for smaller `v` (`2^n` stays normal).
const EXP_MIN: f32 = -87.3;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{gelu_erf_scalar, A, EXP_LN2, EXP_MIN, EXP_P, P};
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// `e^v` for `v <= 0`, 16 lanes: Cephes' `expf` (range reduction by
    /// ln 2 in two parts, degree-7 polynomial), `2^n` by `vscalefps`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp_neg(v: __m512) -> __m512 {
        let v = _mm512_max_ps(v, _mm512_set1_ps(EXP_MIN));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(v, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2[0]), v);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2[1]), r);
        let mut p = _mm512_set1_ps(EXP_P[0]);
        for &c in &EXP_P[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        _mm512_scalef_ps(y, n)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gelu_erf_avx512(x: &[f32], y: &mut [f32]) {
        let len = x.len().min(y.len());
        let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
        let mut i = 0;
        while i + 16 <= len {
            // SAFETY: i + 16 <= len for both slices; loadu / storeu need
            // no alignment.
            let xv = unsafe { _mm512_loadu_ps(xp.add(i)) };
            let z = _mm512_mul_ps(xv, _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
            let a = _mm512_abs_ps(z);
            let t = _mm512_div_ps(
                _mm512_set1_ps(1.0),
                _mm512_fmadd_ps(_mm512_set1_ps(P), a, _mm512_set1_ps(1.0)),
            );
            let mut poly = _mm512_set1_ps(A[4]);
            for c in [A[3], A[2], A[1], A[0]] {
                poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(c));
            }
            poly = _mm512_mul_ps(poly, t);
            let e = _mm512_mul_ps(
                poly,
                exp_neg(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(a, a))),
            );
            // 1 + erf(z) with erf(z) = +-(1 - e) rounded first, as
            // `1 + erf` gives: exactly 0 far left, no denormals.
            let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(z, _mm512_setzero_ps());
            let erf_abs = _mm512_sub_ps(_mm512_set1_ps(1.0), e);
            let erf = _mm512_mask_sub_ps(erf_abs, neg, _mm512_setzero_ps(), erf_abs);
            let one_plus_erf = _mm512_add_ps(_mm512_set1_ps(1.0), erf);
            let out = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5), xv), one_plus_erf);
            // SAFETY: as for the load.
            unsafe { _mm512_storeu_ps(yp.add(i), out) };
            i += 16;
        }
        for j in i..len {
            y[j] = gelu_erf_scalar(x[j]);
        }
    }

    /// [`exp_neg`] on 8 lanes: `2^n` built in the exponent bits (`n >=
    /// -126` for `v >= -87.3`, so always a normal number).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp_neg_avx2(v: __m256) -> __m256 {
        let v = _mm256_max_ps(v, _mm256_set1_ps(EXP_MIN));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2[0]), v);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2[1]), r);
        let mut p = _mm256_set1_ps(EXP_P[0]);
        for &c in &EXP_P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(y, _mm256_castsi256_ps(bits))
    }

    /// [`gelu_erf_avx512`] on 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gelu_erf_avx2(x: &[f32], y: &mut [f32]) {
        let len = x.len().min(y.len());
        let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
        let sign = _mm256_set1_ps(-0.0);
        let mut i = 0;
        while i + 8 <= len {
            // SAFETY: i + 8 <= len for both slices; loadu / storeu need
            // no alignment.
            let xv = unsafe { _mm256_loadu_ps(xp.add(i)) };
            let z = _mm256_mul_ps(xv, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
            let a = _mm256_andnot_ps(sign, z);
            let t = _mm256_div_ps(
                _mm256_set1_ps(1.0),
                _mm256_fmadd_ps(_mm256_set1_ps(P), a, _mm256_set1_ps(1.0)),
            );
            let mut poly = _mm256_set1_ps(A[4]);
            for c in [A[3], A[2], A[1], A[0]] {
                poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(c));
            }
            poly = _mm256_mul_ps(poly, t);
            let e = _mm256_mul_ps(
                poly,
                exp_neg_avx2(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(a, a))),
            );
            // 1 + erf(z), erf(z) = +-(1 - e) rounded first (see the AVX-512 kernel).
            let erf_abs = _mm256_sub_ps(_mm256_set1_ps(1.0), e);
            let erf = _mm256_or_ps(erf_abs, _mm256_and_ps(sign, z));
            let one_plus_erf = _mm256_add_ps(_mm256_set1_ps(1.0), erf);
            let out = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5), xv), one_plus_erf);
            // SAFETY: as for the load.
            unsafe { _mm256_storeu_ps(yp.add(i), out) };
            i += 8;
        }
        for j in i..len {
            y[j] = gelu_erf_scalar(x[j]);
        }
    }

    /// `sigmoid(x)` (times `x` when `SILU`) of 8 lanes: `e = e^-|x|`,
    /// then `1 / (1 + e)` for `x >= 0`, `e / (1 + e)` below.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn sigmoid8<const SILU: bool>(xv: __m256) -> __m256 {
        let one = _mm256_set1_ps(1.0);
        let nx = _mm256_or_ps(xv, _mm256_set1_ps(-0.0));
        // e^-|x|, 0 below EXP_MIN (where it would be denormal).
        let e = _mm256_andnot_ps(
            _mm256_cmp_ps::<_CMP_LT_OQ>(nx, _mm256_set1_ps(EXP_MIN)),
            exp_neg_avx2(nx),
        );
        let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(xv, _mm256_setzero_ps());
        let num = _mm256_blendv_ps(one, e, neg);
        let s = _mm256_div_ps(num, _mm256_add_ps(one, e));
        if SILU {
            _mm256_mul_ps(xv, s)
        } else {
            // NaN in, NaN out (the clamp in exp_neg drops it).
            _mm256_blendv_ps(s, xv, _mm256_cmp_ps::<_CMP_UNORD_Q>(xv, xv))
        }
    }

    /// [`sigmoid8`] (times `x` when `SILU`) over `x` into `y`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn sigmoid_avx2<const SILU: bool>(x: &[f32], y: &mut [f32]) {
        let len = x.len().min(y.len());
        let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
        let mut i = 0;
        while i + 8 <= len {
            // SAFETY: i + 8 <= len for both slices.
            let xv = unsafe { _mm256_loadu_ps(xp.add(i)) };
            // SAFETY: as for the load.
            unsafe { _mm256_storeu_ps(yp.add(i), sigmoid8::<SILU>(xv)) };
            i += 8;
        }
        if i < len {
            // The tail through the same lanes (zero-padded), so a value's
            // result does not depend on where it sits in the slice.
            let (mut xt, mut yt) = ([0f32; 8], [0f32; 8]);
            xt[..len - i].copy_from_slice(&x[i..len]);
            // SAFETY: AVX2 + FMA as for this call; 8 values each.
            unsafe { sigmoid_avx2::<SILU>(&xt, &mut yt) };
            y[i..len].copy_from_slice(&yt[..len - i]);
        }
    }

    /// `silu(g) · u` into `y` (not read: it may be uninitialized):
    /// [`sigmoid_avx2`]'s SiLU of each value, then one multiply, in one
    /// pass; a value's result does not depend on its place (the tail runs
    /// through zero-padded lanes).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn swiglu_avx2(g: &[f32], u: &[f32], y: &mut [MaybeUninit<f32>]) {
        let len = g.len().min(u.len()).min(y.len());
        let (gp, up, yp) = (g.as_ptr(), u.as_ptr(), y.as_mut_ptr() as *mut f32);
        let mut i = 0;
        while i + 8 <= len {
            // SAFETY: i + 8 <= len for the three slices.
            unsafe {
                let v = _mm256_mul_ps(
                    sigmoid8::<true>(_mm256_loadu_ps(gp.add(i))),
                    _mm256_loadu_ps(up.add(i)),
                );
                _mm256_storeu_ps(yp.add(i), v);
            }
            i += 8;
        }
        if i < len {
            let (mut gt, mut yt) = ([0f32; 8], [0f32; 8]);
            gt[..len - i].copy_from_slice(&g[i..len]);
            // SAFETY: AVX2 + FMA as for this call; 8 values each.
            unsafe { sigmoid_avx2::<true>(&gt, &mut yt) };
            for ((o, s), u) in y[i..len].iter_mut().zip(&yt).zip(&u[i..len]) {
                o.write(s * u);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gelu_f64(x: f64) -> f64 {
        // erf by its Taylor series (|z| < 3) or continued fraction for erfc.
        let z = x / std::f64::consts::SQRT_2;
        let erf = if z.abs() < 3.0 {
            let mut term = z;
            let mut sum = z;
            let mut n = 0.0;
            while term.abs() > 1e-17 * sum.abs().max(1e-300) {
                n += 1.0;
                term *= -z * z / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // Lentz-free continued fraction, evaluated bottom-up.
            let a = z.abs();
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (a + f);
            }
            let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f);
            (1.0 - erfc).copysign(z)
        };
        0.5 * x * (1.0 + erf)
    }

    /// Within 5e-7 * |x| / 2 of an f64 GELU from -12 to 12 (1.5e-7 from the
    /// erf approximation, the rest from rounding `t`, the polynomial and
    /// `e^v` in f32), on the vector path where this machine has it and on
    /// the scalar formula.
    #[test]
    fn gelu_erf_is_close_to_f64() {
        let x: Vec<f32> = (0..40_003).map(|i| -12.0 + i as f32 * 6e-4).collect();
        let vector = gelu_erf(&x);
        for (i, &v) in x.iter().enumerate() {
            let want = gelu_f64(v as f64);
            let tol = 5e-7 * v.abs() as f64 / 2.0 + 1e-30;
            let s = gelu_erf_scalar(v) as f64;
            assert!((s - want).abs() <= tol, "scalar x={v}: {s} vs {want}");
            if let Some(y) = &vector {
                assert!(!y[i].is_subnormal(), "x={v} gives a denormal");
                let g = y[i] as f64;
                assert!((g - want).abs() <= tol, "vector x={v}: {g} vs {want}");
            }
        }
    }

    /// Every x86 GELU kernel this machine runs (AVX-512F and AVX2 + FMA),
    /// not only the preferred one, agrees with the scalar formula to a few
    /// ulp over the range where GELU is not tiny.
    #[test]
    fn gelu_erf_kernels_agree() {
        let x: Vec<f32> = (0..4_099).map(|i| -9.0 + i as f32 * 4.5e-3).collect();
        #[cfg(target_arch = "x86_64")]
        for (name, run) in [
            (
                "avx512",
                std::is_x86_feature_detected!("avx512f")
                    .then_some(x86::gelu_erf_avx512 as unsafe fn(&[f32], &mut [f32])),
            ),
            (
                "avx2",
                has_avx2_fma().then_some(x86::gelu_erf_avx2 as unsafe fn(&[f32], &mut [f32])),
            ),
        ] {
            let Some(run) = run else { continue };
            let mut y = vec![0f32; x.len()];
            // SAFETY: the features were detected above.
            unsafe { run(&x, &mut y) };
            for (&v, &g) in x.iter().zip(&y) {
                let s = gelu_erf_scalar(v);
                let tol = 4.0 * f32::EPSILON * s.abs().max(1e-3 * v.abs());
                assert!((g - s).abs() <= tol, "{name} x={v}: {g} vs {s}");
            }
        }
    }

    fn sigmoid_f64(x: f64) -> f64 {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            x.exp() / (1.0 + x.exp())
        }
    }

    /// SiLU and sigmoid within 4 f32 ulp of f64 (plus 1e-37 absolute:
    /// below x = -87.3 `e^x` is 0 instead of denormal), from -100 to 100, on the vector path (with a scalar
    /// tail: 40 003 values) and on the scalar formula; specials.
    #[test]
    fn silu_and_sigmoid_are_close_to_f64() {
        let x: Vec<f32> = (0..40_003).map(|i| -100.0 + i as f32 * 5e-3).collect();
        let (vs, vg) = (silu(&x), sigmoid(&x));
        for (i, &v) in x.iter().enumerate() {
            let sg = sigmoid_f64(v as f64);
            let si = v as f64 * sg;
            let tol =
                |w: f64| 4.0 * f32::EPSILON as f64 * w.abs() + 1e-37 * v.abs().max(1.0) as f64;
            let (a, b) = (
                sigmoid_scalar::<false>(v) as f64,
                sigmoid_scalar::<true>(v) as f64,
            );
            assert!(
                (a - sg).abs() <= tol(sg),
                "scalar sigmoid x={v}: {a} vs {sg}"
            );
            assert!((b - si).abs() <= tol(si), "scalar silu x={v}: {b} vs {si}");
            if let (Some(ys), Some(yg)) = (&vs, &vg) {
                let (g, s) = (yg[i] as f64, ys[i] as f64);
                assert!((g - sg).abs() <= tol(sg), "sigmoid x={v}: {g} vs {sg}");
                assert!((s - si).abs() <= tol(si), "silu x={v}: {s} vs {si}");
                assert!(!yg[i].is_subnormal() && !ys[i].is_subnormal(), "x={v}");
            }
        }
        let sp = [0.0f32, -0.0, f32::INFINITY, f32::NAN, 1e30, -1e30];
        if let (Some(s), Some(g)) = (silu(&sp), sigmoid(&sp)) {
            assert_eq!(g[..3], [0.5, 0.5, 1.0]);
            assert!(g[3].is_nan() && s[3].is_nan());
            assert_eq!(s[2], f32::INFINITY);
            assert_eq!((s[0], g[4], s[4]), (0.0, 1.0, 1e30));
            assert_eq!((g[5], s[5]), (0.0, 0.0));
        }
    }

    #[test]
    fn gelu_erf_keeps_length_and_specials() {
        let x = [0.0f32, -0.0, 1.0, -1.0, 100.0, -100.0, f32::MIN_POSITIVE];
        if let Some(y) = gelu_erf(&x) {
            assert_eq!(y.len(), x.len());
            assert_eq!(y[0], 0.0);
            assert_eq!(y[4], 100.0);
            assert_eq!(y[5], 0.0);
        }
    }
}
