//! Quantized and f32 matrix kernels for the CPU backend: `y = x W^T` with
//! weights `W` in row-major `[n, k]` (f32, or GGML Q8_0 / Q4_0 / Q4_1 /
//! Q5_0 blocks exactly as the GGUF file stores them) and f32 activation
//! rows.
//!
//! ## Why
//! LLM decode is a chain of GEMVs whose cost is streaming the weights from
//! memory, and prefill is the same product over a few hundred rows.
//! candle's general GEMM path reaches about 40% of the measured bandwidth
//! for `1 x k @ k x n`, and candle 0.11's multi-row quantized matmul is
//! several times slower than running its one-row path row by row.
//!
//! ## How (quantized weights)
//! The approach of llama.cpp's `q4_1 x q8_1` dot products, written here:
//! - Each activation row is quantized once per call to int8 per block of 32
//!   (scale `max|x| / 127`, round half to even, vectorized on AVX2), with
//!   the f32 sum of each block for Q4_1's minimum term ([`QuantRows`]). The codes
//!   of two consecutive blocks `A`, `B` are stored as `A[0..16] B[0..16]
//!   A[16..32] B[16..32]`, which is the order the 16 nibble bytes of
//!   two weight blocks give after one 256-bit `and` / shift.
//! - Per block the integer part is exact: `s = Σ (q_w - offset) q_x` in
//!   i32 (Q4_0's offset 8 and Q5_0's 16 are taken off as `offset * Σ q_x`,
//!   precomputed with the activations, as in llama.cpp's `q4_0 x q8_0`).
//!   Then, in f32 and in this order, output `y` adds block `b` to chain
//!   `c[b % 4]`: `c = fma(s, d_w * d_x, c)`, and for Q4_1 `c = c + m_w *
//!   Σx` (`Σx` the exact f32 block sum of the activations); at the end `y
//!   = (c0 + c2) + (c1 + c3)`. Every path (plain Rust, the x86 kernels
//!   and the AMX prefill kernel) computes exactly this: the same bits.
//! - Per pair of weight blocks the x86 kernels load the two 16-byte nibble
//!   runs into one register, split low / high nibbles, `maddubs` against
//!   the int8 activations (nibbles are unsigned; Q8_0 uses the sign trick)
//!   and `madd` with ones to i32 (lanes 0-3 block `A`, 4-7 block `B`).
//!   Four outputs' partial sums are then reduced together by three
//!   unpack-and-add steps to one lane per output and block, converted,
//!   and fused with the four outputs' `d_w * d_x` into the chains: lanes
//!   0-3 of one register hold chain 0 (even pairs) or 2 (odd pairs) of
//!   four outputs, lanes 4-7 chains 1 and 3. The four outputs are four
//!   weight rows of one activation row (decode), or four activation rows
//!   of one weight row (prefill; their scales side by side in
//!   [`QuantRows`]). Q5_0 is Q4_0 with a fifth bit per weight (4 bytes
//!   per block, bit `j` for element `j`), expanded to 0x10 in the code
//!   bytes by one byte shuffle and compare per register, and an offset
//!   of 16.
//! - A tile of up to 4 activation rows x up to 4 weight rows shares each
//!   unpacked weight block and each activation load; decode (one row) runs
//!   4 weight rows at a time, prefill 4 x 2. Prefill's output rows are
//!   split into rayon tasks; decode's into one contiguous run of weight
//!   rows per thread on the batch's hot team (`team::for_ranges`).
//!
//! - Q5_0 prefill on plain AVX2 runs [`lanes`] instead: each weight row
//!   unpacked once, its codes broadcast against eight activation rows held
//!   one per lane, so no lanes are reduced (1.4x the tile kernel's speed
//!   on Zen 3).
//!
//! Every tile computes each output with the arithmetic above, so a
//! prefill row equals the one-row result bit for bit.
//!
//! - Weights placed on the CPU (`Device::place`) where the 256-bit kernels
//!   run (AVX2, AVX-VNNI; Q5_0 on AVX2 only) are repacked once into tiles
//!   of 4 rows ([`pack`]): a pair of blocks' nibbles of one row in one
//!   32-byte run (Q5_0: their fifth bits in one 8-byte run), the tile's 8
//!   scales of a pair side by side. One load then feeds a
//!   row's pair, and one conversion and multiply the tile's scales, where
//!   GGML's layout needs two loads and an insert per row and a gather of
//!   scales from 8 places. [`matmul_packed`] runs the same lane operations
//!   in the same order: the results are the GGML-layout kernels' bits.
//!
//! - Where the CPU has VNNI (AVX-VNNI or AVX-512 VNNI), `vpdpbusd` replaces
//!   each `maddubs` + `madd` pair; the integer sums are the same (no i16
//!   saturation is possible with these operands), so every x86 path gives
//!   the same bits.
//! - Decode streams the weights from DRAM: each tile prefetches the rows
//!   of the tile two ahead, which the hardware prefetchers do not do for
//!   several short interleaved row streams.
//!
//! The instruction set ([`Isa`]) is chosen at run time; machines without
//! AVX2 + FMA + F16C run portable code with the same arithmetic and bits.
//! f32 weights keep f32 activations (a streaming FMA GEMV for one row).

// First: the kernel files below expand its `int8_kernels!`.
#[cfg(target_arch = "x86_64")]
#[macro_use]
mod int8;

mod activations;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod lanes;
mod pack;
mod portable;
#[cfg(target_arch = "x86_64")]
mod vnni;

use activations::QuantRows;
#[cfg(target_arch = "x86_64")]
use avx2::avx2_int8;
#[cfg(target_arch = "x86_64")]
use avx512::{avx512vbmi, avx512wide};
use candle_core::quantized::GgmlDType;
use pack::packs_on;
pub(crate) use pack::{pack, packed_rows, packs, unpack, PACK_ROWS};
use rayon::prelude::*;
#[cfg(target_arch = "x86_64")]
use vnni::{avx512vnni, avxvnni};

/// Weight rows per rayon task: small enough to balance two to sixteen
/// threads, large enough that task overhead stays below a few percent
/// (`work_per_row` bytes of weights times activation rows).
fn rows_per_task(n: usize, work_per_row: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    // At least ~64 KB of weight traffic per task.
    let min_rows = (65_536 / work_per_row.max(1)).max(1);
    // A multiple of 4 keeps the 4-row tiles whole.
    (n / (threads * 8)).max(min_rows).max(1).next_multiple_of(4)
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The instruction sets the int8 kernels are built for. All give the same
/// exact block sums (no i16 saturation is possible with these operands)
/// and add them in the module's order: the same bits on every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Plain Rust.
    Portable,
    /// AVX2 + FMA + F16C: `maddubs` / `madd` products.
    Avx2,
    /// AVX-VNNI (VEX, 256-bit `vpdpbusd`; Alder Lake, Sapphire Rapids...).
    AvxVnni,
    /// AVX-512 VNNI on 256-bit registers (Ice Lake, Zen 4... without AVX-VNNI).
    Avx512Vnni,
    /// AVX-512 F + BW + VNNI on 512-bit registers, two block pairs a step
    /// (Ice Lake, Sapphire Rapids, Zen 4...).
    Avx512Wide,
    /// [`Isa::Avx512Wide`] with AVX-512 VBMI byte permutes gathering a
    /// step's Q4 / Q5_0 nibbles and scales from two loads, and BITALG bit
    /// shuffles picking Q5_0's fifth bits (Ice Lake, Sapphire Rapids,
    /// Zen 4...; not Skylake / Cascade Lake): preferred where present.
    Avx512Vbmi,
    /// [`Isa::Avx512Vbmi`], with prefill on AMX tiles ([`amx`]; Sapphire
    /// Rapids and later, where Linux grants the tile state).
    Amx,
}

impl Isa {
    /// The best set this machine has (detected once).
    pub(crate) fn detect() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            Self::available()
                .into_iter()
                .last()
                .unwrap_or(Isa::Portable)
        })
    }

    /// Every set this machine runs, worst first.
    pub(crate) fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        if !has_avx2_fma() {
            return v;
        }
        v.push(Isa::Avx2);
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512vnni")
                && std::is_x86_feature_detected!("avx512vl")
            {
                v.push(Isa::Avx512Vnni);
            }
            if std::is_x86_feature_detected!("avxvnni") {
                v.push(Isa::AvxVnni);
            }
            if std::is_x86_feature_detected!("avx512vnni")
                && std::is_x86_feature_detected!("avx512vl")
                && std::is_x86_feature_detected!("avx512bw")
            {
                v.push(Isa::Avx512Wide);
                if std::is_x86_feature_detected!("avx512vbmi")
                    && std::is_x86_feature_detected!("avx512bitalg")
                {
                    v.push(Isa::Avx512Vbmi);
                    if crate::cpu::amx::available() {
                        v.push(Isa::Amx);
                    }
                }
            }
        }
        v
    }
}

/// Block formats these kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightFormat {
    /// Plain f32 rows.
    F32,
    /// GGML Q8_0: per 32 weights, an f16 scale and 32 i8.
    Q8_0,
    /// GGML Q4_0: per 32 weights, an f16 scale and 16 bytes of nibbles
    /// (low nibble: element j, high nibble: element j + 16), offset 8.
    Q4_0,
    /// GGML Q4_1: per 32 weights, an f16 scale `d`, an f16 minimum `m` and
    /// 16 bytes of nibbles as Q4_0; a weight is `d * q + m`.
    Q4_1,
    /// GGML Q5_0: per 32 weights, an f16 scale, 4 bytes of fifth bits (bit
    /// j for element j) and 16 bytes of nibbles as Q4_0, offset 16.
    Q5_0,
}

impl WeightFormat {
    /// The format of a GGML dtype, when these kernels read it.
    pub(crate) fn of_ggml(d: GgmlDType) -> Option<Self> {
        match d {
            GgmlDType::Q8_0 => Some(WeightFormat::Q8_0),
            GgmlDType::Q4_0 => Some(WeightFormat::Q4_0),
            GgmlDType::Q4_1 => Some(WeightFormat::Q4_1),
            GgmlDType::Q5_0 => Some(WeightFormat::Q5_0),
            _ => None,
        }
    }

    /// Bytes of one row of `k` weights (`k` a multiple of 32 when quantized).
    fn row_bytes(self, k: usize) -> usize {
        match self {
            WeightFormat::F32 => 4 * k,
            WeightFormat::Q8_0 => k / 32 * 34,
            WeightFormat::Q4_0 => k / 32 * 18,
            WeightFormat::Q4_1 => k / 32 * 20,
            WeightFormat::Q5_0 => k / 32 * 22,
        }
    }

    /// The offset a format's unsigned codes carry (Q4_0 8, Q5_0 16), taken
    /// off the integer sums as `offset * sum(q_x)` ([`QuantRows`]).
    fn offset(self) -> Option<i32> {
        match self {
            WeightFormat::Q4_0 => Some(8),
            WeightFormat::Q5_0 => Some(16),
            _ => None,
        }
    }
}

/// `y[j] = sum_i w[j, i] * x[i]` for `n` rows of `k = x.len()` weights
/// stored in `w` (bytes, in `fmt`). Returns None when the shapes do not fit
/// the format.
#[cfg(test)]
pub(crate) fn gemv(fmt: WeightFormat, w: &[u8], x: &[f32], n: usize) -> Option<Vec<f32>> {
    if fmt != WeightFormat::F32 {
        return matmul(fmt, w, n, x, 1);
    }
    gemv_f32_rows(bytemuck::cast_slice(w), x, 1, n)
}

/// f32 weights (`n` rows of `k = x.len() / m` values) against a few
/// activation rows `x` (row-major `[m, k]`): `y` row-major `[m, n]`
/// ([`gemv_rows_with`] with the f32 dot kernel). None when the shapes do
/// not fit.
pub(crate) fn gemv_f32_rows(w: &[f32], x: &[f32], m: usize, n: usize) -> Option<Vec<f32>> {
    let avx = has_avx2_fma();
    gemv_rows_with(w, x, m, n, |row, xr| {
        dot_f32(bytemuck::cast_slice(row), xr, avx)
    })
}

/// The streaming GEMV over dense weight rows of any element type: `n` rows
/// of `k = x.len() / m` elements in `w` against `m` activation rows `x`
/// (row-major `[m, k]`), `dot(weight row, activation row)` giving one
/// output; `y` row-major `[m, n]`. Each weight row is streamed once and
/// dotted with every activation row (which stay in L1), so small-`m`
/// products (decoder steps, the VAD's few frames) cost one pass over the
/// weights without a GEMM's packing; weight rows are split over rayon's
/// pool. Each output is one `dot` call, so a row of a multi-row call equals
/// the one-row result bit for bit. None when the shapes do not fit.
pub(crate) fn gemv_rows_with<T: Sync>(
    w: &[T],
    x: &[f32],
    m: usize,
    n: usize,
    dot: impl Fn(&[T], &[f32]) -> f32 + Sync,
) -> Option<Vec<f32>> {
    if m == 0 || n == 0 || !x.len().is_multiple_of(m) {
        return None;
    }
    let k = x.len() / m;
    if w.len() != k * n {
        return None;
    }
    let mut yt = vec![0f32; n * m];
    let per = rows_per_task(n, std::mem::size_of::<T>() * k * m);
    yt.par_chunks_mut(per * m).enumerate().for_each(|(t, out)| {
        let r0 = t * per;
        for (i, yo) in out.chunks_mut(m).enumerate() {
            let row = &w[(r0 + i) * k..(r0 + i + 1) * k];
            for (r, v) in yo.iter_mut().enumerate() {
                *v = dot(row, &x[r * k..(r + 1) * k]);
            }
        }
    });
    if m == 1 {
        return Some(yt);
    }
    let mut y = vec![0f32; n * m];
    for (j, col) in yt.chunks_exact(m).enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * n + j] = *v;
        }
    }
    Some(y)
}

/// Activation rows from which prefill runs on AMX tiles where they are
/// granted ([`Isa::Amx`]); fewer go through the AVX-512 tiles.
const AMX_MIN_ROWS: usize = 8;

/// The weight rows in `w` (whole groups of 16, `rb` bytes each, GGML
/// layout) against the `m` activation rows laid out in `groups`, on AMX
/// tiles, written into their columns of `y` (row-major `[m, n]`, from the
/// first of these weight rows' column).
///
/// # Safety
/// `y` is valid for writes of `m` rows of `n` floats; this caller alone
/// writes columns `0..w.len() / rb` from it.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_rows(
    fmt: WeightFormat,
    w: &[u8],
    rb: usize,
    groups: &[amx::Acts16],
    m: usize,
    y: SharedOut,
    n: usize,
) {
    let nb = rb / fmt.row_bytes(32);
    let mut w16 = amx::Weights16::default();
    let mut chains = amx::Chains::zero();
    let mut lanes = [[[0f32; 16]; 16]; 2];
    // SAFETY: Isa::Amx is only offered where AMX is granted.
    let cfg = unsafe { crate::cpu::amx::Tiles::load(amx::tiles()) };
    for (gi, rows16) in w.chunks_exact(16 * rb).enumerate() {
        let rows: [&[u8]; 16] = std::array::from_fn(|i| &rows16[i * rb..(i + 1) * rb]);
        w16.fill(fmt, &rows, nb);
        for (pi, pair) in groups.chunks(2).enumerate() {
            // One or two groups, on the stack (no allocation per pair).
            let both: [&amx::Acts16; 2] = [&pair[0], &pair[pair.len() - 1]];
            let x = &both[..pair.len()];
            let lanes = &mut lanes[..x.len()];
            // SAFETY: the configuration is loaded on this thread; AVX-512
            // comes with Isa::Amx; `w16` and the groups hold nb blocks of fmt.
            unsafe { amx::rows16_for(&cfg, fmt, nb, &w16, x, &mut chains, lanes) };
            for (g, l) in lanes.iter().enumerate() {
                let r0 = 16 * (2 * pi + g);
                for (lane, row) in l.iter().enumerate().take(m.saturating_sub(r0).min(16)) {
                    // SAFETY: row r0 + lane < m, columns 16 gi..16 gi + 16
                    // are this caller's (the contract).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            row.as_ptr(),
                            y.get().add((r0 + lane) * n + 16 * gi),
                            16,
                        )
                    };
                }
            }
        }
    }
}

/// `y[r, j] = sum_i w[j, i] * x[r, i]` for `m` activation rows `x` (row-major
/// `[m, k]`) and `n` quantized weight rows `w` (bytes, in `fmt`); `y` is
/// row-major `[m, n]`. Activations are quantized to int8 per block of 32
/// (see the module docs). Returns None for f32 weights or shapes that do
/// not fit the format.
pub(crate) fn matmul(
    fmt: WeightFormat,
    w: &[u8],
    n: usize,
    x: &[f32],
    m: usize,
) -> Option<Vec<f32>> {
    matmul_with(fmt, w, n, x, m, Isa::detect(), false)
}

/// [`matmul`] over weights in the tile layout of [`pack`] (made on this
/// machine: [`packs`] was true for `fmt`). The results are [`matmul`]'s,
/// bit for bit.
pub(crate) fn matmul_packed(
    fmt: WeightFormat,
    packed: &[u8],
    n: usize,
    x: &[f32],
    m: usize,
) -> Option<Vec<f32>> {
    let isa = Isa::detect();
    if !packs_on(fmt, isa) {
        return None;
    }
    matmul_with(fmt, packed, n, x, m, isa, true)
}

fn matmul_with(
    fmt: WeightFormat,
    w: &[u8],
    n: usize,
    x: &[f32],
    m: usize,
    isa: Isa,
    packed: bool,
) -> Option<Vec<f32>> {
    if fmt == WeightFormat::F32 || m == 0 || !x.len().is_multiple_of(m) {
        return None;
    }
    if packed && !packs_on(fmt, isa) {
        return None;
    }
    let k = x.len() / m;
    let rb = fmt.row_bytes(k);
    if k == 0 || !k.is_multiple_of(32) || w.len() != rb * n {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    let tiled = isa == Isa::Amx && !packed && m >= AMX_MIN_ROWS && amx::takes(fmt);
    #[cfg(not(target_arch = "x86_64"))]
    let tiled = false;
    // The tile kernel reads the rows' codes and scales only; the lane
    // kernels' values are needed for decode or rows after whole groups.
    let lanes = !tiled || !n.is_multiple_of(16);
    let xq = QuantRows::new(fmt, x, m, isa, lanes);
    // `rows` weight rows from `j0` into their slots of `out`.
    let run = |j0: usize, rows: usize, out: &mut [f32]| {
        let w = &w[j0 * rb..(j0 + rows) * rb];
        // Every arm below: `w` holds `rows` rows of `rb` bytes (whole
        // packed tiles first when `packed`: `j0` is a multiple of the tile
        // in both splits below), `out` has `rows * m` slots and `xq` holds
        // m rows of k values in the format's layout, which is what `rows`
        // requires besides its instruction set.
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2 + FMA + F16C detected (Isa::available); the
            // buffers are as above.
            Isa::Avx2 => unsafe { avx2_int8::rows(fmt, w, rb, &xq, out, packed) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-VNNI (and AVX2 + FMA + F16C) detected; the
            // buffers are as above.
            Isa::AvxVnni => unsafe { avxvnni::rows(fmt, w, rb, &xq, out, packed) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 VNNI + VL (and AVX2 + FMA + F16C) detected;
            // the buffers are as above.
            Isa::Avx512Vnni => unsafe { avx512vnni::rows(fmt, w, rb, &xq, out, packed) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 BW (so F), VL and VNNI detected; the buffers
            // are as above.
            Isa::Avx512Wide => unsafe { avx512wide::rows(fmt, w, rb, &xq, out, packed) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 BW (so F), VL, VNNI, VBMI and BITALG
            // detected (AMX is only offered with them); the buffers are as
            // above.
            Isa::Avx512Vbmi | Isa::Amx => unsafe { avx512vbmi::rows(fmt, w, rb, &xq, out, packed) },
            Isa::Portable => portable::rows(fmt, w, rb, &xq, out),
            #[cfg(not(target_arch = "x86_64"))]
            _ => portable::rows(fmt, w, rb, &xq, out),
        }
    };
    if m == 1 {
        let mut yt = vec![0f32; n];
        // Decode streams the weights once: each thread walks one
        // contiguous run (`team::for_ranges`), in units of the
        // kernel's 4-row tiles and claims of at least ~16 KB.
        const TILE: usize = 4;
        let out = SharedOut(yt.as_mut_ptr());
        crate::cpu::team::for_ranges(n.div_ceil(TILE), (16 << 10) / (TILE * rb), |r| {
            let j0 = r.start * TILE;
            let rows = (r.end * TILE).min(n) - j0;
            // SAFETY: for_ranges hands out disjoint unit ranges, so these
            // slices of `yt` (alive until for_ranges returns) are disjoint.
            let out = unsafe { std::slice::from_raw_parts_mut(out.get().add(j0), rows) };
            run(j0, rows, out);
        });
        return Some(yt);
    }
    // Per task: the outputs of `per` weight rows for all m activation
    // rows, weight row major as the kernels write them, then moved into
    // their columns of `y` while still in cache.
    let per = rows_per_task(n, rb * m);
    // Whole groups of 16 weight rows for the tile kernel.
    let per = if tiled { per.next_multiple_of(16) } else { per };
    // Q5_0 on plain AVX2, and on AMD's AVX-512 CPUs (where 512-bit ops
    // are two 256-bit halves), the lane-per-row kernel ([`lanes`]; the
    // same bits as the tiles; there on 512-bit registers with `vpdpbusd`).
    #[cfg(target_arch = "x86_64")]
    let q5_lanes = isa == Isa::Avx2
        || (matches!(isa, Isa::Avx512Wide | Isa::Avx512Vbmi) && crate::cpu::amd_avx512());
    #[cfg(target_arch = "x86_64")]
    let lane_groups: Vec<lanes::Lanes8> = if q5_lanes && fmt == WeightFormat::Q5_0 && !tiled {
        (0..m)
            .step_by(8)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|r0| lanes::Lanes8::new(&xq, r0))
            .collect()
    } else {
        Vec::new()
    };
    #[cfg(target_arch = "x86_64")]
    let groups: Vec<amx::Acts16> = if tiled {
        let q4_1 = fmt == WeightFormat::Q4_1;
        (0..m)
            .step_by(16)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|r0| amx::Acts16::new(&xq, r0, q4_1))
            .collect()
    } else {
        Vec::new()
    };
    // Every element is written below (the tasks' columns cover 0..n, each
    // for all m rows) before the length is set.
    let mut y: Vec<f32> = Vec::with_capacity(n * m);
    let yp = SharedOut(y.as_mut_ptr());
    (0..n.div_ceil(per)).into_par_iter().for_each(|t| {
        let j0 = t * per;
        let rows = per.min(n - j0);
        #[cfg(target_arch = "x86_64")]
        if tiled {
            let whole = rows / 16 * 16;
            let tile = &w[j0 * rb..(j0 + whole) * rb];
            // SAFETY: tasks own disjoint column ranges j0..j0 + rows of `y`
            // (alive until the loop returns), which is m x n.
            unsafe { tile_rows(fmt, tile, rb, &groups, m, SharedOut(yp.get().add(j0)), n) };
            let rest = rows - whole;
            if rest > 0 {
                let mut out = vec![0f32; rest * m];
                run(j0 + whole, rest, &mut out);
                // SAFETY: as above, columns j0 + whole..j0 + rows.
                unsafe { scatter_columns(&out, rest, m, yp.get().add(j0 + whole), n) };
            }
            return;
        }
        let mut out = vec![0f32; rows * m];
        #[cfg(target_arch = "x86_64")]
        if !lane_groups.is_empty() {
            let w = &w[j0 * rb..(j0 + rows) * rb];
            // SAFETY: AVX2 + FMA + F16C detected (Isa::Avx2 or an AVX-512
            // set, which Isa::available offers only with them, and with
            // AVX-512 F, BW and VNNI, which the wide kernel takes); these are
            // `rows` whole Q5_0 rows of the groups' k values (whole packed
            // tiles first when `packed`: j0 is a multiple of the tile).
            unsafe { lanes::rows(w, rb, &lane_groups, m, &mut out, packed, isa != Isa::Avx2) };
        } else {
            run(j0, rows, &mut out);
        }
        #[cfg(not(target_arch = "x86_64"))]
        run(j0, rows, &mut out);
        // SAFETY: tasks own disjoint column ranges j0..j0 + rows of `y`
        // (alive until the loop returns); every index is < m * n.
        unsafe { scatter_columns(&out, rows, m, yp.get().add(j0), n) };
    });
    // SAFETY: all n * m elements were written above (capacity n * m).
    unsafe { y.set_len(n * m) };
    Some(y)
}

/// `out` (`rows` weight rows of `m` values each) into columns
/// `0..rows` of the row-major `[m, n]` matrix at `y`, in bands of 16
/// weight rows, so each band's reads and writes stay in a few cache lines.
///
/// # Safety
/// `y` points at `m` rows of `n >= rows` writable floats that nothing else
/// touches in columns `0..rows` meanwhile.
pub(crate) unsafe fn scatter_columns(out: &[f32], rows: usize, m: usize, y: *mut f32, n: usize) {
    debug_assert!(out.len() == rows * m && rows <= n);
    for j0 in (0..rows).step_by(16) {
        let j1 = (j0 + 16).min(rows);
        for r in 0..m {
            for j in j0..j1 {
                // SAFETY: r < m, j < rows <= n (the caller's contract).
                unsafe { *y.add(r * n + j) = out[j * m + r] };
            }
        }
    }
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

fn dot_f32(row: &[u8], x: &[f32], avx: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: AVX2, FMA and F16C were detected at run time; the kernel
        // reads only within `row` and `x`, whose lengths match.
        return unsafe { avx2::dot_f32(row, x) };
    }
    let _ = avx;
    portable::dot_f32(row, x)
}

#[cfg(test)]
mod tests;
