//! The per-block integer parts of K-quant decode on 512-bit registers
//! (AVX-512 F / BW / VL / VNNI), for [`super::decode`]'s eight-row passes:
//! each block of a row is 64 codes per instruction. Each 64 codes'
//! products are summed into i32 (`vpdpbusd`), two loads' sums packed to
//! i16 (at most 4 · 63 · 127 each: they fit) and scaled and added with one
//! `vpdpwssd` per 128 codes, the scales spread over the lanes by one
//! `vpermw`: 10 instructions a block where `maddubs`, `vpermw` and
//! `vpdpwssd` per 64 codes took 12 (decode 8-9 % faster on one Zen 4
//! thread, Q4_K and Q6_K).

use std::arch::x86_64::*;

use super::decode::{finish_q45k, finish_q6k, q4k_scales, sweep, Decode};

/// # Safety
/// `p..p + 64` readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load64<T>(p: *const T) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe { _mm512_loadu_si512(p as *const __m512i) }
}

/// Sixteen i16 lanes of `a` then sixteen of `b`.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves16(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(a)),
        _mm256_set1_epi16(b),
    )
}

/// Q4_K's and Q5_K's constants: the nibble mask, the `vpermw` indices
/// that spread sub-block scales over the lanes of two 64-code loads'
/// packed sums, and for Q5_K the mask and shifts that move each load's
/// fifth bits (one `qh` bit per sub-block) to bit 4.
struct Q4k {
    m4: __m512i,
    idx: [__m512i; 2],
    hmask: [__m512i; 4],
    hshift: [__m512i; 4],
}

impl Q4k {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new() -> Self {
        Q4k {
            m4: _mm512_set1_epi8(0x0F),
            // Loads t = 2h, 2h + 1 hold sub-blocks (4h, 4h + 2) and
            // (4h + 1, 4h + 3) in their 256-bit halves; packed, 128-bit
            // lane k holds four sums of load 2h then four of load 2h + 1,
            // of the low half's sub-blocks for k < 2.
            idx: [0i16, 4].map(|base| {
                let l: [i16; 32] = std::array::from_fn(|l| {
                    let (k, within) = (l / 8, l % 8);
                    base + (within >= 4) as i16 + if k >= 2 { 2 } else { 0 }
                });
                // SAFETY: 64 bytes.
                unsafe { _mm512_loadu_si512(l.as_ptr() as *const __m512i) }
            }),
            // Load t holds sub-blocks (0, 2), (1, 3), (4, 6), (5, 7): their
            // fifth bits are qh bits 0 / 2, 1 / 3, 4 / 6, 5 / 7.
            hmask: [(0, 2), (1, 3), (4, 6), (5, 7)].map(|(a, b)| {
                _mm512_inserti64x4::<1>(
                    _mm512_set1_epi8(1 << a),
                    _mm256_set1_epi8((1u8 << b) as i8),
                )
            }),
            // Shifted left by 4 - bit (right where negative: by bit - 4).
            hshift: [(4, 2), (3, 1), (0, 2), (1, 3)].map(|(a, b)| halves16(a, b)),
        }
    }

    /// One block at `blk` (Q5_K where `FIVE`) against the activation
    /// codes at `xp` (permuted as [`Decode::codes`]) and the minima operand
    /// `pv`: eight i32 partials of `Σ sc·(q·x)` and of `Σ m·bsum` (exact).
    ///
    /// # Safety
    /// The features of [`q45k_rows8`]; a whole block at `blk`, 256 codes
    /// at `xp`.
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn block<const FIVE: bool>(
        &self,
        blk: *const u8,
        xp: *const i8,
        pv: __m256i,
    ) -> (__m256i, __m256i) {
        // SAFETY: the caller's contract.
        unsafe {
            let z = q4k_scales(blk);
            let zz = _mm512_castsi256_si512(z);
            let qs = if FIVE { blk.add(48) } else { blk.add(16) };
            let (q0, q1) = (load64(qs), load64(qs.add(64)));
            let mut codes = [
                _mm512_and_si512(q0, self.m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(q0), self.m4),
                _mm512_and_si512(q1, self.m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(q1), self.m4),
            ];
            if FIVE {
                let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(16) as *const __m256i));
                for (t, c) in codes.iter_mut().enumerate() {
                    let h = _mm512_and_si512(qh, self.hmask[t]);
                    let h = if t < 2 {
                        _mm512_sllv_epi16(h, self.hshift[t])
                    } else {
                        _mm512_srlv_epi16(h, self.hshift[t])
                    };
                    *c = _mm512_or_si512(*c, h);
                }
            }
            let z0 = _mm512_setzero_si512();
            let r: [__m512i; 4] =
                std::array::from_fn(|t| _mm512_dpbusd_epi32(z0, codes[t], load64(xp.add(64 * t))));
            let p01 = _mm512_packs_epi32(r[0], r[1]);
            let p23 = _mm512_packs_epi32(r[2], r[3]);
            let s = _mm512_dpwssd_epi32(
                _mm512_madd_epi16(p01, _mm512_permutexvar_epi16(self.idx[0], zz)),
                p23,
                _mm512_permutexvar_epi16(self.idx[1], zz),
            );
            (fold(s), _mm256_madd_epi16(z, pv))
        }
    }
}

/// The two 256-bit halves of `s` added (exact).
#[inline]
#[target_feature(enable = "avx512f")]
fn fold(s: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s))
}

/// Eight Q4_K rows (Q5_K where `FIVE`; `rb` bytes apart from `w`)
/// against `a`, read in memory order (row by row: one stream the hardware
/// prefetchers follow), each block's eight-lane partials kept in
/// `scratch` until the eight rows' are reduced together.
///
/// # Safety
/// AVX2, F16C, AVX-512 F / BW / VL / VNNI; eight whole rows of the
/// length `a` was made for at `w`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q45k_rows8<const FIVE: bool>(
    w: *const u8,
    rb: usize,
    a: &Decode,
    scratch: &mut super::decode::Scratch,
) -> [f32; 8] {
    let bb = if FIVE { 176 } else { 144 };
    let k = Q4k::new();
    // SAFETY: eight whole rows at `w` (the caller's contract); block b of
    // the activation row has 256 codes and 16 aux values.
    unsafe {
        sweep(w, rb, (bb, 0), a.scales.len(), scratch, |blk, b| {
            let (s, m) = k.block::<FIVE>(
                blk,
                a.codes.as_ptr().add(256 * b),
                _mm256_loadu_si256(a.aux.as_ptr().add(16 * b) as *const __m256i),
            );
            super::decode::join_sm(s, m)
        })
    };
    // SAFETY: the caller's contract; every block's partials are in
    // `scratch`.
    unsafe { finish_q45k(a, scratch) }
}

/// Q6_K's constants: masks and shifts that put the high bits of each 64
/// codes at bits 4..6, and the `vpermw` indices of the group scales.
struct Q6k {
    m0f: __m512i,
    m0c: __m512i,
    m30: __m512i,
    shl: __m512i,
    shr: __m512i,
    idx: [__m512i; 2],
}

impl Q6k {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new() -> Self {
        Q6k {
            m0f: _mm512_set1_epi8(0x0F),
            // Codes 0..64 of a half take their high bits from qh bits
            // 0..2 (then 2..4), shifted to bits 4..6; codes 64..128 from
            // bits 4..6 (6..8).
            m0c: _mm512_inserti64x4::<1>(_mm512_set1_epi8(0x03), _mm256_set1_epi8(0x0C)),
            m30: _mm512_inserti64x4::<1>(_mm512_set1_epi8(0x30), _mm256_set1_epi8(0xC0u8 as i8)),
            shl: halves16(4, 2),
            shr: halves16(0, 2),
            // Half h's packed sums: 128-bit lane k holds four of group
            // 8h + k (codes 0..64 of the half), then four of 8h + 4 + k.
            idx: std::array::from_fn(|h| {
                let l: [i16; 32] =
                    std::array::from_fn(|i| 8 * h as i16 + 4 * (i % 8 >= 4) as i16 + i as i16 / 8);
                // SAFETY: 64 bytes.
                unsafe { _mm512_loadu_si512(l.as_ptr() as *const __m512i) }
            }),
        }
    }

    /// One block at `blk` against the activation codes at `xp` and the
    /// offset operand `off` ([`Decode::aux`]): eight i32 partials of
    /// `Σ sc·(q·x) - 32 Σ sc·bsum` (exact).
    ///
    /// # Safety
    /// As [`Q4k::block`].
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn block(&self, blk: *const u8, xp: *const i8, off: __m256i) -> __m256i {
        // SAFETY: the caller's contract.
        unsafe {
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i));
            let ss = _mm512_castsi256_si512(sc);
            // -32 Σ sc·bsum: twice the scales against -16 bsum.
            let mut acc = _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_add_epi16(sc, sc), off));
            for h in 0..2 {
                let l = load64(blk.add(64 * h));
                let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    blk.add(128 + 32 * h) as *const __m256i
                ));
                let hi_lo = _mm512_sllv_epi16(_mm512_and_si512(qh, self.m0c), self.shl);
                let hi_hi = _mm512_srlv_epi16(_mm512_and_si512(qh, self.m30), self.shr);
                let codes = [
                    _mm512_or_si512(_mm512_and_si512(l, self.m0f), hi_lo),
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(l), self.m0f), hi_hi),
                ];
                // As Q4_K's: each 64 codes' products to i32 (at most
                // 4 · 63 · 127: they fit i16), the two packed, scaled and
                // added by one `vpdpwssd`.
                let z0 = _mm512_setzero_si512();
                let r: [__m512i; 2] = std::array::from_fn(|t| {
                    _mm512_dpbusd_epi32(z0, codes[t], load64(xp.add(128 * h + 64 * t)))
                });
                acc = _mm512_dpwssd_epi32(
                    acc,
                    _mm512_packs_epi32(r[0], r[1]),
                    _mm512_permutexvar_epi16(self.idx[h], ss),
                );
            }
            fold(acc)
        }
    }
}

/// Eight Q6_K rows (`rb` bytes apart from `w`) against `a`, read as
/// [`q45k_rows8`] reads them.
///
/// # Safety
/// As [`q45k_rows8`].
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q6k_rows8(
    w: *const u8,
    rb: usize,
    a: &Decode,
    scratch: &mut super::decode::Scratch,
) -> [f32; 8] {
    let k = Q6k::new();
    // SAFETY: as in q45k_rows8.
    unsafe {
        sweep(w, rb, (210, 206), a.scales.len(), scratch, |blk, b| {
            k.block(
                blk,
                a.codes.as_ptr().add(256 * b),
                _mm256_loadu_si256(a.aux.as_ptr().add(16 * b) as *const __m256i),
            )
        })
    };
    // SAFETY: the caller's contract; every block's sums are in
    // `scratch`.
    unsafe { finish_q6k(a, scratch) }
}
