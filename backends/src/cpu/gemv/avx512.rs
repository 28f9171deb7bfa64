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
    block_bytes, load16, load32, odd_terms, pair_terms, row_scales, Q4_0, Q4_1, Q5_0, Q8_0,
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

/// Byte `pos` of a Q5_0 quad (four 22-byte blocks) in a two-source byte
/// permute over its first 64 bytes and the 64 from byte 24 (the quad's
/// last 64).
const fn q5_pos(pos: usize) -> u8 {
    if pos < 64 {
        pos as u8
    } else {
        (pos + 40) as u8
    }
}

/// Permute indices of a Q5_0 quad's parts into [`quad5_vbmi`]'s lanes:
/// 0, the nibble bytes (128-bit lane i: block i's 16); 1, each block's
/// four `qh` bytes at the start of both 64-bit words of its lane (for
/// the bit shuffles); 2, the f16 `d` of each block in lanes `4i, 4i + 1`
/// of the first 16 bytes.
const fn q5_index(part: usize) -> [u8; 64] {
    let mut idx = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let (blk, j) = (i / 16, i % 16);
        let pos = match part {
            0 => blk * 22 + 6 + j,
            1 => blk * 22 + 2 + i % 8 % 4,
            _ => (i / 4) * 22 + i % 4 % 2,
        };
        idx[i] = q5_pos(pos);
        i += 1;
    }
    idx
}

static Q5_0_INDICES: [[u8; 64]; 3] = [q5_index(0), q5_index(1), q5_index(2)];

/// Bit indices into each 64-bit word's `qh` for the low nibbles' fifth
/// bits (byte j of word w: bit `8 (w % 2) + j`) and, 16 on, the high
/// nibbles'.
const fn q5_bits(hi: bool) -> [u8; 64] {
    let mut idx = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        idx[i] = ((i / 8) % 2 * 8 + i % 8 + if hi { 16 } else { 0 }) as u8;
        i += 1;
    }
    idx
}

static Q5_0_BITS: [[u8; 64]; 2] = [q5_bits(false), q5_bits(true)];

/// [`unpack_quad`] and [`scales_quad`] for Q5_0 with VBMI and BITALG:
/// the four blocks' nibble bytes, `qh` words and f16 scales picked by
/// byte permutes from two 64-byte loads (instead of eight 16-byte loads,
/// four scalar ones and their inserts), each code's fifth bit by one bit
/// shuffle per 64 codes (`vpshufbitqmb`: 6 % faster on one Zen 4 thread
/// than two byte permutes and tests). Same values in the same lanes.
///
/// # Safety
/// `a` starts 4 whole Q5_0 blocks (88 bytes).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vbmi,avx512bitalg")]
#[inline]
unsafe fn quad5_vbmi(a: *const u8) -> (__m512i, __m512i, __m256) {
    let [nib, qh, sca] = &Q5_0_INDICES;
    let [blo, bhi] = &Q5_0_BITS;
    // SAFETY: the caller's contract (bytes 0..64 and 24..88); the tables
    // are 64 bytes.
    unsafe {
        let (v0, v1) = (load64(a), load64(a.wrapping_add(24)));
        let pick = |t: &[u8; 64]| _mm512_permutex2var_epi8(v0, load64(t.as_ptr()), v1);
        let v = pick(nib);
        let q = pick(qh);
        let m4 = _mm512_set1_epi8(0x0f);
        let x10 = _mm512_set1_epi8(0x10);
        // Each code byte's fifth bit as a mask bit (one bit shuffle per
        // 64 codes); the nibbles are below 0x10, so adding it where set
        // or-s it in.
        let fifth = |c: __m512i, t: &[u8; 64]| {
            _mm512_mask_add_epi8(
                c,
                _mm512_bitshuffle_epi64_mask(q, load64(t.as_ptr())),
                c,
                x10,
            )
        };
        // `d` of each block in lanes 4i, 4i + 1; the minimum lanes +0.
        let dm = _mm512_maskz_permutex2var_epi8(0x3333, v0, load64(sca.as_ptr()), v1);
        (
            fifth(_mm512_and_si512(v, m4), blo),
            fifth(_mm512_and_si512(_mm512_srli_epi16::<4>(v), m4), bhi),
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
            gx: [*const f32; 2],
            nb: usize,
        ) -> [[f32; RW]; RX] {
            debug_assert!((RX == 1 && RW <= 4) || RX == 4);
            let bb = block_bytes(F);
            // As the 256-bit tile's, in one register: lanes 4c..4c + 4
            // are chain c (blocks b with b % 4 = c).
            let mut acc = [_mm512_setzero_ps(); RW];
            let to_scale = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
            let to_min = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
            let w4: [*const u8; 4] = std::array::from_fn(|r| w[r.min(RW - 1)]);
            let pairs = nb / 2;
            let pf = 2 * RW * nb * bb;
            // The rows two tiles on are fetched into L1, or on AMD's
            // AVX-512 CPUs into L2: there the L1 hint slowed Qwen2.5-0.5B
            // decode (mostly Q5_0, a Q8_0 head) to 46-49 tokens/s against
            // 66-68 (EPYC Zen 4, two threads; no prefetch at all: 33-34).
            let l2 = crate::cpu::amd_avx512();
            // SAFETY: quad q reads blocks 4q..4q + 4 <= 2 * pairs <= nb of every
            // weight row, codes 128q..128q + 128, scales 8q..8q + 8, (Q4_0,
            // Q5_0) offsets 16q..16q + 16 of every activation row and group
            // values 16q..16q + 16; a last odd pair and an odd last block read
            // what the 256-bit kernel reads for them (the contract covers all
            // of it). Prefetches never fault.
            unsafe {
                for q in 0..pairs / 2 {
                    let p = 2 * q;
                    // Each activation row's codes, offsets and scales of this
                    // quad, shared by the tile's weight rows.
                    let xv: [_; RX] = std::array::from_fn(|i| {
                        let xp = x[i].wrapping_add(64 * p);
                        let (x0, x1) = (load64(xp), load64(xp.wrapping_add(64)));
                        // Pair layout [A_lo B_lo A_hi B_hi][C_lo D_lo C_hi D_hi]
                        // to the weights' [A_lo B_lo C_lo D_lo], [A_hi ...].
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
                        (xl, xh, init)
                    });
                    let mut s = [[_mm512_setzero_si512(); RW]; RX];
                    let mut dm = [_mm256_setzero_ps(); RW];
                    for r in 0..RW {
                        let a = w[r].wrapping_add(2 * p * bb);
                        // Every line of the quad's span: one prefetch per
                        // pair missed one line in 17 of Q8_0's (68-byte
                        // pairs), each a stall on DRAM; Qwen2.5-0.5B's
                        // Q8_0 head (151936 x 896) took 7.2 ms on two
                        // threads, now 2.9 (EPYC Zen 4).
                        let mut o = 0;
                        while o < 4 * bb {
                            let p0 = a.wrapping_add(pf + o) as *const i8;
                            if l2 {
                                _mm_prefetch::<_MM_HINT_T1>(p0);
                            } else {
                                _mm_prefetch::<_MM_HINT_T0>(p0);
                            }
                            o += 64;
                        }
                        let (lo, hi, d) = if $vbmi && (F == Q4_0 || F == Q4_1) {
                            quad_vbmi::<F>(a)
                        } else if $vbmi && F == Q5_0 {
                            quad5_vbmi(a)
                        } else {
                            let (lo, hi) = unpack_quad::<F>(a, bb);
                            (lo, hi, scales_quad::<F>(a, bb))
                        };
                        dm[r] = d;
                        for (i, &(xl, xh, init)) in xv.iter().enumerate() {
                            s[i][r] = dot::<F>(dot::<F>(init, lo, xl), hi, xh);
                        }
                    }
                    if RX == 1 {
                        // The rows' scales `[block][row]` (and minima):
                        // where VBMI unpacked Q4 quads, transposed from
                        // their registers (Q4_1 decode 10 % faster on one
                        // Zen 4 thread; Q5_0's unchanged), else loaded
                        // again.
                        let (d, m) = if $vbmi && (F == Q4_0 || F == Q4_1) {
                            let dm4: [__m256; 4] = std::array::from_fn(|r| dm[r.min(RW - 1)]);
                            transpose_scales(dm4)
                        } else {
                            let (dab, mab) = row_scales::<F>(w4, p);
                            let (dcd, mcd) = row_scales::<F>(w4, p + 1);
                            (join(dab, dcd), join(mab, mcd))
                        };
                        let xsc =
                            _mm512_castps256_ps512(_mm256_loadu_ps(xs[0].wrapping_add(4 * p)));
                        let sc = _mm512_mul_ps(d, _mm512_permutexvar_ps(to_scale, xsc));
                        let s4 = std::array::from_fn(|r| s[0][r.min(RW - 1)]);
                        let mut v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(reduce4w(s4)), sc, acc[0]);
                        if F == Q4_1 {
                            let sx = _mm512_permutexvar_ps(to_min, xsc);
                            v = _mm512_add_ps(v, _mm512_mul_ps(m, sx));
                        }
                        acc[0] = v;
                    } else {
                        let dx = _mm512_loadu_ps(gx[0].wrapping_add(8 * p));
                        for r in 0..RW {
                            let dw = _mm512_castps256_ps512(dm[r]);
                            let sc = _mm512_mul_ps(_mm512_permutexvar_ps(to_scale, dw), dx);
                            let s4 = std::array::from_fn(|i| s[i][r]);
                            let mut v =
                                _mm512_fmadd_ps(_mm512_cvtepi32_ps(reduce4w(s4)), sc, acc[r]);
                            if F == Q4_1 {
                                let sx = _mm512_loadu_ps(gx[1].wrapping_add(8 * p));
                                let mw = _mm512_permutexvar_ps(to_min, dw);
                                v = _mm512_add_ps(v, _mm512_mul_ps(mw, sx));
                            }
                            acc[r] = v;
                        }
                    }
                }
                let groups = if RX == 1 { 1 } else { RW };
                if pairs % 2 == 1 {
                    // Blocks 2p, 2p + 1 (chains 0, 1: the low half).
                    let p = pairs - 1;
                    let t = pair_terms::<F, RX, RW>(w, x, xs, xo, gx, p, 0);
                    for (a, (s, sc, min)) in acc.iter_mut().zip(t).take(groups) {
                        let lo = _mm512_castps512_ps256(*a);
                        let mut v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, lo);
                        if F == Q4_1 {
                            v = _mm256_add_ps(v, min);
                        }
                        *a = set_low(*a, v);
                    }
                }
                if nb % 2 == 1 {
                    // Block nb - 1: chain (nb - 1) % 4 (0 or 2), lanes 0-3
                    // or 8-11.
                    let third = (nb - 1) % 4 == 2;
                    let t = odd_terms::<F, RX, RW>(w, x, xs, xo, gx, nb);
                    for (a, (s, sc, min)) in acc.iter_mut().zip(t).take(groups) {
                        *a = add_quarter(*a, third, s, sc, min);
                    }
                }
            }
            let mut out = [[0f32; RW]; RX];
            if RX == 1 {
                let y = finish_wide(acc[0]);
                out[0].copy_from_slice(&y[..RW]);
            } else {
                for (r, a) in acc.iter().enumerate() {
                    for (i, v) in finish_wide(*a).into_iter().enumerate() {
                        out[i][r] = v;
                    }
                }
            }
            out
        }
    };
}

/// Four weight rows' quad scales as [`scales_quad`] gives them (row r:
/// `(d, m)` of blocks A..D, eight lanes) to `(d, m)` in the order
/// [`row_scales`] gives two pairs: lane `4 b + r` block b, row r.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose_scales(dm: [__m256; 4]) -> (__m512, __m512) {
    // Rows 0, 1 in lanes 0-15 and rows 2, 3 in 16-31 of the two sources.
    let (a, b) = (join(dm[0], dm[1]), join(dm[2], dm[3]));
    let pick = |idx: &[i32; 16]| {
        // SAFETY: 64 bytes.
        let idx = unsafe { _mm512_loadu_si512(idx.as_ptr() as *const __m512i) };
        _mm512_permutex2var_ps(a, idx, b)
    };
    (pick(&SCALE_ORDER[0]), pick(&SCALE_ORDER[1]))
}

/// [`transpose_scales`]' lanes: lane `4 b + r` takes row r's lane `2 b`
/// (`d`; `2 b + 1`, `m`, in the second table), row r at `16 (r / 2) + 8
/// (r % 2)` of the two sources.
const fn scale_order(second: i32) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut l = 0;
    while l < 16 {
        let (blk, row) = (l as i32 / 4, l as i32 % 4);
        idx[l] = 16 * (row / 2) + 8 * (row % 2) + 2 * blk + second;
        l += 1;
    }
    idx
}

static SCALE_ORDER: [[i32; 16]; 2] = [scale_order(0), scale_order(1)];

/// Per 128-bit lane (one block), the totals of the four i32 lanes of each
/// of `s[0..4]`, in that order (the 256-bit `reduce4`, four blocks wide).
#[target_feature(enable = "avx512f")]
#[inline]
fn reduce4w(s: [__m512i; 4]) -> __m512i {
    let t0 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(s[0], s[1]),
        _mm512_unpackhi_epi32(s[0], s[1]),
    );
    let t1 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(s[2], s[3]),
        _mm512_unpackhi_epi32(s[2], s[3]),
    );
    _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1))
}

/// `lo` in lanes 0-7, `hi` in 8-15.
#[target_feature(enable = "avx512f")]
#[inline]
fn join(lo: __m256, hi: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
        _mm256_castps_pd(hi),
    ))
}

/// `acc` with an odd last block's sums `s` (times `sc`, plus `min`) added
/// into lanes 0-3 or, for `third`, 8-11.
#[target_feature(enable = "avx512f,fma")]
#[inline]
fn add_quarter(acc: __m512, third: bool, s: __m128i, sc: __m128, min: Option<__m128>) -> __m512 {
    let lane = if third {
        _mm512_extractf32x4_ps::<2>(acc)
    } else {
        _mm512_castps512_ps128(acc)
    };
    let mut v = _mm_fmadd_ps(_mm_cvtepi32_ps(s), sc, lane);
    if let Some(m) = min {
        v = _mm_add_ps(v, m);
    }
    if third {
        _mm512_insertf32x4::<2>(acc, v)
    } else {
        _mm512_insertf32x4::<0>(acc, v)
    }
}

/// Four outputs from one register of chains (lanes 4c..4c + 4: chain c):
/// `(c0 + c2) + (c1 + c3)`, as the 256-bit `finish`.
#[target_feature(enable = "avx512f")]
#[inline]
fn finish_wide(acc: __m512) -> [f32; 4] {
    let lo = _mm512_castps512_ps256(acc);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    let t = _mm256_add_ps(lo, hi);
    let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
    let mut out = [0f32; 4];
    // SAFETY: 16 writable bytes.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), u) };
    out
}

wide_tile!(
    tile,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    false
);
wide_tile!(
    tile_vbmi,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg",
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
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg",
    super::dot4_avx512vnni,
    true,
    true,
    true
);
