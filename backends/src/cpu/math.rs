//! Vectorizable f32 `tanh` and `sigmoid` for the CPU backend's element-wise
//! path: the gates of a WaveNet flow and a vocoder's output.
//!
//! libm's `tanhf` / `expf` are scalar calls (perf: ~5% of `bench tts`
//! samples in `__expm1f`, `__tanhf`, `__expf`). Here `e^x` is a
//! Cody-Waite range reduction (`x = n ln 2 + r`, `|r| <= ln 2 / 2`), a
//! degree-7 Taylor polynomial for `e^r` and `2^n` built from its exponent
//! bits: no calls, no table, so loops over it compile to AVX-512 / AVX2
//! vectors (chosen at run time; other machines run the same code scalar).
//! `tanh` is an odd Taylor polynomial (through `x^15`) below `|x| = 0.5`
//! and `1 - 2 / (e^{2|x|} + 1)` above; `sigmoid` is `1 / (1 + e^{-x})`.
//! Both are within 1e-6 relative (2e-7 absolute near zero) of the exact
//! value (tested against f64 below), saturate exactly at large `|x|` and
//! pass NaN through.

use std::mem::MaybeUninit;

/// `e^x` for `x` in `[-87, 88]` (clamped there: a normal result, no
/// overflow), within ~3e-7 relative.
#[inline(always)]
fn exp_clamped(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts: n * LN2_HI is exact for |n| < 2^9.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // n in [-126, 127] after the clamp: 2^n is a normal float, exponent
    // field n + 127. t = 1.5 * 2^23 + n holds 2^22 + n in its low mantissa
    // bits, so (bits + 127) << 23 is that field alone. Integer ops only (a
    // float-to-int `as` cast has saturating semantics that compiled to
    // scalar code, ~1 ns per value). NaN stays NaN through p.
    let scale = f32::from_bits(t.to_bits().wrapping_add(127) << 23);
    p * scale
}

/// `tanh(x)`.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let a = x.abs();
    // Odd Taylor series, coefficients of x^1, x^3, ..., x^15.
    let x2 = x * x;
    let s = -929_569.0 / 638_512_875.0;
    let s = s * x2 + 21_844.0 / 6_081_075.0;
    let s = s * x2 - 1_382.0 / 155_925.0;
    let s = s * x2 + 62.0 / 2_835.0;
    let s = s * x2 - 17.0 / 315.0;
    let s = s * x2 + 2.0 / 15.0;
    let s = s * x2 - 1.0 / 3.0;
    let small = x * (1.0 + x2 * s);
    let large = (1.0 - 2.0 / (exp_clamped(2.0 * a) + 1.0)).copysign(x);
    if a < 0.5 {
        small
    } else {
        large
    }
}

/// GELU, tanh approximation: `x / 2 * (1 + tanh(sqrt(2 / pi) * (x +
/// 0.044715 x^3)))`, as candle's `gelu` writes it, with [`tanh`] (a
/// DiT's MLP: candle's scalar `tanhf` per value was ~10% of a velocity).
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + tanh(SQRT_TWO_OVER_PI * x * (1.0 + 0.044_715 * x * x)))
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_clamped(-x))
}

/// Above this `|x|` [`sin_sq`]'s range reduction loses precision: libm
/// takes those values ([`snake_row`]).
const SIN_SQ_MAX: f32 = 8192.0;

/// `sin(x)^2` for `|x| <= 8192`, within ~2e-7 absolute: `x = n pi + r`
/// (Cody-Waite, pi in three parts: `n * PI_A` is exact for `|n| < 2^16`),
/// `|r| <= pi / 2`, `sin(x)^2 = sin(r)^2` with `sin r` the odd Taylor
/// series through `r^13` (truncation below 7e-10). No calls, no branches:
/// loops over it vectorize. Larger `|x|` give a value in [0, 1], not
/// `sin^2`; NaN stays NaN.
#[inline(always)]
pub(crate) fn sin_sq(x: f32) -> f32 {
    const INV_PI: f32 = std::f32::consts::FRAC_1_PI;
    const PI_A: f32 = 3.140_625;
    const PI_B: f32 = 9.675_026e-4;
    const PI_C: f32 = 1.509_958e-7;
    const ROUND: f32 = 12_582_912.0;
    let n = (x * INV_PI + ROUND) - ROUND;
    let r = ((x - n * PI_A) - n * PI_B) - n * PI_C;
    let r2 = r * r;
    let p = 1.0 / 6_227_020_800.0;
    let p = p * r2 - 1.0 / 39_916_800.0;
    let p = p * r2 + 1.0 / 362_880.0;
    let p = p * r2 - 1.0 / 5_040.0;
    let p = p * r2 + 1.0 / 120.0;
    let p = p * r2 - 1.0 / 6.0;
    let sin = r + r * (r2 * p);
    sin * sin
}

/// One channel's row of the snake activation, `dst[i] = x + gain *
/// sin^2(freq x)` of `x = src[i]` (BigVGAN's SnakeBeta with its
/// parameters exponentiated), or with `gain: None` the original Snake's `x
/// + sin^2(freq x) / freq`. Vectorized ([`map`], [`sin_sq`]); the rare
/// `|freq x|` beyond [`sin_sq`]'s range are redone with libm's `sin`.
pub(crate) fn snake_row(src: &[f32], dst: &mut [MaybeUninit<f32>], freq: f32, gain: Option<f32>) {
    let exact = |v: f32| {
        let s = (freq * v).sin();
        match gain {
            Some(g) => v + g * (s * s),
            None => v + (s * s) / freq,
        }
    };
    match gain {
        Some(g) => map(src, dst, move |v| v + g * sin_sq(freq * v)),
        None => map(src, dst, move |v| v + sin_sq(freq * v) / freq),
    }
    for (d, &v) in dst.iter_mut().zip(src) {
        if (freq * v).abs() > SIN_SQ_MAX {
            d.write(exact(v));
        }
    }
}

/// `dst[i] = f(src[i])` (`dst` no longer than `src`), compiled for the
/// widest vectors this machine has (`f` is inlined into each variant).
pub(crate) fn map<F: Fn(f32) -> f32 + Copy>(src: &[f32], dst: &mut [MaybeUninit<f32>], f: F) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected at run time.
            unsafe { map_avx512(src, dst, f) };
            return;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA were detected at run time.
            unsafe { map_avx2(src, dst, f) };
            return;
        }
    }
    map_portable(src, dst, f);
}

#[inline(always)]
fn map_portable<F: Fn(f32) -> f32>(src: &[f32], dst: &mut [MaybeUninit<f32>], f: F) {
    for (d, &v) in dst.iter_mut().zip(src) {
        d.write(f(v));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn map_avx512<F: Fn(f32) -> f32>(src: &[f32], dst: &mut [MaybeUninit<f32>], f: F) {
    map_portable(src, dst, f);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map_avx2<F: Fn(f32) -> f32>(src: &[f32], dst: &mut [MaybeUninit<f32>], f: F) {
    map_portable(src, dst, f);
}

/// `dst = src^T`: `src` is a row-major `[rows, cols]` matrix, `dst` the
/// row-major `[cols, rows]` one. Blocked so both sides touch a few cache
/// lines per block rather than one line per element.
pub(crate) fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    const B: usize = 16;
    assert!(src.len() >= rows * cols && dst.len() >= rows * cols);
    for r0 in (0..rows).step_by(B) {
        let r1 = (r0 + B).min(rows);
        for c0 in (0..cols).step_by(B) {
            let c1 = (c0 + B).min(cols);
            for r in r0..r1 {
                let row = &src[r * cols..][c0..c1];
                for (c, &v) in (c0..c1).zip(row) {
                    dst[c * rows + r] = v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_matches_index_swap() {
        for &(rows, cols) in &[(1, 1), (3, 5), (16, 16), (17, 33), (193, 192)] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let mut dst = vec![0.0; rows * cols];
            transpose(&src, rows, cols, &mut dst);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        dst[c * rows + r],
                        src[r * cols + c],
                        "{rows}x{cols} at {r},{c}"
                    );
                }
            }
        }
    }

    /// Inputs over the whole useful range, extremes and special values.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (-200_000..=200_000).map(|i| i as f32 * 1e-4).collect();
        v.extend((-60..=60).map(|i| i as f32 * 1.7));
        v.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            1e-8,
            0.499_999_97,
            0.5,
            87.0,
            88.5,
            -87.5,
            100.0,
            -100.0,
            1e30,
            -1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
        ]);
        v
    }

    fn check(f: fn(f32) -> f32, want: fn(f64) -> f64, name: &str) {
        let xs = inputs();
        let mut got = vec![MaybeUninit::new(0f32); xs.len()];
        // Every path: the dispatched (vectorized) one and the plain loop.
        let mut plain = vec![MaybeUninit::new(0f32); xs.len()];
        map(&xs, &mut got, f);
        map_portable(&xs, &mut plain, f);
        for (i, &x) in xs.iter().enumerate() {
            // SAFETY: both were initialized above and fully written.
            let (g, p) = unsafe { (got[i].assume_init(), plain[i].assume_init()) };
            let w = want(f64::from(x));
            for v in [g, p] {
                let err = (f64::from(v) - w).abs();
                assert!(
                    err <= 1e-6 * w.abs() + 1e-37,
                    "{name}({x}) = {v}, want {w} (error {err})"
                );
            }
        }
        let nan = [f32::NAN];
        let mut out = [MaybeUninit::new(0f32)];
        map(&nan, &mut out, f);
        // SAFETY: written above.
        assert!(unsafe { out[0].assume_init() }.is_nan(), "{name}(NaN)");
    }

    #[test]
    fn tanh_matches_f64() {
        check(tanh, f64::tanh, "tanh");
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh(50.0), 1.0);
        assert_eq!(tanh(-50.0), -1.0);
    }

    #[test]
    fn gelu_tanh_matches_f64() {
        let want = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        };
        // `1 + tanh` rounds in f32 (as candle's): far left only an
        // absolute error of about |x| * 6e-8 holds.
        for x in (-120_000..=120_000).map(|i| i as f32 * 1e-4) {
            let g = f64::from(gelu_tanh(x));
            let w = want(f64::from(x));
            assert!(
                (g - w).abs() <= 2e-6 * w.abs() + 2e-7 * f64::from(x).abs(),
                "gelu({x}) = {g}, want {w}"
            );
        }
        assert_eq!(gelu_tanh(-30.0), 0.0);
        assert_eq!(gelu_tanh(30.0), 30.0);
    }

    #[test]
    fn sin_sq_matches_f64() {
        let xs = inputs();
        let mut got = vec![MaybeUninit::new(0f32); xs.len()];
        let mut plain = vec![MaybeUninit::new(0f32); xs.len()];
        map(&xs, &mut got, sin_sq);
        map_portable(&xs, &mut plain, sin_sq);
        for (i, &x) in xs.iter().enumerate() {
            if x.abs() > SIN_SQ_MAX {
                continue;
            }
            // SAFETY: both were fully written above.
            let (g, p) = unsafe { (got[i].assume_init(), plain[i].assume_init()) };
            assert_eq!(g.to_bits(), p.to_bits(), "sin_sq({x}): paths differ");
            let w = f64::from(x).sin().powi(2);
            let err = (f64::from(g) - w).abs();
            // The f32 input's rounding times the slope (|d sin^2| <= 1) is
            // not in the error: x is taken as exact.
            assert!(err <= 3e-7, "sin_sq({x}) = {g}, want {w} (error {err})");
        }
        assert!(sin_sq(f32::NAN).is_nan());
    }

    #[test]
    fn snake_row_matches_f64_and_takes_large_arguments() {
        let xs: Vec<f32> = (-4000..4000)
            .map(|i| i as f32 * 0.0137)
            .chain([1e5, -3e6, 0.0])
            .collect();
        for (freq, gain) in [(1.7f32, Some(0.4f32)), (0.3, None), (900.0, Some(2.0))] {
            let mut out = vec![MaybeUninit::new(0f32); xs.len()];
            snake_row(&xs, &mut out, freq, gain);
            for (i, &x) in xs.iter().enumerate() {
                // SAFETY: written above.
                let g = f64::from(unsafe { out[i].assume_init() });
                let (xf, f) = (f64::from(x), f64::from(freq));
                let s = (f64::from(freq * x)).sin().powi(2);
                let w = match gain {
                    Some(a) => xf + f64::from(a) * s,
                    None => xf + s / f,
                };
                let err = (g - w).abs();
                assert!(
                    err <= 1e-6 * w.abs().max(1.0) * gain.map_or(1.0 / f, f64::from).max(1.0),
                    "snake({x}, {freq}, {gain:?}) = {g}, want {w}"
                );
            }
        }
    }

    #[test]
    fn sigmoid_matches_f64() {
        check(sigmoid, |x| 1.0 / (1.0 + (-x).exp()), "sigmoid");
        assert_eq!(sigmoid(100.0), 1.0);
        assert_eq!(sigmoid(0.0), 0.5);
    }
}
