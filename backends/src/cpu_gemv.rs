//! Decode-shaped matrix-vector kernels for the CPU backend: `y = W x` with
//! one activation row, f32 activations and f32, Q8_0 or Q4_0 weights in
//! row-major `[n, k]` (GGML block layout for the quantized ones).
//!
//! ## Why
//! LLM decode is a chain of GEMVs whose cost is streaming the weights from
//! memory. candle's general GEMM path reaches about 40% of the measured
//! bandwidth for `1 x k @ k x n` on the build machine, and its quantized
//! path first quantizes the activations to 8 bits. These kernels stream
//! each weight row once, keep the activations in f32 (so they are also more
//! accurate than candle's Q8 activation path), and split the output rows
//! over rayon's pool (candle's own thread pool).
//!
//! AVX2 + FMA + F16C code is chosen at run time; other machines use portable code
//! written so the compiler vectorizes it (independent lanes).

use candle_core::quantized::GgmlDType;
use rayon::prelude::*;

/// Rows per rayon task: small enough to balance two to sixteen threads,
/// large enough that task overhead stays below a few percent.
fn rows_per_task(n: usize, k: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    // At least ~64 KB of weights per task.
    let min_rows = (16_384 / k.max(1)).max(1);
    (n / (threads * 8)).max(min_rows).max(1)
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Block formats these kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightFormat {
    /// Plain f32 rows.
    F32,
    /// GGML Q8_0: per 32 weights, an f16 scale and 32 i8.
    Q8_0,
    /// GGML Q4_0: per 32 weights, an f16 scale and 16 bytes of nibbles
    /// (low nibble: element j, high nibble: element j + 16), offset 8.
    Q4_0,
    /// GGML Q4_1: per 32 weights, an f16 scale `d`, an f16 minimum `m` and
    /// 16 bytes of nibbles as Q4_0; a weight is `d * q + m`.
    Q4_1,
}

impl WeightFormat {
    /// The format of a GGML dtype, when these kernels read it.
    pub(crate) fn of_ggml(d: GgmlDType) -> Option<Self> {
        match d {
            GgmlDType::Q8_0 => Some(WeightFormat::Q8_0),
            GgmlDType::Q4_0 => Some(WeightFormat::Q4_0),
            GgmlDType::Q4_1 => Some(WeightFormat::Q4_1),
            _ => None,
        }
    }

    /// Bytes of one row of `k` weights (`k` a multiple of 32 when quantized).
    fn row_bytes(self, k: usize) -> usize {
        match self {
            WeightFormat::F32 => 4 * k,
            WeightFormat::Q8_0 => k / 32 * 34,
            WeightFormat::Q4_0 => k / 32 * 18,
            WeightFormat::Q4_1 => k / 32 * 20,
        }
    }
}

/// `y[j] = sum_i w[j, i] * x[i]` for `n` rows of `k` weights stored in
/// `w` (bytes, in `fmt`). Returns None when the shapes do not fit the format.
pub(crate) fn gemv(fmt: WeightFormat, w: &[u8], x: &[f32], n: usize) -> Option<Vec<f32>> {
    let k = x.len();
    if fmt != WeightFormat::F32 && k % 32 != 0 {
        return None;
    }
    let rb = fmt.row_bytes(k);
    if w.len() != rb * n {
        return None;
    }
    let mut y = vec![0f32; n];
    let per = rows_per_task(n, k);
    let avx = has_avx2_fma();
    #[cfg(target_arch = "x86_64")]
    if avx && fmt != WeightFormat::F32 {
        let (qx, dx, sx) = quantize_x(x);
        y.par_chunks_mut(per).enumerate().for_each(|(t, out)| {
            let r0 = t * per;
            for (i, yo) in out.iter_mut().enumerate() {
                let row = &w[(r0 + i) * rb..(r0 + i + 1) * rb];
                // SAFETY: AVX2, FMA and F16C were detected at run time; `row`
                // holds k / 32 blocks and `qx`, `dx` cover k values.
                *yo = unsafe {
                    match fmt {
                        WeightFormat::Q8_0 => avx2::dot_q8_0_i8(row, &qx, &dx),
                        WeightFormat::Q4_1 => avx2::dot_q4_1_i8(row, &qx, &dx, &sx),
                        _ => avx2::dot_q4_0_i8(row, &qx, &dx),
                    }
                };
            }
        });
        return Some(y);
    }
    y.par_chunks_mut(per).enumerate().for_each(|(t, out)| {
        let r0 = t * per;
        for (i, yo) in out.iter_mut().enumerate() {
            let row = &w[(r0 + i) * rb..(r0 + i + 1) * rb];
            *yo = dot_row(fmt, row, x, avx);
        }
    });
    Some(y)
}

/// Activations quantized to 8 bits per block of 32 (scale max|x| / 127),
/// as llama.cpp and candle do for their quantized dot products: the integer
/// multiply-add then does 32 products in a few instructions. Returns the
/// codes, the scale of each block and the exact sum of each block (for the
/// `m` term of Q4_1).
pub(crate) fn quantize_x(x: &[f32]) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
    let mut q = vec![0i8; x.len()];
    let mut d = Vec::with_capacity(x.len() / 32);
    let sums = x.chunks_exact(32).map(|c| c.iter().sum()).collect();
    for (xs, qs) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let dd = amax / 127.0;
        let id = if dd > 0.0 { 1.0 / dd } else { 0.0 };
        for (o, v) in qs.iter_mut().zip(xs) {
            *o = (v * id).round() as i8;
        }
        d.push(dd);
    }
    (q, d, sums)
}

fn dot_row(fmt: WeightFormat, row: &[u8], x: &[f32], avx: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: AVX2, FMA and F16C were detected at run time; the kernels read
        // only within `row` and `x`, whose lengths match the format.
        return unsafe {
            match fmt {
                WeightFormat::F32 => avx2::dot_f32(row, x),
                WeightFormat::Q8_0 => avx2::dot_q8_0(row, x),
                WeightFormat::Q4_0 => avx2::dot_q4_0(row, x),
                WeightFormat::Q4_1 => portable::dot_q4_1(row, x),
            }
        };
    }
    let _ = avx;
    match fmt {
        WeightFormat::F32 => portable::dot_f32(row, x),
        WeightFormat::Q8_0 => portable::dot_q8_0(row, x),
        WeightFormat::Q4_0 => portable::dot_q4_0(row, x),
        WeightFormat::Q4_1 => portable::dot_q4_1(row, x),
    }
}

fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

mod portable {
    use super::f16_at;

    pub(super) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
        let mut acc = [0f32; 8];
        let mut rc = row.chunks_exact(32);
        let mut xc = x.chunks_exact(8);
        for (r, xs) in (&mut rc).zip(&mut xc) {
            for l in 0..8 {
                let w = f32::from_le_bytes([r[4 * l], r[4 * l + 1], r[4 * l + 2], r[4 * l + 3]]);
                acc[l] += w * xs[l];
            }
        }
        let mut s: f32 = acc.iter().sum();
        for (r, xv) in rc.remainder().chunks_exact(4).zip(xc.remainder()) {
            s += f32::from_le_bytes([r[0], r[1], r[2], r[3]]) * xv;
        }
        s
    }

    pub(super) fn dot_q8_0(row: &[u8], x: &[f32]) -> f32 {
        let mut s = 0f32;
        for (b, xs) in row.chunks_exact(34).zip(x.chunks_exact(32)) {
            let d = f16_at(b);
            let mut acc = [0f32; 8];
            for (i, q) in b[2..].iter().enumerate() {
                acc[i % 8] += (*q as i8) as f32 * xs[i];
            }
            s += d * acc.iter().sum::<f32>();
        }
        s
    }

    pub(super) fn dot_q4_1(row: &[u8], x: &[f32]) -> f32 {
        let mut s = 0f32;
        for (b, xs) in row.chunks_exact(20).zip(x.chunks_exact(32)) {
            let (d, m) = (f16_at(b), f16_at(&b[2..]));
            let mut acc = [0f32; 8];
            for (j, q) in b[4..].iter().enumerate() {
                acc[j % 8] +=
                    (d * (q & 0x0f) as f32 + m) * xs[j] + (d * (q >> 4) as f32 + m) * xs[j + 16];
            }
            s += acc.iter().sum::<f32>();
        }
        s
    }

    pub(super) fn dot_q4_0(row: &[u8], x: &[f32]) -> f32 {
        let mut s = 0f32;
        for (b, xs) in row.chunks_exact(18).zip(x.chunks_exact(32)) {
            let d = f16_at(b);
            let mut acc = [0f32; 8];
            for (j, q) in b[2..].iter().enumerate() {
                acc[j % 8] += ((q & 0x0f) as i32 - 8) as f32 * xs[j]
                    + ((q >> 4) as i32 - 8) as f32 * xs[j + 16];
            }
            s += d * acc.iter().sum::<f32>();
        }
        s
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// The block's f16 scale (first two bytes), broadcast, converted by F16C
    /// (a software f16 conversion per block would cost more than the block).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn scale(b: &[u8]) -> __m256 {
        let bits = i32::from(u16::from_le_bytes([b[0], b[1]]));
        let h = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
        _mm256_broadcastss_ps(h)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available; `row` holds `4 * x.len()` bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
        let k = x.len();
        let w = row.as_ptr() as *const f32;
        let xp = x.as_ptr();
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let mut a2 = _mm256_setzero_ps();
        let mut a3 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY (all loads): i + 32 <= k, so every 8-lane load is in bounds;
        // loadu has no alignment requirement.
        unsafe {
            while i + 32 <= k {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i)), _mm256_loadu_ps(xp.add(i)), a0);
                a1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(w.add(i + 8)),
                    _mm256_loadu_ps(xp.add(i + 8)),
                    a1,
                );
                a2 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(w.add(i + 16)),
                    _mm256_loadu_ps(xp.add(i + 16)),
                    a2,
                );
                a3 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(w.add(i + 24)),
                    _mm256_loadu_ps(xp.add(i + 24)),
                    a3,
                );
                i += 32;
            }
            while i + 8 <= k {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i)), _mm256_loadu_ps(xp.add(i)), a0);
                i += 8;
            }
            let mut s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            while i < k {
                s += w.add(i).read_unaligned() * *xp.add(i);
                i += 1;
            }
            s
        }
    }

    /// Sum over 32 lanes of `w[i] * x[i]` (signed bytes), as 8 i32 partial sums.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn mul_sum_i8(w: __m256i, x: __m256i) -> __m256i {
        // maddubs needs an unsigned operand: |w| and x carrying w's sign.
        let aw = _mm256_sign_epi8(w, w);
        let sx = _mm256_sign_epi8(x, w);
        let pairs = _mm256_maddubs_epi16(aw, sx);
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available; `row` holds `qx.len() / 32`
    /// Q8_0 blocks and `dx` one scale per 32 activations.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q8_0_i8(row: &[u8], qx: &[i8], dx: &[f32]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for ((b, xs), &d) in row.chunks_exact(34).zip(qx.chunks_exact(32)).zip(dx) {
            // SAFETY: 32 quants follow the scale; each x chunk has 32 bytes.
            let (w, x) = unsafe {
                (
                    _mm256_loadu_si256(b.as_ptr().add(2) as *const __m256i),
                    _mm256_loadu_si256(xs.as_ptr() as *const __m256i),
                )
            };
            let s = _mm256_cvtepi32_ps(mul_sum_i8(w, x));
            acc = _mm256_fmadd_ps(_mm256_mul_ps(scale(b), _mm256_set1_ps(d)), s, acc);
        }
        hsum(acc)
    }

    /// # Safety
    /// As [`dot_q8_0_i8`], with Q4_1 blocks and `sx` the exact sum of each
    /// block of activations.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_1_i8(row: &[u8], qx: &[i8], dx: &[f32], sx: &[f32]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut mins = 0f32;
        let m4 = _mm_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        for (((b, xs), &d), &sum) in row
            .chunks_exact(20)
            .zip(qx.chunks_exact(32))
            .zip(dx)
            .zip(sx)
        {
            // SAFETY: 16 bytes of nibbles follow the two f16; each x chunk has 32 bytes.
            let (raw, x) = unsafe {
                (
                    _mm_loadu_si128(b.as_ptr().add(4) as *const __m128i),
                    _mm256_loadu_si256(xs.as_ptr() as *const __m256i),
                )
            };
            let lo = _mm_and_si128(raw, m4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), m4);
            // Nibbles are unsigned: maddubs takes them as they are.
            let pairs = _mm256_maddubs_epi16(_mm256_set_m128i(hi, lo), x);
            let s = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            acc = _mm256_fmadd_ps(_mm256_mul_ps(scale(b), _mm256_set1_ps(d)), s, acc);
            mins += _mm256_cvtss_f32(scale(&b[2..])) * sum;
        }
        hsum(acc) + mins
    }

    /// # Safety
    /// As [`dot_q8_0_i8`], with Q4_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_0_i8(row: &[u8], qx: &[i8], dx: &[f32]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let m4 = _mm_set1_epi8(0x0f);
        let eight = _mm256_set1_epi8(8);
        for ((b, xs), &d) in row.chunks_exact(18).zip(qx.chunks_exact(32)).zip(dx) {
            // SAFETY: 16 bytes of nibbles follow the scale; each x chunk has 32 bytes.
            let (raw, x) = unsafe {
                (
                    _mm_loadu_si128(b.as_ptr().add(2) as *const __m128i),
                    _mm256_loadu_si256(xs.as_ptr() as *const __m256i),
                )
            };
            let lo = _mm_and_si128(raw, m4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), m4);
            let w = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), eight);
            let s = _mm256_cvtepi32_ps(mul_sum_i8(w, x));
            acc = _mm256_fmadd_ps(_mm256_mul_ps(scale(b), _mm256_set1_ps(d)), s, acc);
        }
        hsum(acc)
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available; `row` holds `x.len() / 32` Q8_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q8_0(row: &[u8], x: &[f32]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (b, xs) in row.chunks_exact(34).zip(x.chunks_exact(32)) {
            let d = scale(b);
            let xp = xs.as_ptr();
            // SAFETY: each block has 32 quants after the scale and each x chunk 32 floats.
            unsafe {
                let q = b.as_ptr().add(2);
                let mut s = _mm256_setzero_ps();
                for g in 0..4 {
                    let q8 = _mm_loadl_epi64(q.add(8 * g) as *const __m128i);
                    let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
                    s = _mm256_fmadd_ps(f, _mm256_loadu_ps(xp.add(8 * g)), s);
                }
                acc = _mm256_fmadd_ps(d, s, acc);
            }
        }
        hsum(acc)
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available; `row` holds `x.len() / 32` Q4_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_0(row: &[u8], x: &[f32]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mask = _mm_set1_epi8(0x0f);
        let eight = _mm_set1_epi8(8);
        for (b, xs) in row.chunks_exact(18).zip(x.chunks_exact(32)) {
            let d = scale(b);
            let xp = xs.as_ptr();
            // SAFETY: each block has 16 bytes of nibbles after the scale and
            // each x chunk 32 floats.
            unsafe {
                let raw = _mm_loadu_si128(b.as_ptr().add(2) as *const __m128i);
                let lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);
                let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(raw), mask), eight);
                let mut s = _mm256_setzero_ps();
                let f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
                s = _mm256_fmadd_ps(f0, _mm256_loadu_ps(xp), s);
                let f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(lo)));
                s = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xp.add(8)), s);
                let f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
                s = _mm256_fmadd_ps(f2, _mm256_loadu_ps(xp.add(16)), s);
                let f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(hi)));
                s = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xp.add(24)), s);
                acc = _mm256_fmadd_ps(d, s, acc);
            }
        }
        hsum(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn avx_and_portable_agree_on_odd_sizes() {
        for &(n, k) in &[(1usize, 1usize), (7, 33), (33, 129), (5, 96)] {
            let w = lcg(n * k, 1);
            let x = lcg(k, 2);
            let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
            let y = gemv(WeightFormat::F32, &wb, &x, n).expect("shapes fit");
            for (j, yj) in y.iter().enumerate() {
                let want: f64 = (0..k).map(|i| w[j * k + i] as f64 * x[i] as f64).sum();
                assert!((*yj as f64 - want).abs() < 1e-4, "n{n} k{k} row {j}");
                let p = portable::dot_f32(&wb[j * 4 * k..(j + 1) * 4 * k], &x);
                assert!((p - yj).abs() < 1e-4);
            }
        }
    }

    /// Rows of random blocks with sane f16 scale (0.0625) and min (-0.5).
    fn blocks(fmt: WeightFormat, n: usize, k: usize, seed: u32) -> Vec<u8> {
        let bs = fmt.row_bytes(32);
        lcg(n * fmt.row_bytes(k), seed)
            .iter()
            .enumerate()
            .map(|(i, v)| match (i % bs, fmt) {
                (0, _) => 0x00,
                (1, _) => 0x2c,
                (2, WeightFormat::Q4_1) => 0x00,
                (3, WeightFormat::Q4_1) => 0xb8,
                _ => ((v + 1.0) * 127.0) as u8,
            })
            .collect()
    }

    /// (scale, min, 32 integer codes) of each block of a row.
    fn decode(fmt: WeightFormat, row: &[u8]) -> Vec<(f64, f64, Vec<i64>)> {
        row.chunks_exact(fmt.row_bytes(32))
            .map(|b| {
                let (m, q0) = match fmt {
                    WeightFormat::Q4_1 => (f16_at(&b[2..]) as f64, 4),
                    _ => (0.0, 2),
                };
                let codes = (0..32)
                    .map(|e| match fmt {
                        WeightFormat::Q8_0 => b[q0 + e] as i8 as i64,
                        _ => {
                            let byte = b[q0 + e % 16];
                            let nib = (if e < 16 { byte & 15 } else { byte >> 4 }) as i64;
                            if fmt == WeightFormat::Q4_0 {
                                nib - 8
                            } else {
                                nib
                            }
                        }
                    })
                    .collect();
                (f16_at(b) as f64, m, codes)
            })
            .collect()
    }

    const QFORMATS: [WeightFormat; 3] =
        [WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Q4_1];

    fn portable_dot(fmt: WeightFormat, row: &[u8], x: &[f32]) -> f32 {
        match fmt {
            WeightFormat::Q8_0 => portable::dot_q8_0(row, x),
            WeightFormat::Q4_0 => portable::dot_q4_0(row, x),
            WeightFormat::Q4_1 => portable::dot_q4_1(row, x),
            WeightFormat::F32 => portable::dot_f32(row, x),
        }
    }

    #[test]
    fn int8_activation_path_matches_its_scalar_reference() {
        let (n, k) = (5, 160);
        let x = lcg(k, 7);
        let (qx, dx, sx) = quantize_x(&x);
        for (i, (qv, xv)) in qx.iter().zip(&x).enumerate() {
            assert!((*qv as f32 * dx[i / 32] - xv).abs() <= dx[i / 32] * 0.5 + 1e-7);
        }
        for fmt in QFORMATS {
            let w = blocks(fmt, n, k, 9);
            let y = gemv(fmt, &w, &x, n).expect("shapes fit");
            let rb = fmt.row_bytes(k);
            for (j, yj) in y.iter().enumerate() {
                let row = &w[j * rb..(j + 1) * rb];
                // Scalar: integer products of the codes and the quantized x.
                let mut want = 0f64;
                for (bi, (d, m, codes)) in decode(fmt, row).into_iter().enumerate() {
                    let s: i64 = (0..32).map(|e| codes[e] * qx[bi * 32 + e] as i64).sum();
                    want += d * dx[bi] as f64 * s as f64 + m * sx[bi] as f64;
                }
                let exact = portable_dot(fmt, row, &x) as f64;
                // Either the AVX2 int8 path (matches `want`) or the portable
                // f32 path (matches `exact`) ran.
                let e = (*yj as f64 - want).abs().min((*yj as f64 - exact).abs());
                assert!(
                    e < 1e-3 * (1.0 + want.abs()),
                    "{fmt:?} row {j}: {yj} vs {want}"
                );
            }
        }
    }

    #[test]
    fn portable_quantized_rows_match_dequantized_reference() {
        let (n, k) = (9, 96);
        let x = lcg(k, 3);
        for fmt in QFORMATS {
            let w = blocks(fmt, n, k, 4);
            let rb = fmt.row_bytes(k);
            for j in 0..n {
                let row = &w[j * rb..(j + 1) * rb];
                let p = portable_dot(fmt, row, &x);
                let mut want = 0f64;
                for (bi, (d, m, codes)) in decode(fmt, row).into_iter().enumerate() {
                    for e in 0..32 {
                        want += (d * codes[e] as f64 + m) * x[bi * 32 + e] as f64;
                    }
                }
                assert!(
                    (p as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{fmt:?} row {j}: {p} vs {want}"
                );
            }
        }
    }
}
