//! Activation rows quantized to int8 per block of 32, in the kernels'
//! layout ([`QuantRows`]).

use super::{Isa, WeightFormat};
use rayon::prelude::*;
/// Activation rows quantized to int8 per block of 32 for one weight format,
/// in the kernels' layout.
#[derive(Debug)]
pub(crate) struct QuantRows {
    /// Values per row (a multiple of 32).
    pub(super) k: usize,
    /// Rows.
    pub(super) m: usize,
    /// `m * k` codes. Within a row, blocks go in pairs `A, B` stored as
    /// `A[0..16] B[0..16] A[16..32] B[16..32]`; an odd last block is stored
    /// as it is.
    pub(super) codes: Vec<i8>,
    /// `m * 4 * ceil(k / 64)` floats (an odd last block is followed by two
    /// zeros): per block, the activation scale `d_x` and what the weight
    /// block's minimum `m_w` multiplies: for Q4_1 the exact f32 sum of the
    /// block's activations, zero for the other formats.
    pub(super) scales: Vec<f32>,
    /// The same per-block values of each whole group of four rows (rows
    /// `4g..4g + 4`, `m / 4` groups) side by side, for the kernels that
    /// run four activation rows in the lanes of one register: per pair
    /// of blocks `A, B` (or odd last block, then four zeros), `d_x` of
    /// the four rows for `A` then for `B` ([`QuantRows::group_scales`]),
    /// and likewise the Q4_1 sums ([`QuantRows::group_sums`]; empty for
    /// the other formats).
    pub(super) group_scales: Vec<f32>,
    /// See `group_scales`.
    pub(super) group_sums: Vec<f32>,
    /// Q4_0 and Q5_0 only (else empty): `m * 8 * ceil(k / 64)` i32, per pair
    /// (or odd last block) and accumulator lane, the format's offset (8, 16)
    /// times the sum of the codes that lane multiplies: subtracted from the
    /// lane's i32 sum it applies the offset exactly.
    pub(super) offsets: Vec<i32>,
}

impl QuantRows {
    /// Quantize the `m` rows of `x` (row-major) for weights in `fmt`;
    /// `isa` other than portable quantizes with AVX2 (the same codes:
    /// both round half to even). Without `lanes` the per-lane offsets and
    /// the group values (which only the x86 lane kernels read) are left
    /// empty.
    pub(super) fn new(fmt: WeightFormat, x: &[f32], m: usize, isa: Isa, lanes: bool) -> Self {
        let k = x.len() / m;
        let nb = k / 32;
        let mut codes = vec![0i8; m * k];
        let mut scales = vec![0f32; m * Self::scales_per_row(k)];
        let simd = isa != Isa::Portable;
        let quantize_row = |((xr, qr), sr): ((&[f32], &mut [i8]), &mut [f32])| {
            for (b, xs) in xr.chunks_exact(32).enumerate() {
                let (d, sum, q) = quantize_block(xs, simd);
                let (lo, hi) = (code_index(b, 0, nb), code_index(b, 16, nb));
                qr[lo..lo + 16].copy_from_slice(&q[..16]);
                qr[hi..hi + 16].copy_from_slice(&q[16..]);
                sr[2 * b] = d;
                if fmt == WeightFormat::Q4_1 {
                    sr[2 * b + 1] = sum;
                }
            }
        };
        if m >= 8 {
            x.par_chunks_exact(k)
                .zip(codes.par_chunks_exact_mut(k))
                .zip(scales.par_chunks_exact_mut(Self::scales_per_row(k)))
                .for_each(quantize_row);
        } else {
            x.chunks_exact(k)
                .zip(codes.chunks_exact_mut(k))
                .zip(scales.chunks_exact_mut(Self::scales_per_row(k)))
                .for_each(quantize_row);
        }
        // Lane l of a 32-code group sums bytes 4l..4l + 4 of both of its
        // 32-byte halves (a pair) or of its only half (an odd last block).
        let offsets = if let (Some(off), true) = (fmt.offset(), lanes) {
            codes
                .chunks_exact(k)
                .flat_map(|row| {
                    row.chunks(64).flat_map(|g| {
                        (0..8).map(move |l| {
                            let s: i32 = g
                                .chunks(32)
                                .flat_map(|h| &h[4 * l..4 * l + 4])
                                .map(|q| i32::from(*q))
                                .sum();
                            off * s
                        })
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        let per = Self::scales_per_row(k);
        let group = |slot: usize| -> Vec<f32> {
            let mut g = vec![0f32; m / 4 * 2 * per];
            for (gi, out) in g.chunks_exact_mut(2 * per).enumerate() {
                for b in 0..nb {
                    // Pair b / 2, half b % 2, lane (row) i.
                    for i in 0..4 {
                        out[8 * (b / 2) + 4 * (b % 2) + i] =
                            scales[(4 * gi + i) * per + 2 * b + slot];
                    }
                }
            }
            g
        };
        let group_scales = if lanes { group(0) } else { Vec::new() };
        let group_sums = if lanes && fmt == WeightFormat::Q4_1 {
            group(1)
        } else {
            Vec::new()
        };
        QuantRows {
            k,
            m,
            codes,
            scales,
            offsets,
            group_scales,
            group_sums,
        }
    }

    /// Group `g`'s (rows `4g..4g + 4`) activation scales: 8 floats per
    /// pair of blocks (see the field).
    pub(super) fn group_scales(&self, g: usize) -> &[f32] {
        let per = 2 * Self::scales_per_row(self.k);
        &self.group_scales[g * per..(g + 1) * per]
    }

    /// Group `g`'s Q4_1 block sums, laid out as [`QuantRows::group_scales`]
    /// (empty for the other formats).
    pub(super) fn group_sums(&self, g: usize) -> &[f32] {
        let per = 2 * Self::scales_per_row(self.k);
        self.group_sums.get(g * per..(g + 1) * per).unwrap_or(&[])
    }

    /// Codes of row `r`.
    pub(super) fn codes(&self, r: usize) -> &[i8] {
        &self.codes[r * self.k..(r + 1) * self.k]
    }

    /// Scales of row `r`.
    pub(super) fn scales(&self, r: usize) -> &[f32] {
        let per = Self::scales_per_row(self.k);
        &self.scales[r * per..(r + 1) * per]
    }

    /// Two per block, rounded up to a whole pair (the kernels load four).
    pub(super) fn scales_per_row(k: usize) -> usize {
        4 * k.div_ceil(64)
    }

    /// Q4_0 / Q5_0 offsets of row `r` (empty for other formats).
    pub(super) fn offsets(&self, r: usize) -> &[i32] {
        let per = 8 * self.k.div_ceil(64);
        self.offsets.get(r * per..(r + 1) * per).unwrap_or(&[])
    }
}

/// One block of 32 activations as int8: `(d, sum, codes)` with `d =
/// max|x| / 127`, codes `x / d` rounded half to even (0 when `d` is 0) and
/// the f32 sum of the block (summed in another order by the SIMD path).
pub(super) fn quantize_block(xs: &[f32], simd: bool) -> (f32, f32, [i8; 32]) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        let xs: &[f32; 32] = xs.try_into().expect("blocks of 32");
        // SAFETY: `simd` is set only when AVX2 and FMA were detected.
        return unsafe { quant_avx2::block(xs) };
    }
    let _ = simd;
    let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; 32];
    for (c, v) in q.iter_mut().zip(xs) {
        *c = (v * id).round_ties_even() as i8;
    }
    // The sum in the AVX2 quantizer's order (lanes of 8, then halves), so
    // Q4_1's minimum term has the same bits on every path.
    let s8: [f32; 8] = std::array::from_fn(|l| (xs[l] + xs[8 + l]) + (xs[16 + l] + xs[24 + l]));
    let s4: [f32; 4] = std::array::from_fn(|l| s8[l] + s8[4 + l]);
    let sum = (s4[0] + s4[2]) + (s4[1] + s4[3]);
    (d, sum, q)
}

#[cfg(target_arch = "x86_64")]
mod quant_avx2 {
    use std::arch::x86_64::*;

    /// [`super::quantize_block`] on AVX2: the same `d` and codes
    /// (`cvtps2dq` rounds half to even under the default MXCSR).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn block(xs: &[f32; 32]) -> (f32, f32, [i8; 32]) {
        let v: [__m256; 4] = std::array::from_fn(|i| {
            // SAFETY: four 8-lane loads inside the 32-value array (i < 4).
            unsafe { _mm256_loadu_ps(xs.as_ptr().add(8 * i)) }
        });
        let sign = _mm256_set1_ps(-0.0);
        let a = |i: usize| _mm256_andnot_ps(sign, v[i]);
        let m8 = _mm256_max_ps(_mm256_max_ps(a(0), a(1)), _mm256_max_ps(a(2), a(3)));
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)));
        // packs work per 128-bit lane: the bytes come out as 4-element
        // groups 0, 2, 4, 6 | 1, 3, 5, 7; one permute restores the order.
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let mut codes = [0i8; 32];
        // SAFETY: one 32-byte store into the 32-byte array.
        unsafe { _mm256_storeu_si256(codes.as_mut_ptr() as *mut __m256i, p) };
        let s8 = _mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3]));
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let sum = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)));
        (d, sum, codes)
    }
}

/// Where element `e` of block `b` (of `nb` in the row) sits in
/// [`QuantRows::codes`].
pub(super) fn code_index(b: usize, e: usize, nb: usize) -> usize {
    if b + 1 == nb && nb % 2 == 1 {
        return 32 * b + e;
    }
    let (pair, second) = (b / 2, b % 2);
    64 * pair + 32 * (e / 16) + 16 * second + e % 16
}
