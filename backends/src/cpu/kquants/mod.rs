//! K-quant (Q4_K, Q5_K, Q6_K) weights against f32 activation rows, kept
//! quantized: `y = x W^T` with `W` row-major `[n, k]` exactly as the GGUF
//! file stores it. (Q5_0, a 32-weight block like Q4_0, runs in
//! [`crate::cpu::gemv`] with the other 32-weight formats.)
//!
//! ## Arithmetic (the approach of llama.cpp's `x_K x q8_K` dot products)
//! Each activation row is quantized once per call to int8 ([`Acts`]) per
//! super-block of 256 (one scale `max|x| / 127`, and the code sums of each
//! group of 16: Q8_K's `bsums`, for the K-quants' minima and Q6_K's offset
//! of 32); on AVX2 by a vector quantizer with the scalar code's bits, and
//! for prefill spread over the worker pool (one block at a time: serial,
//! it was a third of a 128-row Q6_K matmul).
//!
//! Per weight super-block the integer part is exact: the codes' products with the int8 activations,
//! weighted by the integer sub-block scales, summed in i32 (no overflow is
//! possible: at most 256 products of 63 x 127 times a scale of 63). Then,
//! in f32 and in this order, the block's contribution is added to the
//! row's sum:
//! - Q4_K / Q5_K: `acc += (d_w * d_x) * Σ sc·(q·x) - (dmin_w * d_x) * Σ m·bsum`;
//! - Q6_K: `acc += (d_w * d_x) * (Σ sc·(q·x) - 32 Σ sc·bsum)`.
//!
//! The AVX2 kernels ([`avx2`]) compute the same integers (with `maddubs` /
//! `madd`; the operands cannot saturate i16) and run the same f32 steps in
//! the same order, so every instruction set gives the same bits, and a
//! prefill row equals the one-row (decode) result bit for bit. Decode takes
//! eight weight rows at a time ([`decode`]: the rows read in memory order
//! and prefetched, each block's scales spread by shuffles, the eight rows'
//! block sums reduced together, the f32 steps one lane per row), with 32
//! codes an instruction on AVX2 and 64 where AVX-512 VNNI runs
//! ([`avx512`]); the rows past the last eight run a one-row kernel per
//! format.
//!
//! Prefill (several rows) unpacks each weight row once to one byte per code
//! and an i16 scale per group of 16, then runs it against eight activation
//! rows at a time ([`Rows8`]), the f32 steps above with one lane per row
//! (the same operations in the same order as the scalar code: the same
//! bits). On plain AVX2 ([`lanes`]) each 4 weight codes are broadcast to
//! the eight lanes, the products of codes that share a scale are summed in
//! i16 before one `madd` with it, and four weight rows share each
//! activation load (also on AMD's AVX-512 CPUs, where it measured faster:
//! [`Paths::lanes_prefill`]; there, past eight rows, sixteen rows share a
//! 512-bit register ([`Layout::Wide`]) and each 4 codes' products go
//! straight into i32 with `vpdpbusd`, one multiply by the weight scale per
//! span). Elsewhere where AVX-512 VNNI is (`avx2::rows8_vnni`), each 32
//! weight codes are loaded once for the eight rows, `madd` and add fuse
//! into `vpdpwssd`, the eight block sums are reduced together, and two
//! weight rows share each activation load. The minima's or offset's
//! correction is one `madd` per pair of groups.
//!
//! Where the CPU has AMX-INT8 and Linux grants the tile state ([`amx`]),
//! prefill runs sixteen weight rows against sixteen activation rows per
//! tile multiply (`tdpbusd`), the group scales folded into the weight codes
//! once per sixteen rows (exact i32 sums), and runs the same f32 steps with
//! AVX-512: the same bits again.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod decode;
#[cfg(target_arch = "x86_64")]
mod lanes;
mod rows8;
#[cfg(test)]
mod tests;

use candle_core::quantized::GgmlDType;
use rayon::prelude::*;
use rows8::{fill_lane, Layout, Rows8};

/// The block formats of this module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KFormat {
    /// GGML Q4_K: per 256 weights f16 `d` and `dmin`, 12 bytes of 6-bit
    /// sub-block scales and minima (8 sub-blocks of 32), 128 bytes of
    /// nibbles; a weight is `d * sc * q - dmin * m`.
    Q4K,
    /// GGML Q5_K: Q4_K with a fifth bit per weight (32 bytes of high bits).
    Q5K,
    /// GGML Q6_K: per 256 weights 128 bytes of low nibbles, 64 bytes of
    /// 2-bit high parts, 16 int8 scales (groups of 16) and an f16 `d`; a
    /// weight is `d * sc * (q - 32)`.
    Q6K,
}

impl KFormat {
    /// The format of a GGML dtype, when this module reads it.
    pub(crate) fn of_ggml(d: GgmlDType) -> Option<Self> {
        match d {
            GgmlDType::Q4K => Some(KFormat::Q4K),
            GgmlDType::Q5K => Some(KFormat::Q5K),
            GgmlDType::Q6K => Some(KFormat::Q6K),
            _ => None,
        }
    }

    /// Weights per block.
    pub(crate) fn block(self) -> usize {
        256
    }

    /// Bytes per block.
    pub(crate) fn block_bytes(self) -> usize {
        match self {
            KFormat::Q4K => 144,
            KFormat::Q5K => 176,
            KFormat::Q6K => 210,
        }
    }

    /// Activation code sums per block that [`Rows8`] keeps: Q4_K / Q5_K one
    /// per sub-block of 32, Q6_K one per group of 16.
    fn groups(self) -> usize {
        match self {
            KFormat::Q4K | KFormat::Q5K => 8,
            KFormat::Q6K => 16,
        }
    }

    /// Activation values per code sum.
    fn sum_group(self) -> usize {
        16
    }
}

/// Activation rows quantized to int8 for one format (see the module docs).
pub(crate) struct Acts {
    k: usize,
    block: usize,
    group: usize,
    codes: Vec<i8>,
    /// One scale per block of each row.
    scales: Vec<f32>,
    /// Code sums per group of each row.
    sums: Vec<i32>,
}

/// Activation values from which [`Acts::new`] quantizes on the pool.
const PAR_ACTS: usize = 1 << 15;

impl Acts {
    /// Quantize `m` rows of `k` values (`x` row-major).
    pub(crate) fn new(fmt: KFormat, x: &[f32], k: usize) -> Self {
        Self::new_with(fmt, x, k, has_avx2())
    }

    /// [`Self::new`], on the AVX2 quantizer where `avx2` (only true where
    /// [`has_avx2`]): the same bits either way.
    fn new_with(fmt: KFormat, x: &[f32], k: usize, avx2: bool) -> Self {
        let block = fmt.block();
        let group = fmt.sum_group();
        let mut codes = vec![0i8; x.len()];
        let mut sums = vec![0i32; x.len() / group];
        // One block: its codes and code sums written, its scale returned.
        let quantize = |((xb, cb), sb): ((&[f32], &mut [i8]), &mut [i32])| {
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: AVX2 was detected; a block (a multiple of 32
                // values) of each, and its sums of 16 codes.
                return unsafe { avx2::quantize_block(xb, cb, sb) };
            }
            let _ = avx2;
            let amax = abs_max(xb);
            let (d, id) = if amax > 0.0 {
                (amax / 127.0, 127.0 / amax)
            } else {
                (0.0, 0.0)
            };
            for (c, v) in cb.iter_mut().zip(xb) {
                *c = round_code(v * id);
            }
            for (s, g) in sb.iter_mut().zip(cb.chunks_exact(group)) {
                *s = g.iter().map(|&c| i32::from(c)).sum();
            }
            d
        };
        // Prefill's activations are spread over the pool (each block is
        // quantized alone: the same bits in any order); decode's one row
        // is too small to share.
        let scales = if x.len() >= PAR_ACTS {
            x.par_chunks_exact(block)
                .zip(codes.par_chunks_exact_mut(block))
                .zip(sums.par_chunks_exact_mut(block / group))
                .with_min_len(16)
                .map(quantize)
                .collect()
        } else {
            x.chunks_exact(block)
                .zip(codes.chunks_exact_mut(block))
                .zip(sums.chunks_exact_mut(block / group))
                .map(quantize)
                .collect()
        };
        Acts {
            k,
            block,
            group,
            codes,
            scales,
            sums,
        }
    }

    #[inline(always)]
    fn codes(&self, r: usize) -> &[i8] {
        &self.codes[r * self.k..(r + 1) * self.k]
    }

    #[inline(always)]
    fn scales(&self, r: usize) -> &[f32] {
        let nb = self.k / self.block;
        &self.scales[r * nb..(r + 1) * nb]
    }

    #[inline(always)]
    fn sums(&self, r: usize) -> &[i32] {
        let ng = self.k / self.group;
        &self.sums[r * ng..(r + 1) * ng]
    }
}

/// The largest `|v|` of `x` (0 for none; NaN ignored, as `f32::max` does),
/// over sixteen lanes so the compiler vectorizes it: the same value as
/// one running maximum, since the maximum does not depend on the order.
fn abs_max(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = l.max(v.abs());
        }
    }
    let tail = chunks.remainder().iter().fold(0f32, |a, v| a.max(v.abs()));
    lanes.iter().fold(tail, |a, &l| a.max(l))
}

/// `t.round().clamp(-127.0, 127.0) as i8` (half away from zero), without
/// the libm call `round` is on baseline x86-64: clamped first (the same
/// result: ±127 are integers), truncated, then moved one step where the
/// dropped fraction (exact in f32) is at least a half. NaN gives 0, as the
/// cast does.
#[inline(always)]
fn round_code(t: f32) -> i8 {
    let t = t.clamp(-127.0, 127.0);
    let i = t as i32;
    let f = t - i as f32;
    (i + i32::from(f >= 0.5) - i32::from(f <= -0.5)) as i8
}

#[inline(always)]
pub(crate) fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Q4_K / Q5_K's eight 6-bit scales and eight minima from the 12 packed
/// bytes at once (llama.cpp's `utmp` unpacking): the values of
/// [`scale_min_k4`] for `j` in `0..8`.
#[inline(always)]
pub(crate) fn scales_mins_k4(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let u = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let sc = [u0 & K1, (u2 & K2) | (((u0 >> 6) & K3) << 4)];
    let mn = [u1 & K1, ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4)];
    let bytes = |v: [u32; 2]| {
        let mut o = [0u8; 8];
        o[..4].copy_from_slice(&v[0].to_le_bytes());
        o[4..].copy_from_slice(&v[1].to_le_bytes());
        o
    };
    (bytes(sc), bytes(mn))
}

/// Q4_K / Q5_K's 6-bit scales and minima of sub-block `j` (0..8) from the
/// 12 packed bytes (GGML's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (i32, i32) {
    if j < 4 {
        (i32::from(s[j] & 63), i32::from(s[j + 4] & 63))
    } else {
        (
            i32::from((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4)),
            i32::from((s[j + 4] >> 4) | ((s[j] >> 6) << 4)),
        )
    }
}

/// The integer parts of one block against its activation codes: for
/// Q4_K / Q5_K the eight sub-block sums `Σ q·x`, for Q6_K `Σ sc·(q·x)`
/// over the 16 groups. Portable code; the AVX2 kernels compute the same
/// integers.
pub(crate) mod scalar {
    use super::scale_min_k4;

    /// `Σ sc_j · (Σ q·x over sub-block j)` of Q4_K (`high` None) or Q5_K
    /// (`high` its 32 bytes of fifth bits).
    pub(crate) fn q45k(scales: &[u8], qs: &[u8], high: Option<&[u8]>, x: &[i8]) -> i32 {
        let mut total = 0i32;
        for j in 0..4 {
            let (mut a, mut b) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                let (mut lo, mut hi) = (i32::from(q & 15), i32::from(q >> 4));
                if let Some(h) = high {
                    lo |= i32::from((h[l] >> (2 * j)) & 1) << 4;
                    hi |= i32::from((h[l] >> (2 * j + 1)) & 1) << 4;
                }
                a += lo * i32::from(x[64 * j + l]);
                b += hi * i32::from(x[64 * j + 32 + l]);
            }
            total += scale_min_k4(2 * j, scales).0 * a + scale_min_k4(2 * j + 1, scales).0 * b;
        }
        total
    }

    /// `Σ_g sc_g · (Σ q·x over group g)` of Q6_K (codes 0..63).
    pub(crate) fn q6k(blk: &[u8], x: &[i8]) -> i32 {
        let (ql, qh, sc) = (&blk[..128], &blk[128..192], &blk[192..208]);
        let mut g = [0i32; 16];
        for half in 0..2 {
            let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
            let x = &x[128 * half..];
            let g = &mut g[8 * half..];
            for l in 0..32 {
                let is = l / 16;
                let q1 = i32::from((ql[l] & 15) | ((qh[l] & 3) << 4));
                let q2 = i32::from((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
                let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
                g[is] += q1 * i32::from(x[l]);
                g[is + 2] += q2 * i32::from(x[l + 32]);
                g[is + 4] += q3 * i32::from(x[l + 64]);
                g[is + 6] += q4 * i32::from(x[l + 96]);
            }
        }
        g.iter()
            .zip(sc)
            .map(|(&v, &s)| v * i32::from(s as i8))
            .sum()
    }
}

/// One weight row against activation row `r` (see the module docs for the
/// f32 steps, which every path shares).
fn dot(fmt: KFormat, row: &[u8], xq: &Acts, r: usize, avx2: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: AVX2 was detected at run time (`avx2` is only true then).
        return unsafe { dot_avx2(fmt, row, xq, r) };
    }
    dot_portable(fmt, row, xq, r)
}

/// [`dot`] on AVX2: one row kernel per format (`avx2::q45k_row`,
/// `avx2::q6k_row`), the same integers and f32 steps in the same order:
/// the same bits.
///
/// # Safety
/// AVX2 and F16C must be available ([`has_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn dot_avx2(fmt: KFormat, row: &[u8], xq: &Acts, r: usize) -> f32 {
    let (x, dx, sums) = (xq.codes(r), xq.scales(r), xq.sums(r));
    // SAFETY: AVX2 and F16C (this function's contract); `row` is whole
    // blocks of the row `xq` was made for (matmul checks the shapes).
    unsafe {
        match fmt {
            KFormat::Q4K => avx2::q45k_row(false, row, x, dx, sums),
            KFormat::Q5K => avx2::q45k_row(true, row, x, dx, sums),
            KFormat::Q6K => avx2::q6k_row(row, x, dx, sums),
        }
    }
}

/// [`dot`] in plain Rust.
fn dot_portable(fmt: KFormat, row: &[u8], xq: &Acts, r: usize) -> f32 {
    let codes = xq.codes(r);
    let block = fmt.block();
    let mut acc = 0f32;
    for (b, blk) in row.chunks_exact(fmt.block_bytes()).enumerate() {
        let x = &codes[b * block..(b + 1) * block];
        let isum = match fmt {
            KFormat::Q4K => scalar::q45k(&blk[4..16], &blk[16..144], None, x),
            KFormat::Q5K => scalar::q45k(&blk[4..16], &blk[48..176], Some(&blk[16..48]), x),
            KFormat::Q6K => scalar::q6k(blk, x),
        };
        acc += finish(fmt, blk, block_d(fmt, blk), isum, xq, r, b);
    }
    acc
}

/// A block's f16 scale `d`, as f32.
#[inline(always)]
fn block_d(fmt: KFormat, blk: &[u8]) -> f32 {
    match fmt {
        KFormat::Q6K => f16_at(&blk[208..]),
        _ => f16_at(blk),
    }
}

/// Block `b`'s f32 contribution from its integer part `isum` (what
/// [`scalar`] computes for the block against row `r`'s codes); `d` is
/// [`block_d`].
#[inline(always)]
fn finish(fmt: KFormat, blk: &[u8], d: f32, isum: i32, xq: &Acts, r: usize, b: usize) -> f32 {
    let dx = xq.scales(r)[b];
    let sums = xq.sums(r);
    match fmt {
        KFormat::Q4K | KFormat::Q5K => {
            let s = &blk[4..16];
            let bs = &sums[16 * b..16 * (b + 1)];
            let msum: i32 = (0..8)
                .map(|j| scale_min_k4(j, s).1 * (bs[2 * j] + bs[2 * j + 1]))
                .sum();
            (d * dx) * isum as f32 - (f16_at(&blk[2..]) * dx) * msum as f32
        }
        KFormat::Q6K => {
            let bs = &sums[16 * b..16 * (b + 1)];
            let off: i32 = blk[192..208]
                .iter()
                .zip(bs)
                .map(|(&s, &v)| i32::from(s as i8) * v)
                .sum();
            let isum = isum - 32 * off;
            (d * dx) * isum as f32
        }
    }
}

/// A weight row unpacked once for several activation rows (prefill): its
/// unsigned codes and the integer scale of each group of 16 (and, for the
/// SIMD kernels, the same scales laid out as the `madd` operand of each
/// 32 codes, and the minima in pairs).
/// `Σ_groups scale · Σ code·x` over a block is the integer part of
/// [`scalar`], so the results are [`dot`]'s bit for bit.
#[derive(Default)]
struct Unpacked {
    codes: Vec<u8>,
    scales: Vec<i16>,
    /// [`block_d`] of each block.
    d: Vec<f32>,
    /// Q4_K / Q5_K: each block's f16 `dmin`, as f32 (others: 0).
    dmin: Vec<f32>,
    /// Per 32 codes, the 16 i16 multipliers of their 16 `maddubs` pair
    /// sums: 8 times the first group's scale, 8 times the second's (empty
    /// until [`Self::fill_sv`]).
    sv: Vec<i16>,
    /// Per block, the [`Rows8`] group multipliers of the integer
    /// correction (see [`KFormat::groups`]): Q4_K / Q5_K the eight
    /// sub-block minima, Q6_K 32 times the sixteen scales (all within
    /// -4096..4064), two by two as i16 pairs (group `2p` low, `2p + 1`
    /// high), the other operand of [`Rows8::gs`]'s `madd`.
    min_pairs: Vec<i32>,
    /// Integer parts of each block against one activation row (scratch).
    isums: Vec<i32>,
    /// Q6_K in the lane kernel ([`Self::offset_q6k`]): per block,
    /// `128 · Σ_g sc_g · Σ_{i in g} (q_i - 32)` (empty until then).
    offsets: Vec<i32>,
}

impl Unpacked {
    /// `avx2`: the codes come from the AVX2 unpacker (the same bytes).
    fn new(fmt: KFormat, row: &[u8], k: usize, avx2: bool) -> Self {
        let mut u = Unpacked::default();
        u.refill(fmt, row, k, avx2);
        u
    }

    /// [`Self::new`] in the buffers already here (no allocation once they
    /// have grown to `k`); `sv` is emptied.
    fn refill(&mut self, fmt: KFormat, row: &[u8], k: usize, avx2: bool) {
        self.codes.resize(k, 0);
        let block = fmt.block();
        for (b, blk) in row.chunks_exact(fmt.block_bytes()).enumerate() {
            let c = &mut self.codes[b * block..(b + 1) * block];
            if avx2 {
                // SAFETY: AVX2 was detected (`avx2` is only true then);
                // `blk` is one block of `fmt`, `c` its codes.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    avx2::unpack_codes(fmt, blk, c)
                };
                continue;
            }
            match fmt {
                KFormat::Q4K | KFormat::Q5K => {
                    let (high, qs) = match fmt {
                        KFormat::Q5K => (Some(&blk[16..48]), &blk[48..176]),
                        _ => (None, &blk[16..144]),
                    };
                    for j in 0..4 {
                        for l in 0..32 {
                            let q = qs[32 * j + l];
                            let (mut lo, mut hi) = (q & 15, q >> 4);
                            if let Some(h) = high {
                                lo |= ((h[l] >> (2 * j)) & 1) << 4;
                                hi |= ((h[l] >> (2 * j + 1)) & 1) << 4;
                            }
                            c[64 * j + l] = lo;
                            c[64 * j + 32 + l] = hi;
                        }
                    }
                }
                KFormat::Q6K => {
                    let (ql, qh) = (&blk[..128], &blk[128..192]);
                    for half in 0..2 {
                        let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                        let c = &mut c[128 * half..];
                        for l in 0..32 {
                            c[l] = (ql[l] & 15) | ((qh[l] & 3) << 4);
                            c[l + 32] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
                            c[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                            c[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                        }
                    }
                }
            }
        }
        self.refill_scales(fmt, row, k);
    }

    /// All of [`Self::refill`] but the codes (not written), for the AMX
    /// kernel, which unpacks them straight into its tiles.
    fn refill_scales(&mut self, fmt: KFormat, row: &[u8], k: usize) {
        let nb = k / fmt.block();
        let per = fmt.block() / 16;
        self.scales.resize(k / 16, 1);
        self.d.clear();
        self.isums.clear();
        self.isums.resize(nb, 0);
        self.dmin.clear();
        self.dmin.resize(nb, 0.0);
        self.min_pairs.clear();
        self.sv.clear();
        let pair = |a: i32, b: i32| i32::from(a as i16 as u16) | (i32::from(b as i16) << 16);
        // One pass over the blocks, each block's packed scales decoded once.
        for (b, blk) in row.chunks_exact(fmt.block_bytes()).enumerate() {
            self.d.push(block_d(fmt, blk));
            let sc = &mut self.scales[b * per..(b + 1) * per];
            match fmt {
                KFormat::Q4K | KFormat::Q5K => {
                    let s: [u8; 12] = std::array::from_fn(|i| blk[4 + i]);
                    let (scales, mins) = scales_mins_k4(&s);
                    for (two, v) in sc.chunks_exact_mut(2).zip(scales) {
                        two.fill(i16::from(v));
                    }
                    self.dmin[b] = f16_at(&blk[2..]);
                    let min = mins.map(i32::from);
                    self.min_pairs
                        .extend((0..4).map(|p| pair(min[2 * p], min[2 * p + 1])));
                }
                KFormat::Q6K => {
                    for (g, v) in sc.iter_mut().enumerate() {
                        *v = i16::from(blk[192 + g] as i8);
                    }
                    let min = |g: usize| 32 * i32::from(blk[192 + g] as i8);
                    self.min_pairs
                        .extend((0..8).map(|p| pair(min(2 * p), min(2 * p + 1))));
                }
            }
        }
    }

    /// Q6_K for the lane kernel ([`lanes`]): each code becomes `q - 32`
    /// (an i8 in -32..=31, stored as its byte), the other operand being
    /// the activation codes plus 128 (0..=255, [`Rows8`]'s lanes layout for
    /// Q6_K). Then `Σ sc_g · Σ (x + 128)(q - 32)` less this block's
    /// [`Self::offsets`] is `Σ sc_g · Σ x (q - 32)`, the integer the other
    /// paths reach through their per-row code sums: one constant per block
    /// and weight row instead of a `madd` per group pair and row.
    ///
    /// `avx2`: on the AVX2 helper (only true where [`has_avx2`]; the same
    /// bytes and sums).
    fn offset_q6k(&mut self, avx2: bool) {
        self.offsets.clear();
        for (c, sc) in self
            .codes
            .chunks_exact_mut(256)
            .zip(self.scales.chunks_exact(16))
        {
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: AVX2 was detected; a block's 256 codes and 16
                // scales.
                let off = unsafe { lanes::offset_q6k_block(c, sc) };
                self.offsets.push(128 * off);
                continue;
            }
            let _ = avx2;
            let mut off = 0i32;
            for (g, &s) in c.chunks_exact_mut(16).zip(sc) {
                let mut sum = 0i32;
                for q in g {
                    *q = q.wrapping_sub(32);
                    sum += i32::from(*q as i8);
                }
                off += i32::from(s) * sum;
            }
            // |off| <= 16 groups · 128 · 16 · 32: 128 · off fits in i32.
            self.offsets.push(128 * off);
        }
    }

    /// Lays out the eight-row kernels' `sv` (in the buffer already here).
    fn fill_sv(&mut self) {
        self.sv.resize(self.codes.len() / 2, 0);
        for (o, s) in self
            .sv
            .chunks_exact_mut(16)
            .zip(self.scales.chunks_exact(2))
        {
            o[..8].fill(s[0]);
            o[8..].fill(s[1]);
        }
    }

    /// The row against activation row `r`.
    fn dot(&mut self, fmt: KFormat, row: &[u8], xq: &Acts, r: usize, avx2: bool) -> f32 {
        grouped(
            &self.codes,
            &self.scales,
            xq.codes(r),
            fmt.block(),
            &mut self.isums,
            avx2,
        );
        let mut acc = 0f32;
        for (b, blk) in row.chunks_exact(fmt.block_bytes()).enumerate() {
            acc += finish(fmt, blk, self.d[b], self.isums[b], xq, r, b);
        }
        acc
    }
}

/// Per block of `block` values: `out[b] = Σ_g sc_g · Σ_{i in group g of
/// 16} c_i · x_i`.
fn grouped(c: &[u8], sc: &[i16], x: &[i8], block: usize, out: &mut [i32], avx2: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: AVX2 was detected at run time (`has_avx2`); `c` and `x`
        // hold 16 values per scale in `sc` and `out.len()` blocks of
        // `block` (a multiple of 32) values.
        return unsafe { avx2::grouped(c, sc, x, block, out) };
    }
    let _ = avx2;
    for (b, o) in out.iter_mut().enumerate() {
        let span = b * block..(b + 1) * block;
        *o = c[span.clone()]
            .chunks_exact(16)
            .zip(x[span].chunks_exact(16))
            .zip(&sc[b * block / 16..(b + 1) * block / 16])
            .map(|((c, x), &s)| {
                i32::from(s)
                    * c.iter()
                        .zip(x)
                        .map(|(&a, &b)| i32::from(a) * i32::from(b))
                        .sum::<i32>()
            })
            .sum();
    }
}

/// Whether AVX-512 VNNI (with VL) is here, for the prefill kernel's
/// `vpdpwssd` (the same integers as the AVX2 path).
pub(crate) fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the AVX2 kernels run here (with F16C, which every AVX2 CPU has,
/// for the blocks' f16 scales).
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `y[r, j] = Σ_i w[j, i] · x[r, i]` for `m` activation rows `x` (row-major
/// `[m, k]`) and `n` weight rows `w` in `fmt`; `y` row-major `[m, n]`. None
/// when the shapes do not fit the format.
pub(crate) fn matmul(fmt: KFormat, w: &[u8], n: usize, x: &[f32], m: usize) -> Option<Vec<f32>> {
    matmul_with(fmt, w, n, x, m, has_avx2())
}

pub(crate) fn matmul_with(
    fmt: KFormat,
    w: &[u8],
    n: usize,
    x: &[f32],
    m: usize,
    avx2: bool,
) -> Option<Vec<f32>> {
    let paths = Paths {
        avx2,
        vnni: avx2 && has_vnni(),
        lanes_prefill: crate::cpu::amd_avx512(),
        amx: avx2 && has_amx(),
    };
    matmul_isa(fmt, w, n, x, m, paths)
}

/// Which kernels [`matmul_isa`] may use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Paths {
    /// The AVX2 kernels (only where [`has_avx2`]).
    pub(crate) avx2: bool,
    /// The AVX-512 VNNI kernels (only where [`has_vnni`]): decode's
    /// 64-code blocks ([`avx512`]), and `vpdpwssd` in the eight-row
    /// prefill kernel unless `lanes_prefill`.
    pub(crate) vnni: bool,
    /// Prefill on the lane kernel ([`lanes`]) even where `vnni`: on AMD
    /// Zen 4 (each 512-bit op two 256-bit halves) Qwen2.5-1.5B Q4_K_M
    /// prefill ran 117-130 tokens/s there against 92-93 on the VNNI
    /// eight-row kernel. With `vnni` too and more than eight activation
    /// rows, the lane kernel runs on 512-bit registers (`lanes::rows16`).
    pub(crate) lanes_prefill: bool,
    /// Whole groups of sixteen weight rows on AMX tiles (only where
    /// [`has_amx`]).
    pub(crate) amx: bool,
}

/// Whether the AMX prefill kernel runs here (x86-64 Linux with AMX-INT8
/// granted, and AVX-512).
pub(crate) fn has_amx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`matmul_with`] on the kernels `paths` names.
pub(crate) fn matmul_isa(
    fmt: KFormat,
    w: &[u8],
    n: usize,
    x: &[f32],
    m: usize,
    paths: Paths,
) -> Option<Vec<f32>> {
    let Paths {
        avx2,
        vnni,
        lanes_prefill,
        amx,
    } = paths;
    if m == 0 || n == 0 || !x.len().is_multiple_of(m) {
        return None;
    }
    let k = x.len() / m;
    if k == 0 || !k.is_multiple_of(fmt.block()) {
        return None;
    }
    let rb = k / fmt.block() * fmt.block_bytes();
    if w.len() != rb * n {
        return None;
    }
    // The tile kernel only runs where the process was granted the tiles.
    let amx = amx && has_amx();
    let xq = Acts::new(fmt, x, k);
    // Prefill on AVX2: activation rows in groups of eight lanes (with AMX
    // only for the weight rows past the last whole tile group).
    // AVX-512 VNNI fuses `rows8_vnni`'s `madd`s into `vpdpwssd`; plain
    // AVX2 runs the lane-per-row kernel ([`lanes`]), with fewer multiplies;
    // where AVX-512 VNNI runs and the lanes were chosen over the eight-row
    // VNNI kernel, on sixteen rows a 512-bit register (`vpdpbusd`) once
    // there are more than eight.
    let layout = match (vnni, lanes_prefill) {
        (true, false) => Layout::Rows,
        (true, true) if m > 8 => Layout::Wide,
        _ => Layout::Lanes,
    };
    let groups: Vec<Rows8> = if m > 1 && avx2 && !(amx && n.is_multiple_of(16)) {
        (0..m)
            .into_par_iter()
            .step_by(layout.lanes())
            .map(|r0| Rows8::new(fmt, &xq, m, r0, layout))
            .collect()
    } else {
        Vec::new()
    };
    #[cfg(target_arch = "x86_64")]
    let groups16: Vec<amx::Rows16> = if m > 1 && amx {
        (0..m)
            .into_par_iter()
            .step_by(16)
            .map(|r0| amx::Rows16::new(fmt, &xq, m, r0))
            .collect()
    } else {
        Vec::new()
    };
    // Whole groups of sixteen weight rows on AMX tiles, from `j0` on while
    // `rows` allow, written straight into their columns of `y` (row-major
    // `[m, n]`); the number of rows done (a multiple of sixteen). The
    // unpacked rows and tile layouts are buffers reused from group to
    // group.
    #[cfg(target_arch = "x86_64")]
    let tiles = |j0: usize, rows: usize, y: SharedOut| -> usize {
        if groups16.is_empty() {
            return 0;
        }
        let whole = rows / 16 * 16;
        let mut us: Vec<Unpacked> = (0..16).map(|_| Unpacked::default()).collect();
        let mut w16 = amx::Weights16::default();
        let mut lanes = [[[0f32; 16]; 16]; 2];
        let mut sums = amx::Quad::new();
        // SAFETY: AMX is granted (`groups16` is only filled then).
        let cfg = unsafe { amx::Tiles::load([(16, 64); 8]) };
        for j in (j0..j0 + whole).step_by(16) {
            let rows: [&[u8]; 16] = std::array::from_fn(|i| &w[(j + i) * rb..(j + i + 1) * rb]);
            for (u, row) in us.iter_mut().zip(rows) {
                u.refill_scales(fmt, row, k);
            }
            w16.fill(fmt, &rows, &us, k);
            // The next sixteen rows are fetched into L2 over the tile
            // passes below: otherwise the first touch of each block (its
            // scales, above) waits on memory.
            let passes = groups16.len().div_ceil(2);
            let mut ahead = amx::Ahead::new(
                w.get((j + 16) * rb..(j + 32) * rb),
                passes * (k / fmt.block()),
            );
            // Two groups of activation rows at a time.
            for gs in groups16.chunks(2) {
                let lanes = &mut lanes[..gs.len()];
                // SAFETY: AMX is granted (`groups16` is only filled then);
                // `w16` and `us` are these sixteen rows of k values, each
                // of `gs` sixteen rows of `xq`, all for `fmt`.
                unsafe {
                    amx::rows16_for(&cfg, fmt, k, &w16, &us, gs, &mut sums, lanes, &mut ahead)
                };
                for (g, lanes) in gs.iter().zip(lanes.iter()) {
                    for (r, row) in lanes.iter().enumerate().take(g.rows) {
                        // SAFETY: g.r0 + r < m and j + 16 <= n; this task
                        // alone writes columns j..j + 16.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                row.as_ptr(),
                                y.get().add((g.r0 + r) * n + j),
                                16,
                            )
                        };
                    }
                }
            }
        }
        whole
    };
    // Weight rows j0..j0 + rows against the groups of eight activation
    // rows, written straight into their columns of `y` (row-major
    // `[m, n]`).
    #[cfg(target_arch = "x86_64")]
    let grouped = |j0: usize, rows: usize, y: SharedOut| {
        // Weight rows in tiles of TILE, each unpacked once into
        // buffers reused from tile to tile (no allocation per weight
        // row); the tile runs against every group of eight activation
        // rows a few blocks at a time (`chunk`), so one group's codes
        // of those blocks and the tile's unpacked codes and scales
        // (about 24 KB) are reused from L1 rather than each weight row
        // sweeping every group's codes over the whole row. Each
        // output's blocks are still added in order from zero: the same
        // bits.
        const TILE: usize = 8;
        let width = match layout {
            Layout::Rows => avx2::ROWS8_WIDTH,
            Layout::Lanes | Layout::Wide => lanes::WIDTH,
        };
        // Groups of activation rows per kernel call: the lane kernel
        // shares each weight broadcast between two.
        let per = match layout {
            Layout::Rows | Layout::Wide => 1,
            Layout::Lanes => lanes::groups(fmt),
        };
        // Lanes of eight activation rows per group (two when wide).
        let halves = layout.lanes() / 8;
        let nb = k / fmt.block();
        let chunk = (16 << 10) / (TILE * 2 * fmt.block());
        let chunk = chunk.max(1);
        let mut us: Vec<Unpacked> = (0..TILE).map(|_| Unpacked::default()).collect();
        // `[group][half][tile row]` lanes.
        let mut acc = vec![[0f32; 8]; groups.len() * halves * TILE];
        let all = rows;
        for t in 0..all.div_ceil(TILE) {
            let j = j0 + t * TILE;
            let rows = TILE.min(all - t * TILE);
            for (i, u) in us.iter_mut().take(rows).enumerate() {
                u.refill(fmt, &w[(j + i) * rb..(j + i + 1) * rb], k, true);
                if layout == Layout::Rows {
                    u.fill_sv();
                } else if fmt == KFormat::Q6K {
                    u.offset_q6k(true);
                }
            }
            acc.fill([0.0; 8]);
            // The next tile's rows, fetched into L2 over this tile's
            // passes: unpacking them otherwise waits on memory.
            let next = TILE.min(all.saturating_sub((t + 1) * TILE));
            let mut ahead = decode::Ahead::new(
                w.get((j + TILE) * rb..(j + TILE + next) * rb),
                nb.div_ceil(chunk) * groups.len().div_ceil(per),
            );
            for b0 in (0..nb).step_by(chunk) {
                let blocks = b0..(b0 + chunk).min(nb);
                for (gs, acc) in groups.chunks(per).zip(acc.chunks_mut(per * halves * TILE)) {
                    ahead.step();
                    for w0 in (0..rows).step_by(width) {
                        let w1 = (w0 + width).min(rows);
                        // SAFETY: AVX2 was detected (`avx2` is only
                        // true then), VNNI with `vnni`; each `us` is a
                        // row of k values, `xq` holds m rows of k codes
                        // and each of `gs` eight (wide: sixteen, with
                        // AVX-512 VNNI) rows' block data; `blocks` lie in
                        // 0..nb; `acc` holds TILE rows per group and half.
                        unsafe {
                            let (u, b) = (&us[w0..w1], blocks.clone());
                            match layout {
                                Layout::Rows => {
                                    avx2::rows8_for(fmt, u, &xq, &gs[0], b, &mut acc[w0..w1])
                                }
                                Layout::Lanes => {
                                    lanes::rows8_for(fmt, u, &xq, gs, b, &mut acc[w0..], TILE)
                                }
                                Layout::Wide => {
                                    lanes::rows16_for(fmt, u, &xq, &gs[0], b, &mut acc[w0..], TILE)
                                }
                            }
                        };
                    }
                }
            }
            // Each group's lanes by eight: rows r0..r0 + real.
            let eights = groups.iter().flat_map(|g| {
                (0..halves).map(move |h| (g.r0 + 8 * h, g.rows.saturating_sub(8 * h).min(8)))
            });
            for ((r0, real), acc) in eights.zip(acc.chunks_exact(TILE)) {
                let whole = <&[[f32; 8]; 8]>::try_from(acc);
                if let (8, 8, true, Ok(acc)) = (rows, real, layout != Layout::Rows, whole) {
                    // SAFETY: AVX2 (the lane layouts run only there);
                    // rows r0..r0 + 8 < m, columns j..j + 8 <= n, which
                    // this task alone writes.
                    unsafe { lanes::store_transposed(acc, y.get().add(r0 * n + j), n) };
                    continue;
                }
                for r in 0..real {
                    // SAFETY: r0 + r < m and j + rows <= n; this
                    // task alone writes columns j..j + rows.
                    let yr = unsafe {
                        std::slice::from_raw_parts_mut(y.get().add((r0 + r) * n + j), rows)
                    };
                    for (v, l) in yr.iter_mut().zip(acc) {
                        *v = l[r];
                    }
                }
            }
        }
    };
    // Outputs transposed (weight row major): each weight row is read once
    // and dotted with every activation row.
    let run = |j0: usize, out: &mut [f32]| {
        for (i, yo) in out.chunks_mut(m).enumerate() {
            let row = &w[(j0 + i) * rb..(j0 + i + 1) * rb];
            if m == 1 {
                yo[0] = dot(fmt, row, &xq, 0, avx2);
            } else {
                // Unpacked once, dotted with every activation row.
                let mut u = Unpacked::new(fmt, row, k, false);
                for (r, v) in yo.iter_mut().enumerate() {
                    *v = u.dot(fmt, row, &xq, r, avx2);
                }
            }
        }
    };
    if m == 1 {
        // Decode: each thread of the batch's hot team walks one contiguous
        // run of weight rows, claims of at least ~16 KB.
        // Eight rows at a time ([`decode`]), so claims are in units of
        // eight rows: claims shrink towards the end of a run, and rows
        // short of a pass go through the one-row kernel (with long rows,
        // Q6_K 8960 wide, the smallest claims were two rows).
        #[cfg(target_arch = "x86_64")]
        let wide = avx2.then(|| decode::Decode::new(fmt, &xq, vnni));
        const UNIT: usize = 8;
        let mut yt = vec![0f32; n];
        let out = SharedOut(yt.as_mut_ptr());
        let min_claim = ((16 << 10) / (UNIT * rb)).max(1);
        crate::cpu::team::for_ranges(n.div_ceil(UNIT), min_claim, |u| {
            let r = u.start * UNIT..(u.end * UNIT).min(n);
            // SAFETY: for_ranges hands out disjoint ranges of units, so
            // these slices of `yt` (alive until for_ranges returns) are
            // disjoint.
            let o = unsafe { std::slice::from_raw_parts_mut(out.get().add(r.start), r.len()) };
            #[cfg(target_arch = "x86_64")]
            let done = match &wide {
                // SAFETY: AVX2 (and F16C) were detected (`avx2` is only
                // true then), AVX-512 VNNI where `vnni`; the rows are of
                // this call's row size.
                Some(d) => unsafe { d.rows(&w[r.start * rb..r.end * rb], rb, o) },
                None => 0,
            };
            #[cfg(not(target_arch = "x86_64"))]
            let done = 0;
            run(r.start + done, &mut o[done..]);
        });
        return Some(yt);
    }
    let threads = rayon::current_num_threads().max(1);
    let mut per = (n / (threads * 8)).max((65_536 / (rb * m)).max(1)).max(1);
    if amx {
        // Tasks of whole tile groups of weight rows.
        per = per.next_multiple_of(16);
    }
    // Per task: its weight rows' outputs for every activation row (the
    // tile groups straight into `y`; the rest then moved into their
    // columns of `y` while still in cache).
    // Every element is written below (the tasks' columns cover 0..n, each
    // for all m rows) before the length is set.
    let mut y: Vec<f32> = Vec::with_capacity(n * m);
    let yp = SharedOut(y.as_mut_ptr());
    (0..n.div_ceil(per)).into_par_iter().for_each(|t| {
        let j0 = t * per;
        let rows = per.min(n - j0);
        #[cfg(target_arch = "x86_64")]
        let done = tiles(j0, rows, yp);
        #[cfg(not(target_arch = "x86_64"))]
        let done = 0;
        if done == rows {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if !groups.is_empty() {
            grouped(j0 + done, rows - done, yp);
            return;
        }
        let mut out = vec![0f32; (rows - done) * m];
        run(j0 + done, &mut out);
        // SAFETY: tasks own disjoint column ranges j0..j0 + rows of `y`
        // (alive until the loop returns); every index is < m * n.
        unsafe {
            crate::cpu::gemv::scatter_columns(&out, rows - done, m, yp.get().add(j0 + done), n)
        };
    });
    // SAFETY: all n * m elements were written above (capacity n * m).
    unsafe { y.set_len(n * m) };
    Some(y)
}

/// A pointer to an output buffer that disjoint ranges are written through
/// from several threads.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// SAFETY: users write disjoint ranges only, while the buffer lives.
unsafe impl Send for SharedOut {}
// SAFETY: as for Send: shared use only writes disjoint ranges.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer (a method, so closures capture the Sync wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}
