//! Quantized and f32 matrix kernels for the CPU backend: `y = x W^T` with
//! weights `W` in row-major `[n, k]` (f32, or GGML Q8_0 / Q4_0 / Q4_1
//! blocks exactly as the GGUF file stores them) and f32 activation rows.
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
//! - Per pair of weight blocks: load the two 16-byte nibble runs into one
//!   register, split low / high nibbles, `maddubs` against the int8
//!   activations (nibbles are unsigned; Q8_0 uses the sign trick), `madd`
//!   with ones to i32 (lanes 0-3 block `A`, 4-7 block `B`), convert, and
//!   FMA with `d_w * d_x` into an f32 accumulator. The four f16 scales of
//!   the pair (`d`, `m` per block) are converted by one F16C instruction.
//!   Q4_0's offset of 8 is taken off the i32 sums as `8 * sum(q_x)`
//!   (precomputed per lane with the activations), so its block sums are
//!   exact integers, as in llama.cpp's `q4_0 x q8_0`.
//! - A tile of up to 4 activation rows x up to 4 weight rows shares each
//!   unpacked weight block and each activation load; decode (one row) runs
//!   4 weight rows at a time, prefill 4 x 2. Prefill's output rows are
//!   split into rayon tasks; decode's into one contiguous run of weight
//!   rows per thread on the batch's hot team (`cpu_team::for_ranges`).
//!
//! Every tile computes each output with the same operations in the same
//! order, so a prefill row equals the one-row result bit for bit.
//!
//! - Weights placed on the CPU (`Device::place`) where the 256-bit kernels
//!   run (AVX2, AVX-VNNI) are repacked once into tiles of 4 rows
//!   ([`pack`]): a pair of blocks' nibbles of one row in one 32-byte run,
//!   the tile's 8 scales of a pair side by side. One load then feeds a
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
//! AVX2 + FMA + F16C run portable code with the same int8 arithmetic (sums
//! in another order).
//! f32 weights keep f32 activations (a streaming FMA GEMV for one row).

use candle_core::quantized::GgmlDType;
use rayon::prelude::*;

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
/// integer block sums (no i16 saturation is possible with these operands),
/// so their results differ only where f32 sums are ordered differently:
/// not at all between the three x86 paths.
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
    /// step's Q4 nibbles and scales from two loads (Ice Lake, Sapphire
    /// Rapids, Zen 4...; not Skylake / Cascade Lake): preferred where
    /// present.
    Avx512Vbmi,
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
                if std::is_x86_feature_detected!("avx512vbmi") {
                    v.push(Isa::Avx512Vbmi);
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
}

impl WeightFormat {
    /// The format of a GGML dtype, when these kernels read it.
    pub(crate) fn of_ggml(d: GgmlDType) -> Option<Self> {
        match d {
            GgmlDType::Q8_0 => Some(WeightFormat::Q8_0),
            GgmlDType::Q4_0 => Some(WeightFormat::Q4_0),
            GgmlDType::Q4_1 => Some(WeightFormat::Q4_1),
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

/// Weight rows per tile of the packed layout ([`pack`]).
pub(crate) const PACK_ROWS: usize = 4;

/// Whether [`pack`] has a layout for `fmt` that this machine's kernels
/// read: the block formats, where the 256-bit int8 kernels run (AVX2,
/// AVX-VNNI).
/// The 512-bit kernels gather a step's blocks with their own permutes and
/// read GGML's layout; portable code has no use for it.
pub(crate) fn packs(fmt: WeightFormat) -> bool {
    packs_on(fmt, Isa::detect())
}

fn packs_on(fmt: WeightFormat, isa: Isa) -> bool {
    fmt != WeightFormat::F32 && matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni)
}

/// Where a block keeps its quants (after `d`, and `m` for Q4_1).
fn quant_offset(fmt: WeightFormat) -> usize {
    if fmt == WeightFormat::Q4_1 {
        4
    } else {
        2
    }
}

/// The byte moves between GGML's row-major blocks and the packed tile
/// layout ([`pack`]): `f(ggml_offset, packed_offset, len)` for every run of
/// bytes that moves, covering both buffers once. None when the format has
/// no packed layout or the sizes do not fit.
fn pack_moves(
    fmt: WeightFormat,
    len: usize,
    n: usize,
    k: usize,
    mut f: impl FnMut(usize, usize, usize),
) -> Option<()> {
    if fmt == WeightFormat::F32 || k == 0 || !k.is_multiple_of(32) || len != n * fmt.row_bytes(k) {
        return None;
    }
    let (bb, nb) = (fmt.row_bytes(32), k / 32);
    let rb = nb * bb;
    let off = quant_offset(fmt);
    // 16-byte runs of a block's quants: one of nibbles, or Q8_0's two
    // halves (stored half by half over the group's blocks: the activation
    // pair layout).
    let halves: &[usize] = if fmt == WeightFormat::Q8_0 {
        &[0, 16]
    } else {
        &[0]
    };
    // The f16 fields of a block: `d`, and `m` for Q4_1.
    let fields: &[usize] = if fmt == WeightFormat::Q4_1 {
        &[0, 2]
    } else {
        &[0]
    };
    let mut o = 0;
    for t in 0..n / PACK_ROWS {
        let at = |r: usize, b: usize| (t * PACK_ROWS + r) * rb + b * bb;
        let mut group = |blocks: &[usize]| {
            for r in 0..PACK_ROWS {
                for &h in halves {
                    for &b in blocks {
                        f(at(r, b) + off + h, o, 16);
                        o += 16;
                    }
                }
            }
            for &field in fields {
                for &b in blocks {
                    for r in 0..PACK_ROWS {
                        f(at(r, b) + field, o, 2);
                        o += 2;
                    }
                }
            }
        };
        for p in 0..nb / 2 {
            group(&[2 * p, 2 * p + 1]);
        }
        if nb % 2 == 1 {
            group(&[nb - 1]);
        }
    }
    let tail = n / PACK_ROWS * PACK_ROWS * rb;
    f(tail, o, len - tail);
    Some(())
}

/// GGML Q4_0 / Q4_1 / Q8_0 weights (`n` rows of `k` values, as the file
/// stores them) in the layout the 256-bit decode kernels stream fastest.
/// Rows go in tiles of [`PACK_ROWS`]; a tile holds, for each pair of
/// blocks `2p, 2p + 1`: each of its 4 rows' quants of the pair in the
/// activation pair layout (Q4: the 16 nibble bytes of block `2p`, then of
/// `2p + 1`: one 32-byte load; Q8_0: `A[0..16] B[0..16] A[16..32]
/// B[16..32]`: two), then the 8 f16 scales `d` (block `2p` of rows 0-3,
/// then block `2p + 1`), then for Q4_1 the 8 minimums `m` in the same
/// order; an odd last block follows as each row's quants in element order,
/// 4 `d` (and 4 `m`). A tile is exactly its 4 rows' bytes, so row `j` of a whole tile
/// still starts its tile's span at `j * row_bytes`; rows after the last
/// whole tile stay in GGML's layout.
///
/// Why: in GGML's layout a tile's scales sit in 8 places per pair of
/// blocks, and gathering them cost as much as the dot products
/// (Q4_1 1 x 896 x 4864 on AVX2, Zen 3: 0.67x the time in cache, 0.75x
/// streamed from DRAM with the scales side by side).
pub(crate) fn pack(fmt: WeightFormat, w: &[u8], n: usize, k: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; w.len()];
    pack_moves(fmt, w.len(), n, k, |g, p, len| {
        out[p..p + len].copy_from_slice(&w[g..g + len])
    })?;
    Some(out)
}

/// GGML's layout back from [`pack`]'s.
pub(crate) fn unpack(fmt: WeightFormat, packed: &[u8], n: usize, k: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; packed.len()];
    pack_moves(fmt, packed.len(), n, k, |g, p, len| {
        out[g..g + len].copy_from_slice(&packed[p..p + len])
    })?;
    Some(out)
}

/// GGML's bytes of rows `ids` of [`pack`]ed weights (an embedding lookup
/// in a packed matrix), read in place. None when the sizes do not fit or an
/// id is out of range.
pub(crate) fn packed_rows(
    fmt: WeightFormat,
    packed: &[u8],
    n: usize,
    k: usize,
    ids: &[usize],
) -> Option<Vec<u8>> {
    if fmt == WeightFormat::F32
        || k == 0
        || !k.is_multiple_of(32)
        || packed.len() != n * fmt.row_bytes(k)
    {
        return None;
    }
    let (bb, nb) = (fmt.row_bytes(32), k / 32);
    let rb = nb * bb;
    let (off, pair) = (quant_offset(fmt), 8 * bb);
    let halves = if fmt == WeightFormat::Q8_0 { 2 } else { 1 };
    let tiled = n / PACK_ROWS * PACK_ROWS;
    let mut out = Vec::with_capacity(ids.len() * rb);
    for &j in ids {
        if j >= n {
            return None;
        }
        if j >= tiled {
            out.extend_from_slice(&packed[j * rb..(j + 1) * rb]);
            continue;
        }
        let (base, r) = (j / PACK_ROWS * PACK_ROWS * rb, j % PACK_ROWS);
        for b in 0..nb {
            // A block of a pair (2 blocks a row) or the odd last one.
            let (group, which, per) = if b < nb / 2 * 2 {
                (base + b / 2 * pair, b % 2, 2)
            } else {
                (base + nb / 2 * pair, 0, 1)
            };
            // Bytes of quants one row has in the group.
            let row = 16 * per * halves;
            let field = |f: usize| group + 4 * row + 8 * per * f + 2 * (4 * which + r);
            let mut block = [0u8; 34];
            block[..2].copy_from_slice(&packed[field(0)..field(0) + 2]);
            if fmt == WeightFormat::Q4_1 {
                block[2..4].copy_from_slice(&packed[field(1)..field(1) + 2]);
            }
            for h in 0..halves {
                let q = group + row * r + 16 * (h * per + which);
                block[off + 16 * h..off + 16 * h + 16].copy_from_slice(&packed[q..q + 16]);
            }
            out.extend_from_slice(&block[..bb]);
        }
    }
    Some(out)
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
    let xq = QuantRows::new(fmt, x, m, isa);
    // `rows` weight rows from `j0` into their slots of `out`.
    let run = |j0: usize, rows: usize, out: &mut [f32]| {
        let w = &w[j0 * rb..(j0 + rows) * rb];
        // SAFETY (each arm): the instruction sets were detected at run time
        // (Isa::available); `w` holds `rows` rows of `rb` bytes (whole
        // packed tiles first when `packed`: `j0` is a multiple of the tile
        // in both splits below), `out` has
        // `rows * m` slots and `xq` holds m rows of k values in the format's
        // layout.
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { avx2_int8::rows(fmt, w, rb, &xq, out, packed) },
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => unsafe { avxvnni::rows(fmt, w, rb, &xq, out, packed) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => unsafe { avx512vnni::rows(fmt, w, rb, &xq, out, packed) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Wide => unsafe { avx512wide::rows(fmt, w, rb, &xq, out, packed) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vbmi => unsafe { avx512vbmi::rows(fmt, w, rb, &xq, out, packed) },
            _ => portable::rows(fmt, w, rb, &xq, out),
        }
    };
    let mut yt = vec![0f32; n * m];
    if m == 1 {
        // Decode streams the weights once: each thread walks one
        // contiguous run (`cpu_team::for_ranges`), in units of the
        // kernel's 4-row tiles and claims of at least ~16 KB.
        const TILE: usize = 4;
        let out = SharedOut(yt.as_mut_ptr());
        crate::cpu_team::for_ranges(n.div_ceil(TILE), (16 << 10) / (TILE * rb), |r| {
            let j0 = r.start * TILE;
            let rows = (r.end * TILE).min(n) - j0;
            // SAFETY: for_ranges hands out disjoint unit ranges, so these
            // slices of `yt` (alive until for_ranges returns) are disjoint.
            let out = unsafe { std::slice::from_raw_parts_mut(out.get().add(j0), rows) };
            run(j0, rows, out);
        });
        return Some(yt);
    }
    // Per task: outputs of `per` weight rows for all m activation rows,
    // transposed (weight row major), so tasks write disjoint slices.
    let per = rows_per_task(n, rb * m);
    yt.par_chunks_mut(per * m)
        .enumerate()
        .for_each(|(t, out)| run(t * per, out.len() / m, out));
    // Transpose in bands of 16 output rows: each weight row's 16 values
    // are one cache line of `yt`.
    const BAND: usize = 16;
    let mut y = vec![0f32; n * m];
    y.par_chunks_mut(BAND * n)
        .enumerate()
        .for_each(|(t, band)| {
            let r0 = t * BAND;
            let rows = band.len() / n;
            for (j, col) in yt.chunks_exact(m).enumerate() {
                for (r, v) in col[r0..r0 + rows].iter().enumerate() {
                    band[r * n + j] = *v;
                }
            }
        });
    Some(y)
}

/// A pointer to an output buffer that disjoint ranges are written through
/// from several threads.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// SAFETY: users write disjoint ranges only, while the buffer lives.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer (a method, so closures capture the Sync wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Activation rows quantized to int8 per block of 32 for one weight format,
/// in the kernels' layout.
#[derive(Debug)]
pub(crate) struct QuantRows {
    /// Values per row (a multiple of 32).
    k: usize,
    /// Rows.
    m: usize,
    /// `m * k` codes. Within a row, blocks go in pairs `A, B` stored as
    /// `A[0..16] B[0..16] A[16..32] B[16..32]`; an odd last block is stored
    /// as it is.
    codes: Vec<i8>,
    /// `m * 4 * ceil(k / 64)` floats (an odd last block is followed by two
    /// zeros): per block, the activation scale `d_x` and
    /// what the weight block's minimum `m_w` multiplies: for Q4_1 the exact
    /// f32 sum of the block's activations, divided by the number of
    /// accumulator lanes that add it (4 for a pair, 8 for an odd last
    /// block); zero for the other formats.
    scales: Vec<f32>,
    /// Q4_0 only (else empty): `m * 8 * ceil(k / 64)` i32, per pair (or odd
    /// last block) and accumulator lane, `8 *` the sum of the codes that
    /// lane multiplies: subtracted from the lane's i32 sum it applies the
    /// format's offset of 8 exactly.
    offsets: Vec<i32>,
}

impl QuantRows {
    /// Quantize the `m` rows of `x` (row-major) for weights in `fmt`;
    /// `isa` other than portable quantizes with AVX2 (the same codes:
    /// both round half to even).
    fn new(fmt: WeightFormat, x: &[f32], m: usize, isa: Isa) -> Self {
        let k = x.len() / m;
        let nb = k / 32;
        let mut codes = vec![0i8; m * k];
        let mut scales = vec![0f32; m * Self::scales_per_row(k)];
        let simd = isa != Isa::Portable;
        let quantize_row = |((xr, qr), sr): ((&[f32], &mut [i8]), &mut [f32])| {
            for (b, xs) in xr.chunks_exact(32).enumerate() {
                let (d, sum, q) = quantize_block(xs, simd);
                let (lo, hi) = (code_index(b, 0, nb), code_index(b, 16, nb));
                qr[lo..lo + 16].copy_from_slice(&q[..16]);
                qr[hi..hi + 16].copy_from_slice(&q[16..]);
                let lanes = if b + 1 == nb && nb % 2 == 1 { 8.0 } else { 4.0 };
                sr[2 * b] = d;
                if fmt == WeightFormat::Q4_1 {
                    sr[2 * b + 1] = sum / lanes;
                }
            }
        };
        if m >= 8 {
            x.par_chunks_exact(k)
                .zip(codes.par_chunks_exact_mut(k))
                .zip(scales.par_chunks_exact_mut(Self::scales_per_row(k)))
                .for_each(quantize_row);
        } else {
            x.chunks_exact(k)
                .zip(codes.chunks_exact_mut(k))
                .zip(scales.chunks_exact_mut(Self::scales_per_row(k)))
                .for_each(quantize_row);
        }
        // Lane l of a 32-code group sums bytes 4l..4l + 4 of both of its
        // 32-byte halves (a pair) or of its only half (an odd last block).
        let offsets = if fmt == WeightFormat::Q4_0 {
            codes
                .chunks_exact(k)
                .flat_map(|row| {
                    row.chunks(64).flat_map(|g| {
                        (0..8).map(move |l| {
                            let s: i32 = g
                                .chunks(32)
                                .flat_map(|h| &h[4 * l..4 * l + 4])
                                .map(|q| i32::from(*q))
                                .sum();
                            8 * s
                        })
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        QuantRows {
            k,
            m,
            codes,
            scales,
            offsets,
        }
    }

    /// Codes of row `r`.
    fn codes(&self, r: usize) -> &[i8] {
        &self.codes[r * self.k..(r + 1) * self.k]
    }

    /// Scales of row `r`.
    fn scales(&self, r: usize) -> &[f32] {
        let per = Self::scales_per_row(self.k);
        &self.scales[r * per..(r + 1) * per]
    }

    /// Two per block, rounded up to a whole pair (the kernels load four).
    fn scales_per_row(k: usize) -> usize {
        4 * k.div_ceil(64)
    }

    /// Q4_0 offsets of row `r` (empty for other formats).
    fn offsets(&self, r: usize) -> &[i32] {
        let per = 8 * self.k.div_ceil(64);
        self.offsets.get(r * per..(r + 1) * per).unwrap_or(&[])
    }
}

/// One block of 32 activations as int8: `(d, sum, codes)` with `d =
/// max|x| / 127`, codes `x / d` rounded half to even (0 when `d` is 0) and
/// the f32 sum of the block (summed in another order by the SIMD path).
fn quantize_block(xs: &[f32], simd: bool) -> (f32, f32, [i8; 32]) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        let xs: &[f32; 32] = xs.try_into().expect("blocks of 32");
        // SAFETY: `simd` is set only when AVX2 and FMA were detected.
        return unsafe { quant_avx2::block(xs) };
    }
    let _ = simd;
    let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; 32];
    for (c, v) in q.iter_mut().zip(xs) {
        *c = (v * id).round_ties_even() as i8;
    }
    (d, xs.iter().sum(), q)
}

#[cfg(target_arch = "x86_64")]
mod quant_avx2 {
    use std::arch::x86_64::*;

    /// [`super::quantize_block`] on AVX2: the same `d` and codes
    /// (`cvtps2dq` rounds half to even under the default MXCSR).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn block(xs: &[f32; 32]) -> (f32, f32, [i8; 32]) {
        // SAFETY: four 8-lane loads inside the 32-value array.
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xs.as_ptr().add(8 * i)) });
        let sign = _mm256_set1_ps(-0.0);
        let a = |i: usize| _mm256_andnot_ps(sign, v[i]);
        let m8 = _mm256_max_ps(_mm256_max_ps(a(0), a(1)), _mm256_max_ps(a(2), a(3)));
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)));
        // packs work per 128-bit lane: the bytes come out as 4-element
        // groups 0, 2, 4, 6 | 1, 3, 5, 7; one permute restores the order.
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let mut codes = [0i8; 32];
        // SAFETY: one 32-byte store into the 32-byte array.
        unsafe { _mm256_storeu_si256(codes.as_mut_ptr() as *mut __m256i, p) };
        let s8 = _mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3]));
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let sum = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)));
        (d, sum, codes)
    }
}

/// Where element `e` of block `b` (of `nb` in the row) sits in
/// [`QuantRows::codes`].
fn code_index(b: usize, e: usize, nb: usize) -> usize {
    if b + 1 == nb && nb % 2 == 1 {
        return 32 * b + e;
    }
    let (pair, second) = (b / 2, b % 2);
    64 * pair + 32 * (e / 16) + 16 * second + e % 16
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

fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

mod portable {
    use super::{code_index, f16_at, QuantRows, WeightFormat};

    pub(super) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
        let mut acc = [0f32; 8];
        let mut rc = row.chunks_exact(32);
        let mut xc = x.chunks_exact(8);
        for (r, xs) in (&mut rc).zip(&mut xc) {
            for l in 0..8 {
                let w = f32::from_le_bytes([r[4 * l], r[4 * l + 1], r[4 * l + 2], r[4 * l + 3]]);
                acc[l] += w * xs[l];
            }
        }
        let mut s: f32 = acc.iter().sum();
        for (r, xv) in rc.remainder().chunks_exact(4).zip(xc.remainder()) {
            s += f32::from_le_bytes([r[0], r[1], r[2], r[3]]) * xv;
        }
        s
    }

    /// One weight row against activation row `r`: the int8 arithmetic of
    /// the AVX2 kernels, block by block.
    pub(super) fn dot(fmt: WeightFormat, row: &[u8], xq: &QuantRows, r: usize) -> f32 {
        let nb = xq.k / 32;
        let (codes, scales) = (xq.codes(r), xq.scales(r));
        let bb = fmt.row_bytes(32);
        let mut s = 0f32;
        for (b, blk) in row.chunks_exact(bb).enumerate() {
            let lo = &codes[code_index(b, 0, nb)..code_index(b, 0, nb) + 16];
            let hi = &codes[code_index(b, 16, nb)..code_index(b, 16, nb) + 16];
            let d = f16_at(blk);
            let (isum, m_w) = match fmt {
                WeightFormat::Q8_0 => {
                    let q = &blk[2..34];
                    let dot = |w: &[u8], x: &[i8]| -> i32 {
                        w.iter()
                            .zip(x)
                            .map(|(a, b)| i32::from(*a as i8) * i32::from(*b))
                            .sum()
                    };
                    (dot(&q[..16], lo) + dot(&q[16..], hi), 0.0)
                }
                _ => {
                    let (q, m_w, off) = match fmt {
                        WeightFormat::Q4_1 => (&blk[4..20], f16_at(&blk[2..]), 0),
                        _ => (&blk[2..18], 0.0, 8),
                    };
                    let isum: i32 = q
                        .iter()
                        .zip(lo.iter().zip(hi))
                        .map(|(w, (a, b))| {
                            (i32::from(w & 15) - off) * i32::from(*a)
                                + (i32::from(w >> 4) - off) * i32::from(*b)
                        })
                        .sum();
                    (isum, m_w)
                }
            };
            let lanes = if b + 1 == nb && nb % 2 == 1 { 8.0 } else { 4.0 };
            s += d * scales[2 * b] * isum as f32 + m_w * scales[2 * b + 1] * lanes;
        }
        s
    }

    /// All activation rows against the weight rows in `w` (`rb` bytes each);
    /// `out[j * m + r]` = weight row j . activation row r.
    pub(super) fn rows(fmt: WeightFormat, w: &[u8], rb: usize, xq: &QuantRows, out: &mut [f32]) {
        for (row, o) in w.chunks_exact(rb).zip(out.chunks_exact_mut(xq.m)) {
            for (r, v) in o.iter_mut().enumerate() {
                *v = dot(fmt, row, xq, r);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! f32 GEMV rows (AVX2 + FMA); the int8 kernels are generated by
    //! `int8_kernels!`.
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available; `row` holds `4 * x.len()` bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
        let k = x.len();
        let w = row.as_ptr() as *const f32;
        let xp = x.as_ptr();
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let mut a2 = _mm256_setzero_ps();
        let mut a3 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY (all loads): i + 32 <= k, so every 8-lane load is in bounds;
        // loadu has no alignment requirement.
        unsafe {
            while i + 32 <= k {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i)), _mm256_loadu_ps(xp.add(i)), a0);
                a1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(w.add(i + 8)),
                    _mm256_loadu_ps(xp.add(i + 8)),
                    a1,
                );
                a2 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(w.add(i + 16)),
                    _mm256_loadu_ps(xp.add(i + 16)),
                    a2,
                );
                a3 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(w.add(i + 24)),
                    _mm256_loadu_ps(xp.add(i + 24)),
                    a3,
                );
                i += 32;
            }
            while i + 8 <= k {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i)), _mm256_loadu_ps(xp.add(i)), a0);
                i += 8;
            }
            let mut s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            while i < k {
                s += w.add(i).read_unaligned() * *xp.add(i);
                i += 1;
            }
            s
        }
    }
}

/// The int8 kernels for one x86 instruction set: `$features` for
/// `target_feature`, `$dot4(acc, u8s, i8s)` adding the 4-product sums of
/// each i32 lane, and `$vnni` when that is one instruction (both nibble
/// halves then go through it; without VNNI they add as i16 first).
#[cfg(target_arch = "x86_64")]
macro_rules! int8_kernels {
    ($name:ident, $features:literal, $dot4:path, $vnni:literal, $wide:literal, $vbmi:literal) => {
        mod $name {
            use super::avx2::hsum;
            use super::{QuantRows, WeightFormat};
            use std::arch::x86_64::*;

            pub(super) const Q8_0: u8 = 0;
            pub(super) const Q4_0: u8 = 1;
            pub(super) const Q4_1: u8 = 2;

            /// Bytes of one block.
            pub(super) const fn block_bytes(f: u8) -> usize {
                match f {
                    Q8_0 => 34,
                    Q4_0 => 18,
                    _ => 20,
                }
            }

            // Loads: `_mm*_lddqu_si*` (unaligned, like loadu). stdarch implements
            // the `loadu` intrinsics with `ptr::copy_nonoverlapping`, whose
            // precondition checks (on in the dev profile the product builds with)
            // put a branch pair on every load of these loops and cost about half
            // their speed; `lddqu` maps straight to the instruction.

            /// 16 bytes at `p`.
            ///
            /// # Safety
            /// `p..p + 16` is readable.
            #[target_feature(enable = $features)]
            #[inline]
            pub(super) unsafe fn load16<T>(p: *const T) -> __m128i {
                // SAFETY: the caller's contract.
                unsafe { _mm_lddqu_si128(p as *const __m128i) }
            }

            /// 32 bytes at `p`.
            ///
            /// # Safety
            /// `p..p + 32` is readable.
            #[target_feature(enable = $features)]
            #[inline]
            pub(super) unsafe fn load32<T>(p: *const T) -> __m256i {
                // SAFETY: the caller's contract.
                unsafe { _mm256_lddqu_si256(p as *const __m256i) }
            }

            /// The f16 scales of blocks `a` and `b` (their first 16 bytes) as f16
            /// pairs in 32-bit lanes 0 and 1: `(d, m)` for Q4_1, `(d, +0)` for the
            /// others (whose second f16 slot holds quants).
            #[target_feature(enable = $features)]
            #[inline]
            pub(super) fn scale_pairs<const F: u8>(a: __m128i, b: __m128i) -> __m128i {
                let dm = _mm_unpacklo_epi32(a, b);
                if F == Q4_1 {
                    dm
                } else {
                    _mm_blend_epi16::<0b1010_1010>(dm, _mm_setzero_si128())
                }
            }

            /// The weights of blocks `a` and `b` in the activation pair layout:
            /// (`A[0..16] B[0..16]`, `A[16..32] B[16..32]`).
            ///
            /// # Safety
            /// AVX2 available; `a` and `b` point at whole blocks.
            #[target_feature(enable = $features)]
            #[inline]
            pub(super) unsafe fn unpack_pair<const F: u8>(
                a: *const u8,
                b: *const u8,
            ) -> (__m256i, __m256i) {
                // SAFETY: the 16-byte loads stay inside the blocks: nibbles at 2..18
                // (Q4_0) or 4..20 (Q4_1), quants at 2..34 (Q8_0).
                unsafe {
                    if F == Q8_0 {
                        let l =
                            _mm256_set_m128i(load16(b.wrapping_add(2)), load16(a.wrapping_add(2)));
                        let h = _mm256_set_m128i(
                            load16(b.wrapping_add(18)),
                            load16(a.wrapping_add(18)),
                        );
                        return (l, h);
                    }
                    let off = if F == Q4_1 { 4 } else { 2 };
                    let v =
                        _mm256_set_m128i(load16(b.wrapping_add(off)), load16(a.wrapping_add(off)));
                    let m4 = _mm256_set1_epi8(0x0f);
                    (
                        _mm256_and_si256(v, m4),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
                    )
                }
            }

            /// The weights of one block in plain element order.
            ///
            /// # Safety
            /// AVX2 available; `a` points at a whole block.
            #[target_feature(enable = $features)]
            #[inline]
            pub(super) unsafe fn unpack_one<const F: u8>(a: *const u8) -> __m256i {
                // SAFETY: as in `unpack_pair`.
                unsafe {
                    if F == Q8_0 {
                        return load32(a.wrapping_add(2));
                    }
                    let off = if F == Q4_1 { 4 } else { 2 };
                    let raw = load16(a.wrapping_add(off));
                    let m4 = _mm_set1_epi8(0x0f);
                    _mm256_set_m128i(
                        _mm_and_si128(_mm_srli_epi16::<4>(raw), m4),
                        _mm_and_si128(raw, m4),
                    )
                }
            }

            /// `sum w * x` over byte quads, as 8 i32 partial sums of 4 products
            /// each, added to `acc`.
            #[target_feature(enable = $features)]
            #[inline]
            pub(super) fn dot_i8<const F: u8>(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
                if F == Q8_0 {
                    // The unsigned operand must be |w|, and x carries w's sign
                    // (|-128| reads as the unsigned 128).
                    return $dot4(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
                }
                $dot4(acc, w, x)
            }

            /// The pair's i32 sums: lanes 0-3 block `A`, 4-7 block `B`, added to
            /// `acc`.
            #[target_feature(enable = $features)]
            #[inline]
            pub(super) fn dot_pair<const F: u8>(
                acc: __m256i,
                l: __m256i,
                h: __m256i,
                xl: __m256i,
                xh: __m256i,
            ) -> __m256i {
                if $vnni || F == Q8_0 {
                    return dot_i8::<F>(dot_i8::<F>(acc, l, xl), h, xh);
                }
                // Nibbles on maddubs: at most 4 * 15 * 127 per i16 lane, so both
                // halves add as i16 before one widening.
                let ones = _mm256_set1_epi16(1);
                let p = _mm256_add_epi16(_mm256_maddubs_epi16(l, xl), _mm256_maddubs_epi16(h, xh));
                _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones))
            }

            /// Dot products of `RX` activation rows with `RW` weight rows:
            /// `out[i][r]` = weight row `w[r]` . activation row `x[i]`.
            ///
            /// # Safety
            /// AVX2, FMA and F16C available; each `w[r]` points at `nb` blocks of
            /// format `F`; each `x[i]` at `32 * nb` codes, each `xs[i]` at
            /// `4 * ceil(nb / 2)` scales and, for Q4_0, each `xo[i]` at
            /// `8 * ceil(nb / 2)` offsets of a [`QuantRows`] row made for `F`.
            #[target_feature(enable = $features)]
            unsafe fn tile<const F: u8, const RX: usize, const RW: usize>(
                w: [*const u8; RW],
                x: [*const i8; RX],
                xs: [*const f32; RX],
                xo: [*const i32; RX],
                nb: usize,
            ) -> [[f32; RW]; RX] {
                if $wide {
                    // SAFETY: the same contract; this instance's features
                    // include the wide kernel's (and VBMI where `$vbmi`).
                    return unsafe {
                        if $vbmi {
                            super::wide::tile_vbmi::<F, RX, RW>(w, x, xs, xo, nb)
                        } else {
                            super::wide::tile::<F, RX, RW>(w, x, xs, xo, nb)
                        }
                    };
                }
                let bb = block_bytes(F);
                // Even pairs accumulate in [0], odd ones in [1] (the two
                // halves of one 512-bit register in the wide kernel, which
                // gives the same bits).
                let mut acc = [[[_mm256_setzero_ps(); 2]; RW]; RX];
                // d_w d_x of block A to lanes 0-3, of B to 4-7; then the minimum terms.
                let to_scale = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);
                let to_min = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
                // SAFETY: pair p reads blocks 2p and 2p + 1 < nb of every weight
                // row, codes 64p..64p + 64, scales 4p..4p + 4 and (Q4_0) offsets
                // 8p..8p + 8 of every activation row; the odd last block reads
                // block nb - 1, codes 32 (nb - 1).. + 32, scales 4 (nb / 2).. + 4
                // and offsets 8 (nb / 2).. + 8 (the contract). The 16-byte scale
                // loads at a block's start stay inside it (blocks are 18 to 34
                // bytes).
                unsafe {
                    // Software prefetch two tiles ahead: the tile's RW rows are RW
                    // short interleaved streams (a few hundred bytes each), which
                    // the hardware prefetchers follow too late to keep DRAM busy
                    // (one tile ahead: about 1.5x the weight throughput of none on
                    // one thread streaming 256 MB; two tiles a little more).
                    // Prefetches never fault, so running past the rows is harmless.
                    let pf = 2 * RW * nb * bb;
                    for p in 0..nb / 2 {
                        for r in 0..RW {
                            let a = w[r].wrapping_add(2 * p * bb);
                            let b = a.wrapping_add(bb);
                            _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add(pf) as *const i8);
                            let (l, h) = unpack_pair::<F>(a, b);
                            let dm = _mm_cvtph_ps(scale_pairs::<F>(load16(a), load16(b)));
                            for i in 0..RX {
                                let xp = x[i].wrapping_add(64 * p);
                                let init = start::<F>(xo[i], p);
                                let s = dot_pair::<F>(
                                    init,
                                    l,
                                    h,
                                    load32(xp),
                                    load32(xp.wrapping_add(32)),
                                );
                                let xsc = _mm_castsi128_ps(load16(xs[i].wrapping_add(4 * p)));
                                let sc = _mm256_castps128_ps256(_mm_mul_ps(dm, xsc));
                                let mut v = _mm256_fmadd_ps(
                                    _mm256_cvtepi32_ps(s),
                                    _mm256_permutevar8x32_ps(sc, to_scale),
                                    acc[i][r][p % 2],
                                );
                                if F == Q4_1 {
                                    v = _mm256_add_ps(v, _mm256_permutevar8x32_ps(sc, to_min));
                                }
                                acc[i][r][p % 2] = v;
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
                                let mut v = _mm256_fmadd_ps(
                                    _mm256_cvtepi32_ps(s),
                                    _mm256_broadcastss_ps(sc),
                                    acc[i][r][0],
                                );
                                if F == Q4_1 {
                                    let m = _mm_shuffle_ps::<0b01_01_01_01>(sc, sc);
                                    v = _mm256_add_ps(v, _mm256_set_m128(m, m));
                                }
                                acc[i][r][0] = v;
                            }
                        }
                    }
                }
                let mut out = [[0f32; RW]; RX];
                for i in 0..RX {
                    for r in 0..RW {
                        out[i][r] = hsum(_mm256_add_ps(acc[i][r][0], acc[i][r][1]));
                    }
                }
                out
            }

            /// Where pair `p`'s i32 sums start: for Q4_0 minus its offset
            /// term (`xo`: a [`QuantRows`] row's offsets), else zero.
            ///
            /// # Safety
            /// For Q4_0, `xo` points at `8 * (p + 1)` offsets.
            #[target_feature(enable = $features)]
            #[inline]
            pub(super) unsafe fn start<const F: u8>(xo: *const i32, p: usize) -> __m256i {
                if F == Q4_0 {
                    // SAFETY: the caller's contract.
                    let o = unsafe { load32(xo.wrapping_add(8 * p)) };
                    _mm256_sub_epi32(_mm256_setzero_si256(), o)
                } else {
                    _mm256_setzero_si256()
                }
            }

            /// Element `r` of each 128-bit half of `v` in all four lanes of
            /// that half.
            #[target_feature(enable = $features)]
            #[inline]
            fn lane(v: __m256, r: usize) -> __m256 {
                match r {
                    0 => _mm256_permute_ps::<0x00>(v),
                    1 => _mm256_permute_ps::<0x55>(v),
                    2 => _mm256_permute_ps::<0xaa>(v),
                    _ => _mm256_permute_ps::<0xff>(v),
                }
            }

            /// [`tile`] for one activation row and the 4 weight rows of a
            /// packed tile at `t` ([`super::pack`]): the same operations on
            /// every lane in the same order, so the same bits. The scales
            /// of the tile's 8 blocks of a pair come in one load and
            /// convert and multiply together; a row's lanes then take
            /// theirs with one in-lane permute.
            ///
            /// # Safety
            /// As [`tile`], with `t` pointing at a whole packed tile of `nb`
            /// blocks a row.
            #[target_feature(enable = $features)]
            unsafe fn tile_packed<const F: u8>(
                t: *const u8,
                x: *const i8,
                xs: *const f32,
                xo: *const i32,
                nb: usize,
            ) -> [f32; 4] {
                let bb = block_bytes(F);
                // Bytes of one pair of blocks over the tile's rows, of one
                // row's quants of a pair, and where the scales (then
                // minimums) start.
                let pair = 8 * bb;
                let row = if F == Q8_0 { 64 } else { 32 };
                let ds = 4 * row;
                let mut acc = [[_mm256_setzero_ps(); 2]; 4];
                let m4 = _mm256_set1_epi8(0x0f);
                // SAFETY: pair p reads bytes p * pair.. + pair of the tile
                // and, as in `tile`, codes 64p.. + 64, scales 4p.. + 4 and
                // (Q4_0) offsets 8p.. + 8; the odd last block reads the
                // tile's last 4 * bb bytes. Prefetches never fault.
                unsafe {
                    // Two tiles ahead, every line of the pair's span.
                    let pf = 2 * 4 * nb * bb;
                    for p in 0..nb / 2 {
                        let tp = t.wrapping_add(p * pair);
                        let mut line = 0;
                        while line < pair {
                            _mm_prefetch::<_MM_HINT_T0>(tp.wrapping_add(pf + line) as *const i8);
                            line += 64;
                        }
                        let xp = x.wrapping_add(64 * p);
                        let (xl, xh) = (load32(xp), load32(xp.wrapping_add(32)));
                        // [d_x A, s_x A, d_x B, s_x B] (s_x: Q4_1's minimum term).
                        let xsc = _mm_castsi128_ps(load16(xs.wrapping_add(4 * p)));
                        let dsc = _mm256_mul_ps(
                            _mm256_cvtph_ps(load16(tp.wrapping_add(ds))),
                            _mm256_set_m128(
                                _mm_permute_ps::<0b10_10_10_10>(xsc),
                                _mm_permute_ps::<0>(xsc),
                            ),
                        );
                        let msc = if F == Q4_1 {
                            _mm256_mul_ps(
                                _mm256_cvtph_ps(load16(tp.wrapping_add(ds + 16))),
                                _mm256_set_m128(
                                    _mm_permute_ps::<0b11_11_11_11>(xsc),
                                    _mm_permute_ps::<0b01_01_01_01>(xsc),
                                ),
                            )
                        } else {
                            _mm256_setzero_ps()
                        };
                        let init = start::<F>(xo, p);
                        for (r, a) in acc.iter_mut().enumerate() {
                            let q = tp.wrapping_add(row * r);
                            let (l, h) = if F == Q8_0 {
                                (load32(q), load32(q.wrapping_add(32)))
                            } else {
                                let v = load32(q);
                                (
                                    _mm256_and_si256(v, m4),
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
                                )
                            };
                            let s = dot_pair::<F>(init, l, h, xl, xh);
                            let mut v =
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), lane(dsc, r), a[p % 2]);
                            if F == Q4_1 {
                                v = _mm256_add_ps(v, lane(msc, r));
                            }
                            a[p % 2] = v;
                        }
                    }
                    if nb % 2 == 1 {
                        let (b, p) = (nb - 1, nb / 2);
                        let tp = t.wrapping_add(p * pair);
                        let xsc = _mm_castsi128_ps(load16(xs.wrapping_add(4 * p)));
                        // Four f16 scales (then minimums) of rows 0-3.
                        let d4 = _mm_cvtph_ps(_mm_loadl_epi64(
                            tp.wrapping_add(2 * row) as *const __m128i
                        ));
                        let dsc = _mm_mul_ps(d4, _mm_permute_ps::<0>(xsc));
                        let msc = if F == Q4_1 {
                            let mins = _mm_cvtph_ps(_mm_loadl_epi64(
                                tp.wrapping_add(2 * row + 8) as *const __m128i
                            ));
                            _mm_mul_ps(mins, _mm_permute_ps::<0b01_01_01_01>(xsc))
                        } else {
                            _mm_setzero_ps()
                        };
                        let init = start::<F>(xo, p);
                        let xv = load32(x.wrapping_add(32 * b));
                        for (r, a) in acc.iter_mut().enumerate() {
                            // The block in plain order, as `unpack_one` gives it.
                            let wv = if F == Q8_0 {
                                load32(tp.wrapping_add(32 * r))
                            } else {
                                let raw = load16(tp.wrapping_add(16 * r));
                                let low = _mm256_castsi256_si128(m4);
                                _mm256_set_m128i(
                                    _mm_and_si128(_mm_srli_epi16::<4>(raw), low),
                                    _mm_and_si128(raw, low),
                                )
                            };
                            let s = dot_i8::<F>(init, wv, xv);
                            let sc = _mm256_castps128_ps256(dsc);
                            let mut v = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(s),
                                _mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(r as i32)),
                                a[0],
                            );
                            if F == Q4_1 {
                                let m = _mm256_castps128_ps256(msc);
                                v = _mm256_add_ps(
                                    v,
                                    _mm256_permutevar8x32_ps(m, _mm256_set1_epi32(r as i32)),
                                );
                            }
                            a[0] = v;
                        }
                    }
                }
                let mut out = [0f32; 4];
                for (o, a) in out.iter_mut().zip(&acc) {
                    *o = hsum(_mm256_add_ps(a[0], a[1]));
                }
                out
            }

            /// [`rows_f`] over packed weights ([`super::pack`]): `w` starts
            /// at a tile boundary; its whole tiles are packed, any rows
            /// after them are in GGML's layout.
            ///
            /// # Safety
            /// As [`rows`] with `packed`, with `F` the format's code.
            #[target_feature(enable = $features)]
            unsafe fn rows_packed_f<const F: u8>(
                w: &[u8],
                rb: usize,
                xq: &QuantRows,
                out: &mut [f32],
            ) {
                const T: usize = super::PACK_ROWS;
                let (n, m, nb) = (w.len() / rb, xq.m, xq.k / 32);
                let tiles = n / T;
                for t in 0..tiles {
                    let tp = w[t * T * rb..].as_ptr();
                    // Activation rows innermost: the tile (4 rows) stays in
                    // L1 while every row of a prefill passes over it.
                    for i in 0..m {
                        // SAFETY: tile t is whole (t < n / T) and row i < m
                        // of `xq` has the lengths `tile_packed` reads.
                        let y = unsafe {
                            tile_packed::<F>(
                                tp,
                                xq.codes(i).as_ptr(),
                                xq.scales(i).as_ptr(),
                                xq.offsets(i).as_ptr(),
                                nb,
                            )
                        };
                        for (r, v) in y.iter().enumerate() {
                            out[(t * T + r) * m + i] = *v;
                        }
                    }
                }
                for j in tiles * T..n {
                    for i in 0..m {
                        // SAFETY: row j < n is in GGML's layout, i < m.
                        unsafe { run_tile::<F, 1, 1>(w, rb, xq, i, j, out) };
                    }
                }
            }

            /// Run one `RX x RW` tile at activation row `i0`, weight row `j0`.
            ///
            /// # Safety
            /// As [`rows`]; `i0 + RX <= xq.m` and `j0 + RW` rows fit in `w`.
            #[target_feature(enable = $features)]
            unsafe fn run_tile<const F: u8, const RX: usize, const RW: usize>(
                w: &[u8],
                rb: usize,
                xq: &QuantRows,
                i0: usize,
                j0: usize,
                out: &mut [f32],
            ) {
                let wp: [*const u8; RW] = std::array::from_fn(|r| w[(j0 + r) * rb..].as_ptr());
                let xp: [*const i8; RX] = std::array::from_fn(|i| xq.codes(i0 + i).as_ptr());
                let sp: [*const f32; RX] = std::array::from_fn(|i| xq.scales(i0 + i).as_ptr());
                let op: [*const i32; RX] = std::array::from_fn(|i| xq.offsets(i0 + i).as_ptr());
                // SAFETY: the pointers start whole rows of the lengths `tile` needs
                // (slicing above checked the starts; rows are rb = nb blocks; the
                // offsets are read for Q4_0 only, whose QuantRows has them).
                let y = unsafe { tile::<F, RX, RW>(wp, xp, sp, op, xq.k / 32) };
                for (i, yr) in y.iter().enumerate() {
                    for (r, v) in yr.iter().enumerate() {
                        out[(j0 + r) * xq.m + i0 + i] = *v;
                    }
                }
            }

            /// # Safety
            /// As [`rows`], with `F` the format's code.
            #[target_feature(enable = $features)]
            unsafe fn rows_f<const F: u8>(w: &[u8], rb: usize, xq: &QuantRows, out: &mut [f32]) {
                let n = w.len() / rb;
                let m = xq.m;
                // SAFETY (every tile): rows j..j + RW < n of `w` and activation
                // rows i..i + RX < m, checked by the loop bounds.
                unsafe {
                    if m == 1 {
                        let mut j = 0;
                        while j + 4 <= n {
                            run_tile::<F, 1, 4>(w, rb, xq, 0, j, out);
                            j += 4;
                        }
                        for j in j..n {
                            run_tile::<F, 1, 1>(w, rb, xq, 0, j, out);
                        }
                        return;
                    }
                    let mut i = 0;
                    while i < m {
                        let mut j = 0;
                        if i + 4 <= m {
                            while j + 2 <= n {
                                run_tile::<F, 4, 2>(w, rb, xq, i, j, out);
                                j += 2;
                            }
                            for j in j..n {
                                run_tile::<F, 4, 1>(w, rb, xq, i, j, out);
                            }
                            i += 4;
                        } else {
                            while j + 2 <= n {
                                run_tile::<F, 1, 2>(w, rb, xq, i, j, out);
                                j += 2;
                            }
                            for j in j..n {
                                run_tile::<F, 1, 1>(w, rb, xq, i, j, out);
                            }
                            i += 1;
                        }
                    }
                }
            }

            /// All activation rows of `xq` against the weight rows in `w` (`rb`
            /// bytes each, `fmt` blocks; in [`super::pack`]'s layout when
            /// `packed`, from a tile boundary); `out[j * m + r]` = weight
            /// row j . activation row r.
            ///
            /// # Safety
            /// AVX2, FMA and F16C available; `xq` was made for `fmt` with `rb` =
            /// `fmt.row_bytes(xq.k)`; `out` has `m` slots per weight row.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn rows(
                fmt: WeightFormat,
                w: &[u8],
                rb: usize,
                xq: &QuantRows,
                out: &mut [f32],
                packed: bool,
            ) {
                assert!(rb == fmt.row_bytes(xq.k) && out.len() == w.len() / rb * xq.m);
                assert!(
                    fmt != WeightFormat::Q4_0 || xq.offsets.len() == xq.m * 8 * xq.k.div_ceil(64)
                );
                // SAFETY: the caller's contract; the assert checks the lengths.
                unsafe {
                    match (fmt, packed) {
                        (WeightFormat::Q8_0, false) => rows_f::<Q8_0>(w, rb, xq, out),
                        (WeightFormat::Q4_0, false) => rows_f::<Q4_0>(w, rb, xq, out),
                        (WeightFormat::Q4_1, false) => rows_f::<Q4_1>(w, rb, xq, out),
                        (WeightFormat::Q4_0, true) => rows_packed_f::<Q4_0>(w, rb, xq, out),
                        (WeightFormat::Q4_1, true) => rows_packed_f::<Q4_1>(w, rb, xq, out),
                        (WeightFormat::Q8_0, true) => rows_packed_f::<Q8_0>(w, rb, xq, out),
                        // matmul_with sends f32 weights to dot_f32 and
                        // packs block formats only, never here.
                        _ => {}
                    }
                }
            }
        }
    };
}

/// `acc + madd(maddubs(u, s), 1)`: exact while no i16 pair saturates,
/// which the kernels' operands guarantee (|u| <= 128, |s| <= 127).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn dot4_avx2(
    acc: std::arch::x86_64::__m256i,
    u: std::arch::x86_64::__m256i,
    s: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
    )
}

/// `vpdpbusd` (AVX-VNNI).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
fn dot4_avxvnni(
    acc: std::arch::x86_64::__m256i,
    u: std::arch::x86_64::__m256i,
    s: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    std::arch::x86_64::_mm256_dpbusd_avx_epi32(acc, u, s)
}

/// `vpdpbusd` (AVX-512 VNNI, 256-bit form).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
#[inline]
fn dot4_avx512vnni(
    acc: std::arch::x86_64::__m256i,
    u: std::arch::x86_64::__m256i,
    s: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    std::arch::x86_64::_mm256_dpbusd_epi32(acc, u, s)
}

#[cfg(target_arch = "x86_64")]
int8_kernels!(
    avx2_int8,
    "avx2,fma,f16c",
    super::dot4_avx2,
    false,
    false,
    false
);
#[cfg(target_arch = "x86_64")]
int8_kernels!(
    avxvnni,
    "avx2,fma,f16c,avxvnni",
    super::dot4_avxvnni,
    true,
    false,
    false
);
#[cfg(target_arch = "x86_64")]
int8_kernels!(
    avx512vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    super::dot4_avx512vnni,
    true,
    false,
    false
);
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

/// The int8 tile on 512-bit registers (AVX-512 F + BW + VNNI): two pairs
/// of blocks per step, so each instruction does twice the work of the
/// 256-bit kernels'. The integer block sums are the same, and pair `p`
/// lands in lanes `8 (p % 2) ..` of one accumulator, where the 256-bit
/// kernels keep even and odd pairs apart: every x86 path gives the same
/// bits. (`bench ops` with a cache-sized working set: the 256-bit Q4
/// kernels ran ~18 GB/s on two threads from L2, under the DRAM ceiling,
/// so decode was compute-bound.)
#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    // The 256-bit AVX-512 VNNI kernel's helpers (same block layouts and
    // integer sums): the last pair and an odd last block use them as is.
    use super::avx512vnni::{
        block_bytes, dot_i8, dot_pair, load16, load32, scale_pairs, start, unpack_one, unpack_pair,
        Q4_0, Q4_1, Q8_0,
    };

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
            let off = if F == Q4_1 { 4 } else { 2 };
            let ab = _mm256_set_m128i(load16(b.wrapping_add(off)), load16(a.wrapping_add(off)));
            let cd = _mm256_set_m128i(load16(d.wrapping_add(off)), load16(c.wrapping_add(off)));
            let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ab), cd);
            let m4 = _mm512_set1_epi8(0x0f);
            (
                _mm512_and_si512(v, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
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
                // weight row, codes 128q..128q + 128, scales 8q..8q + 8 and (Q4_0)
                // offsets 16q..16q + 16 of every activation row; a last odd pair and
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
                            let init = if F == Q4_0 {
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
                            let (lo, hi, dm) = if $vbmi && F != Q8_0 {
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
                                let s = dot_pair::<F>(
                                    init,
                                    l,
                                    h,
                                    load32(xp),
                                    load32(xp.wrapping_add(32)),
                                );
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
                        let o = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(
                            acc[i][r],
                        )));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn f32_rows_equal_one_row_gemvs() {
        let (n, k) = (37, 70);
        let w = lcg(n * k, 5);
        let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        for m in 1..=8 {
            let x = lcg(m * k, 6 + m as u32);
            let y = gemv_f32_rows(&w, &x, m, n).expect("shapes fit");
            for r in 0..m {
                let one = gemv(WeightFormat::F32, &wb, &x[r * k..(r + 1) * k], n).expect("fit");
                assert_eq!(&y[r * n..(r + 1) * n], &one[..], "m={m} row {r}");
            }
        }
        assert!(gemv_f32_rows(&w, &lcg(2 * k + 1, 1), 2, n).is_none());
    }

    #[test]
    fn f32_gemv_avx_and_portable_agree_on_odd_sizes() {
        for &(n, k) in &[(1usize, 1usize), (7, 33), (33, 129), (5, 96)] {
            let w = lcg(n * k, 1);
            let x = lcg(k, 2);
            let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
            let y = gemv(WeightFormat::F32, &wb, &x, n).expect("shapes fit");
            for (j, yj) in y.iter().enumerate() {
                let want: f64 = (0..k).map(|i| w[j * k + i] as f64 * x[i] as f64).sum();
                assert!((*yj as f64 - want).abs() < 1e-4, "n{n} k{k} row {j}");
                let p = portable::dot_f32(&wb[j * 4 * k..(j + 1) * 4 * k], &x);
                assert!((p - yj).abs() < 1e-4);
            }
        }
    }

    const QFORMATS: [WeightFormat; 3] =
        [WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Q4_1];

    /// Rows of random blocks; every block has its own f16 scale (0.01 to
    /// 0.06) and, for Q4_1, minimum (-0.5 to 0), so a kernel that pairs a
    /// block with its neighbour's scale fails. Q8_0 codes cover -128..127.
    fn blocks(fmt: WeightFormat, n: usize, k: usize, seed: u32) -> Vec<u8> {
        let bs = fmt.row_bytes(32);
        let r = lcg(n * fmt.row_bytes(k), seed);
        let mut out = Vec::with_capacity(r.len());
        for (b, rb) in r.chunks_exact(bs).enumerate() {
            let u = |i: usize| (rb[i] + 1.0) / 2.0;
            let d = half::f16::from_f32(0.01 + 0.05 * u(0)).to_le_bytes();
            let m = half::f16::from_f32(-0.5 * u(1)).to_le_bytes();
            for (i, v) in rb.iter().enumerate() {
                out.push(match (i, fmt) {
                    (0 | 1, _) => d[i],
                    (2 | 3, WeightFormat::Q4_1) => m[i - 2],
                    // Every 7th block holds the extreme codes.
                    _ if b % 7 == 3 => [0x00, 0xff, 0x80, 0x0f, 0xf0][i % 5],
                    _ => ((v + 1.0) * 127.99) as u8,
                });
            }
        }
        out
    }

    /// (scale, min, 32 integer codes) of each block of a row.
    fn decode(fmt: WeightFormat, row: &[u8]) -> Vec<(f64, f64, Vec<i64>)> {
        row.chunks_exact(fmt.row_bytes(32))
            .map(|b| {
                let (m, q0) = match fmt {
                    WeightFormat::Q4_1 => (f16_at(&b[2..]) as f64, 4),
                    _ => (0.0, 2),
                };
                let codes = (0..32)
                    .map(|e| match fmt {
                        WeightFormat::Q8_0 => b[q0 + e] as i8 as i64,
                        _ => {
                            let byte = b[q0 + e % 16];
                            let nib = (if e < 16 { byte & 15 } else { byte >> 4 }) as i64;
                            if fmt == WeightFormat::Q4_0 {
                                nib - 8
                            } else {
                                nib
                            }
                        }
                    })
                    .collect();
                (f16_at(b) as f64, m, codes)
            })
            .collect()
    }

    /// `m` activation rows of `k` values with one all-zero block (scale 0)
    /// and one block of a thousand times the others' range.
    fn activations(m: usize, k: usize, seed: u32) -> Vec<f32> {
        let mut x = lcg(m * k, seed);
        for r in 0..m {
            let row = &mut x[r * k..(r + 1) * k];
            if k >= 64 {
                row[32..64].fill(0.0);
            }
            if k >= 96 {
                row[64..96].iter_mut().for_each(|v| *v *= 1000.0);
            }
        }
        x
    }

    /// Every instruction set this machine runs.
    fn paths() -> Vec<Isa> {
        Isa::available()
    }

    /// Against f64 arithmetic on the dequantized weights and the exact
    /// activations. Error bound: quantizing an activation to int8 moves it
    /// by at most half its block's step `d_x = max|x| / 127`, so output j
    /// is off by at most `sum_blocks d_x / 2 * sum_e |d_w q_e|` (q_e the
    /// signed code: Q4_0's offset is applied exactly through integer sums,
    /// Q4_1's minimum multiplies the exact f32 block sum), plus f32 rounding
    /// of the products and sums, bounded here by `1e-5 * sum |w x|` (about
    /// 80 f32 epsilons).
    #[test]
    fn quantized_matmul_matches_f64_reference_within_int8_bound() {
        for fmt in QFORMATS {
            for k in [32usize, 64, 96, 160, 576] {
                for n in [1usize, 3, 7, 13] {
                    let w = blocks(fmt, n, k, 9 + k as u32);
                    let rb = fmt.row_bytes(k);
                    let dec: Vec<_> = (0..n).map(|j| decode(fmt, &w[j * rb..][..rb])).collect();
                    for m in 1..=9 {
                        let x = activations(m, k, 7 * m as u32);
                        for isa in paths() {
                            let y = matmul_with(fmt, &w, n, &x, m, isa, false).expect("shapes fit");
                            for r in 0..m {
                                let xr = &x[r * k..(r + 1) * k];
                                for (j, blocks) in dec.iter().enumerate() {
                                    let (mut want, mut bound, mut mag) = (0f64, 0f64, 0f64);
                                    for (b, (d, mn, codes)) in blocks.iter().enumerate() {
                                        let xs = &xr[32 * b..32 * b + 32];
                                        let amax =
                                            xs.iter().fold(0f64, |a, v| a.max(v.abs() as f64));
                                        let mut wq = 0f64;
                                        for (c, xv) in codes.iter().zip(xs) {
                                            let wv = d * *c as f64 + mn;
                                            want += wv * *xv as f64;
                                            mag += (wv.abs() + mn.abs()) * (xv.abs() as f64);
                                            wq += (d * *c as f64).abs();
                                        }
                                        bound += amax / 127.0 / 2.0 * wq;
                                    }
                                    let got = y[r * n + j] as f64;
                                    let tol = bound + 1e-5 * mag + 1e-6;
                                    assert!(
                                        (got - want).abs() <= tol,
                                        "{fmt:?} isa={isa:?} k={k} n={n} m={m} [{r}, {j}]: \
                                         {got} vs {want} (bound {tol})"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Against the integer arithmetic the kernels promise (the int8 codes
    /// and scales recomputed here, products summed exactly in i64): only
    /// f32 rounding remains, well under `1e-5 * sum |terms|`. Catches a
    /// wrong rounding mode or scale that the int8 bound above could hide.
    #[test]
    fn quantized_matmul_is_the_int8_arithmetic() {
        let (n, k, m) = (6, 160, 5);
        let x = activations(m, k, 3);
        for fmt in QFORMATS {
            let w = blocks(fmt, n, k, 4);
            let rb = fmt.row_bytes(k);
            for isa in paths() {
                let y = matmul_with(fmt, &w, n, &x, m, isa, false).expect("shapes fit");
                for r in 0..m {
                    for j in 0..n {
                        let (mut want, mut mag) = (0f64, 0f64);
                        for (b, (d, mn, codes)) in
                            decode(fmt, &w[j * rb..][..rb]).into_iter().enumerate()
                        {
                            let xs = &x[r * k + 32 * b..][..32];
                            let dx = xs.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                            let id = if dx > 0.0 { 1.0 / dx } else { 0.0 };
                            let q: Vec<i64> = xs
                                .iter()
                                .map(|v| (v * id).round_ties_even() as i64)
                                .collect();
                            let s: i64 = codes.iter().zip(&q).map(|(c, qv)| c * qv).sum();
                            let sx: f64 = xs.iter().map(|v| *v as f64).sum();
                            let t = d * dx as f64 * s as f64 + mn * sx;
                            want += t;
                            // sum |w x| over the elements: the kernels add
                            // partial sums of a block (per SIMD lane) whose
                            // magnitudes can exceed the block's total.
                            let abs_s: i64 =
                                codes.iter().zip(&q).map(|(c, qv)| (c * qv).abs()).sum();
                            let abs_sx: f64 = xs.iter().map(|v| (*v as f64).abs()).sum();
                            mag += (d * dx as f64).abs() * abs_s as f64 + (mn * abs_sx).abs();
                        }
                        let got = y[r * n + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * mag + 1e-6,
                            "{fmt:?} isa={isa:?} [{r}, {j}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// A prefill row (any tile shape, any thread split) is the one-row
    /// result, bit for bit.
    #[test]
    fn multi_row_results_equal_the_one_row_kernel() {
        for fmt in QFORMATS {
            for (n, k) in [(13usize, 96usize), (9, 576), (40, 64)] {
                let w = blocks(fmt, n, k, 11);
                for m in 1..=9 {
                    let x = activations(m, k, 5);
                    for isa in paths() {
                        let y = matmul_with(fmt, &w, n, &x, m, isa, false).expect("shapes fit");
                        for r in 0..m {
                            let one =
                                matmul_with(fmt, &w, n, &x[r * k..(r + 1) * k], 1, isa, false)
                                    .expect("shapes fit");
                            let got: Vec<u32> =
                                y[r * n..(r + 1) * n].iter().map(|v| v.to_bits()).collect();
                            let want: Vec<u32> = one.iter().map(|v| v.to_bits()).collect();
                            assert_eq!(got, want, "{fmt:?} isa={isa:?} n={n} k={k} m={m} row {r}");
                        }
                    }
                }
            }
        }
    }

    /// The SIMD paths (AVX2 maddubs, AVX-VNNI, AVX-512 VNNI, wide, VBMI) form the same
    /// integer sums and add them in the same order: equal bit for bit.
    #[test]
    fn simd_paths_agree_bit_for_bit() {
        let simd: Vec<Isa> = paths()
            .into_iter()
            .filter(|i| *i != Isa::Portable)
            .collect();
        for fmt in QFORMATS {
            for (n, k, m) in [(13usize, 96usize, 1usize), (9, 576, 5), (40, 160, 2)] {
                let w = blocks(fmt, n, k, 21);
                let x = activations(m, k, 8);
                let ys: Vec<Vec<u32>> = simd
                    .iter()
                    .map(|isa| {
                        let y = matmul_with(fmt, &w, n, &x, m, *isa, false).expect("shapes fit");
                        y.iter().map(|v| v.to_bits()).collect()
                    })
                    .collect();
                for (isa, y) in simd.iter().zip(&ys) {
                    assert_eq!(
                        y, &ys[0],
                        "{fmt:?} {isa:?} vs {:?} n={n} k={k} m={m}",
                        simd[0]
                    );
                }
            }
        }
    }

    #[test]
    fn shapes_that_do_not_fit_are_refused() {
        let w = blocks(WeightFormat::Q4_1, 2, 64, 1);
        let x = lcg(64, 2);
        assert!(matmul(WeightFormat::Q4_1, &w, 2, &x, 1).is_some());
        assert!(matmul(WeightFormat::Q4_1, &w, 3, &x, 1).is_none());
        assert!(matmul(WeightFormat::Q4_1, &w, 2, &x[..63], 1).is_none());
        assert!(matmul(WeightFormat::Q4_1, &w[..40], 1, &x[..48], 1).is_none());
        assert!(matmul(WeightFormat::Q4_1, &w, 2, &x, 0).is_none());
        assert!(matmul(WeightFormat::F32, &w, 2, &x, 1).is_none());
    }
    /// [`pack`] and [`unpack`] are inverse for every row count (whole
    /// tiles, a tail, both) and block count (odd too); other formats and
    /// sizes are refused.
    #[test]
    fn packing_round_trips() {
        for fmt in QFORMATS {
            for k in [32usize, 64, 96, 160, 576] {
                for n in [1usize, 3, 4, 5, 8, 13] {
                    let w = blocks(fmt, n, k, 31 + n as u32);
                    let p = pack(fmt, &w, n, k).expect("fits");
                    assert_eq!(p.len(), w.len());
                    if n >= PACK_ROWS {
                        assert_ne!(p, w, "{fmt:?} n={n} k={k}: the tiles moved");
                    }
                    assert_eq!(
                        unpack(fmt, &p, n, k).expect("fits"),
                        w,
                        "{fmt:?} n={n} k={k}"
                    );
                }
            }
        }
        let w = blocks(WeightFormat::Q4_1, 4, 64, 1);
        assert!(pack(WeightFormat::Q4_1, &w, 4, 64).is_some());
        assert!(pack(WeightFormat::Q4_1, &w, 3, 64).is_none());
        assert!(pack(WeightFormat::Q4_1, &w, 4, 48).is_none());
        assert!(pack(WeightFormat::F32, &[0u8; 4 * 4 * 64], 4, 64).is_none());
    }

    /// The packed tile layout's known positions: row 1's nibbles of block
    /// 1, and the scale of row 2's block 0, of the first pair.
    #[test]
    fn packed_layout_puts_a_pair_side_by_side() {
        let fmt = WeightFormat::Q4_1;
        let (n, k) = (4, 64);
        let w = blocks(fmt, n, k, 5);
        let p = pack(fmt, &w, n, k).expect("fits");
        let (rb, bb) = (fmt.row_bytes(k), 20);
        assert_eq!(&p[32 + 16..64], &w[rb + bb + 4..rb + 2 * bb]);
        assert_eq!(&p[128 + 4..128 + 6], &w[2 * rb..2 * rb + 2]);
        assert_eq!(
            &p[144 + 8 + 6..144 + 8 + 8],
            &w[3 * rb + bb + 2..3 * rb + bb + 4]
        );
    }

    /// Packed weights give the GGML-layout kernels' results bit for bit,
    /// decode and prefill, with and without a tail of unpacked rows.
    #[test]
    fn packed_matmul_is_the_unpacked_bits() {
        let isas: Vec<Isa> = paths()
            .into_iter()
            .filter(|i| packs_on(WeightFormat::Q4_1, *i))
            .collect();
        if isas.is_empty() {
            eprintln!("no 256-bit int8 kernel on this machine: nothing packs");
        }
        for fmt in QFORMATS {
            for (n, k) in [
                (1usize, 64usize),
                (4, 32),
                (5, 96),
                (8, 160),
                (13, 576),
                (40, 64),
            ] {
                let w = blocks(fmt, n, k, 17 + k as u32);
                let p = pack(fmt, &w, n, k).expect("fits");
                for m in [1usize, 2, 5, 9] {
                    let x = activations(m, k, 3 + m as u32);
                    for &isa in &isas {
                        let want = matmul_with(fmt, &w, n, &x, m, isa, false).expect("fits");
                        let got = matmul_with(fmt, &p, n, &x, m, isa, true).expect("fits");
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got), bits(&want), "{fmt:?} {isa:?} n={n} k={k} m={m}");
                    }
                }
            }
        }
        let w = blocks(WeightFormat::Q4_1, 4, 64, 1);
        assert!(matmul_with(
            WeightFormat::Q4_1,
            &w,
            4,
            &lcg(64, 1),
            1,
            Isa::Portable,
            true
        )
        .is_none());
    }

    /// Rows read in place from packed weights are the unpacked rows.
    #[test]
    fn packed_rows_are_the_ggml_rows() {
        for fmt in QFORMATS {
            for (n, k) in [(4usize, 32usize), (7, 96), (13, 576), (8, 64)] {
                let w = blocks(fmt, n, k, 41);
                let p = pack(fmt, &w, n, k).expect("fits");
                let rb = fmt.row_bytes(k);
                let ids: Vec<usize> = (0..n).rev().chain([0, n - 1]).collect();
                let got = packed_rows(fmt, &p, n, k, &ids).expect("fits");
                let want: Vec<u8> = ids
                    .iter()
                    .flat_map(|&j| w[j * rb..(j + 1) * rb].to_vec())
                    .collect();
                assert_eq!(got, want, "{fmt:?} n={n} k={k}");
                assert!(packed_rows(fmt, &p, n, k, &[n]).is_none());
            }
        }
    }
}
