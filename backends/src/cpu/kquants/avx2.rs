//! AVX2 integer parts of the K-quant dot products: the same i32
//! values as [`super::scalar`] (exact integer sums: the order does not
//! matter), from `maddubs` (unsigned weight codes x signed activation
//! codes; at most 2 x 63 x 127 per i16 lane, no saturation) and `madd`.

use std::arch::x86_64::*;

/// Sum of the eight i32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// 32 unaligned bytes at `p`.
///
/// # Safety
/// `p..p + 32` must be readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// The 6-bit codes (0..64) of half `half` of a Q6_K block, 4 x 32 bytes
/// in the block's code order: low nibbles from `ql`, two high bits each
/// from `qh`. What the dot kernel and the prefill unpacker both read.
///
/// # Safety
/// `blk` holds at least the block's first 192 bytes; `half` is 0 or 1.
#[target_feature(enable = "avx2")]
unsafe fn q6k_codes(blk: &[u8], half: usize) -> [__m256i; 4] {
    debug_assert!(blk.len() >= 192 && half < 2);
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x03);
    // SAFETY: ql is blk[0..128], qh blk[128..192] (the caller's promise).
    let (ql0, ql1, qh) = unsafe {
        (
            load(blk.as_ptr().add(64 * half)),
            load(blk.as_ptr().add(64 * half + 32)),
            load(blk.as_ptr().add(128 + 32 * half)),
        )
    };
    [
        _mm256_or_si256(
            _mm256_and_si256(ql0, m4),
            _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m2)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(ql1, m4),
            _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(qh), m2)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
            _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(qh), m2)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
            _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(qh), m2)),
        ),
    ]
}

/// `Σ_g sc_g · (Σ q·x over group g)` of one Q6_K super-block (codes 0..63).
///
/// # Safety
/// AVX2 must be available; `blk` holds 210 bytes and `x` 256 codes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn q6k(blk: &[u8], x: &[i8]) -> i32 {
    debug_assert!(blk.len() >= 210 && x.len() >= 256);
    let sc = &blk[192..208];
    let mut acc = _mm256_setzero_si256();
    for half in 0..2 {
        // SAFETY: `blk` holds a whole Q6_K block (checked above).
        let q = unsafe { q6k_codes(blk, half) };
        for (i, qv) in q.iter().enumerate() {
            let g = 8 * half + 2 * i;
            // SAFETY: `x` has 256 codes.
            let xv = unsafe { load(x.as_ptr().add(128 * half + 32 * i) as *const u8) };
            let s = _mm256_set_m128i(
                _mm_set1_epi16(i16::from(sc[g + 1] as i8)),
                _mm_set1_epi16(i16::from(sc[g] as i8)),
            );
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(*qv, xv), s));
        }
    }
    hsum_i32(acc)
}

/// Per block of `block` values: `out[b] = Σ_g sc_g · Σ_{i in group g of
/// 16} c_i · x_i` (codes at most 63).
///
/// # Safety
/// AVX2 must be available; `c` and `x` hold `out.len() * block` values,
/// `sc` one scale per 16 of them, `block` a multiple of 32.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn grouped(c: &[u8], sc: &[i16], x: &[i8], block: usize, out: &mut [i32]) {
    debug_assert!(c.len() >= out.len() * block && x.len() >= c.len() && block.is_multiple_of(32));
    let per = block / 32;
    for (b, o) in out.iter_mut().enumerate() {
        let mut acc = _mm256_setzero_si256();
        for i in b * per..(b + 1) * per {
            // SAFETY: 32 * i + 32 <= out.len() * block <= c.len() <= x.len(),
            // and sc has 2 * i + 2 <= c.len() / 16 entries.
            let (cv, xv, s0, s1) = unsafe {
                (
                    load(c.as_ptr().add(32 * i)),
                    load(x.as_ptr().add(32 * i) as *const u8),
                    *sc.get_unchecked(2 * i),
                    *sc.get_unchecked(2 * i + 1),
                )
            };
            let sv = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(cv, xv), sv));
        }
        *o = hsum_i32(acc);
    }
}

/// Block `b`'s f16 at byte `off`, as f32 (F16C: exact, like the portable
/// conversion).
///
/// # Safety
/// F16C available; `p..p + 2` readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_ptr(p: *const u8) -> f32 {
    // SAFETY: two readable bytes (the caller's promise).
    let v = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16::from_le(v)))))
}

/// `Σ_j v_j` for the eight i32 `p_j = s[2j] + s[2j + 1]` of sixteen code
/// sums `s` times eight weights `w` (exact).
///
/// # Safety
/// AVX2 available; `s..s + 16` readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pair_sums_dot(s: *const i32, w: __m256i) -> i32 {
    // SAFETY: sixteen readable i32 (the caller's promise).
    let (a, b) = unsafe {
        (
            _mm256_loadu_si256(s as *const __m256i),
            _mm256_loadu_si256(s.add(8) as *const __m256i),
        )
    };
    // hadd pairs within 128-bit halves: [p0 p1 p4 p5 | p2 p3 p6 p7].
    let p = _mm256_permutevar8x32_epi32(
        _mm256_hadd_epi32(a, b),
        _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7),
    );
    hsum_i32(_mm256_mullo_epi32(p, w))
}

/// One Q4_K (`five` false) or Q5_K weight row against one activation row
/// (decode): what [`super::dot`]'s portable path gives, bit for bit. Per
/// super-block the eight 6-bit scales and minima are unpacked together
/// ([`super::scales_mins_k4`]), the minima's term `Σ m_j · bsum_j` is one
/// multiply and reduction, and the f32 steps are the portable ones in the
/// same order.
///
/// # Safety
/// AVX2 and F16C available.
///
/// # Panics
/// When `x` (256 codes per block of `row`), `dx` (a scale per block) or
/// `sums` (16 code sums per block) are short.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q45k_row(five: bool, row: &[u8], x: &[i8], dx: &[f32], sums: &[i32]) -> f32 {
    let bb = if five { 176 } else { 144 };
    let nb = row.len() / bb;
    assert!(x.len() >= nb * 256 && dx.len() >= nb && sums.len() >= nb * 16);
    let m4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let qs_at = if five { 48 } else { 16 };
    let mut acc = 0f32;
    for b in 0..nb {
        // SAFETY: block b < nb lies in `row`; its codes, scale and sums in
        // `x`, `dx` and `sums` (asserted above).
        unsafe {
            let blk = row.as_ptr().add(b * bb);
            let xb = x.as_ptr().add(256 * b) as *const u8;
            let (sc, mn) = super::scales_mins_k4(&*(blk.add(4) as *const [u8; 12]));
            let hbits = if five { load(blk.add(16)) } else { m4 };
            let mut iacc = _mm256_setzero_si256();
            for j in 0..4 {
                let q = load(blk.add(qs_at + 32 * j));
                let mut lo = _mm256_and_si256(q, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                if five {
                    let b0 = _mm256_and_si256(
                        _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j as i32)),
                        one,
                    );
                    let b1 = _mm256_and_si256(
                        _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j as i32 + 1)),
                        one,
                    );
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(b0));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(b1));
                }
                let pa = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(lo, load(xb.add(64 * j))),
                    _mm256_set1_epi16(i16::from(sc[2 * j])),
                );
                let pb = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, load(xb.add(64 * j + 32))),
                    _mm256_set1_epi16(i16::from(sc[2 * j + 1])),
                );
                iacc = _mm256_add_epi32(iacc, _mm256_add_epi32(pa, pb));
            }
            let isum = hsum_i32(iacc);
            let mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64(mn.as_ptr() as *const __m128i));
            let msum = pair_sums_dot(sums.as_ptr().add(16 * b), mins);
            let (d, dmin, dxb) = (f16_ptr(blk), f16_ptr(blk.add(2)), *dx.get_unchecked(b));
            acc += (d * dxb) * isum as f32 - (dmin * dxb) * msum as f32;
        }
    }
    acc
}

/// One Q6_K weight row against one activation row (decode): what
/// [`super::dot`]'s portable path gives, bit for bit; the offset term
/// `Σ sc_g · bsum_g` is two multiplies and one reduction.
///
/// # Safety
/// AVX2 and F16C available.
///
/// # Panics
/// As [`q45k_row`].
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q6k_row(row: &[u8], x: &[i8], dx: &[f32], sums: &[i32]) -> f32 {
    let nb = row.len() / 210;
    assert!(x.len() >= nb * 256 && dx.len() >= nb && sums.len() >= nb * 16);
    let mut acc = 0f32;
    for b in 0..nb {
        let blk = &row[210 * b..210 * (b + 1)];
        // SAFETY: block b < nb: its codes, scale and sums are in `x`, `dx`
        // and `sums` (asserted above); `blk` is one whole block.
        unsafe {
            let isum = q6k(blk, &x[256 * b..256 * (b + 1)]);
            let sc = _mm_loadu_si128(blk.as_ptr().add(192) as *const __m128i);
            let s = sums.as_ptr().add(16 * b);
            let off = _mm256_add_epi32(
                _mm256_mullo_epi32(
                    _mm256_cvtepi8_epi32(sc),
                    _mm256_loadu_si256(s as *const __m256i),
                ),
                _mm256_mullo_epi32(
                    _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)),
                    _mm256_loadu_si256(s.add(8) as *const __m256i),
                ),
            );
            let isum = isum - 32 * hsum_i32(off);
            acc += (f16_ptr(blk.as_ptr().add(208)) * *dx.get_unchecked(b)) * isum as f32;
        }
    }
    acc
}

/// Q5_K's fifth bit `p` of each byte of `h`, moved to bit 4 (the others
/// cleared). Within each byte: a 16-bit shift of at most 4 moves no set
/// bit across bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn fifth(h: __m256i, p: usize) -> __m256i {
    let h = _mm256_and_si256(h, _mm256_set1_epi8((1u8 << p) as i8));
    match p {
        0 => _mm256_slli_epi16::<4>(h),
        1 => _mm256_slli_epi16::<3>(h),
        2 => _mm256_slli_epi16::<2>(h),
        3 => _mm256_slli_epi16::<1>(h),
        4 => h,
        5 => _mm256_srli_epi16::<1>(h),
        6 => _mm256_srli_epi16::<2>(h),
        _ => _mm256_srli_epi16::<3>(h),
    }
}

/// `pshufb` indices that put i16 lane `t` of each 128-bit half in all
/// eight lanes of the half.
#[inline]
#[target_feature(enable = "avx2")]
fn pick16(t: usize) -> __m128i {
    _mm_set1_epi16((((2 * t + 1) << 8) | (2 * t)) as i16)
}

/// Eight Q4_K rows (Q5_K where `FIVE`; `rb` bytes apart from `w`) against
/// the activation row `a` (decode), [`super::decode::sweep`]'s way: per
/// block, 32 codes an instruction, the eight sub-block scales spread over
/// the lanes by one byte shuffle per 32 codes; the eight rows' values, the
/// portable path's bits.
///
/// # Safety
/// AVX2 and F16C; eight whole rows of the length `a` was made for at `w`.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q45k_rows8<const FIVE: bool>(
    w: *const u8,
    rb: usize,
    a: &super::decode::Decode,
    scratch: &mut super::decode::Scratch,
) -> [f32; 8] {
    use super::decode::{finish_q45k, q4k_scales, sweep, Q4K_ORDER};
    let bb = if FIVE { 176 } else { 144 };
    let m4 = _mm256_set1_epi8(0x0F);
    let pick: [__m256i; 8] = std::array::from_fn(|t| _mm256_broadcastsi128_si256(pick16(t)));
    // SAFETY: eight whole rows at `w` (the caller's contract); block b of
    // the activation row has 256 codes and 16 aux values.
    unsafe {
        sweep(w, rb, (bb, 0), a.scales.len(), scratch, |blk, b| {
            let z = q4k_scales(blk);
            let sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(z));
            let xp = a.codes.as_ptr().add(256 * b) as *const u8;
            let m = _mm256_madd_epi16(z, load(a.aux.as_ptr().add(16 * b) as *const u8));
            let (qs, hb) = if FIVE {
                (blk.add(48), load(blk.add(16)))
            } else {
                (blk.add(16), m4)
            };
            let mut s = _mm256_setzero_si256();
            for j in 0..4 {
                let q = load(qs.add(32 * j));
                let mut lo = _mm256_and_si256(q, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                if FIVE {
                    lo = _mm256_or_si256(lo, fifth(hb, 2 * j));
                    hi = _mm256_or_si256(hi, fifth(hb, 2 * j + 1));
                }
                for (t, c) in [(2 * j, lo), (2 * j + 1, hi)] {
                    let x = load(xp.add(32 * Q4K_ORDER[t]));
                    let p = _mm256_maddubs_epi16(c, x);
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, pick[t])));
                }
            }
            super::decode::join_sm(s, m)
        });
        finish_q45k(a, scratch)
    }
}

/// Eight Q6_K rows (`rb` bytes apart from `w`) against `a`, as
/// [`q45k_rows8`]: the group scales of each 32 codes (two groups) spread
/// by one byte shuffle, the offset term `-32 Σ sc·bsum` one `madd` per
/// block.
///
/// # Safety
/// As [`q45k_rows8`].
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q6k_rows8(
    w: *const u8,
    rb: usize,
    a: &super::decode::Decode,
    scratch: &mut super::decode::Scratch,
) -> [f32; 8] {
    use super::decode::{finish_q6k, sweep};
    // Code vector i of a half holds groups 2i (low 128 bits) and 2i + 1.
    let pick: [__m256i; 4] =
        std::array::from_fn(|i| _mm256_set_m128i(pick16(2 * i + 1), pick16(2 * i)));
    // SAFETY: as in q45k_rows8.
    unsafe {
        sweep(w, rb, (210, 206), a.scales.len(), scratch, |blk, b| {
            let xp = a.codes.as_ptr().add(256 * b) as *const u8;
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i));
            // -32 Σ sc·bsum: twice the scales against -16 bsum.
            let mut s = _mm256_madd_epi16(
                _mm256_add_epi16(sc, sc),
                load(a.aux.as_ptr().add(16 * b) as *const u8),
            );
            let blk = std::slice::from_raw_parts(blk, 210);
            for half in 0..2 {
                // Groups 8 half .. 8 half + 8 in both 128-bit halves.
                let sh = if half == 0 {
                    _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc))
                } else {
                    _mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(sc))
                };
                for (i, c) in q6k_codes(blk, half).into_iter().enumerate() {
                    let x = load(xp.add(128 * half + 32 * i));
                    let p = _mm256_maddubs_epi16(c, x);
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sh, pick[i])));
                }
            }
            s
        });
        finish_q6k(a, scratch)
    }
}

/// The eight i32 sums of `a[0..8]`, lane `r` holding `Σ a[r]` (exact).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn sums8(a: &[__m256i; 8]) -> __m256i {
    let t0 = _mm256_hadd_epi32(a[0], a[1]);
    let t1 = _mm256_hadd_epi32(a[2], a[3]);
    let t2 = _mm256_hadd_epi32(a[4], a[5]);
    let t3 = _mm256_hadd_epi32(a[6], a[7]);
    let u0 = _mm256_hadd_epi32(t0, t1);
    let u1 = _mm256_hadd_epi32(t2, t3);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(u0, u1),
        _mm256_permute2x128_si256::<0x31>(u0, u1),
    )
}

/// Block `b`'s f32 contribution for weight row `u`, one lane per
/// activation row of `g`, from the lanes' integer sums `isum`: the minima's
/// (Q4_K / Q5_K, `MINMAX`) or offset's (Q6_K) integer correction, one
/// `madd` per pair of groups ([`super::Rows8::gs`] against
/// [`super::Unpacked::min_pairs`]: exact), then the f32 steps of the module
/// docs in their order. `dx` holds the lanes' activation scales of block
/// `b`. Shared by every prefill kernel.
///
/// # Safety
/// `u` and `g` made for the same format (`NG` its [`super::KFormat::groups`])
/// and row length; `b` one of its blocks.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn block_value<const NG: usize, const MINMAX: bool>(
    u: &super::Unpacked,
    g: &super::Rows8,
    b: usize,
    dx: __m256,
    isum: __m256i,
) -> __m256 {
    debug_assert!(g.gs.len() >= (b + 1) * NG * 8);
    let mut gsum = _mm256_setzero_si256();
    for p in 0..NG / 2 {
        // SAFETY: (b * NG / 2 + p) * 16 + 16 <= g.gs.len() (NG * 8 per
        // block) and b * NG / 2 + p < u.min_pairs.len() (NG / 2 per block).
        let (gv, mp) = unsafe {
            (
                _mm256_loadu_si256(g.gs.as_ptr().add((b * NG / 2 + p) * 16) as *const __m256i),
                *u.min_pairs.get_unchecked(b * NG / 2 + p),
            )
        };
        gsum = _mm256_add_epi32(gsum, _mm256_madd_epi16(gv, _mm256_set1_epi32(mp)));
    }
    let (d, dmin) = (u.d[b], u.dmin[b]);
    let ddx = _mm256_mul_ps(_mm256_set1_ps(d), dx);
    if MINMAX {
        _mm256_sub_ps(
            _mm256_mul_ps(ddx, _mm256_cvtepi32_ps(isum)),
            _mm256_mul_ps(
                _mm256_mul_ps(_mm256_set1_ps(dmin), dx),
                _mm256_cvtepi32_ps(gsum),
            ),
        )
    } else {
        _mm256_mul_ps(ddx, _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, gsum)))
    }
}

macro_rules! rows8_kernel {
    ($name:ident, $features:literal) => {
        /// `W` unpacked weight rows against the eight activation rows of
        /// `g` (prefill), over `blocks`: each block's value is added to
        /// `out[w][lane]` (weight row `w`, that activation row), so calls
        /// over the blocks in order from zeros end with what [`super::dot`]
        /// gives, bit for bit. Per block,
        /// the integer parts come from one load of each 32 weight codes
        /// and of each 32 activation codes, shared by the eight rows and
        /// the `W` weight rows (`maddubs` / `madd` with the group scales,
        /// exact i32 sums); then the f32 steps of the module docs run with
        /// one lane per activation row: the same operations in the same
        /// order as the scalar code, so the same bits.
        ///
        /// # Safety
        /// The function's features must be available; each `u[w]` holds one
        /// row of `xq.k` values in `fmt`, `xq` at least `g.r0 + g.rows` rows
        /// and `g` was made from `xq` for `fmt`.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<
            const NG: usize,
            const PER: usize,
            const MINMAX: bool,
            const W: usize,
        >(
            fmt: super::KFormat,
            u: [&super::Unpacked; W],
            xq: &super::Acts,
            g: &super::Rows8,
            blocks: std::ops::Range<usize>,
            out: &mut [[f32; 8]; W],
        ) {
            let k = xq.k;
            let block = fmt.block();
            let nb = k / block;
            // The format's constants (`rows8_for` picks them), so the loops
            // unroll.
            let (ng, per) = (NG, PER);
            debug_assert!(ng == fmt.groups() && per == block / 32);
            for u in u {
                debug_assert!(u.codes.len() == k && u.scales.len() == k / 16 && u.d.len() == nb);
                debug_assert!(u.min_pairs.len() == nb * ng / 2 && u.sv.len() == k / 2);
            }
            debug_assert!(g.dx.len() == nb * 8 && g.gs.len() == nb * ng * 8);
            debug_assert!(g.codes.len() == 8 * k);
            let xs = g.codes.as_ptr() as *const u8;
            let c: [*const u8; W] = std::array::from_fn(|w| u[w].codes.as_ptr());
            let minmax = MINMAX;
            debug_assert!(minmax == matches!(fmt, super::KFormat::Q4K | super::KFormat::Q5K));
            debug_assert!(blocks.end <= nb);
            let mut acc: [__m256; W] = std::array::from_fn(|w| {
                // SAFETY: each `out[w]` holds 8 floats.
                unsafe { _mm256_loadu_ps(out[w].as_ptr()) }
            });
            for b in blocks {
                let mut a = [[_mm256_setzero_si256(); 8]; W];
                for i in b * per..(b + 1) * per {
                    // SAFETY: 32 * i + 32 <= k: the codes of each weight row
                    // and of every activation row (k each); `sv` has k / 2
                    // entries (16 per 32 codes).
                    let (wv, sv): ([__m256i; W], [__m256i; W]) = unsafe {
                        (
                            std::array::from_fn(|w| load(c[w].add(32 * i))),
                            std::array::from_fn(
                                |w| load(u[w].sv.as_ptr().add(16 * i) as *const u8),
                            ),
                        )
                    };
                    for r in 0..8 {
                        // SAFETY: 256 * i + 32 * r + 32 <= 8 k: the codes of
                        // activation row r (`g.codes`).
                        let xv = unsafe { load(xs.add(256 * i + 32 * r)) };
                        for w in 0..W {
                            a[w][r] = _mm256_add_epi32(
                                a[w][r],
                                _mm256_madd_epi16(_mm256_maddubs_epi16(wv[w], xv), sv[w]),
                            );
                        }
                    }
                }
                // SAFETY: b * 8 + 8 <= g.dx.len().
                let dx = unsafe { _mm256_loadu_ps(g.dx.as_ptr().add(b * 8)) };
                for w in 0..W {
                    // SAFETY: `u[w]` and `g` are made for `fmt` and k (the
                    // caller's promise), b < nb.
                    let v = unsafe { block_value::<NG, MINMAX>(u[w], g, b, dx, sums8(&a[w])) };
                    acc[w] = _mm256_add_ps(acc[w], v);
                }
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                // SAFETY: `o` has 8 floats.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *a) };
            }
        }
    };
}

// Where AVX-512 VNNI is, the compiler fuses each `madd` and its add into
// `vpdpwssd` (the same exact i32 sums), and 32 registers hold two weight
// rows' accumulators. (A 512-bit version, 64 codes an instruction,
// measured no faster on Sapphire Rapids: the multiplies' ports are the
// limit either way.) Plain AVX2 runs `super::lanes` instead.
rows8_kernel!(rows8_vnni, "avx2,avx512vnni,avx512vl");

/// Weight rows per `rows8_vnni` call.
pub(super) const ROWS8_WIDTH: usize = 2;

/// `rows8_vnni` built for `fmt`'s constants, over one or two weight rows
/// (`u.len()`).
///
/// # Safety
/// As `rows8_vnni`: AVX-512 VNNI + VL must be available.
pub(super) unsafe fn rows8_for(
    fmt: super::KFormat,
    u: &[super::Unpacked],
    xq: &super::Acts,
    g: &super::Rows8,
    blocks: std::ops::Range<usize>,
    out: &mut [[f32; 8]],
) {
    use super::KFormat::*;
    assert!(u.len() == out.len() && u.len() <= ROWS8_WIDTH);
    // SAFETY: the caller's guarantees; the constants are `fmt`'s.
    unsafe {
        match (u, out) {
            ([u0, u1], [o0, o1]) => {
                let mut o = [*o0, *o1];
                let b = blocks;
                match fmt {
                    Q4K | Q5K => rows8_vnni::<8, 8, true, 2>(fmt, [u0, u1], xq, g, b, &mut o),
                    Q6K => rows8_vnni::<16, 8, false, 2>(fmt, [u0, u1], xq, g, b, &mut o),
                }
                (*o0, *o1) = (o[0], o[1]);
            }
            ([u0], [o0]) => {
                let mut o = [*o0];
                let b = blocks;
                match fmt {
                    Q4K | Q5K => rows8_vnni::<8, 8, true, 1>(fmt, [u0], xq, g, b, &mut o),
                    Q6K => rows8_vnni::<16, 8, false, 1>(fmt, [u0], xq, g, b, &mut o),
                }
                *o0 = o[0];
            }
            _ => unreachable!("rows8_for takes one or two rows (asserted)"),
        }
    }
}

/// 32 bytes to `p`.
///
/// # Safety
/// `p..p + 32` must be writable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store(p: *mut u8, v: __m256i) {
    // SAFETY: the caller guarantees 32 writable bytes.
    unsafe { _mm256_storeu_si256(p as *mut __m256i, v) }
}

/// The unsigned codes of one block in element order (what
/// `Unpacked::new` writes with scalar code, the same bytes).
///
/// # Safety
/// AVX2 must be available; `blk` holds one block of `fmt` and `c` its
/// `fmt.block()` codes.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn unpack_codes(fmt: super::KFormat, blk: &[u8], c: &mut [u8]) {
    debug_assert!(c.len() >= fmt.block());
    // SAFETY: the caller's promises.
    let codes = unsafe { block_codes(fmt, blk) };
    for (i, v) in codes.into_iter().enumerate() {
        // SAFETY: `c` has 256 bytes.
        unsafe { store(c.as_mut_ptr().add(32 * i), v) };
    }
}

/// [`unpack_codes`]'s codes in registers: 32 per vector, in element
/// order.
///
/// # Safety
/// AVX2 must be available; `blk` holds one block of `fmt`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn block_codes(fmt: super::KFormat, blk: &[u8]) -> [__m256i; 8] {
    debug_assert!(blk.len() >= fmt.block_bytes());
    let m4 = _mm256_set1_epi8(0x0F);
    let mut out = [_mm256_setzero_si256(); 8];
    match fmt {
        super::KFormat::Q4K | super::KFormat::Q5K => {
            let (high, qs) = match fmt {
                super::KFormat::Q5K => (Some(&blk[16..48]), &blk[48..176]),
                _ => (None, &blk[16..144]),
            };
            let one = _mm256_set1_epi8(1);
            // SAFETY: `high` has 32 bytes when given.
            let hbits = high.map(|h| unsafe { load(h.as_ptr()) });
            for j in 0..4 {
                // SAFETY: `qs` has 128 bytes.
                let q = unsafe { load(qs.as_ptr().add(32 * j)) };
                let mut lo = _mm256_and_si256(q, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                if let Some(h) = hbits {
                    let b0 =
                        _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j as i32)), one);
                    let b1 = _mm256_and_si256(
                        _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j as i32 + 1)),
                        one,
                    );
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(b0));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(b1));
                }
                (out[2 * j], out[2 * j + 1]) = (lo, hi);
            }
        }
        super::KFormat::Q6K => {
            for half in 0..2 {
                // SAFETY: `blk` holds a whole Q6_K block.
                let q = unsafe { q6k_codes(blk, half) };
                out[4 * half..4 * half + 4].copy_from_slice(&q);
            }
        }
    }
    out
}

/// One block of activations quantized as [`super::Acts::new`] does it with
/// scalar code, the same bits: the largest `|v|` (NaN ignored, as
/// `f32::max` does: `max_ps` returns its second operand, the running
/// maximum, on a NaN), then each `v · (127 / amax)` rounded half away from
/// zero into -127..=127 by [`super::round_code`]'s steps (NaN gives 0), and
/// each 16 codes' sum. Returns the block's scale `amax / 127`.
///
/// # Safety
/// AVX2; `x.len()` and `codes.len()` equal, a multiple of 32; `sums` holds
/// `x.len() / 16` values.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_block(x: &[f32], codes: &mut [i8], sums: &mut [i32]) -> f32 {
    debug_assert!(
        x.len() == codes.len() && x.len().is_multiple_of(32) && sums.len() == x.len() / 16
    );
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut m = _mm256_setzero_ps();
    for c in x.chunks_exact(8) {
        // SAFETY: eight readable floats.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        m = _mm256_max_ps(_mm256_and_ps(v, abs), m);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: eight writable floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let amax = lanes.iter().fold(0f32, |a, &l| a.max(l));
    let (d, id) = if amax > 0.0 {
        (amax / 127.0, 127.0 / amax)
    } else {
        (0.0, 0.0)
    };
    let (idv, hi, lo) = (
        _mm256_set1_ps(id),
        _mm256_set1_ps(127.0),
        _mm256_set1_ps(-127.0),
    );
    let (half, mhalf) = (_mm256_set1_ps(0.5), _mm256_set1_ps(-0.5));
    let round = |v: __m256| {
        let t = _mm256_mul_ps(v, idv);
        // NaN to 0 (the cast's result), then clamp: `min_ps(hi, t)`
        // would pass a NaN on, so it is gone first.
        let t = _mm256_and_ps(t, _mm256_cmp_ps::<_CMP_ORD_Q>(t, t));
        let t = _mm256_max_ps(_mm256_min_ps(t, hi), lo);
        let i = _mm256_cvttps_epi32(t);
        let f = _mm256_sub_ps(t, _mm256_cvtepi32_ps(i));
        // Compare masks are -1 where true: i + (f >= .5) - (f <= -.5).
        let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(f, half));
        let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(f, mhalf));
        _mm256_add_epi32(_mm256_sub_epi32(i, up), down)
    };
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for ((c, o), s) in x
        .chunks_exact(32)
        .zip(codes.chunks_exact_mut(32))
        .zip(sums.chunks_exact_mut(2))
    {
        // SAFETY: 32 readable floats.
        let v = unsafe { [0, 8, 16, 24].map(|j| round(_mm256_loadu_ps(c.as_ptr().add(j)))) };
        s[0] = hsum_i32(_mm256_add_epi32(v[0], v[1]));
        s[1] = hsum_i32(_mm256_add_epi32(v[2], v[3]));
        // Within -127..=127: the packs do not saturate.
        let w = _mm256_packs_epi16(
            _mm256_packs_epi32(v[0], v[1]),
            _mm256_packs_epi32(v[2], v[3]),
        );
        // SAFETY: 32 writable bytes.
        unsafe {
            store(
                o.as_mut_ptr() as *mut u8,
                _mm256_permutevar8x32_epi32(w, order),
            )
        };
    }
    d
}
