//! Decode (one activation row) of Q4_K, Q5_K and Q6_K on 512-bit registers
//! (AVX-512 F / BW / VL / VNNI): eight weight rows at a time.
//!
//! The AVX2 row kernel spent most of its time outside the products: a
//! scalar unpacking of each block's scales, two broadcasts per 32 codes
//! and a horizontal sum per block and row. Here each block of a row is
//! 64 codes per instruction; its 6-bit scales are unpacked with byte
//! shuffles and spread over the lanes by one `vpermw` per 64 codes; the
//! scaled pair sums go straight into the accumulator (`vpdpwssd`). The
//! eight rows are read in memory order, one stream (blocks across rows
//! were eight short streams, which prefetching caught up with only
//! partly), each block's partial sums kept aside; then the eight rows'
//! block sums are reduced together, so the f32 steps of the module docs
//! run with one lane per weight row. The integers are
//! the exact block sums of the other paths, and the f32 steps the same
//! operations in the same order: the same bits.

use std::arch::x86_64::*;

use super::{Acts, KFormat};

/// How far ahead (bytes) each row block prefetches the rows into L2.
/// Streaming 1 GB of weight copies on two threads (Xeon, AVX-512), the
/// rows read in memory order: none 15-17 GB/s, 512 / 1024 bytes ahead
/// into L1 17-20, 2048 into L2 19-23 (Q4_K and Q6_K, rows of 1536 and
/// 8960).
const PF: usize = 2048;

/// Weight rows per pass.
pub(super) const ROWS: usize = 8;

/// One activation row laid out for these kernels.
pub(super) struct Decode {
    fmt: KFormat,
    /// Codes of each block of 256: Q4_K's and Q5_K's in the order of their 64-code
    /// loads (sub-blocks 0 and 2, 1 and 3, 4 and 6, 5 and 7: a low-nibble
    /// load holds sub-blocks `2j`, `2j + 2`), Q6_K's as they are.
    codes: Vec<i8>,
    /// 16 values per block. Q4_K / Q5_K: zeros, then the eight sub-blocks' code
    /// sums (the minima's `madd` operand against `[scales, minima]`).
    /// Q6_K: `-16 ×` the sixteen groups' code sums (against twice the
    /// group scales: the offset of 32, folded into the block sum).
    aux: Vec<i16>,
    /// The activation scale of each block.
    scales: Vec<f32>,
}

impl Decode {
    /// Row 0 of `xq` for `fmt`.
    pub(super) fn new(fmt: KFormat, xq: &Acts) -> Self {
        let (x, sums) = (xq.codes(0), xq.sums(0));
        let nb = x.len() / 256;
        let mut aux = vec![0i16; 16 * nb];
        let codes = match fmt {
            KFormat::Q4K | KFormat::Q5K => {
                let mut codes = vec![0i8; x.len()];
                for (b, (xb, cb)) in x
                    .chunks_exact(256)
                    .zip(codes.chunks_exact_mut(256))
                    .enumerate()
                {
                    for (t, sb) in [0, 2, 1, 3, 4, 6, 5, 7].into_iter().enumerate() {
                        cb[32 * t..32 * t + 32].copy_from_slice(&xb[32 * sb..32 * sb + 32]);
                    }
                    for j in 0..8 {
                        // At most 32 codes of ±127: fits an i16.
                        aux[16 * b + 8 + j] =
                            (sums[16 * b + 2 * j] + sums[16 * b + 2 * j + 1]) as i16;
                    }
                }
                codes
            }
            KFormat::Q6K => {
                for (a, &s) in aux.iter_mut().zip(sums) {
                    // 16 codes of ±127: |16 s| <= 32512.
                    *a = (-16 * s) as i16;
                }
                x.to_vec()
            }
        };
        Decode {
            fmt,
            codes,
            aux,
            scales: xq.scales(0).to_vec(),
        }
    }

    /// `y[i] = row i of w · x` for the first `ROWS ×` whole passes of
    /// `y.len()` rows of `rb` bytes (`w` holds them); the number of rows
    /// done.
    ///
    /// # Safety
    /// AVX2, F16C and AVX-512 F / BW / VL / VNNI available
    /// ([`super::has_vnni`]); `rb` is the row size of the activation row
    /// `self` was made from, in `self.fmt`.
    pub(super) unsafe fn rows(&self, w: &[u8], rb: usize, y: &mut [f32]) -> usize {
        let whole = y.len() / ROWS * ROWS;
        assert!(w.len() >= whole * rb && rb == self.scales.len() * self.fmt.block_bytes());
        let mut scratch = Vec::new();
        for (g, yo) in y[..whole].chunks_exact_mut(ROWS).enumerate() {
            // SAFETY: rows 8g..8g + 8 lie in `w` (asserted), each of the
            // blocks `self` has codes, sums and scales for; the caller
            // promises the features.
            let v = unsafe {
                let p = w.as_ptr().add(g * ROWS * rb);
                match self.fmt {
                    KFormat::Q4K => q45k_rows8::<false>(p, rb, self, &mut scratch),
                    KFormat::Q5K => q45k_rows8::<true>(p, rb, self, &mut scratch),
                    _ => q6k_rows8(p, rb, self, &mut scratch),
                }
            };
            yo.copy_from_slice(&v);
        }
        whole
    }
}

/// # Safety
/// `p..p + 64` readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load64<T>(p: *const T) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe { _mm512_loadu_si512(p as *const __m512i) }
}

/// Fetches the `bb` bytes at `p` into L2.
#[inline(always)]
fn prefetch(p: *const u8, bb: usize) {
    let mut off = 0;
    while off < bb {
        // SAFETY: a prefetch never faults; the address is only computed.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off) as *const i8) };
        off += 64;
    }
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

/// Lane `r` of the result: the sum of the eight i32 lanes of row `r`,
/// where `c[i]` holds row `2i` in lanes 0..8 and row `2i + 1` in 8..16.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce_pairs(c: [__m512i; 4]) -> __m256i {
    // Quarters: rows 0..4 (resp. 4..8), four lanes each.
    let e0 = _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b10_00_10_00>(c[0], c[1]),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(c[0], c[1]),
    );
    let e1 = _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b10_00_10_00>(c[2], c[3]),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(c[2], c[3]),
    );
    // Quarter q: [row q: two partials, row q + 4: two partials].
    let f = _mm512_add_epi32(_mm512_unpacklo_epi64(e0, e1), _mm512_unpackhi_epi64(e0, e1));
    // Lane 4q: row q, lane 4q + 2: row q + 4.
    let g = _mm512_add_epi32(f, _mm512_shuffle_epi32::<0b10_11_00_01>(f));
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, g))
}

/// Q4_K's eight scales and eight minima of the block at `blk`, as i16
/// lanes `[sc0..8, m0..8]` ([`super::scales_mins_k4`]'s values, from
/// byte shuffles).
///
/// # Safety
/// `blk..blk + 20` readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q4k_scales(blk: *const u8) -> __m256i {
    // SAFETY: bytes 4..20 of the block (the caller's contract).
    let v = unsafe { _mm_loadu_si128(blk.add(4) as *const __m128i) };
    // [s0..4, s8..12, s4..8, s8..12]: the low parts.
    let a = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
    );
    let a = _mm_blend_epi32::<0b1000>(a, _mm_srli_epi16::<4>(a));
    let low = _mm_and_si128(
        a,
        _mm_setr_epi8(
            63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15,
        ),
    );
    // Scales 4..8 take bits 6..8 of s0..4 as their bits 4..6, minima
    // 4..8 those of s4..8.
    let b = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7),
    );
    let high = _mm_and_si128(_mm_srli_epi16::<2>(b), _mm_set1_epi8(0x30));
    _mm256_cvtepu8_epi16(_mm_or_si128(low, high))
}

/// The f16 pair at byte `off` of each of eight blocks `rb` bytes apart
/// from `p`, as one i32 lane per block (first f16 in the low half).
///
/// # Safety
/// `p + r·rb + off .. + 4` readable for r in 0..8.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn f16_pairs(p: *const u8, rb: usize, off: usize) -> __m256i {
    let rb = rb as i32;
    let idx = _mm256_setr_epi32(0, rb, 2 * rb, 3 * rb, 4 * rb, 5 * rb, 6 * rb, 7 * rb);
    // SAFETY: the caller's contract.
    unsafe { _mm256_i32gather_epi32::<1>(p.add(off) as *const i32, idx) }
}

/// The low (`HIGH` false) or high f16 of each lane, as f32 (exact).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl")]
fn f16_lanes<const HIGH: bool>(v: __m256i) -> __m256 {
    let v = if HIGH { _mm256_srli_epi32::<16>(v) } else { v };
    _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v))
}

/// Q4_K's and Q5_K's constants: the nibble mask, the `vpermw` indices
/// that spread sub-block scales over the lanes of each 64-code load, and
/// for Q5_K the mask and shifts that move each load's fifth bits (one
/// `qh` bit per sub-block) to bit 4.
struct Q4k {
    m4: __m512i,
    idx: [__m512i; 4],
    hmask: [__m512i; 4],
    hshift: [__m512i; 4],
}

impl Q4k {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new() -> Self {
        Q4k {
            m4: _mm512_set1_epi8(0x0F),
            idx: [
                halves16(0, 2),
                halves16(1, 3),
                halves16(4, 6),
                halves16(5, 7),
            ],
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
            let mut s = _mm512_setzero_si512();
            for (t, c) in codes.into_iter().enumerate() {
                s = _mm512_dpwssd_epi32(
                    s,
                    _mm512_maddubs_epi16(c, load64(xp.add(64 * t))),
                    _mm512_permutexvar_epi16(self.idx[t], zz),
                );
            }
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

/// Lane `r`: the sum of the eight lanes of `v[r]` (exact).
#[inline]
#[target_feature(enable = "avx512f")]
fn sum_rows(v: &[__m256i]) -> __m256i {
    reduce_pairs(std::array::from_fn(|i| {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v[2 * i]), v[2 * i + 1])
    }))
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
unsafe fn q45k_rows8<const FIVE: bool>(
    w: *const u8,
    rb: usize,
    a: &Decode,
    scratch: &mut Vec<__m256i>,
) -> [f32; 8] {
    let bb = if FIVE { 176 } else { 144 };
    let k = Q4k::new();
    let nb = a.scales.len();
    // Sized on the first pass, then reused: every slot read below is
    // written first in each pass.
    if scratch.len() < 16 * nb {
        scratch.resize(16 * nb, _mm256_setzero_si256());
    }
    for r in 0..8 {
        for b in 0..nb {
            prefetch(w.wrapping_add(r * rb + bb * b + PF), bb);
            // SAFETY: block b of row r (the caller's contract) and of the
            // activation row (256 codes, 16 aux values per block).
            let (s, m) = unsafe {
                k.block::<FIVE>(
                    w.add(r * rb + bb * b),
                    a.codes.as_ptr().add(256 * b),
                    _mm256_loadu_si256(a.aux.as_ptr().add(16 * b) as *const __m256i),
                )
            };
            scratch[16 * b + r] = s;
            scratch[16 * b + 8 + r] = m;
        }
    }
    let mut acc = _mm256_setzero_ps();
    for (b, &dx) in a.scales.iter().enumerate() {
        let isum = _mm256_cvtepi32_ps(sum_rows(&scratch[16 * b..16 * b + 8]));
        let msum = _mm256_cvtepi32_ps(sum_rows(&scratch[16 * b + 8..16 * b + 16]));
        // SAFETY: the blocks' first four bytes (the caller's contract).
        let dm = unsafe { f16_pairs(w.add(bb * b), rb, 0) };
        let dxv = _mm256_set1_ps(dx);
        let (d, dmin) = (f16_lanes::<false>(dm), f16_lanes::<true>(dm));
        acc = _mm256_add_ps(
            acc,
            _mm256_sub_ps(
                _mm256_mul_ps(_mm256_mul_ps(d, dxv), isum),
                _mm256_mul_ps(_mm256_mul_ps(dmin, dxv), msum),
            ),
        );
    }
    let mut out = [0f32; 8];
    // SAFETY: eight f32.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// Q6_K's constants: masks and shifts that put the high bits of each 64
/// codes at bits 4..6, and the `vpermw` indices of the group scales.
struct Q6k {
    m0f: __m512i,
    m0c: __m512i,
    m30: __m512i,
    shl: __m512i,
    shr: __m512i,
    idx: [__m512i; 4],
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
            // Eight i16 lanes (sixteen codes) per group.
            idx: std::array::from_fn(|q| {
                let g = 4 * q as i16;
                let l: [i16; 32] = std::array::from_fn(|i| g + i as i16 / 8);
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
                for (t, c) in codes.into_iter().enumerate() {
                    acc = _mm512_dpwssd_epi32(
                        acc,
                        _mm512_maddubs_epi16(c, load64(xp.add(128 * h + 64 * t))),
                        _mm512_permutexvar_epi16(self.idx[2 * h + t], ss),
                    );
                }
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
unsafe fn q6k_rows8(w: *const u8, rb: usize, a: &Decode, scratch: &mut Vec<__m256i>) -> [f32; 8] {
    let k = Q6k::new();
    let nb = a.scales.len();
    // Sized on the first pass, then reused: every slot read below is
    // written first in each pass.
    if scratch.len() < 8 * nb {
        scratch.resize(8 * nb, _mm256_setzero_si256());
    }
    for r in 0..8 {
        for b in 0..nb {
            prefetch(w.wrapping_add(r * rb + 210 * b + PF), 210);
            // SAFETY: as in q45k_rows8.
            scratch[8 * b + r] = unsafe {
                k.block(
                    w.add(r * rb + 210 * b),
                    a.codes.as_ptr().add(256 * b),
                    _mm256_loadu_si256(a.aux.as_ptr().add(16 * b) as *const __m256i),
                )
            };
        }
    }
    let mut acc = _mm256_setzero_ps();
    for (b, &dx) in a.scales.iter().enumerate() {
        let isum = _mm256_cvtepi32_ps(sum_rows(&scratch[8 * b..8 * b + 8]));
        // The f16 d at bytes 208..210: the high half of the pair at 206.
        // SAFETY: bytes 206..210 of each block (the caller's contract).
        let d = f16_lanes::<true>(unsafe { f16_pairs(w.add(210 * b), rb, 206) });
        acc = _mm256_add_ps(
            acc,
            _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(dx)), isum),
        );
    }
    let mut out = [0f32; 8];
    // SAFETY: eight f32.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
    out
}
