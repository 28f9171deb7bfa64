//! `y = x W^T` for f16 weights `W` (row-major `[n, k]`) and a few f32
//! activation rows, accumulating in f32.
//!
//! ## Why
//! A decoder step is a chain of GEMVs whose cost is streaming the weights;
//! a checkpoint stored in fp16 (Whisper's CTranslate2 `model.bin`, for one)
//! cast to f32 at load streams twice the bytes it needs. Every f16 value is
//! exactly an f32 value, so converting each weight in registers gives the
//! very products of the f32 path; only the order of the f32 sums differs
//! (as it does between any two GEMV kernels).
//!
//! ## How
//! Per weight row: 16 (AVX-512F) or 8 (AVX2 + F16C) halves at a time are
//! converted with `vcvtph2ps` and FMA'd against the activations into four
//! independent accumulators, then summed; the rows go through the shared
//! streaming GEMV ([`crate::cpu::gemv::gemv_rows_with`]). Other machines run
//! portable code (same products, sums in another order).

use half::f16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Isa {
    Avx512,
    Avx2,
    Portable,
}

fn isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
        {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// `y[r, j] = sum_i w[j, i] * x[r, i]` for `m` activation rows `x`
/// (row-major `[m, k]`) and `n` f16 weight rows `w` (`[n, k]`); `y` is
/// row-major `[m, n]`. None when the lengths do not match.
pub(crate) fn matmul(w: &[f16], n: usize, x: &[f32], m: usize) -> Option<Vec<f32>> {
    matmul_with(w, n, x, m, isa())
}

fn matmul_with(w: &[f16], n: usize, x: &[f32], m: usize, isa: Isa) -> Option<Vec<f32>> {
    crate::cpu::gemv::gemv_rows_with(w, x, m, n, |row, xr| dot(row, xr, isa))
}

fn dot(row: &[f16], x: &[f32], isa: Isa) -> f32 {
    debug_assert_eq!(row.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: the features were detected at run time (`isa`); the
        // kernels read only within `row` and `x`, whose lengths match.
        Isa::Avx512 => return unsafe { x86::dot_avx512(row, x) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { x86::dot_avx2(row, x) },
        Isa::Portable => {}
    }
    let _ = isa;
    dot_portable(row, x)
}

fn dot_portable(row: &[f16], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut rc = row.chunks_exact(8);
    let mut xc = x.chunks_exact(8);
    for (r, xs) in (&mut rc).zip(&mut xc) {
        for l in 0..8 {
            acc[l] = r[l].to_f32().mul_add(xs[l], acc[l]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (r, xv) in rc.remainder().iter().zip(xc.remainder()) {
        s += r.to_f32() * xv;
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot_avx512(row: &[f16], x: &[f32]) -> f32 {
        let k = x.len().min(row.len());
        let w = row.as_ptr() as *const u16;
        let xp = x.as_ptr();
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: (all loads) i + 64 (or + 16) <= k, so every 16-lane load
        // of `row` (32 bytes) and `x` is in bounds; loadu has no alignment
        // requirement.
        unsafe {
            while i + 64 <= k {
                for (u, a) in acc.iter_mut().enumerate() {
                    let h = _mm256_loadu_si256(w.add(i + 16 * u) as *const __m256i);
                    *a = _mm512_fmadd_ps(
                        _mm512_cvtph_ps(h),
                        _mm512_loadu_ps(xp.add(i + 16 * u)),
                        *a,
                    );
                }
                i += 64;
            }
            while i + 16 <= k {
                let h = _mm256_loadu_si256(w.add(i) as *const __m256i);
                acc[0] = _mm512_fmadd_ps(_mm512_cvtph_ps(h), _mm512_loadu_ps(xp.add(i)), acc[0]);
                i += 16;
            }
        }
        let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        let mut t = _mm512_reduce_add_ps(s);
        for j in i..k {
            t += row[j].to_f32() * x[j];
        }
        t
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_avx2(row: &[f16], x: &[f32]) -> f32 {
        let k = x.len().min(row.len());
        let w = row.as_ptr() as *const u16;
        let xp = x.as_ptr();
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: (all loads) i + 32 (or + 8) <= k, so every 8-lane load of
        // `row` (16 bytes) and `x` is in bounds; loadu has no alignment
        // requirement.
        unsafe {
            while i + 32 <= k {
                for (u, a) in acc.iter_mut().enumerate() {
                    let h = _mm_loadu_si128(w.add(i + 8 * u) as *const __m128i);
                    *a =
                        _mm256_fmadd_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xp.add(i + 8 * u)), *a);
                }
                i += 32;
            }
            while i + 8 <= k {
                let h = _mm_loadu_si128(w.add(i) as *const __m128i);
                acc[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xp.add(i)), acc[0]);
                i += 8;
            }
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let hi = _mm256_extractf128_ps(s, 1);
        let q = _mm_add_ps(_mm256_castps256_ps128(s), hi);
        let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
        let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
        let mut t = _mm_cvtss_f32(q);
        for j in i..k {
            t += row[j].to_f32() * x[j];
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, k: usize, m: usize) -> (Vec<f16>, Vec<f32>) {
        let w = (0..n * k)
            .map(|i| f16::from_f32(((i * 7919 % 2003) as f32 / 1001.0 - 1.0) * 0.5))
            .collect();
        let x = (0..m * k)
            .map(|i| (i * 104_729 % 997) as f32 / 498.0 - 1.0)
            .collect();
        (w, x)
    }

    /// Every ISA this machine has against an f64 reference of the same f16
    /// weights: only the order of the f32 sums differs, so the error is a
    /// few f32 roundings of the partial sums (k <= 389 terms of |w x| <= 0.5).
    #[test]
    fn matches_f64_reference_on_every_isa() {
        let mut isas = vec![Isa::Portable];
        if isa() != Isa::Portable {
            isas.push(Isa::Avx2);
        }
        if isa() == Isa::Avx512 {
            isas.push(Isa::Avx512);
        }
        // k: a multiple of 64, one with a 16-lane tail, one with a scalar tail.
        for &(n, k, m) in &[(67, 384, 1), (130, 80, 3), (9, 389, 2)] {
            let (w, x) = data(n, k, m);
            for &i in &isas {
                let y = matmul_with(&w, n, &x, m, i).expect("shapes match");
                for r in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k)
                            .map(|p| w[j * k + p].to_f64() * x[r * k + p] as f64)
                            .sum();
                        let got = y[r * n + j] as f64;
                        assert!(
                            (got - want).abs() < 1e-4,
                            "{i:?} n={n} k={k} row {r} col {j}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn mismatched_lengths_are_refused() {
        let (w, x) = data(4, 16, 1);
        assert!(matmul(&w, 5, &x, 1).is_none());
        assert!(matmul(&w, 4, &x[..15], 1).is_none());
    }
}
