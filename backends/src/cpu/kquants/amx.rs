//! The K-quant prefill kernel on Intel AMX (Sapphire Rapids and later):
//! sixteen weight rows against sixteen activation rows per tile multiply.
//!
//! Once per sixteen weight rows the codes are unpacked in registers and the
//! group scales folded into them: `p = sc · q` (Q6_K: `sc · (q - 32) +
//! 4096`, its scales being signed), split into two unsigned bytes `p = 256
//! · hi + lo` laid out as A tiles ([`Weights16`]); the next sixteen rows
//! are prefetched meanwhile. The sixteen activation rows' int8 codes are
//! laid out once per call as B tiles ([`Rows16`]). A block is then four
//! 64-code steps of two `tdpbusd` (`lo`, `hi`) into two accumulator tiles,
//! and its exact integer sums are `256 · hi + lo` (less `4096 · Σx` for
//! Q6_K): the `Σ_groups sc · Σ q·x` of every other path (Q6_K: with its
//! codes' bias taken off). AVX-512 adds the minima's correction (VNNI, one
//! `vpdpwssd` per pair of groups) and runs the f32 steps of the module docs
//! with one lane per activation row, in the same order: the same bits. Each
//! weight tile serves two groups of activation rows. The tile instructions
//! are inline assembly (Rust's AMX intrinsics are not stable); Linux must
//! grant the process the tile state first ([`available`]).

pub(super) use super::decode::Ahead;
use super::{Acts, KFormat, Unpacked};
pub(crate) use crate::cpu::amx::{available, transpose16, Tiles};
use std::arch::asm;
use std::arch::x86_64::*;

/// Sixteen activation rows of [`Acts`] laid out for the AMX kernel (rows
/// past the end repeat the last row; their lanes are dropped).
pub(crate) struct Rows16 {
    /// First row.
    pub(super) r0: usize,
    /// Rows that are real (1 to 16).
    pub(super) rows: usize,
    /// The codes as B tiles: per 4 consecutive codes one tile row of 16
    /// lanes x 4 bytes, so each 64 codes are one 16 x 64 tile.
    tiles: Vec<i8>,
    /// `[block][lane]` scales.
    dx: Vec<f32>,
    /// `[block][group pair][lane][2]` code sums (as `Rows8::gs`).
    gs: Vec<i16>,
}

impl Rows16 {
    pub(super) fn new(fmt: KFormat, xq: &Acts, m: usize, r0: usize) -> Self {
        let k = xq.k;
        let nb = k / xq.block;
        let rows = (m - r0).min(16);
        let mut tiles = vec![0i8; 16 * k];
        let mut dx = vec![0f32; nb * 16];
        let mut gs = vec![0i16; nb * fmt.groups() * 16];
        for lane in 0..16 {
            let r = r0 + lane.min(rows - 1);
            for (t, four) in xq.codes(r).chunks_exact(4).enumerate() {
                tiles[64 * t + 4 * lane..64 * t + 4 * lane + 4].copy_from_slice(four);
            }
            super::fill_lane(fmt, xq, r, (16, lane), &mut dx, &mut gs);
        }
        Rows16 {
            r0,
            rows,
            tiles,
            dx,
            gs,
        }
    }
}

/// Sixteen weight rows laid out for the AMX kernel: the group scales
/// folded into the codes, `p = sc · (q - bias) + offset` (Q4_K / Q5_K: at
/// most 63 · 31 = 1953, bias and offset 0; Q6_K: its codes' bias of 32
/// too, so `p` is 32..=8192 with offset 4096, its scales being signed),
/// split into two unsigned bytes `p = 256 · hi + lo`, each laid out as A
/// tiles of 16 rows x 64 codes (1,024 contiguous bytes per tile).
#[derive(Default)]
pub(super) struct Weights16 {
    lo: Vec<u8>,
    hi: Vec<u8>,
}

/// [`Weights16`]'s offset for Q6_K: `sc · (q - 32)` is -4064..=4096.
const Q6K_OFFSET: i16 = 4096;

/// Q6_K's code bias: its weights are `d · sc · (q - 32)`.
const Q6K_BIAS: i16 = 32;

impl Weights16 {
    /// Lays out the sixteen rows `rows` (raw blocks of `fmt`, `k` codes
    /// each; `u` the same rows' [`Unpacked::refill_scales`]) in the buffers
    /// already here: no allocation once they have grown to `16 k` bytes.
    /// The codes are unpacked in registers straight into the tiles.
    pub(super) fn fill(&mut self, fmt: KFormat, rows: &[&[u8]; 16], u: &[Unpacked], k: usize) {
        debug_assert!(u.len() == 16);
        let bias_offset = match fmt {
            KFormat::Q4K | KFormat::Q5K => (0, 0),
            KFormat::Q6K => (Q6K_BIAS, Q6K_OFFSET),
        };
        // Every byte is written below; `resize` only zeroes on growth.
        self.lo.resize(16 * k, 0);
        self.hi.resize(16 * k, 0);
        let rb = k / 256 * fmt.block_bytes();
        for (r, (row, u)) in rows.iter().zip(u).enumerate() {
            assert!(row.len() == rb && u.scales.len() == k / 16);
            // SAFETY: AVX2 and AVX-512 F + BW + VBMI are here (`available`, which
            // every caller of the AMX kernel checked); `row` holds k / 256
            // blocks of `fmt` and `u.scales` their k / 16 scales (just
            // asserted); `lo` and `hi` hold 16 k bytes.
            unsafe {
                fill_row(
                    fmt,
                    row,
                    &u.scales,
                    bias_offset,
                    r,
                    &mut self.lo,
                    &mut self.hi,
                )
            };
        }
    }
}

/// Row `r` of every tile of [`Weights16`] from its raw blocks `row` and
/// its scales (one per 16 codes).
///
/// # Safety
/// AVX2 and AVX-512 F + BW + VBMI; `row` whole blocks of `fmt`, `scales` one per
/// 16 of their codes, `lo` and `hi` 16 bytes per code of `row`.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
unsafe fn fill_row(
    fmt: KFormat,
    row: &[u8],
    scales: &[i16],
    bias_offset: (i16, i16),
    r: usize,
    lo: &mut [u8],
    hi: &mut [u8],
) {
    for (b, blk) in row.chunks_exact(fmt.block_bytes()).enumerate() {
        // SAFETY: `blk` is one block of `fmt`; AVX2 is here.
        let codes = unsafe { super::avx2::block_codes(fmt, blk) };
        for q in 0..4 {
            // Tile c holds codes 64 c..64 c + 64 of each row, row r at
            // byte 64 r.
            let (c, at) = (4 * b + q, 1024 * (4 * b + q) + 64 * r);
            // SAFETY: AVX-512 F + BW + VBMI; four scales, 64 bytes of each
            // output (the caller's sizes).
            unsafe {
                scale_split(
                    [codes[2 * q], codes[2 * q + 1]],
                    &scales[4 * c..4 * c + 4],
                    bias_offset,
                    &mut lo[at..at + 64],
                    &mut hi[at..at + 64],
                )
            };
        }
    }
}

/// `p = scales[i / 16] · (codes[i] - bias) + offset` for 64 codes (two
/// vectors of 32), split into `lo[i] = p mod 256` and `hi[i] = p / 256`.
///
/// # Safety
/// AVX-512 F + BW + VBMI; `lo` and `hi` hold 64 bytes, `scales` 4 values; every
/// `p` within 0..32768 (exact in i16: codes below 64, bias 32 and scales
/// within -128..128 with offset 4096, or non-negative scales below 64 with
/// bias and offset 0 and codes below 32).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn scale_split(
    halves: [__m256i; 2],
    scales: &[i16],
    (bias, offset): (i16, i16),
    lo: &mut [u8],
    hi: &mut [u8],
) {
    debug_assert!(scales.len() == 4 && lo.len() == 64 && hi.len() == 64);
    let p: [__m512i; 2] = std::array::from_fn(|h| {
        let q = _mm512_sub_epi16(_mm512_cvtepu8_epi16(halves[h]), _mm512_set1_epi16(bias));
        let sv = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi16(scales[2 * h])),
            _mm256_set1_epi16(scales[2 * h + 1]),
        );
        _mm512_add_epi16(_mm512_mullo_epi16(q, sv), _mm512_set1_epi16(offset))
    });
    // The low bytes of the 64 words are the even bytes of p[0] ++ p[1],
    // the high bytes the odd ones: one byte permute each.
    let even = _mm512_set_epi8(
        126, 124, 122, 120, 118, 116, 114, 112, 110, 108, 106, 104, 102, 100, 98, 96, 94, 92, 90,
        88, 86, 84, 82, 80, 78, 76, 74, 72, 70, 68, 66, 64, 62, 60, 58, 56, 54, 52, 50, 48, 46, 44,
        42, 40, 38, 36, 34, 32, 30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0,
    );
    let odd = _mm512_add_epi8(even, _mm512_set1_epi8(1));
    // SAFETY: 64 bytes of each output.
    unsafe {
        _mm512_storeu_si512(
            lo.as_mut_ptr() as *mut __m512i,
            _mm512_permutex2var_epi8(p[0], even, p[1]),
        );
        _mm512_storeu_si512(
            hi.as_mut_ptr() as *mut __m512i,
            _mm512_permutex2var_epi8(p[0], odd, p[1]),
        );
    }
}

/// Block `b`'s f32 contribution added to `acc` (one register per weight
/// row, one lane per activation row) from the block's exact integer sums
/// `isum`: for Q4_K / Q5_K (`MINMAX`) the minima's integer correction, one
/// `vpdpwssd` per pair of groups; then the f32 steps of the module docs in
/// their order. Q6_K's sums need no correction here: its bias is folded
/// into the weights ([`Weights16`]) and its offset taken off in
/// [`block_sums`].
///
/// # Safety
/// AVX-512 F + BW + VNNI; `u` sixteen rows and `x` made for the same
/// format (`NG` groups per block) and row length, `b` one of its blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn finish_block<const NG: usize, const MINMAX: bool>(
    u: &[Unpacked],
    x: &Rows16,
    b: usize,
    isum: &[__m512i; 16],
    acc: &mut [__m512; 16],
) {
    // SAFETY: b * 16 + 16 <= x.dx.len().
    let dx = unsafe { _mm512_loadu_ps(x.dx.as_ptr().add(b * 16)) };
    for ((a, s), u) in acc.iter_mut().zip(isum).zip(u) {
        let ddx = _mm512_mul_ps(_mm512_set1_ps(u.d[b]), dx);
        let v = if MINMAX {
            let mut gsum = _mm512_setzero_si512();
            for p in 0..NG / 2 {
                // SAFETY: (b * NG / 2 + p) * 32 + 32 <= x.gs.len() and
                // b * NG / 2 + p < u.min_pairs.len().
                let (gv, mp) = unsafe {
                    (
                        _mm512_loadu_si512(
                            x.gs.as_ptr().add((b * NG / 2 + p) * 32) as *const __m512i
                        ),
                        *u.min_pairs.get_unchecked(b * NG / 2 + p),
                    )
                };
                gsum = _mm512_dpwssd_epi32(gsum, gv, _mm512_set1_epi32(mp));
            }
            _mm512_sub_ps(
                _mm512_mul_ps(ddx, _mm512_cvtepi32_ps(*s)),
                _mm512_mul_ps(
                    _mm512_mul_ps(_mm512_set1_ps(u.dmin[b]), dx),
                    _mm512_cvtepi32_ps(gsum),
                ),
            )
        } else {
            _mm512_mul_ps(ddx, _mm512_cvtepi32_ps(*s))
        };
        *a = _mm512_add_ps(*a, v);
    }
}

/// The block's exact integer sums, one register per weight row, from the
/// two stored tiles `lo` and `hi`: `256 · hi + lo`, less `4096 · Σx` for
/// Q6_K (not `MINMAX`), `Σx` the block's code sums of each lane from `x`.
///
/// # Safety
/// AVX-512 F + BW; `x` made for a format of `NG` groups, `b` its block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn block_sums<const NG: usize, const MINMAX: bool>(
    lo: &[[i32; 16]; 16],
    hi: &[[i32; 16]; 16],
    x: &Rows16,
    b: usize,
) -> [__m512i; 16] {
    let mut off = _mm512_setzero_si512();
    if !MINMAX {
        // Σx of each lane: the group sums, pairwise by `madd` with ones.
        for p in 0..NG / 2 {
            // SAFETY: (b * NG / 2 + p) * 32 + 32 <= x.gs.len().
            let gv = unsafe {
                _mm512_loadu_si512(x.gs.as_ptr().add((b * NG / 2 + p) * 32) as *const __m512i)
            };
            off = _mm512_add_epi32(off, _mm512_madd_epi16(gv, _mm512_set1_epi16(1)));
        }
        off = _mm512_mullo_epi32(off, _mm512_set1_epi32(i32::from(Q6K_OFFSET)));
    }
    let mut isum = [_mm512_setzero_si512(); 16];
    for ((s, lo), hi) in isum.iter_mut().zip(lo).zip(hi) {
        // SAFETY: one stored tile row each (64 aligned bytes).
        let (lo, hi) = unsafe {
            (
                _mm512_load_si512(lo.as_ptr() as *const __m512i),
                _mm512_load_si512(hi.as_ptr() as *const __m512i),
            )
        };
        *s = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32::<8>(hi), lo), off);
    }
    isum
}

/// Weight rows `w` (with their [`Unpacked`] rows `u`, the same 16) against
/// the sixteen activation rows of `x`: `out[lane][w]` is what
/// [`super::dot`] gives for weight row `w` and that activation row, bit for
/// bit. Per block, four 64-code steps of two tile multiplies (`lo` and
/// `hi` against the same activation tile) into two accumulator tiles,
/// stored once.
///
/// # Safety
/// `_tiles` (the configuration, which proves [`available`]) is loaded on
/// this thread; `w`, `u` and `x` made for the same format and row length
/// `k`, `u` the same sixteen rows as `w`; `NG` is the
/// format's `groups()` and `MINMAX` whether it has minima (Q4_K, Q5_K;
/// otherwise Q6_K).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
// The kernel's inputs and its scratch: a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows16<const NG: usize, const MINMAX: bool>(
    _tiles: &Tiles,
    k: usize,
    w: &Weights16,
    u: &[Unpacked],
    x: &Rows16,
    sums: &mut Quad,
    out: &mut [[f32; 16]; 16],
    ahead: &mut Ahead,
) {
    let nb = k / 256;
    debug_assert!(u.len() == 16 && w.lo.len() == 16 * k && w.hi.len() == 16 * k);
    debug_assert!(x.tiles.len() == 16 * k && x.dx.len() == nb * 16);
    // tmm0 / tmm1 the lo / hi sums, tmm2 / tmm3 lo / hi codes (16 x 64),
    // tmm4 the activations (16 rows of 16 lanes x 4 codes).
    let mut acc = [_mm512_setzero_ps(); 16];
    for b in 0..nb {
        ahead.step();
        // SAFETY: block b's four 64-code tiles of each operand are 4,096
        // bytes from 4,096 b (within 16 k); `sums` holds 2 x 16 rows of 64
        // bytes. The activation tiles of 32-code groups 2c and 2c + 1 are
        // together the 64-code tile c (16 bytes per code, in order).
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tileloadd tmm4, [{x} + {s}*1]",
                "tileloadd tmm2, [{lo} + {s}*1]",
                "tileloadd tmm3, [{hi} + {s}*1]",
                "tdpbusd tmm0, tmm2, tmm4",
                "tdpbusd tmm1, tmm3, tmm4",
                "tileloadd tmm4, [{x} + {s}*1 + 1024]",
                "tileloadd tmm2, [{lo} + {s}*1 + 1024]",
                "tileloadd tmm3, [{hi} + {s}*1 + 1024]",
                "tdpbusd tmm0, tmm2, tmm4",
                "tdpbusd tmm1, tmm3, tmm4",
                "tileloadd tmm4, [{x} + {s}*1 + 2048]",
                "tileloadd tmm2, [{lo} + {s}*1 + 2048]",
                "tileloadd tmm3, [{hi} + {s}*1 + 2048]",
                "tdpbusd tmm0, tmm2, tmm4",
                "tdpbusd tmm1, tmm3, tmm4",
                "tileloadd tmm4, [{x} + {s}*1 + 3072]",
                "tileloadd tmm2, [{lo} + {s}*1 + 3072]",
                "tileloadd tmm3, [{hi} + {s}*1 + 3072]",
                "tdpbusd tmm0, tmm2, tmm4",
                "tdpbusd tmm1, tmm3, tmm4",
                "tilestored [{c} + {s}*1], tmm0",
                "tilestored [{c} + {s}*1 + 1024], tmm1",
                x = in(reg) x.tiles.as_ptr().add(4096 * b),
                lo = in(reg) w.lo.as_ptr().add(4096 * b),
                hi = in(reg) w.hi.as_ptr().add(4096 * b),
                c = in(reg) sums.0.as_mut_ptr(),
                s = in(reg) 64usize,
                options(nostack),
            );
        }
        // SAFETY: block b of rows made for the same format.
        unsafe {
            let isum = block_sums::<NG, MINMAX>(&sums.0[0], &sums.0[1], x, b);
            finish_block::<NG, MINMAX>(u, x, b, &isum, &mut acc);
        }
    }
    // SAFETY: AVX-512 F is here.
    let rows = unsafe { transpose16(&acc) };
    for (o, a) in out.iter_mut().zip(&rows) {
        // SAFETY: `o` has 16 floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
    }
}

/// Four 16 x 16 i32 tiles as stored.
#[repr(C, align(64))]
pub(super) struct Quad([[[i32; 16]; 16]; 4]);

impl Quad {
    /// Scratch for the tile stores, made once per run of weight-row groups.
    pub(super) fn new() -> Box<Quad> {
        Box::new(Quad([[[0; 16]; 16]; 4]))
    }
}

/// [`rows16`] against two groups of sixteen activation rows at once: each
/// weight tile loaded serves both (half the weight loads per multiply; the
/// weights' tiles of a row group do not fit in L1).
///
/// # Safety
/// As [`rows16`], for `x[0]` and `x[1]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
// The kernel's inputs and its scratch: a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows16x2<const NG: usize, const MINMAX: bool>(
    _tiles: &Tiles,
    k: usize,
    w: &Weights16,
    u: &[Unpacked],
    x: [&Rows16; 2],
    sums: &mut Quad,
    out: [&mut [[f32; 16]; 16]; 2],
    ahead: &mut Ahead,
) {
    let nb = k / 256;
    debug_assert!(u.len() == 16 && w.lo.len() == 16 * k && w.hi.len() == 16 * k);
    debug_assert!(x
        .iter()
        .all(|x| x.tiles.len() == 16 * k && x.dx.len() == nb * 16));
    // tmm0 / tmm1 the lo / hi sums against x[0], tmm5 / tmm6 against
    // x[1]; tmm2 / tmm3 lo / hi codes; tmm4 / tmm7 the activations.
    let mut acc = [[_mm512_setzero_ps(); 16]; 2];
    for b in 0..nb {
        ahead.step();
        // SAFETY: as in `rows16`, for both activation groups;
        // `sums` holds 4 x 16 rows of 64 bytes.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm5",
                "tilezero tmm6",
                "tileloadd tmm2, [{lo} + {s}*1]",
                "tileloadd tmm4, [{x0} + {s}*1]",
                "tdpbusd tmm0, tmm2, tmm4",
                "tileloadd tmm3, [{hi} + {s}*1]",
                "tdpbusd tmm1, tmm3, tmm4",
                "tileloadd tmm7, [{x1} + {s}*1]",
                "tdpbusd tmm5, tmm2, tmm7",
                "tdpbusd tmm6, tmm3, tmm7",
                "tileloadd tmm2, [{lo} + {s}*1 + 1024]",
                "tileloadd tmm4, [{x0} + {s}*1 + 1024]",
                "tdpbusd tmm0, tmm2, tmm4",
                "tileloadd tmm3, [{hi} + {s}*1 + 1024]",
                "tdpbusd tmm1, tmm3, tmm4",
                "tileloadd tmm7, [{x1} + {s}*1 + 1024]",
                "tdpbusd tmm5, tmm2, tmm7",
                "tdpbusd tmm6, tmm3, tmm7",
                "tileloadd tmm2, [{lo} + {s}*1 + 2048]",
                "tileloadd tmm4, [{x0} + {s}*1 + 2048]",
                "tdpbusd tmm0, tmm2, tmm4",
                "tileloadd tmm3, [{hi} + {s}*1 + 2048]",
                "tdpbusd tmm1, tmm3, tmm4",
                "tileloadd tmm7, [{x1} + {s}*1 + 2048]",
                "tdpbusd tmm5, tmm2, tmm7",
                "tdpbusd tmm6, tmm3, tmm7",
                "tileloadd tmm2, [{lo} + {s}*1 + 3072]",
                "tileloadd tmm4, [{x0} + {s}*1 + 3072]",
                "tdpbusd tmm0, tmm2, tmm4",
                "tileloadd tmm3, [{hi} + {s}*1 + 3072]",
                "tdpbusd tmm1, tmm3, tmm4",
                "tileloadd tmm7, [{x1} + {s}*1 + 3072]",
                "tdpbusd tmm5, tmm2, tmm7",
                "tdpbusd tmm6, tmm3, tmm7",
                "tilestored [{c} + {s}*1], tmm0",
                "tilestored [{c} + {s}*1 + 1024], tmm1",
                "tilestored [{c} + {s}*1 + 2048], tmm5",
                "tilestored [{c} + {s}*1 + 3072], tmm6",
                x0 = in(reg) x[0].tiles.as_ptr().add(4096 * b),
                x1 = in(reg) x[1].tiles.as_ptr().add(4096 * b),
                lo = in(reg) w.lo.as_ptr().add(4096 * b),
                hi = in(reg) w.hi.as_ptr().add(4096 * b),
                c = in(reg) sums.0.as_mut_ptr(),
                s = in(reg) 64usize,
                options(nostack),
            );
        }
        for (g, acc) in acc.iter_mut().enumerate() {
            // SAFETY: block b of rows made for the same format.
            unsafe {
                let isum = block_sums::<NG, MINMAX>(&sums.0[2 * g], &sums.0[2 * g + 1], x[g], b);
                finish_block::<NG, MINMAX>(u, x[g], b, &isum, acc);
            }
        }
    }
    for (o, a) in out.into_iter().zip(&acc) {
        // SAFETY: AVX-512 F is here.
        let rows = unsafe { transpose16(a) };
        for (o, a) in o.iter_mut().zip(&rows) {
            // SAFETY: `o` has 16 floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
        }
    }
}

/// The AMX kernel for `fmt` on one or two groups of sixteen activation
/// rows (`x.len()`, as many `out`).
///
/// # Safety
/// As [`rows16`], for each of `x`.
// The kernel's inputs and its scratch: a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows16_for(
    tiles: &Tiles,
    fmt: KFormat,
    k: usize,
    w: &Weights16,
    u: &[Unpacked],
    x: &[Rows16],
    sums: &mut Quad,
    out: &mut [[[f32; 16]; 16]],
    ahead: &mut Ahead,
) {
    assert!(x.len() == out.len() && (1..=2).contains(&x.len()));
    // SAFETY: the caller's guarantees; the constants are `fmt`'s.
    unsafe {
        match (fmt, x, out) {
            (KFormat::Q4K | KFormat::Q5K, [x0, x1], [o0, o1]) => {
                rows16x2::<8, true>(tiles, k, w, u, [x0, x1], sums, [o0, o1], ahead)
            }
            (KFormat::Q6K, [x0, x1], [o0, o1]) => {
                rows16x2::<16, false>(tiles, k, w, u, [x0, x1], sums, [o0, o1], ahead)
            }
            (KFormat::Q4K | KFormat::Q5K, x, out) => {
                for (x, o) in x.iter().zip(out) {
                    rows16::<8, true>(tiles, k, w, u, x, sums, o, ahead);
                }
            }
            (KFormat::Q6K, x, out) => {
                for (x, o) in x.iter().zip(out) {
                    rows16::<16, false>(tiles, k, w, u, x, sums, o, ahead);
                }
            }
        }
    }
}
