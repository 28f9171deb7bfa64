//! The AVX2 prefill kernel with one lane per activation row: each 4 weight
//! codes are broadcast to the eight lanes and multiplied with 4 codes of
//! each of the eight activation rows ([`super::Rows8`] in its
//! [`Layout::Lanes`] layout), so a lane accumulates its own row's dot
//! product and no horizontal sum is left to do at the end of a block.
//!
//! Why: the kernel it replaces on AVX2 (`avx2::rows8_vnni`'s code: 32
//! codes of one activation row per register) pays one `maddubs` and one
//! `madd` per 32 codes and row, then reduces eight registers per block;
//! Zen 3 issues two of those multiplies a cycle, and they bounded it. Here
//! the `maddubs` pair sums of a span of codes that share a weight scale are
//! added in i16 first and meet the scale in one `madd`: per 32 codes, row
//! and weight row, 9 multiplies for Q4_K (spans of 32), 10 for Q5_K (16),
//! 12 for Q6_K (8) instead of 16. The i16 sums cannot overflow: a
//! `maddubs` lane is at most 2 x 15 x 127 = 3810 for Q4_K's 4-bit codes,
//! and a span adds at most 8 of them (30,480); Q5_K's 5-bit codes give
//! 7874, 4 per span (31,496); Q6_K's 6-bit codes 16,002, 2 per span
//! (32,004), or see below. The block's i32 sums are the same integers as every other
//! path's, and the f32 steps are [`avx2::block_value`]'s: the same bits.
//!
//! Measured on Zen 3 (one thread, 128 activation rows, min of 12 calls):
//! Q4_K 1536 x 2240 from 52 to 64 GMAC/s with two weight rows per call,
//! about 70 with four ([`WIDTH`]); Q6_K 8960 x 768 from 50 to 53. Weight
//! codes laid out pre-broadcast (32 bytes per 4 codes, one plain load)
//! measured slower (48 and 37): writing them costs more than the
//! broadcasts save.
//!
//! Q4_K and Q5_K calls take two groups of eight activation rows
//! ([`groups`]): a weight broadcast and a span's scale then serve sixteen
//! rows. With the results written straight into the output's columns (no
//! transposed copy), Q4_K 2240 x 1536 x 128 rows went from 70-73 to 79-81
//! GMAC/s on Zen 3 (one thread, min of 12 calls, alternating builds).
//!
//! Q6_K's codes carry a bias of 32, which the other paths take out per
//! group and activation row (`block_value`'s eight `madd`s per block,
//! weight row and row group: a third of this kernel's Q6_K time). Here the
//! operands trade places: the activation codes plus 128 (0..=255, the
//! unsigned operand) times the weight codes less 32 (-32..=31). A
//! `maddubs` lane is then at most 2 x 255 x 32 = 16,320, 2 per span
//! (32,640), and `Σ sc · Σ (x + 128)(q - 32)` differs from the other
//! paths' `Σ sc · Σ x (q - 32)` by `128 · Σ sc · Σ (q - 32)`, a constant
//! per block of the weight row (`Unpacked::offset_q6k`): the same integer
//! after one subtraction. Q6_K 768 x 8960 x 128 rows: 53-54 to 58-60
//! GMAC/s (one thread), the kernel alone 76 to 86.
//!
//! [`Layout::Lanes`]: super::Layout::Lanes

use super::avx2;
use std::arch::x86_64::*;

/// Weight rows per call: each activation load serves this many.
pub(super) const WIDTH: usize = 4;

/// Groups of eight activation rows per call for `fmt`: each weight
/// broadcast and scale serves this many. Q6_K takes one: with a `madd`
/// every two steps, two groups' sums do not fit in the registers, and the
/// compiler's spills (stored and at once reloaded) made it 20 % slower
/// than one group.
pub(super) fn groups(fmt: super::KFormat) -> usize {
    match fmt {
        super::KFormat::Q6K => 1,
        _ => 2,
    }
}

/// `W` unpacked weight rows against the eight activation rows of each of
/// the `G` groups `g` over `blocks`, each block's value added to
/// `out[group].add(w)[lane]`, as `avx2::rows8_vnni` does (the same bits).
/// `SPAN`: codes summed in i16 before their scale's `madd` (32 for Q4_K,
/// 16 for Q5_K, 8 for Q6_K; see the module docs). With two groups, each
/// weight broadcast and scale serves both groups' rows.
///
/// # Safety
/// AVX2 must be available; each `u[w]` holds one row of `xq.k` values in
/// `fmt`; each `g` was made from `xq` for `fmt` in the lanes layout; each
/// `out[i]` points at `W` writable entries that nothing else touches.
#[target_feature(enable = "avx2")]
unsafe fn rows8<
    const NG: usize,
    const MINMAX: bool,
    const SPAN: usize,
    const W: usize,
    const G: usize,
    const OFFSET: bool,
>(
    fmt: super::KFormat,
    u: [&super::Unpacked; W],
    xq: &super::Acts,
    g: [&super::Rows8; G],
    blocks: std::ops::Range<usize>,
    out: [*mut [f32; 8]; G],
) {
    let k = xq.k;
    debug_assert!(fmt.block() == 256 && NG == fmt.groups() && blocks.end <= k / 256);
    for g in g {
        debug_assert!(g.layout == super::Layout::Lanes && g.codes.len() == 8 * k);
    }
    for u in u {
        debug_assert!(u.codes.len() == k && u.scales.len() == k / 16);
    }
    let mut xs = [std::ptr::null::<u8>(); G];
    for i in 0..G {
        xs[i] = g[i].codes.as_ptr() as *const u8;
    }
    let mut c = [std::ptr::null::<u8>(); W];
    let mut sc = [std::ptr::null::<i16>(); W];
    for w in 0..W {
        c[w] = u[w].codes.as_ptr();
        sc[w] = u[w].scales.as_ptr();
    }
    // The running sums, in a local the compiler may keep on the stack (in
    // registers with two groups they would crowd out the i16 sums below).
    let mut sums = [[_mm256_setzero_ps(); W]; G];
    for (s, o) in sums.iter_mut().zip(out) {
        for (w, s) in s.iter_mut().enumerate() {
            // SAFETY: `out[i]` points at W entries of 8 floats.
            *s = unsafe { _mm256_loadu_ps(o.add(w) as *const f32) };
        }
    }
    for b in blocks {
        let mut isum = [[_mm256_setzero_si256(); W]; G];
        // The block's codes: 256 of each weight row, 8 x 256 of the rows.
        let q0 = b * 256;
        let mut xb = [std::ptr::null::<u8>(); G];
        let mut cb = [std::ptr::null::<u8>(); W];
        let mut sb = [std::ptr::null::<i16>(); W];
        // SAFETY: q0 + 256 <= k (b < nb); the lanes layout keeps the
        // eight rows' codes q..q + 4 as the 32 bytes at 8 q; q0 / 16 + 16
        // <= k / 16, the length of `scales`.
        unsafe {
            for i in 0..G {
                xb[i] = xs[i].add(8 * q0);
            }
            for w in 0..W {
                cb[w] = c[w].add(q0);
                sb[w] = sc[w].add(q0 / 16);
            }
        }
        for span in 0..256 / SPAN {
            let mut s16 = [[_mm256_setzero_si256(); W]; G];
            for j in 0..SPAN / 4 {
                let q = span * SPAN + 4 * j;
                let mut xv = [_mm256_setzero_si256(); G];
                for i in 0..G {
                    // SAFETY: q + 4 <= 256: in the block (see above).
                    xv[i] = unsafe { _mm256_loadu_si256(xb[i].add(8 * q) as *const __m256i) };
                }
                for w in 0..W {
                    // SAFETY: as above.
                    let wv =
                        unsafe { _mm256_set1_epi32((cb[w].add(q) as *const i32).read_unaligned()) };
                    for i in 0..G {
                        let p = if OFFSET {
                            _mm256_maddubs_epi16(xv[i], wv)
                        } else {
                            _mm256_maddubs_epi16(wv, xv[i])
                        };
                        s16[i][w] = _mm256_add_epi16(s16[i][w], p);
                    }
                }
            }
            for w in 0..W {
                // SAFETY: span * SPAN / 16 < 16: in the block's scales.
                let s = _mm256_set1_epi16(unsafe { *sb[w].add(span * SPAN / 16) });
                for i in 0..G {
                    isum[i][w] = _mm256_add_epi32(isum[i][w], _mm256_madd_epi16(s16[i][w], s));
                }
            }
        }
        for i in 0..G {
            // SAFETY: b * 8 + 8 <= g.dx.len() (eight lanes per block).
            let dx = unsafe { _mm256_loadu_ps(g[i].dx.as_ptr().add(b * 8)) };
            for w in 0..W {
                let v = if OFFSET {
                    // `block_value`'s steps for Q6_K, the per-row code sums'
                    // term replaced by the weight row's constant (the same
                    // integer).
                    let off = _mm256_set1_epi32(u[w].offsets[b]);
                    let ddx = _mm256_mul_ps(_mm256_set1_ps(u[w].d[b]), dx);
                    _mm256_mul_ps(ddx, _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[i][w], off)))
                } else {
                    // SAFETY: `u[w]` and `g[i]` are made for `fmt` and k
                    // (the caller's promise), b < nb.
                    unsafe { avx2::block_value::<NG, MINMAX>(u[w], g[i], b, dx, isum[i][w]) }
                };
                sums[i][w] = _mm256_add_ps(sums[i][w], v);
            }
        }
    }
    for (s, o) in sums.iter().zip(out) {
        for (w, s) in s.iter().enumerate() {
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(o.add(w) as *mut f32, *s) };
        }
    }
}

/// [`rows8`] on sixteen activation rows ([`super::Layout::Wide`]: each 4
/// codes of the sixteen rows are one 512-bit register), on AVX-512 VNNI:
/// each 4 codes of a weight row are broadcast and meet the sixteen rows' 4
/// codes in one `vpdpbusd`, which sums the four products straight into i32
/// lanes. A span's sums (the codes sharing one weight scale: `SPAN` 32 for
/// Q4_K and Q5_K, 16 for Q6_K) then meet the scale in one `vpmulld`. No
/// i16 step is left, so no span has to be cut short for overflow (a span
/// sums at most 32 products, each below 2^14), and per four codes, weight
/// row and sixteen activation rows there is one multiply where [`rows8`]
/// issues two `maddubs` and two adds. Q6_K's operands trade places as in
/// [`rows8`] (the activation codes plus 128 unsigned, the weight codes less
/// 32 signed). The block values ([`block_value16`]) take all sixteen lanes
/// at once too.
///
/// The block sums are the same integers as every other path's, and the f32
/// steps are [`rows8`]'s, lane by lane: the same bits.
///
/// Measured on AMD Zen 4 (2 threads, 128 activation rows, min of 15
/// calls, alternating with [`rows8`] in the same process): Q4_K 1536 x
/// 8960 from 9.6-10.0 to 8.0-8.8 ms, Q6_K 8960 x 1536 from 12.0 to
/// 8.0-8.3 ms with two eight-lane groups loaded into one register; then
/// 7.1 and 7.6 ms with the sixteen rows' codes, scales and sums laid out
/// for 512-bit loads (the reference in the same runs, the eight-row VNNI
/// kernel, 12.0-12.3 and 13.2-13.4 ms both times). Carrying the i16 sums
/// of [`rows8`] over to 512 bits gained less (Q6_K 9.5 ms against 7.8-8.6
/// in the same rounds, Q4_K the same), and eight weight rows per call no
/// more than four (Q4_K 7.3 ms).
///
/// # Safety
/// AVX-512 F, BW and VNNI must be available; each `u[w]` holds one row of
/// `xq.k` values in `fmt`; `g` was made from `xq` for `fmt` in the wide
/// layout; `out[h]` points at `W` writable entries (lanes `8h..8h + 8` of
/// each weight row) that nothing else touches.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni")]
unsafe fn rows16<
    const NG: usize,
    const MINMAX: bool,
    const SPAN: usize,
    const W: usize,
    const OFFSET: bool,
>(
    fmt: super::KFormat,
    u: [&super::Unpacked; W],
    xq: &super::Acts,
    g: &super::Rows8,
    blocks: std::ops::Range<usize>,
    out: [*mut [f32; 8]; 2],
) {
    let k = xq.k;
    debug_assert!(fmt.block() == 256 && NG == fmt.groups() && blocks.end <= k / 256);
    debug_assert!(g.layout == super::Layout::Wide && g.codes.len() == 16 * k);
    for u in u {
        debug_assert!(u.codes.len() == k && u.scales.len() == k / 16);
    }
    let xs = g.codes.as_ptr() as *const u8;
    let c: [*const u8; W] = std::array::from_fn(|w| u[w].codes.as_ptr());
    let sc: [*const i16; W] = std::array::from_fn(|w| u[w].scales.as_ptr());
    let mut sums = [_mm512_setzero_ps(); W];
    for (w, s) in sums.iter_mut().enumerate() {
        // SAFETY: `out[h]` points at W entries of 8 floats.
        *s = unsafe {
            let lo = _mm256_loadu_ps(out[0].add(w) as *const f32);
            let hi = _mm256_loadu_ps(out[1].add(w) as *const f32);
            let v = _mm512_castps_pd(_mm512_castps256_ps512(lo));
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(v, _mm256_castps_pd(hi)))
        };
    }
    for b in blocks {
        let mut isum = [_mm512_setzero_si512(); W];
        let q0 = b * 256;
        // SAFETY: q0 + 256 <= k (b < nb); the wide layout keeps the
        // sixteen rows' codes q..q + 4 as the 64 bytes at 16 q; q0 / 16 +
        // 16 <= k / 16, the length of `scales`.
        let (xb, cb, sb) = unsafe {
            (
                xs.add(16 * q0),
                c.map(|c| c.add(q0)),
                sc.map(|s| s.add(q0 / 16)),
            )
        };
        for span in 0..256 / SPAN {
            let mut s32 = [_mm512_setzero_si512(); W];
            for j in 0..SPAN / 4 {
                let q = span * SPAN + 4 * j;
                // SAFETY: q + 4 <= 256: in the block (see above).
                let xv = unsafe { _mm512_loadu_si512(xb.add(16 * q) as *const __m512i) };
                for w in 0..W {
                    // SAFETY: as above.
                    let wv =
                        unsafe { _mm512_set1_epi32((cb[w].add(q) as *const i32).read_unaligned()) };
                    // The unsigned operand first.
                    s32[w] = if OFFSET {
                        _mm512_dpbusd_epi32(s32[w], xv, wv)
                    } else {
                        _mm512_dpbusd_epi32(s32[w], wv, xv)
                    };
                }
            }
            for w in 0..W {
                // SAFETY: span * SPAN / 16 < 16: in the block's scales.
                let sc = _mm512_set1_epi32(i32::from(unsafe { *sb[w].add(span * SPAN / 16) }));
                isum[w] = _mm512_add_epi32(isum[w], _mm512_mullo_epi32(s32[w], sc));
            }
        }
        // SAFETY: b * 16 + 16 <= g.dx.len() (sixteen lanes per block).
        let dx = unsafe { _mm512_loadu_ps(g.dx.as_ptr().add(b * 16)) };
        for w in 0..W {
            let v = if OFFSET {
                // `rows8`'s steps for Q6_K.
                let off = _mm512_set1_epi32(u[w].offsets[b]);
                let ddx = _mm512_mul_ps(_mm512_set1_ps(u[w].d[b]), dx);
                _mm512_mul_ps(ddx, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[w], off)))
            } else {
                // SAFETY: `u[w]` and `g` are made for `fmt` and k (the
                // caller's promise), b < nb.
                unsafe { block_value16::<NG, MINMAX>(u[w], g, b, dx, isum[w]) }
            };
            sums[w] = _mm512_add_ps(sums[w], v);
        }
    }
    for (w, s) in sums.iter().enumerate() {
        // SAFETY: as above.
        unsafe {
            _mm256_storeu_ps(out[0].add(w) as *mut f32, _mm512_castps512_ps256(*s));
            _mm256_storeu_ps(
                out[1].add(w) as *mut f32,
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*s))),
            );
        }
    }
}

/// `avx2::block_value` on the sixteen lanes of a wide group: the same
/// operations in the same order, lane by lane (the same bits).
///
/// # Safety
/// AVX-512 F and BW must be available; `u` and `g` are made for the same
/// format and k, `g` in the wide layout; b < k / 256.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn block_value16<const NG: usize, const MINMAX: bool>(
    u: &super::Unpacked,
    g: &super::Rows8,
    b: usize,
    dx: __m512,
    isum: __m512i,
) -> __m512 {
    debug_assert!(g.gs.len() >= (b + 1) * NG * 16);
    let mut gsum = _mm512_setzero_si512();
    for p in 0..NG / 2 {
        // SAFETY: (b * NG / 2 + p) * 32 + 32 <= g.gs.len() (NG * 16 per
        // block) and b * NG / 2 + p < u.min_pairs.len() (NG / 2 per block).
        let (gv, mp) = unsafe {
            (
                _mm512_loadu_si512(g.gs.as_ptr().add((b * NG / 2 + p) * 32) as *const __m512i),
                *u.min_pairs.get_unchecked(b * NG / 2 + p),
            )
        };
        gsum = _mm512_add_epi32(gsum, _mm512_madd_epi16(gv, _mm512_set1_epi32(mp)));
    }
    let (d, dmin) = (u.d[b], u.dmin[b]);
    let ddx = _mm512_mul_ps(_mm512_set1_ps(d), dx);
    if MINMAX {
        _mm512_sub_ps(
            _mm512_mul_ps(ddx, _mm512_cvtepi32_ps(isum)),
            _mm512_mul_ps(
                _mm512_mul_ps(_mm512_set1_ps(dmin), dx),
                _mm512_cvtepi32_ps(gsum),
            ),
        )
    } else {
        _mm512_mul_ps(ddx, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum, gsum)))
    }
}

/// The eight lanes of eight accumulators `acc` (`acc[w][r]`: weight row
/// `w`, activation row `r`) stored as eight rows of eight outputs:
/// `y[r * stride + w] = acc[w][r]`, the 8 x 8 transpose done in registers.
/// (Read lane by lane, each of the 64 loads waited on the kernel's
/// just-stored accumulators: about 5 % of a prefill's matmul time.)
///
/// # Safety
/// AVX2 must be available; `y + r * stride .. + 8` is writable for each r
/// in 0..8 and overlaps nothing else in use.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn store_transposed(acc: &[[f32; 8]; 8], y: *mut f32, stride: usize) {
    let r: [__m256; 8] = std::array::from_fn(|w| {
        // SAFETY: `acc[w]` holds 8 floats.
        unsafe { _mm256_loadu_ps(acc[w].as_ptr()) }
    });
    // t[2i], t[2i + 1]: rows 2i, 2i + 1 interleaved (per 128-bit half).
    let t: [__m256; 8] = std::array::from_fn(|j| {
        let i = j / 2;
        if j % 2 == 0 {
            _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1])
        } else {
            _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1])
        }
    });
    // u[4i + c]: per half H, rows 4i..4i + 4 at column 4H + c.
    let u: [__m256; 8] = std::array::from_fn(|k| {
        let (i, jc) = (k / 4, k % 4);
        let (a, b) = (t[4 * i + jc / 2], t[4 * i + 2 + jc / 2]);
        if jc % 2 == 0 {
            _mm256_shuffle_ps::<0b01_00_01_00>(a, b)
        } else {
            _mm256_shuffle_ps::<0b11_10_11_10>(a, b)
        }
    });
    for c in 0..4 {
        let lo = _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]);
        let hi = _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]);
        // SAFETY: rows c and 4 + c of `y` hold 8 writable floats.
        unsafe {
            _mm256_storeu_ps(y.add(c * stride), lo);
            _mm256_storeu_ps(y.add((4 + c) * stride), hi);
        }
    }
}

/// One Q6_K block of `Unpacked::offset_q6k`: its 256 codes become
/// `q - 32` in place; returns `Σ_g sc_g · Σ_{i in g} (q_i - 32)` over its
/// sixteen groups (the same integer as the scalar loop).
///
/// # Safety
/// AVX2 must be available; `c` holds 256 codes, `sc` 16 scales.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn offset_q6k_block(c: &mut [u8], sc: &[i16]) -> i32 {
    assert!(c.len() == 256 && sc.len() == 16);
    let ones = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_si256();
    for j in 0..8 {
        // SAFETY: 32 * j + 32 <= 256 = c.len().
        let v = unsafe { _mm256_loadu_si256(c.as_ptr().add(32 * j) as *const __m256i) };
        let v = _mm256_sub_epi8(v, _mm256_set1_epi8(32));
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(c.as_mut_ptr().add(32 * j) as *mut __m256i, v) };
        // Pair sums of the signed codes (-64..=62): lanes 0..8 group 2j,
        // 8..16 group 2j + 1.
        let p = _mm256_maddubs_epi16(ones, v);
        let s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * j + 1]), _mm_set1_epi16(sc[2 * j]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
    }
    let mut l = [0i32; 8];
    // SAFETY: `l` holds 8 i32.
    unsafe { _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, acc) };
    l.iter().sum()
}

/// [`rows8`] built for `fmt`'s constants over `u.len()` weight rows
/// (1 to [`WIDTH`]) and `g.len()` groups (1 or 2): group `i`'s row `w`
/// accumulates in `out[i * stride + w]`.
///
/// # Safety
/// As [`rows8`].
pub(super) unsafe fn rows8_for(
    fmt: super::KFormat,
    u: &[super::Unpacked],
    xq: &super::Acts,
    g: &[super::Rows8],
    blocks: std::ops::Range<usize>,
    out: &mut [[f32; 8]],
    stride: usize,
) {
    // SAFETY: the caller's guarantees.
    unsafe {
        match (u.len(), g.len()) {
            (4, 2) => with::<4, 2>(fmt, u, xq, g, blocks, out, stride),
            (3, 2) => with::<3, 2>(fmt, u, xq, g, blocks, out, stride),
            (2, 2) => with::<2, 2>(fmt, u, xq, g, blocks, out, stride),
            (1, 2) => with::<1, 2>(fmt, u, xq, g, blocks, out, stride),
            (4, 1) => with::<4, 1>(fmt, u, xq, g, blocks, out, stride),
            (3, 1) => with::<3, 1>(fmt, u, xq, g, blocks, out, stride),
            (2, 1) => with::<2, 1>(fmt, u, xq, g, blocks, out, stride),
            (1, 1) => with::<1, 1>(fmt, u, xq, g, blocks, out, stride),
            (n, g) => unreachable!(
                "lanes::rows8_for takes 1 to {WIDTH} rows and 1 or 2 groups, not {n} and {g}"
            ),
        }
    }
}

/// [`rows16`] built for `fmt`'s constants over `u.len()` weight rows (1
/// to [`WIDTH`]) and the sixteen rows of `g` ([`super::Layout::Wide`]):
/// weight row `w` accumulates lanes 0..8 in `out[w]` and 8..16 in
/// `out[stride + w]`.
///
/// # Safety
/// As [`rows16`]; `out` holds at least `stride + u.len()` entries.
pub(super) unsafe fn rows16_for(
    fmt: super::KFormat,
    u: &[super::Unpacked],
    xq: &super::Acts,
    g: &super::Rows8,
    blocks: std::ops::Range<usize>,
    out: &mut [[f32; 8]],
    stride: usize,
) {
    // SAFETY: the caller's guarantees.
    unsafe {
        match u.len() {
            4 => with16::<4>(fmt, u, xq, g, blocks, out, stride),
            3 => with16::<3>(fmt, u, xq, g, blocks, out, stride),
            2 => with16::<2>(fmt, u, xq, g, blocks, out, stride),
            1 => with16::<1>(fmt, u, xq, g, blocks, out, stride),
            n => unreachable!("lanes::rows16_for takes 1 to {WIDTH} rows, not {n}"),
        }
    }
}

/// [`rows16_for`] for `W` rows.
///
/// # Safety
/// As [`rows16_for`].
unsafe fn with16<const W: usize>(
    fmt: super::KFormat,
    u: &[super::Unpacked],
    xq: &super::Acts,
    g: &super::Rows8,
    blocks: std::ops::Range<usize>,
    out: &mut [[f32; 8]],
    stride: usize,
) {
    use super::KFormat::*;
    assert!(u.len() == W && stride >= W && out.len() >= stride + W);
    let us: [&super::Unpacked; W] = std::array::from_fn(|w| &u[w]);
    let o = [out.as_mut_ptr(), out[stride..].as_mut_ptr()];
    // SAFETY: as in `with`; the two halves' W entries are disjoint
    // (stride >= W).
    unsafe {
        match fmt {
            Q4K => rows16::<8, true, 32, W, false>(fmt, us, xq, g, blocks, o),
            Q5K => rows16::<8, true, 32, W, false>(fmt, us, xq, g, blocks, o),
            Q6K => rows16::<16, false, 16, W, true>(fmt, us, xq, g, blocks, o),
        }
    }
}

/// [`rows8_for`] for `W` rows and `G` groups.
///
/// # Safety
/// As [`rows8`]; `u` holds `W` rows, `g` `G` groups, `out` at least
/// `(G - 1) * stride + W` entries.
unsafe fn with<const W: usize, const G: usize>(
    fmt: super::KFormat,
    u: &[super::Unpacked],
    xq: &super::Acts,
    g: &[super::Rows8],
    blocks: std::ops::Range<usize>,
    out: &mut [[f32; 8]],
    stride: usize,
) {
    use super::KFormat::*;
    assert!(u.len() == W && g.len() == G && stride >= W && out.len() >= (G - 1) * stride + W);
    let us: [&super::Unpacked; W] = std::array::from_fn(|w| &u[w]);
    let gs: [&super::Rows8; G] = std::array::from_fn(|i| &g[i]);
    // Group `i`'s W running sums, in place (no copy per call).
    let o: [*mut [f32; 8]; G] = std::array::from_fn(|i| out[i * stride..].as_mut_ptr());
    // SAFETY: the caller's guarantees; the constants are `fmt`'s; each
    // `o[i]` starts W entries of `out` (asserted above), disjoint for
    // distinct groups (stride >= W).
    unsafe {
        match fmt {
            Q4K => rows8::<8, true, 32, W, G, false>(fmt, us, xq, gs, blocks, o),
            Q5K => rows8::<8, true, 16, W, G, false>(fmt, us, xq, gs, blocks, o),
            Q6K => rows8::<16, false, 8, W, G, true>(fmt, us, xq, gs, blocks, o),
        }
    }
}
