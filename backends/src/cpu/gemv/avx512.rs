//! The int8 tile on 512-bit registers (AVX-512 F + BW + VNNI): two pairs
//! of blocks per step, so each instruction does twice the work of the
//! 256-bit kernels'. The integer block sums are the same, and pair `p`
//! lands in lanes `8 (p % 2) ..` of one accumulator, where the 256-bit
//! kernels keep even and odd pairs apart: every x86 path gives the same
//! bits. (`bench ops` with a cache-sized working set: the 256-bit Q4
//! kernels ran ~18 GB/s on two threads from L2, under the DRAM ceiling,
//! so decode was compute-bound.)

use std::arch::x86_64::*;

// The 256-bit AVX-512 VNNI kernel's helpers (same block layouts and
// integer sums): the last pair and an odd last block use them as is.
use super::vnni::avx512vnni::{
    block_bytes, dot_i8, dot_pair, load16, load32, scale_pairs, start, unpack_one, unpack_pair,
    Q4_0, Q4_1, Q5_0, Q8_0,
};
use super::vnni::dot4_avx512vnni;

/// # Safety
/// `p..p + 64` is readable.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load64<T>(p: *const T) -> __m512i {
    // SAFETY: the caller's contract (loadu has no alignment requirement).
    unsafe { _mm512_loadu_si512(p as *const __m512i) }
}

/// Blocks a, b, c, d's weights as (`A[0..16] B[0..16] C[0..16]
/// D[0..16]`, `A[16..32] B[16..32] C[16..32] D[16..32]`).
///
/// # Safety
/// The four pointers start whole blocks of format `F`.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
unsafe fn unpack_quad<const F: u8>(a: *const u8, bb: usize) -> (__m512i, __m512i) {
    // SAFETY: every load stays inside its block (as in the 256-bit
    // kernels' unpack_pair).
    unsafe {
        let (b, c, d) = (
            a.wrapping_add(bb),
            a.wrapping_add(2 * bb),
            a.wrapping_add(3 * bb),
        );
        if F == Q8_0 {
            // [A_lo A_hi B_lo B_hi] and [C_lo C_hi D_lo D_hi] -> lanes.
            let t0 = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(load32(a.wrapping_add(2))),
                load32(b.wrapping_add(2)),
            );
            let t1 = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(load32(c.wrapping_add(2))),
                load32(d.wrapping_add(2)),
            );
            return (
                _mm512_shuffle_i64x2::<0b10_00_10_00>(t0, t1),
                _mm512_shuffle_i64x2::<0b11_01_11_01>(t0, t1),
            );
        }
        let off = match F {
            Q4_1 => 4,
            Q5_0 => 6,
            _ => 2,
        };
        let ab = _mm256_set_m128i(load16(b.wrapping_add(off)), load16(a.wrapping_add(off)));
        let cd = _mm256_set_m128i(load16(d.wrapping_add(off)), load16(c.wrapping_add(off)));
        let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ab), cd);
        let m4 = _mm512_set1_epi8(0x0f);
        let (lo, hi) = (
            _mm512_and_si512(v, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
        );
        if F != Q5_0 {
            return (lo, hi);
        }
        // Q5_0's fifth bits (4 bytes after `d`): 128-bit lane i holds block
        // i's; low nibbles take bits 0-15, high ones 16-31, as 0x10.
        let qh = |p: *const u8| (p.wrapping_add(2) as *const i32).read_unaligned();
        let q4 = _mm_set_epi32(qh(d), qh(c), qh(b), qh(a));
        let rep = _mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
            _mm512_castsi128_si512(q4),
        );
        let bit = _mm512_set1_epi64(0x8040_2010_0804_0201_u64 as i64);
        let x10 = _mm512_set1_epi8(0x10);
        let fifth = |idx: __m512i| {
            let bytes = _mm512_shuffle_epi8(rep, idx);
            _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bytes, bit), x10)
        };
        let lo_idx = _mm512_set_epi64(
            0x0101_0101_0101_0101,
            0,
            0x0101_0101_0101_0101,
            0,
            0x0101_0101_0101_0101,
            0,
            0x0101_0101_0101_0101,
            0,
        );
        let hi_idx = _mm512_set_epi64(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
        );
        (
            _mm512_or_si512(lo, fifth(lo_idx)),
            _mm512_or_si512(hi, fifth(hi_idx)),
        )
    }
}

/// The f16 scales of blocks a..d as 8 floats `(d, m)` per block (`m`
/// +0 for formats without a minimum).
///
/// # Safety
/// `a` starts 4 whole blocks `bb` bytes apart.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn scales_quad<const F: u8>(a: *const u8, bb: usize) -> __m256 {
    // SAFETY: 16-byte loads at block starts stay inside the blocks.
    unsafe {
        let ab = _mm_unpacklo_epi32(load16(a), load16(a.wrapping_add(bb)));
        let cd = _mm_unpacklo_epi32(
            load16(a.wrapping_add(2 * bb)),
            load16(a.wrapping_add(3 * bb)),
        );
        let dm = _mm_unpacklo_epi64(ab, cd);
        let dm = if F == Q4_1 {
            dm
        } else {
            _mm_blend_epi16::<0b1010_1010>(dm, _mm_setzero_si128())
        };
        _mm256_cvtph_ps(dm)
    }
}

/// Byte indices, into (64 bytes from the first block, the fourth
/// block's 16 nibble bytes), of blocks a..d's nibble bytes, for blocks
/// of `bb` bytes whose nibbles start at `off`.
const fn nibble_index(bb: usize, off: usize) -> [u8; 64] {
    let mut idx = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let (blk, j) = (i / 16, i % 16);
        idx[i] = if blk == 3 { 64 + j } else { blk * bb + off + j } as u8;
        i += 1;
    }
    idx
}

/// Byte indices of blocks a..d's 4 header bytes (`d`, then `m` or the
/// first nibbles) in the first 64 bytes, in lanes 0-15.
const fn scale_index(bb: usize) -> [u8; 64] {
    let mut idx = [0u8; 64];
    let mut i = 0;
    while i < 16 {
        idx[i] = ((i / 4) * bb + i % 4) as u8;
        i += 1;
    }
    idx
}

static Q4_0_NIBBLES: [u8; 64] = nibble_index(18, 2);
static Q4_1_NIBBLES: [u8; 64] = nibble_index(20, 4);
static Q4_0_SCALES: [u8; 64] = scale_index(18);
static Q4_1_SCALES: [u8; 64] = scale_index(20);

/// [`unpack_quad`] and [`scales_quad`] for Q4_0 / Q4_1 with VBMI: the
/// four blocks' nibble bytes and f16 scales gathered by one two-source
/// and one one-source byte permute from a 64-byte and a 16-byte load
/// (instead of eight 16-byte loads and six inserts / unpacks). Same
/// values in the same lanes.
///
/// # Safety
/// `a` starts 4 whole blocks of format `F` (Q4_0 or Q4_1), 72 or 80
/// bytes: the 64-byte load stays inside them.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn quad_vbmi<const F: u8>(a: *const u8) -> (__m512i, __m512i, __m256) {
    let (nib, sca, off) = if F == Q4_1 {
        (&Q4_1_NIBBLES, &Q4_1_SCALES, 4)
    } else {
        (&Q4_0_NIBBLES, &Q4_0_SCALES, 2)
    };
    // SAFETY: the caller's contract; the tables are 64 bytes.
    unsafe {
        let v0 = load64(a);
        let v1 = _mm512_castsi128_si512(load16(a.wrapping_add(3 * block_bytes(F) + off)));
        let v = _mm512_permutex2var_epi8(v0, load64(nib.as_ptr()), v1);
        let m4 = _mm512_set1_epi8(0x0f);
        // Q4_0 has no minimum: its lanes of `m` are zeroed (+0, as
        // scales_quad gives).
        let keep: u64 = if F == Q4_1 { 0xffff } else { 0x3333 };
        let dm = _mm512_maskz_permutexvar_epi8(keep, load64(sca.as_ptr()), v0);
        (
            _mm512_and_si512(v, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
            _mm256_cvtph_ps(_mm512_castsi512_si128(dm)),
        )
    }
}

/// `acc + sum w * x` per i32 lane (4 products each); Q8_0's weights are
/// signed (the unsigned operand is |w|, x carries w's sign).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn dot<const F: u8>(acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
    if F == Q8_0 {
        let neg = _mm512_movepi8_mask(w);
        let xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
        // Where w is 0 the product is 0 whatever x's sign.
        return _mm512_dpbusd_epi32(acc, _mm512_abs_epi8(w), xs);
    }
    _mm512_dpbusd_epi32(acc, w, x)
}

/// The wide `tile` for one feature set: `$vbmi` gathers Q4 blocks with
/// [`quad_vbmi`].
macro_rules! wide_tile {
    ($name:ident, $features:literal, $vbmi:literal) => {
        /// As the 256-bit kernels' `tile` (same contract and result bits).
        ///
        /// # Safety
        /// AVX2, FMA, F16C, AVX-512 F / BW / VL / VNNI (and VBMI for the
        /// VBMI instance) available; the pointers as the 256-bit `tile`
        /// requires.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<const F: u8, const RX: usize, const RW: usize>(
            w: [*const u8; RW],
            x: [*const i8; RX],
            xs: [*const f32; RX],
            xo: [*const i32; RX],
            nb: usize,
        ) -> [[f32; RW]; RX] {
            let bb = block_bytes(F);
            // Lanes 0-7: even pairs, 8-15: odd pairs.
            let mut acc = [[_mm512_setzero_ps(); RW]; RX];
            let to_scale = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
            let to_min = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
            let to_scale8 = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);
            let to_min8 = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
            let pairs = nb / 2;
            let pf = 2 * RW * nb * bb;
            // SAFETY: quad q reads blocks 4q..4q + 4 <= 2 * pairs <= nb of every
            // weight row, codes 128q..128q + 128, scales 8q..8q + 8 and (Q4_0,
            // Q5_0) offsets 16q..16q + 16 of every activation row; a last odd pair and
            // an odd last block read what the 256-bit kernel reads for them (the
            // contract covers all of it). Prefetches never fault.
            unsafe {
                for q in 0..pairs / 2 {
                    let p = 2 * q;
                    // Each activation row's codes, offsets and scales of this
                    // quad, shared by the tile's weight rows.
                    let xv: [_; RX] = std::array::from_fn(|i| {
                        let xp = x[i].wrapping_add(64 * p);
                        let (x0, x1) = (load64(xp), load64(xp.wrapping_add(64)));
                        // Pair layout [A_lo B_lo A_hi B_hi][C_lo D_lo C_hi D_hi]
                        // -> [A_lo B_lo C_lo D_lo], [A_hi B_hi C_hi D_hi].
                        let xl = _mm512_shuffle_i64x2::<0b01_00_01_00>(x0, x1);
                        let xh = _mm512_shuffle_i64x2::<0b11_10_11_10>(x0, x1);
                        let init = if F == Q4_0 || F == Q5_0 {
                            _mm512_sub_epi32(
                                _mm512_setzero_si512(),
                                load64(xo[i].wrapping_add(8 * p)),
                            )
                        } else {
                            _mm512_setzero_si512()
                        };
                        (xl, xh, init, _mm256_loadu_ps(xs[i].wrapping_add(4 * p)))
                    });
                    for r in 0..RW {
                        let a = w[r].wrapping_add(2 * p * bb);
                        _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add(pf) as *const i8);
                        _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add(pf + 2 * bb) as *const i8);
                        let (lo, hi, dm) = if $vbmi && (F == Q4_0 || F == Q4_1) {
                            quad_vbmi::<F>(a)
                        } else {
                            let (lo, hi) = unpack_quad::<F>(a, bb);
                            (lo, hi, scales_quad::<F>(a, bb))
                        };
                        for (i, &(xl, xh, init, xsc)) in xv.iter().enumerate() {
                            let s = dot::<F>(dot::<F>(init, lo, xl), hi, xh);
                            let sc = _mm512_castps256_ps512(_mm256_mul_ps(dm, xsc));
                            let mut v = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(s),
                                _mm512_permutexvar_ps(to_scale, sc),
                                acc[i][r],
                            );
                            if F == Q4_1 {
                                v = _mm512_add_ps(v, _mm512_permutexvar_ps(to_min, sc));
                            }
                            acc[i][r] = v;
                        }
                    }
                }
                if pairs % 2 == 1 {
                    // The last pair (even): the 256-bit kernel's step on lanes 0-7.
                    let p = pairs - 1;
                    for r in 0..RW {
                        let a = w[r].wrapping_add(2 * p * bb);
                        let b = a.wrapping_add(bb);
                        let (l, h) = unpack_pair::<F>(a, b);
                        let dm = _mm_cvtph_ps(scale_pairs::<F>(load16(a), load16(b)));
                        for i in 0..RX {
                            let xp = x[i].wrapping_add(64 * p);
                            let init = start::<F>(xo[i], p);
                            let s =
                                dot_pair::<F>(init, l, h, load32(xp), load32(xp.wrapping_add(32)));
                            let xsc = _mm_castsi128_ps(load16(xs[i].wrapping_add(4 * p)));
                            let sc = _mm256_castps128_ps256(_mm_mul_ps(dm, xsc));
                            let lo8 = _mm512_castps512_ps256(acc[i][r]);
                            let mut v = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(s),
                                _mm256_permutevar8x32_ps(sc, to_scale8),
                                lo8,
                            );
                            if F == Q4_1 {
                                v = _mm256_add_ps(v, _mm256_permutevar8x32_ps(sc, to_min8));
                            }
                            acc[i][r] = set_low(acc[i][r], v);
                        }
                    }
                }
                if nb % 2 == 1 {
                    let (b, p) = (nb - 1, nb / 2);
                    for r in 0..RW {
                        let a = w[r].wrapping_add(b * bb);
                        let wv = unpack_one::<F>(a);
                        let first = load16(a);
                        let dm = _mm_cvtph_ps(scale_pairs::<F>(first, first));
                        for i in 0..RX {
                            let init = start::<F>(xo[i], p);
                            let s = dot_i8::<F>(init, wv, load32(x[i].wrapping_add(32 * b)));
                            let xsc = _mm_castsi128_ps(load16(xs[i].wrapping_add(4 * p)));
                            let sc = _mm_mul_ps(dm, xsc);
                            let lo8 = _mm512_castps512_ps256(acc[i][r]);
                            let mut v = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(s),
                                _mm256_broadcastss_ps(sc),
                                lo8,
                            );
                            if F == Q4_1 {
                                let m = _mm_shuffle_ps::<0b01_01_01_01>(sc, sc);
                                v = _mm256_add_ps(v, _mm256_set_m128(m, m));
                            }
                            acc[i][r] = set_low(acc[i][r], v);
                        }
                    }
                }
            }
            let mut out = [[0f32; RW]; RX];
            for i in 0..RX {
                for r in 0..RW {
                    let e = _mm512_castps512_ps256(acc[i][r]);
                    let o =
                        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[i][r])));
                    out[i][r] = super::avx2::hsum(_mm256_add_ps(e, o));
                }
            }
            out
        }
    };
}

wide_tile!(
    tile,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    false
);
wide_tile!(
    tile_vbmi,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi",
    true
);

/// `acc` with lanes 0-7 replaced by `v`.
#[target_feature(enable = "avx512f")]
#[inline]
fn set_low(acc: __m512, v: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<0>(
        _mm512_castps_pd(acc),
        _mm256_castps_pd(v),
    ))
}

#[cfg(target_arch = "x86_64")]
int8_kernels!(
    avx512wide,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    super::dot4_avx512vnni,
    true,
    true,
    false
);
#[cfg(target_arch = "x86_64")]
int8_kernels!(
    avx512vbmi,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi",
    super::dot4_avx512vnni,
    true,
    true,
    true
);
