//! Decode (one activation row) of Q4_K, Q5_K and Q6_K, eight weight rows
//! at a time: the activation row's layout ([`Decode`]), the pass over the
//! rows, and the parts both instruction sets share; and the prefetching
//! of weight rows ahead that decode and the prefill kernels use.
//!
//! The one-row kernels spent most of their time outside the products: a
//! scalar unpacking of each block's scales, two broadcasts per 32 codes,
//! and a horizontal sum and f32 steps per block and row. Here each block's
//! scales are unpacked with byte shuffles and spread over the lanes by
//! shuffles; the eight rows are read in memory order, one stream (blocks
//! across rows were eight short streams), each block's integer partials
//! kept aside with its f16 scales (the reduction loads the eight rows'
//! scales at once: gathering them from the rows cost 5-7 % on rows of
//! 8960); then the eight rows' block sums are reduced together, and the
//! f32 steps of the module docs run with one lane per weight row. The
//! integers are the exact block sums of the other paths, and the f32
//! steps the same operations in the same order: the same bits.
//!
//! The per-block integer kernels are [`super::avx2`]'s (32 codes an
//! instruction) and, where AVX-512 VNNI runs, [`super::avx512`]'s (64
//! codes an instruction, scale and accumulate fused).

use std::arch::x86_64::*;

use super::{Acts, KFormat};

/// How far ahead (bytes) each row block prefetches the rows into L2, by
/// default. Streaming 1 GB of weight copies on two threads (Xeon,
/// AVX-512), the rows read in memory order: none 15-17 GB/s, 512 / 1024
/// bytes ahead into L1 17-20, 2048 into L2 19-23 (Q4_K and Q6_K, rows of
/// 1536 and 8960).
pub(super) const PF: usize = 2048;

/// The distance on AMD CPUs with AVX-512 (Zen 4 and later), where 2048
/// bytes ahead was slower than no software prefetch at all: Qwen2.5-1.5B
/// Q4_K_M decode on an EPYC Zen 4 (two threads) went from 25.6 tokens/s
/// at 2048 bytes to 31-32 with none and 34-40 at 8 to 32 KB ahead (64 KB:
/// 29-31).
pub(super) const PF_ZEN4: usize = 16 << 10;

/// The prefetch distance in force (bytes; 0: no software prefetch):
/// `EDGEFLOW_PREFETCH_BYTES` where it holds a number, else [`PF_ZEN4`] on
/// AMD CPUs with AVX-512, else [`PF`]. Read once.
pub(super) fn prefetch_distance() -> usize {
    static CHOSEN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let auto = || {
            if crate::cpu::amd_avx512() {
                PF_ZEN4
            } else {
                PF
            }
        };
        match std::env::var("EDGEFLOW_PREFETCH_BYTES") {
            Ok(v) => parse_distance(&v).unwrap_or_else(|| {
                eprintln!(
                    "warning: EDGEFLOW_PREFETCH_BYTES={v:?} is not a byte count from 0 \
                     to 1048576; choosing the prefetch distance from this CPU"
                );
                auto()
            }),
            Err(_) => auto(),
        }
    })
}

/// A prefetch distance as `EDGEFLOW_PREFETCH_BYTES` gives it: a byte
/// count up to 1 MB (past that the lines would leave L2 before they are
/// read), else None.
fn parse_distance(v: &str) -> Option<usize> {
    v.trim().parse::<usize>().ok().filter(|&n| n <= 1 << 20)
}

/// Weight rows per pass.
pub(super) const ROWS: usize = 8;

/// One activation row laid out for these kernels.
pub(super) struct Decode {
    fmt: KFormat,
    /// Whether the AVX-512 VNNI kernels run (else the AVX2 ones).
    wide: bool,
    /// Codes of each block of 256: Q4_K's and Q5_K's in the order of the
    /// AVX-512 kernel's 64-code loads (sub-blocks 0 and 2, 1 and 3, 4 and
    /// 6, 5 and 7: a low-nibble load holds sub-blocks `2j`, `2j + 2`; sub-
    /// block `s` starts at `32 ·` [`Q4K_ORDER`]`[s]`), Q6_K's as they are.
    pub(super) codes: Vec<i8>,
    /// 16 values per block. Q4_K / Q5_K: zeros, then the eight sub-blocks' code
    /// sums (the minima's `madd` operand against `[scales, minima]`).
    /// Q6_K: `-16 ×` the sixteen groups' code sums (against twice the
    /// group scales: the offset of 32, folded into the block sum).
    pub(super) aux: Vec<i16>,
    /// The activation scale of each block.
    pub(super) scales: Vec<f32>,
}

/// Where Q4_K's sub-block `s` sits in a block of [`Decode::codes`]
/// (in units of 32 codes; the order is its own inverse).
pub(super) const Q4K_ORDER: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

impl Decode {
    /// Row 0 of `xq` for `fmt`, for the AVX-512 VNNI kernels where `wide`
    /// (else the AVX2 ones).
    pub(super) fn new(fmt: KFormat, xq: &Acts, wide: bool) -> Self {
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
                    for (t, sb) in Q4K_ORDER.into_iter().enumerate() {
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
            wide,
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
    /// AVX2 and F16C available, and AVX-512 F / BW / VL / VNNI where made
    /// `wide` ([`super::has_vnni`]); `rb` is the row size of the
    /// activation row `self` was made from, in `self.fmt`.
    pub(super) unsafe fn rows(&self, w: &[u8], rb: usize, y: &mut [f32]) -> usize {
        use super::{avx2, avx512};
        let whole = y.len() / ROWS * ROWS;
        assert!(w.len() >= whole * rb && rb == self.scales.len() * self.fmt.block_bytes());
        let mut scratch = Scratch::default();
        for (g, yo) in y[..whole].chunks_exact_mut(ROWS).enumerate() {
            // SAFETY: rows 8g..8g + 8 lie in `w` (asserted), each of the
            // blocks `self` has codes, sums and scales for; the caller
            // promises the features.
            let v = unsafe {
                let p = w.as_ptr().add(g * ROWS * rb);
                let s = &mut scratch;
                match (self.fmt, self.wide) {
                    (KFormat::Q4K, true) => avx512::q45k_rows8::<false>(p, rb, self, s),
                    (KFormat::Q5K, true) => avx512::q45k_rows8::<true>(p, rb, self, s),
                    (KFormat::Q6K, true) => avx512::q6k_rows8(p, rb, self, s),
                    (KFormat::Q4K, false) => avx2::q45k_rows8::<false>(p, rb, self, s),
                    (KFormat::Q5K, false) => avx2::q45k_rows8::<true>(p, rb, self, s),
                    (KFormat::Q6K, false) => avx2::q6k_rows8(p, rb, self, s),
                }
            };
            yo.copy_from_slice(&v);
        }
        whole
    }
}

/// Fetches the `bb` bytes at `p` into L2.
#[inline(always)]
pub(super) fn prefetch(p: *const u8, bb: usize) {
    let mut off = 0;
    while off < bb {
        // SAFETY: a prefetch never faults; the address is only computed.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off) as *const i8) };
        off += 64;
    }
}

/// The next weight rows of a prefill kernel, fetched into L2 a few lines
/// at a time while the current ones are multiplied ([`Ahead::step`] once
/// per block of every AMX tile pass; once per chunk of blocks and group
/// of activation rows in the lane kernels). (All at once, when the
/// current rows were laid out, the prefetches waited for free line-fill
/// buffers: the first touches of the next rows, their scales, then
/// waited on memory.)
pub(super) struct Ahead {
    p: *const u8,
    left: usize,
    per: usize,
}

impl Ahead {
    /// `next` (none: nothing to fetch) spread over `steps` calls.
    pub(super) fn new(next: Option<&[u8]>, steps: usize) -> Self {
        let (p, left) = next.map_or((std::ptr::null(), 0), |n| (n.as_ptr(), n.len()));
        Ahead {
            p,
            left,
            per: left.div_ceil(steps.max(1)).next_multiple_of(64),
        }
    }

    /// Fetches the next share of the rows.
    #[inline]
    pub(super) fn step(&mut self) {
        let n = self.per.min(self.left);
        let mut off = 0;
        while off < n {
            // SAFETY: a prefetch never faults; `p + off` lies in `next`.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.p.wrapping_add(off) as *const i8) };
            off += 64;
        }
        self.p = self.p.wrapping_add(n);
        self.left -= n;
    }
}

/// What a pass over eight rows keeps until their values are reduced
/// together: each block's integer partials, and each block's f16 scale
/// pair, so that the reduction reads the eight rows' pairs with one load.
#[derive(Default)]
pub(super) struct Scratch {
    /// One vector per block and row: block `b` of row `r` at `8 b + r`.
    parts: Vec<__m256i>,
    /// The four bytes at the pair's offset of block `b` of row `r`, at
    /// `8 b + r`.
    pairs: Vec<u32>,
}

/// Runs `block` on each block of the eight rows at `w` (`rb` bytes
/// apart, `nb` blocks of `bb` bytes each), in memory order (row by row:
/// one stream the hardware prefetchers follow, each block also fetching
/// [`prefetch_distance`] bytes ahead into L2), and keeps the vector it
/// gives for each block, and the four bytes at `pair` in the block (its
/// f16 scales), in `scratch` until the eight rows' are reduced together.
/// `block` gets the block's address and `b`.
///
/// # Safety
/// Eight whole rows of `nb` blocks at `w`; `pair + 4 <= bb`.
#[inline(always)]
pub(super) unsafe fn sweep(
    w: *const u8,
    rb: usize,
    (bb, pair): (usize, usize),
    nb: usize,
    scratch: &mut Scratch,
    mut block: impl FnMut(*const u8, usize) -> __m256i,
) {
    debug_assert!(pair + 4 <= bb);
    // Sized on the first pass, then reused: every slot read after a pass
    // is written first in it.
    if scratch.parts.len() < 8 * nb {
        // SAFETY: an all-zero vector is a valid value.
        scratch.parts.resize(8 * nb, unsafe { std::mem::zeroed() });
        scratch.pairs.resize(8 * nb, 0);
    }
    let pf = prefetch_distance();
    for r in 0..ROWS {
        for b in 0..nb {
            if pf > 0 {
                prefetch(w.wrapping_add(r * rb + bb * b + pf), bb);
            }
            // SAFETY: block b of row r lies in the rows (the caller's
            // contract), its bytes pair..pair + 4 too.
            let (v, d) = unsafe {
                let blk = w.add(r * rb + bb * b);
                (
                    block(blk, b),
                    (blk.add(pair) as *const u32).read_unaligned(),
                )
            };
            scratch.parts[8 * b + r] = v;
            scratch.pairs[8 * b + r] = d;
        }
    }
}

/// Q4_K's eight scales and eight minima of the block at `blk`, as i16
/// lanes `[sc0..8, m0..8]` ([`super::scales_mins_k4`]'s values, from
/// byte shuffles).
///
/// # Safety
/// `blk..blk + 20` readable.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn q4k_scales(blk: *const u8) -> __m256i {
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

/// The f16 pairs of block `b` of the eight rows kept in `scratch`, as
/// f32 lanes: (first f16s, second f16s) (exact).
///
/// # Safety
/// F16C; `scratch` filled for block `b`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_pairs(scratch: &Scratch, b: usize) -> (__m256, __m256) {
    let v = &scratch.pairs[8 * b..8 * b + 8];
    // SAFETY: eight u32 (sliced above).
    let v = unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) };
    // Per 128-bit half: [first f16 of four lanes, second f16 of them].
    let h = _mm256_packus_epi32(
        _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)),
        _mm256_srli_epi32::<16>(v),
    );
    let h = _mm256_permute4x64_epi64::<0b11_01_10_00>(h);
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
    )
}

/// Lane `r`: the sum of the eight i32 lanes of `v[r]` (exact).
///
/// # Safety
/// `v` holds eight vectors.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sum_rows(v: &[__m256i]) -> __m256i {
    debug_assert!(v.len() >= 8);
    // SAFETY: eight vectors (the caller's contract).
    super::avx2::sums8(unsafe { &*(v.as_ptr() as *const [__m256i; 8]) })
}

/// One vector for a block's two partials: lanes 0-3 hold `s`'s eight
/// lanes summed in pairs (lane i: `s[i] + s[i + 4]`), lanes 4-7 `m`'s
/// (exact), so that the sweep keeps one vector a block, not two.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn join_sm(s: __m256i, m: __m256i) -> __m256i {
    let fold =
        |v: __m256i| _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    _mm256_set_m128i(fold(m), fold(s))
}

/// Of eight vectors `v[r]` made by [`join_sm`]: (lane r the sum of lanes
/// 0-3 of `v[r]`, lane r the sum of lanes 4-7) (exact).
///
/// # Safety
/// `v` holds eight vectors.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sum_halves(v: &[__m256i]) -> (__m256i, __m256i) {
    debug_assert!(v.len() >= 8);
    // Per 128-bit half, after two rounds of pairwise sums: rows 4j..4j + 4
    // of `s` (low half) and of `m` (high half).
    let (u0, u1) = (
        _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3])),
        _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7])),
    );
    (
        _mm256_permute2x128_si256::<0x20>(u0, u1),
        _mm256_permute2x128_si256::<0x31>(u0, u1),
    )
}

/// The eight Q4_K / Q5_K rows' values from each block's integer partials
/// in `scratch` (`8 b + r`: row r's `Σ sc·(q·x)` and `Σ m·bsum` joined by
/// [`join_sm`]) and its f16 pair `(d, dmin)` (offset 0): per block,
/// `acc += (d · dx) · isum - (dmin · dx) · msum`, one lane per row.
///
/// # Safety
/// AVX2 and F16C; `scratch` filled by [`sweep`] for each of `a`'s
/// blocks.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn finish_q45k(a: &Decode, scratch: &Scratch) -> [f32; 8] {
    let parts = &scratch.parts;
    assert!(parts.len() >= 8 * a.scales.len() && scratch.pairs.len() >= 8 * a.scales.len());
    let mut acc = _mm256_setzero_ps();
    for (b, &dx) in a.scales.iter().enumerate() {
        // SAFETY: 16 b + 16 <= parts.len() and 8 b + 8 <= pairs.len()
        // (asserted).
        let ((isum, msum), (d, dmin)) =
            unsafe { (sum_halves(&parts[8 * b..]), f16_pairs(scratch, b)) };
        let (isum, msum) = (_mm256_cvtepi32_ps(isum), _mm256_cvtepi32_ps(msum));
        let dxv = _mm256_set1_ps(dx);
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

/// The eight Q6_K rows' values from each block's integer sums in
/// `scratch` (`8 b + r`: row r's `Σ sc·(q·x) - 32 Σ sc·bsum`) and its f16
/// `d` (the second of the pair kept from offset 206): per block,
/// `acc += (d · dx) · isum`, one lane per row.
///
/// # Safety
/// As [`finish_q45k`].
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn finish_q6k(a: &Decode, scratch: &Scratch) -> [f32; 8] {
    let parts = &scratch.parts;
    assert!(parts.len() >= 8 * a.scales.len() && scratch.pairs.len() >= 8 * a.scales.len());
    let mut acc = _mm256_setzero_ps();
    for (b, &dx) in a.scales.iter().enumerate() {
        // The f16 d at bytes 208..210: the second of the pair at 206.
        // SAFETY: 8 b + 8 <= parts.len() and pairs.len() (asserted).
        let (isum, (_, d)) = unsafe {
            (
                _mm256_cvtepi32_ps(sum_rows(&parts[8 * b..])),
                f16_pairs(scratch, b),
            )
        };
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

#[cfg(test)]
mod tests {
    use super::parse_distance;

    #[test]
    fn prefetch_distance_reads_a_byte_count_or_nothing() {
        assert_eq!(parse_distance("16384"), Some(16384));
        assert_eq!(parse_distance(" 0\n"), Some(0));
        assert_eq!(parse_distance("1048576"), Some(1 << 20));
        for bad in ["1048577", "-1", "16k", "", "2048.0"] {
            assert_eq!(parse_distance(bad), None, "{bad:?}");
        }
    }
}
