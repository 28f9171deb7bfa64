//! Direct 1-D convolution for the CPU backend: f32, stride 1, one group,
//! any padding and dilation — the shape of every convolution in a HiFi-GAN
//! vocoder, a WaveNet flow and a Whisper front end.
//!
//! ## Why
//! candle lowers `conv1d` to im2col + GEMM. For the narrow, long signals of
//! a vocoder (32–128 channels over tens of thousands of samples) that
//! materializes a `c_in * k` times larger copy of the input and then runs a
//! GEMM whose one small dimension (the output channels) starves the
//! micro-kernel: about 8 GFLOP/s on the build machine. Convolving directly
//! reads each input sample from cache `k` times instead: the output is
//! tiled into blocks of 8 output channels x 48 time steps held in 24
//! AVX-512 registers (4 x 48 in 8 AVX2 registers, as three thirds), and each
//! (input channel, tap) step costs 3 input loads and 8 weight broadcasts
//! for 24 fused multiply-adds, so the kernel is bound by FMA throughput,
//! not memory.
//!
//! Weights are packed as `[c_out / N][c_in][k][N]` (zero rows pad `c_out`
//! to a multiple of the block `N`; [`PackedWeights`], kept by the caller
//! across calls), output blocks skip taps whose weights are all zero, and
//! the bias seeds the accumulators. A task owns one output-channel block
//! over a span of 384 steps and sweeps the input channels in groups whose
//! rows fit in L1, so each input sample is read from L1 by every tap. The
//! input is zero-padded (and leaky-ReLU'd) once: for long inputs span by
//! span inside the task that then runs every output block of that span
//! while its rows sit in L2; for short ones as a whole, with the tasks of
//! one span as neighbours. Tasks run on rayon's pool. The output is
//! written once, without a zero fill first, optionally interleaved as the
//! phases of a transposed convolution.
//!
//! AVX-512F or AVX2 + FMA code is chosen at run time; other machines run the same
//! blocking in portable code.

use rayon::prelude::*;

/// Time steps per output tile: 3 AVX-512 vectors, or three thirds of 2 AVX2 vectors.
const TT: usize = 48;
/// Time steps per task (a multiple of `TT`).
const T_TASK: usize = TT * 8;

/// Shape of one direct convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conv1dShape {
    /// Batch size.
    pub batch: usize,
    /// Input channels.
    pub c_in: usize,
    /// Input length.
    pub t_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel taps.
    pub k: usize,
    /// Zero padding on each side.
    pub padding: usize,
    /// Spacing of the taps.
    pub dilation: usize,
}

impl Conv1dShape {
    /// Output length, None when the kernel is longer than the padded input.
    pub fn t_out(&self) -> Option<usize> {
        let span = self.dilation * (self.k.checked_sub(1)?) + 1;
        (self.t_in + 2 * self.padding)
            .checked_sub(span)
            .map(|n| n + 1)
    }
}

/// The instruction set a tile runs on, chosen once per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Portable,
    Avx2,
    Avx512,
}

fn isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// A raw output pointer shared by tasks that write disjoint regions.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes a distinct (channel block, time span) region of
// the output buffer, which outlives the parallel loop.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer `n` elements in (a method, so closures capture the
    /// whole `Send` wrapper rather than its raw field).
    ///
    /// # Safety
    /// `n` must stay inside the output buffer.
    unsafe fn at(self, n: usize) -> *mut f32 {
        // SAFETY: the caller keeps `n` in bounds.
        unsafe { self.0.add(n) }
    }
}

/// What is folded into a convolution besides its bias.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fused<'a> {
    /// Leaky-ReLU slope applied to the input first.
    pub pre_slope: Option<f32>,
    /// Added to the output, laid out as the output is.
    pub residual: Option<&'a [f32]>,
    /// Polyphase interleave (0 or 1: none): output channel `p * c + o`
    /// (`c = c_out / phases`) at time `t` is written to `[batch, c, t_out *
    /// phases]` at `[o, t * phases + p]` — the output of a transposed
    /// convolution computed as `phases` ordinary ones, without a copy.
    pub phases: usize,
}

/// Weights `[c_out, c_in, k]` repacked for the kernel of one instruction
/// set: `[c_out / n][c_in][k][n]` in output-channel blocks of `n` (zero
/// rows pad `c_out` to a multiple of `n`). Packing costs a pass over the
/// weights, so callers that convolve with the same weights again keep it.
#[derive(Debug)]
pub(crate) struct PackedWeights {
    isa: Isa,
    n: usize,
    c_out: usize,
    c_in: usize,
    k: usize,
    /// Output phases the rows are ordered for (see [`Fused::phases`]).
    phases: usize,
    data: Vec<f32>,
    /// Per block, the taps `lo..hi` outside which all its weights are
    /// zero (a transposed convolution's phases use 2 of 3): the kernel
    /// skips the rest.
    taps: Vec<(usize, usize)>,
}

impl PackedWeights {
    /// Pack `w` as `[c_out, c_in, k]` for this machine and an output of
    /// `phases` interleaved phases (1: none); None when a size is zero,
    /// `phases` does not divide `c_out` or `w` does not match.
    pub fn new(c_out: usize, c_in: usize, k: usize, w: &[f32], phases: usize) -> Option<Self> {
        Self::on(isa(), c_out, c_in, k, w, phases)
    }

    fn on(isa: Isa, c_out: usize, c_in: usize, k: usize, w: &[f32], phases: usize) -> Option<Self> {
        let phases = phases.max(1);
        if c_out == 0
            || c_in == 0
            || k == 0
            || w.len() != c_out * c_in * k
            || !c_out.is_multiple_of(phases)
        {
            return None;
        }
        // AVX-512's 32 registers hold 8 output channels x 3 vectors; the
        // other paths (16 registers) take 4. A single output channel (a
        // vocoder's last layer) takes blocks of 1 rather than computing
        // zero rows.
        let n = if c_out == 1 {
            1
        } else if isa == Isa::Avx512 && c_out > 4 {
            8
        } else {
            4
        };
        let blocks = c_out.div_ceil(n);
        let per_block = c_in * k * n;
        let mut data = vec![0f32; blocks * per_block];
        let pack = |blk: usize, dst: &mut [f32]| {
            for r in 0..n.min(c_out - blk * n) {
                let ch = source_channel(blk * n + r, c_out, phases);
                let src = &w[ch * c_in * k..][..c_in * k];
                for (i, &v) in src.iter().enumerate() {
                    dst[i * n + r] = v;
                }
            }
        };
        if data.len() * 4 > 1 << 20 {
            data.par_chunks_mut(per_block)
                .enumerate()
                .for_each(|(blk, dst)| pack(blk, dst));
        } else {
            for (blk, dst) in data.chunks_mut(per_block).enumerate() {
                pack(blk, dst);
            }
        }
        let taps = data
            .chunks(per_block)
            .map(|blk| {
                let used = |j: &usize| {
                    (0..c_in).any(|c| blk[(c * k + j) * n..][..n].iter().any(|&v| v != 0.0))
                };
                let lo = (0..k).find(used).unwrap_or(0);
                let hi = (lo..k).rev().find(used).map_or(lo, |j| j + 1);
                (lo, hi)
            })
            .collect();
        Some(PackedWeights {
            isa,
            n,
            c_out,
            c_in,
            k,
            phases,
            data,
            taps,
        })
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }
}

/// The weight row (output channel `p * c + o`, `c = c_out / phases`) that
/// packed row `q` holds: with phases the rows are ordered `q = o * phases +
/// p`, so a block's rows land next to each other in the interleaved output.
fn source_channel(q: usize, c_out: usize, phases: usize) -> usize {
    if phases > 1 {
        (q % phases) * (c_out / phases) + q / phases
    } else {
        q
    }
}

/// `y[b, o, t] = bias[o] + sum_{c, j} w[o, c, j] * x[b, c, t + j*d - p]`,
/// with `x` as `[batch, c_in, t_in]`, `w` as `[c_out, c_in, k]` and the
/// result as `[batch, c_out, t_out]`, all row-major; `fused` adds a leaky
/// ReLU on `x`, a residual on `y` and an interleaved output layout. Returns
/// None when the shape is degenerate or the slices do not match it.
#[cfg(test)]
pub(crate) fn conv1d(
    s: Conv1dShape,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    fused: Fused<'_>,
) -> Option<Vec<f32>> {
    conv1d_on(isa(), s, x, w, bias, fused)
}

/// [`conv1d`] on a given instruction set (which the caller checked).
#[cfg(test)]
fn conv1d_on(
    isa: Isa,
    s: Conv1dShape,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    fused: Fused<'_>,
) -> Option<Vec<f32>> {
    let pw = PackedWeights::on(isa, s.c_out, s.c_in, s.k, w, fused.phases)?;
    conv1d_packed(s, x, &pw, bias, fused)
}

/// [`conv1d`] with weights packed by [`PackedWeights::new`] (which must
/// match the shape's `c_out`, `c_in` and `k`).
pub(crate) fn conv1d_packed(
    s: Conv1dShape,
    x: &[f32],
    w: &PackedWeights,
    bias: Option<&[f32]>,
    fused: Fused<'_>,
) -> Option<Vec<f32>> {
    let t_out = s.t_out()?;
    let phases = fused.phases.max(1);
    if s.dilation == 0
        || (w.c_out, w.c_in, w.k, w.phases) != (s.c_out, s.c_in, s.k, phases)
        || x.len() != s.batch * s.c_in * s.t_in
        || bias.is_some_and(|b| b.len() != s.c_out)
        || fused
            .residual
            .is_some_and(|r| r.len() != s.batch * s.c_out * t_out)
    {
        return None;
    }
    Some(match w.n {
        8 => blocked::<8>(w.isa, s, t_out, x, (&w.data, &w.taps), bias, fused),
        1 => blocked::<1>(w.isa, s, t_out, x, (&w.data, &w.taps), bias, fused),
        _ => blocked::<4>(w.isa, s, t_out, x, (&w.data, &w.taps), bias, fused),
    })
}

/// The convolution with output blocks of `N` channels (shape checked,
/// weights `wp` packed in blocks of `N`, with each block's used taps).
fn blocked<const N: usize>(
    isa: Isa,
    s: Conv1dShape,
    t_out: usize,
    x: &[f32],
    (wp, taps): (&[f32], &[(usize, usize)]),
    bias: Option<&[f32]>,
    fused: Fused<'_>,
) -> Vec<f32> {
    let blocks = s.c_out.div_ceil(N);
    let per_block = s.c_in * s.k * N;
    let mut bp = vec![0f32; blocks * N];
    let phases = fused.phases.max(1);
    if let Some(b) = bias {
        for (q, v) in bp[..s.c_out].iter_mut().enumerate() {
            *v = b[source_channel(q, s.c_out, phases)];
        }
    }
    // Padded input rows long enough for whole tiles: every tile reads
    // [t0, t0 + TT + span - 1) of a row.
    let span = s.dilation * (s.k - 1);
    let t_tiles = t_out.div_ceil(TT) * TT;
    let row = t_tiles + span;
    let len = s.batch * s.c_out * t_out;
    // Every element is written exactly once below (no zero fill first).
    let mut y: Vec<f32> = Vec::with_capacity(len);
    let mut xp: Vec<f32> = Vec::new();
    for bi in 0..s.batch {
        let xb = &x[bi * s.c_in * s.t_in..][..s.c_in * s.t_in];
        // Padded positions q0 .. q0 + len of every input row, appended to
        // `dst` (padding stays zero: leaky_relu(0) = 0).
        let fill = |dst: &mut Vec<f32>, q0: usize, len: usize| {
            for c in 0..s.c_in {
                let src = &xb[c * s.t_in..][..s.t_in];
                fill_row(isa, dst, src, q0, len, s.padding, fused.pre_slope);
            }
        };
        let out = OutPtr(y.as_mut_ptr());
        let item = bi * s.c_out * t_out;
        let residual = fused.residual.map(|r| &r[item..][..s.c_out * t_out]);
        let spans = t_out.div_ceil(T_TASK);
        let tasks = blocks * spans;
        // Input channels per sweep: the rows of x a task reads in one sweep
        // (T_TASK + span floats each) stay within about 24 KB of L1.
        let c_step = (6144 / (T_TASK + span)).clamp(1, s.c_in);
        // Output block `blk` over times t_lo..t_hi, from padded rows `xs` of
        // length `row` whose first column is padded position `q0`.
        let block = |blk: usize, t_lo: usize, t_hi: usize, xs: &[f32], row: usize, q0: usize| {
            let wb = &wp[blk * per_block..][..per_block];
            let bb = &bp[blk * N..][..N];
            // Accumulators of this task's tiles, seeded with the bias.
            let n_tiles = (t_hi - t_lo).div_ceil(TT);
            let mut acc = vec![[[0f32; TT]; N]; n_tiles];
            for a in acc.iter_mut() {
                for (row, &b) in a.iter_mut().zip(bb) {
                    row.fill(b);
                }
            }
            let mut c_lo = 0;
            while c_lo < s.c_in {
                let c_hi = (c_lo + c_step).min(s.c_in);
                let geo = Geo {
                    c_lo,
                    c_hi,
                    k: s.k,
                    taps: taps[blk],
                    dilation: s.dilation,
                    row,
                };
                for (i, a) in acc.iter_mut().enumerate() {
                    let cols = (t_hi - t_lo - i * TT).min(TT);
                    tile(isa, &geo, xs, wb, t_lo - q0 + i * TT, cols, a);
                }
                c_lo = c_hi;
            }
            let rows = (s.c_out - blk * N).min(N);
            for (i, a) in acc.iter().enumerate() {
                let t0 = t_lo + i * TT;
                let n = TT.min(t_out - t0);
                if phases == 1 {
                    let at = blk * N * t_out + t0;
                    // Rows blk*N .. blk*N + rows (<= c_out) at times t0 ..
                    // t0 + n (<= t_out), t_out apart.
                    let res = residual.map(|r| &r[at..at + (rows - 1) * t_out + n]);
                    // SAFETY: that region lies inside this batch item's
                    // output, and no other task writes it.
                    unsafe { store_rows(isa, a, rows, n, out.at(item + at), t_out, res) };
                } else {
                    // Row q = o * phases + p goes to [o, t * phases + p]:
                    // consecutive rows are consecutive elements.
                    let mut base = [0usize; N];
                    for (r, b) in base.iter_mut().enumerate().take(rows) {
                        let q = blk * N + r;
                        *b = (q / phases) * t_out * phases + q % phases;
                    }
                    // A transpose: time outer, rows inner, both index `a`.
                    #[allow(clippy::needless_range_loop)]
                    for ti in 0..n {
                        let t = (t0 + ti) * phases;
                        for (r, &b) in base.iter().enumerate().take(rows) {
                            let e = b + t;
                            let v = a[r][ti];
                            let val = residual.map_or(v, |res| v + res[e]);
                            // SAFETY: (o, p, t) -> o * t_out * phases + t *
                            // phases + p is one to one onto this batch item's
                            // output (p < phases, t < t_out, o < c_out /
                            // phases), and row q, time t is this task's only.
                            unsafe { *out.at(item + e) = val };
                        }
                    }
                }
            }
        };
        // All on rayon's pool (also gemm's), not candle's spinning barrier
        // pool: its idle threads sleep, which matters on a loaded 2-core
        // machine, where a thread spinning at a barrier takes the core the
        // straggler it waits for needs (measured with perf: 25% of all
        // samples spinning at load 6, against under 12% with rayon).
        if spans >= LOCAL_SPANS {
            // A long input: each task pads the rows of its own span, which
            // then stay in L2 for every output block, instead of one pass
            // writing a padded copy of the whole input out to memory and
            // the tasks reading it back.
            (0..spans).into_par_iter().for_each(|sp| {
                let t_lo = sp * T_TASK;
                let t_hi = (t_lo + T_TASK).min(t_out);
                let row = (t_hi - t_lo).div_ceil(TT) * TT + span;
                let mut xs = Vec::with_capacity(s.c_in * row);
                fill(&mut xs, t_lo, row);
                for blk in 0..blocks {
                    block(blk, t_lo, t_hi, &xs, row, t_lo);
                }
            });
        } else {
            xp.clear();
            fill(&mut xp, 0, row);
            let work = |task: usize| {
                // Span-major: the tasks of one span (neighbours in rayon's
                // split) share its input rows, which stay in L2 between them.
                let (blk, sp) = (task % blocks, task / blocks);
                let t_lo = sp * T_TASK;
                block(blk, t_lo, (t_lo + T_TASK).min(t_out), &xp, row, 0);
            };
            if tasks > 1 && tasks * s.c_in * s.k * T_TASK > 1 << 16 {
                (0..tasks).into_par_iter().for_each(work);
            } else {
                (0..tasks).for_each(work);
            }
        }
    }
    // SAFETY: the tasks of every batch item wrote each of its c_out * t_out
    // elements (see the store above), and f32 has no invalid bit patterns.
    unsafe { y.set_len(len) };
    y
}

/// Depthwise convolution (`groups == c_in == c_out`, weights `[c, 1, k]`):
/// `y[b, c, t] = bias[c] + sum_j w[c, j] * x[b, c, t + j*d - p]`, with `x`
/// as `[batch, c, t_in]` and `s.c_out == s.c_in`. Each row is a few
/// vectorized multiply-adds over shifted slices; candle runs it as `c`
/// separate im2col convolutions (~0.5 ms for a [192, 193] input, 100x
/// this). None when the shape is degenerate or the slices do not match it.
pub(crate) fn depthwise(
    s: Conv1dShape,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
) -> Option<Vec<f32>> {
    let t_out = s.t_out()?;
    let c = s.c_in;
    if s.c_out != c
        || s.dilation == 0
        || x.len() != s.batch * c * s.t_in
        || w.len() != c * s.k
        || bias.is_some_and(|b| b.len() != c)
    {
        return None;
    }
    let mut y = vec![0f32; s.batch * c * t_out];
    let row = |(r, out): (usize, &mut [f32])| {
        let ch = r % c;
        out.fill(bias.map_or(0.0, |b| b[ch]));
        let src = &x[r * s.t_in..][..s.t_in];
        for (j, &wj) in w[ch * s.k..][..s.k].iter().enumerate() {
            // Output t reads src[t + j*d - p]: t in [lo, hi) stays inside.
            let shift = j * s.dilation;
            let lo = s.padding.saturating_sub(shift).min(t_out);
            let hi = (s.t_in + s.padding).saturating_sub(shift).min(t_out);
            if hi <= lo {
                continue;
            }
            let first = lo + shift - s.padding;
            for (o, &v) in out[lo..hi].iter_mut().zip(&src[first..]) {
                *o += wj * v;
            }
        }
    };
    if y.len() >= 1 << 16 {
        y.par_chunks_mut(t_out).enumerate().for_each(row);
    } else {
        y.chunks_mut(t_out).enumerate().for_each(row);
    }
    Some(y)
}

/// Spans from which a convolution pads its input span by span, inside the
/// tasks (enough tasks to keep every thread of a small machine busy).
const LOCAL_SPANS: usize = 8;

/// Write the first `n` values of `rows` accumulator rows to `dst`, row `r`
/// at `dst + r * stride`, adding `res` (laid out as `dst`, from its start)
/// when given. Vector code where the instruction set has it: this runs once
/// per output tile, and as scalar code it cost a tenth of a vocoder's time.
///
/// # Safety
/// `dst + r * stride .. + n` must be valid for writes for every `r < rows`
/// and written by nobody else meanwhile; `rows <= N`, `n <= TT`, and `res`
/// (when given) holds at least `(rows - 1) * stride + n` values.
unsafe fn store_rows<const N: usize>(
    isa: Isa,
    acc: &[[f32; TT]; N],
    rows: usize,
    n: usize,
    dst: *mut f32,
    stride: usize,
    res: Option<&[f32]>,
) {
    debug_assert!(rows <= N && n <= TT);
    debug_assert!(res.is_none_or(|r| rows == 0 || r.len() >= (rows - 1) * stride + n));
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F was detected (the isa came from `isa()`); the
        // caller's contract bounds every access.
        Isa::Avx512 => unsafe { store_rows_avx512(acc, rows, n, dst, stride, res) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2.
        Isa::Avx2 => unsafe { store_rows_avx2(acc, rows, n, dst, stride, res) },
        // SAFETY: the caller's contract.
        _ => unsafe { store_rows_portable(acc, rows, n, dst, stride, res) },
    }
}

/// [`store_rows`] as plain loops (auto-vectorized in the wrappers below).
///
/// # Safety
/// As [`store_rows`].
#[inline(always)]
unsafe fn store_rows_portable<const N: usize>(
    acc: &[[f32; TT]; N],
    rows: usize,
    n: usize,
    dst: *mut f32,
    stride: usize,
    res: Option<&[f32]>,
) {
    for (r, v) in acc.iter().enumerate().take(rows) {
        // SAFETY: the caller's contract.
        let d = unsafe { std::slice::from_raw_parts_mut(dst.add(r * stride), n) };
        match res {
            Some(res) => {
                for ((d, &a), &b) in d.iter_mut().zip(&v[..n]).zip(&res[r * stride..][..n]) {
                    *d = a + b;
                }
            }
            None => d.copy_from_slice(&v[..n]),
        }
    }
}

/// [`store_rows`] compiled for AVX2.
///
/// # Safety
/// As [`store_rows`], on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn store_rows_avx2<const N: usize>(
    acc: &[[f32; TT]; N],
    rows: usize,
    n: usize,
    dst: *mut f32,
    stride: usize,
    res: Option<&[f32]>,
) {
    // SAFETY: forwarded contract.
    unsafe { store_rows_portable(acc, rows, n, dst, stride, res) }
}

/// [`store_rows`] with AVX-512 masked loads and stores (no scalar tail).
///
/// # Safety
/// As [`store_rows`], on a CPU with AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_rows_avx512<const N: usize>(
    acc: &[[f32; TT]; N],
    rows: usize,
    n: usize,
    dst: *mut f32,
    stride: usize,
    res: Option<&[f32]>,
) {
    use std::arch::x86_64::*;
    // SAFETY: lanes past `n` are masked off; the caller's contract bounds
    // the rest.
    unsafe {
        for (r, v) in acc.iter().enumerate().take(rows) {
            let d = dst.add(r * stride);
            let mut lo = 0;
            while lo < n {
                let lanes = (n - lo).min(16);
                let m: __mmask16 = if lanes == 16 { !0 } else { (1u16 << lanes) - 1 };
                let mut a = _mm512_loadu_ps(v.as_ptr().add(lo));
                if let Some(res) = res {
                    let b = _mm512_maskz_loadu_ps(m, res.as_ptr().add(r * stride + lo));
                    a = _mm512_add_ps(a, b);
                }
                _mm512_mask_storeu_ps(d.add(lo), m, a);
                lo += 16;
            }
        }
    }
}

/// Append padded positions `q0 .. q0 + len` of one input row — `padding`
/// zeros, `src` (through leaky ReLU with `slope`), then zeros — to `dst`.
fn fill_row(
    isa: Isa,
    dst: &mut Vec<f32>,
    src: &[f32],
    q0: usize,
    len: usize,
    padding: usize,
    slope: Option<f32>,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F was detected (the isa came from `isa()`).
        Isa::Avx512 => unsafe { fill_row_avx512(dst, src, q0, len, padding, slope) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 was detected.
        Isa::Avx2 => unsafe { fill_row_avx2(dst, src, q0, len, padding, slope) },
        _ => fill_row_portable(dst, src, q0, len, padding, slope),
    }
}

/// [`fill_row`] compiled for AVX-512F.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fill_row_avx512(
    dst: &mut Vec<f32>,
    src: &[f32],
    q0: usize,
    len: usize,
    padding: usize,
    slope: Option<f32>,
) {
    fill_row_portable(dst, src, q0, len, padding, slope)
}

/// [`fill_row`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_row_avx2(
    dst: &mut Vec<f32>,
    src: &[f32],
    q0: usize,
    len: usize,
    padding: usize,
    slope: Option<f32>,
) {
    fill_row_portable(dst, src, q0, len, padding, slope)
}

/// [`fill_row`] as plain slice loops (written once each, no zero fill
/// first), which the wrappers above vectorize.
#[inline(always)]
fn fill_row_portable(
    dst: &mut Vec<f32>,
    src: &[f32],
    q0: usize,
    len: usize,
    padding: usize,
    slope: Option<f32>,
) {
    use std::mem::MaybeUninit;
    let end = q0 + len;
    // The part of q0..end that holds src, as padded positions (hi >= lo).
    let lo = padding.clamp(q0, end);
    let hi = (padding + src.len()).clamp(q0, end);
    // (lo < padding only when the range ends before src starts: empty.)
    let part: &[f32] = if hi > lo {
        &src[lo - padding..hi - padding]
    } else {
        &[]
    };
    let start = dst.len();
    dst.reserve(len);
    let spare = &mut dst.spare_capacity_mut()[..len];
    let (head, rest) = spare.split_at_mut(lo - q0);
    let (mid, tail) = rest.split_at_mut(part.len());
    head.fill(MaybeUninit::new(0.0));
    tail.fill(MaybeUninit::new(0.0));
    match slope {
        Some(a) => {
            for (d, &v) in mid.iter_mut().zip(part) {
                d.write(if v >= 0.0 { v } else { a * v });
            }
        }
        None => {
            for (d, &v) in mid.iter_mut().zip(part) {
                d.write(v);
            }
        }
    }
    // SAFETY: head, mid and tail cover the `len` reserved values, all written.
    unsafe { dst.set_len(start + len) };
}

/// Geometry a tile needs.
struct Geo {
    /// Input channels of this sweep.
    c_lo: usize,
    c_hi: usize,
    k: usize,
    /// Taps `lo..hi` of `0..k` to run (the others' weights are zero).
    taps: (usize, usize),
    dilation: usize,
    /// Length of one padded input row.
    row: usize,
}

/// Add input channels `c_lo..c_hi` to one `N` x 48 output tile starting at
/// time `t0`, of which the first `cols` columns are output (AVX2 skips the
/// thirds past them: a 193-step output is 5 tiles, the last with 1).
fn tile<const N: usize>(
    isa: Isa,
    g: &Geo,
    xp: &[f32],
    wb: &[f32],
    t0: usize,
    cols: usize,
    acc: &mut [[f32; TT]; N],
) {
    // Every index either kernel reads.
    assert!(g.c_lo < g.c_hi && g.c_hi * g.k * N <= wb.len());
    assert!(g.taps.0 <= g.taps.1 && g.taps.1 <= g.k);
    assert!((g.c_hi - 1) * g.row + t0 + (g.k - 1) * g.dilation + TT <= xp.len());
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 => {
            // SAFETY: AVX-512F was detected at run time; the assertions
            // above bound every read.
            unsafe { tile_avx512(g, xp, wb, t0, acc, 0) };
            return;
        }
        Isa::Avx2 => {
            // SAFETY: AVX2 and FMA were detected at run time; the assertions
            // above bound every read; each call covers a third of the tile.
            unsafe {
                for col in (0..cols.min(TT)).step_by(TT / 3) {
                    tile_avx2(g, xp, wb, t0, acc, col);
                }
            }
            return;
        }
        Isa::Portable => {}
    }
    let _ = isa;
    for c in g.c_lo..g.c_hi {
        for j in g.taps.0..g.taps.1 {
            let xs = &xp[c * g.row + t0 + j * g.dilation..][..TT];
            let ws = &wb[(c * g.k + j) * N..][..N];
            for (a, &wv) in acc.iter_mut().zip(ws) {
                for (av, &xv) in a.iter_mut().zip(xs) {
                    *av += wv * xv;
                }
            }
        }
    }
}

/// One register-blocked kernel body per instruction set: `N` output
/// channels x `$v` vectors of `$w` lanes starting at column `col` of the
/// tile, accumulating input channels `c_lo..c_hi` (`$v` loads and `N`
/// broadcasts per `$v N` FMAs).
///
/// AVX2 takes 4 x 2: 8 accumulators cover the FMA latency of two pipes,
/// and with the 2 inputs and a broadcast they use 11 of 16 registers.
/// The 4 x 3 block this kernel used before needed all 16, and LLVM spilled
/// one and shuffled the rest through moves each step: 40-43 GFLOP/s on a
/// Zen 3 core in L1, against 94 for 4 x 2 (a standalone probe of both).
macro_rules! tile_kernel {
    ($name:ident, $feat:literal, $w:literal, $v:literal, $vec:ty, $load:ident, $store:ident, $set1:ident, $fma:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name<const N: usize>(
            g: &Geo,
            xp: &[f32],
            wb: &[f32],
            t0: usize,
            acc: &mut [[f32; TT]; N],
            col: usize,
        ) {
            use std::arch::x86_64::*;
            // SAFETY: the caller checked the CPU features; every pointer stays
            // inside `xp` / `wb` (see the assertions in `tile`) and `acc` is a
            // local array with `col + $v * $w <= TT`.
            unsafe {
                let mut a: [[$vec; $v]; N] = [[$set1(0.0); $v]; N];
                for (r, row) in a.iter_mut().enumerate() {
                    for (v, reg) in row.iter_mut().enumerate() {
                        *reg = $load(acc[r].as_ptr().add(col + v * $w));
                    }
                }
                let (j_lo, j_hi) = g.taps;
                // Row and weight pointers step per channel (no index
                // arithmetic inside the channel loop).
                let mut xc = xp
                    .as_ptr()
                    .add(g.c_lo * g.row + t0 + col + j_lo * g.dilation);
                let mut wc = wb.as_ptr().add((g.c_lo * g.k + j_lo) * N);
                for _ in g.c_lo..g.c_hi {
                    let mut xr = xc;
                    let mut wq = wc;
                    xc = xc.wrapping_add(g.row);
                    wc = wc.wrapping_add(g.k * N);
                    for _ in j_lo..j_hi {
                        let mut x = [$set1(0.0); $v];
                        for (i, xv) in x.iter_mut().enumerate() {
                            *xv = $load(xr.add(i * $w));
                        }
                        for (r, row) in a.iter_mut().enumerate() {
                            let wv = $set1(*wq.add(r));
                            for (reg, xv) in row.iter_mut().zip(x) {
                                *reg = $fma(wv, xv, *reg);
                            }
                        }
                        xr = xr.add(g.dilation);
                        wq = wq.add(N);
                    }
                }
                for (r, row) in a.iter().enumerate() {
                    for (v, reg) in row.iter().enumerate() {
                        $store(acc[r].as_mut_ptr().add(col + v * $w), *reg);
                    }
                }
            }
        }
    };
}

tile_kernel!(
    tile_avx2,
    "avx2,fma",
    8,
    2,
    __m256,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps
);
tile_kernel!(
    tile_avx512,
    "avx512f",
    16,
    3,
    __m512,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps
);

#[cfg(test)]
mod tests {
    use super::*;

    /// f64 reference of the same convolution.
    fn reference(s: Conv1dShape, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
        let t_out = s.t_out().unwrap_or(0);
        let mut y = vec![0f64; s.batch * s.c_out * t_out];
        for bi in 0..s.batch {
            for o in 0..s.c_out {
                for t in 0..t_out {
                    let mut acc = b.map_or(0.0, |b| f64::from(b[o]));
                    for c in 0..s.c_in {
                        for j in 0..s.k {
                            let i = (t + j * s.dilation) as isize - s.padding as isize;
                            if (0..s.t_in as isize).contains(&i) {
                                acc += f64::from(w[(o * s.c_in + c) * s.k + j])
                                    * f64::from(x[(bi * s.c_in + c) * s.t_in + i as usize]);
                            }
                        }
                    }
                    y[(bi * s.c_out + o) * t_out + t] = acc;
                }
            }
        }
        y
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn check(s: Conv1dShape, with_bias: bool) {
        let x = data(s.batch * s.c_in * s.t_in, 1);
        let w = data(s.c_out * s.c_in * s.k, 2);
        let b = data(s.c_out, 3);
        let b = with_bias.then_some(b.as_slice());
        let want = reference(s, &x, &w, b);
        for isa in available() {
            let got = conv1d_on(isa, s, &x, &w, b, Fused::default()).expect("valid shape");
            compare(s, &got, &want, isa);
        }
    }

    /// Every instruction set this machine can run.
    fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2);
            }
            if std::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    fn compare(s: Conv1dShape, got: &[f32], want: &[f64], isa: Isa) {
        assert_eq!(got.len(), want.len(), "{s:?} on {isa:?}");
        // f32 accumulation over c_in * k products of magnitude <= 1: the
        // error bound grows with the sum's length.
        let tol = 1e-6 * (s.c_in * s.k) as f64 + 1e-6;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (f64::from(*g) - w).abs() <= tol,
                "{s:?} on {isa:?} at {i}: {g} vs {w} (tol {tol})"
            );
        }
    }

    #[test]
    fn matches_f64_reference_on_odd_shapes() {
        for &(batch, c_in, t_in, c_out, k, padding, dilation) in &[
            (1, 1, 1, 1, 1, 0, 1),
            (1, 3, 5, 1, 3, 1, 1),
            (1, 7, 50, 5, 3, 1, 1),
            (2, 5, 31, 9, 7, 9, 3),
            (1, 32, 1000, 32, 7, 18, 6),
            (1, 13, 403, 6, 5, 0, 2),
            (1, 192, 97, 256, 7, 3, 1),
            (3, 4, 24, 4, 1, 0, 1),
            (1, 2, 9, 3, 4, 2, 1),
            // A vocoder's last layer: one output channel, a long input.
            (1, 32, 5000, 1, 7, 3, 1),
        ] {
            let s = Conv1dShape {
                batch,
                c_in,
                t_in,
                c_out,
                k,
                padding,
                dilation,
            };
            check(s, true);
            check(s, false);
        }
    }

    #[test]
    fn folds_leaky_relu_and_residual() {
        let s = Conv1dShape {
            batch: 2,
            c_in: 37,
            t_in: 301,
            c_out: 11,
            k: 5,
            padding: 6,
            dilation: 3,
        };
        let x = data(s.batch * s.c_in * s.t_in, 4);
        let w = data(s.c_out * s.c_in * s.k, 5);
        let b = data(s.c_out, 6);
        let t_out = s.t_out().expect("fits");
        let r = data(s.batch * s.c_out * t_out, 7);
        let xa: Vec<f32> = x
            .iter()
            .map(|&v| if v >= 0.0 { v } else { 0.1 * v })
            .collect();
        let want = reference(s, &xa, &w, Some(&b));
        let fused = Fused {
            pre_slope: Some(0.1),
            residual: Some(&r),
            phases: 1,
        };
        let want: Vec<f64> = want
            .iter()
            .zip(&r)
            .map(|(w, r)| w + f64::from(*r))
            .collect();
        for isa in available() {
            let got = conv1d_on(isa, s, &x, &w, Some(&b), fused).expect("valid shape");
            compare(s, &got, &want, isa);
        }
        let short = &r[..r.len() - 1];
        let bad = Fused {
            residual: Some(short),
            ..fused
        };
        assert!(
            conv1d(s, &x, &w, Some(&b), bad).is_none(),
            "residual of the wrong size"
        );
    }

    #[test]
    fn interleaves_phases() {
        // 3 phases of 4 channels: output channel p * 4 + o at time t lands
        // at [o, t * 3 + p]; the residual is laid out like the output.
        for &(c_out, phases, k, pre) in &[(12, 3, 3, true), (16, 8, 3, false), (6, 2, 1, true)] {
            let s = Conv1dShape {
                batch: 2,
                c_in: 9,
                t_in: 101,
                c_out,
                k,
                padding: k / 2,
                dilation: 1,
            };
            let x = data(s.batch * s.c_in * s.t_in, 8);
            let w = data(s.c_out * s.c_in * s.k, 9);
            let b = data(s.c_out, 10);
            let t_out = s.t_out().expect("fits");
            let r = data(s.batch * s.c_out * t_out, 11);
            let slope = pre.then_some(0.2f32);
            let xa: Vec<f32> = x
                .iter()
                .map(|&v| match slope {
                    Some(a) if v < 0.0 => a * v,
                    _ => v,
                })
                .collect();
            let plain = reference(s, &xa, &w, Some(&b));
            let c = c_out / phases;
            let mut want = vec![0f64; plain.len()];
            for bi in 0..s.batch {
                for ch in 0..c_out {
                    let (p, o) = (ch / c, ch % c);
                    for t in 0..t_out {
                        let at = (bi * c + o) * t_out * phases + t * phases + p;
                        want[at] = plain[(bi * c_out + ch) * t_out + t] + f64::from(r[at]);
                    }
                }
            }
            let fused = Fused {
                pre_slope: slope,
                residual: Some(&r),
                phases,
            };
            for isa in available() {
                let got = conv1d_on(isa, s, &x, &w, Some(&b), fused).expect("valid shape");
                compare(s, &got, &want, isa);
            }
            let bad = Fused { phases: 5, ..fused };
            assert!(
                conv1d(s, &x, &w, Some(&b), bad).is_none(),
                "phases must divide c_out"
            );
        }
    }

    #[test]
    fn skips_zero_taps() {
        // Blocks whose leading / trailing taps are all zero (as in the
        // phases of a transposed convolution), and an all-zero block.
        let s = Conv1dShape {
            batch: 1,
            c_in: 6,
            t_in: 77,
            c_out: 24,
            k: 5,
            padding: 4,
            dilation: 2,
        };
        let mut w = data(s.c_out * s.c_in * s.k, 12);
        for o in 0..s.c_out {
            for c in 0..s.c_in {
                for j in 0..s.k {
                    let zero = match o {
                        0..4 => j == 0 || j == 4,
                        4..8 => j < 3,
                        8..16 => j == 4,
                        _ => true,
                    };
                    if zero {
                        w[(o * s.c_in + c) * s.k + j] = 0.0;
                    }
                }
            }
        }
        let x = data(s.batch * s.c_in * s.t_in, 13);
        let b = data(s.c_out, 14);
        let want = reference(s, &x, &w, Some(&b));
        for isa in available() {
            let got = conv1d_on(isa, s, &x, &w, Some(&b), Fused::default()).expect("valid shape");
            compare(s, &got, &want, isa);
        }
    }

    #[test]
    fn pads_span_by_span_on_long_inputs() {
        // Long enough for the per-span padding path, with a padding longer
        // than a span on each side, phases, leaky ReLU and a residual.
        for &(padding, phases) in &[(3, 1), (500, 1), (2, 4)] {
            let s = Conv1dShape {
                batch: 2,
                c_in: 5,
                t_in: T_TASK * LOCAL_SPANS + 37,
                c_out: 12,
                k: 5,
                padding,
                dilation: 2,
            };
            let x = data(s.batch * s.c_in * s.t_in, 15);
            let w = data(s.c_out * s.c_in * s.k, 16);
            let b = data(s.c_out, 17);
            let t_out = s.t_out().expect("fits");
            assert!(t_out.div_ceil(T_TASK) >= LOCAL_SPANS);
            let r = data(s.batch * s.c_out * t_out, 18);
            let xa: Vec<f32> = x
                .iter()
                .map(|&v| if v >= 0.0 { v } else { 0.3 * v })
                .collect();
            let plain = reference(s, &xa, &w, Some(&b));
            let c = s.c_out / phases;
            let mut want = vec![0f64; plain.len()];
            for bi in 0..s.batch {
                for ch in 0..s.c_out {
                    let (p, o) = (ch / c, ch % c);
                    for t in 0..t_out {
                        let at = (bi * c + o) * t_out * phases + t * phases + p;
                        want[at] = plain[(bi * s.c_out + ch) * t_out + t] + f64::from(r[at]);
                    }
                }
            }
            let fused = Fused {
                pre_slope: Some(0.3),
                residual: Some(&r),
                phases,
            };
            for isa in available() {
                let got = conv1d_on(isa, s, &x, &w, Some(&b), fused).expect("valid shape");
                compare(s, &got, &want, isa);
            }
        }
    }

    #[test]
    fn depthwise_matches_f64_reference() {
        for &(batch, c, t_in, k, padding, dilation) in &[
            (1, 192, 193, 3, 1, 1),
            (2, 5, 17, 3, 3, 3),
            (1, 4, 9, 5, 0, 1),
            (1, 3, 4, 3, 9, 9),
        ] {
            let s = Conv1dShape {
                batch,
                c_in: c,
                t_in,
                c_out: c,
                k,
                padding,
                dilation,
            };
            let x = data(batch * c * t_in, 4);
            let w = data(c * k, 5);
            let b = data(c, 6);
            let got = depthwise(s, &x, &w, Some(&b)).expect("valid shape");
            // The grouped reference: a full conv whose weights are zero off the diagonal.
            let mut full = vec![0f32; c * c * k];
            for o in 0..c {
                full[(o * c + o) * k..][..k].copy_from_slice(&w[o * k..][..k]);
            }
            let want = reference(s, &x, &full, Some(&b));
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() <= 1e-5,
                    "{s:?} at {i}: {g} vs {w}"
                );
            }
        }
        let bad = Conv1dShape {
            batch: 1,
            c_in: 2,
            t_in: 4,
            c_out: 3,
            k: 3,
            padding: 1,
            dilation: 1,
        };
        assert!(depthwise(bad, &[0.0; 8], &[0.0; 6], None).is_none());
    }

    #[test]
    fn rejects_degenerate_shapes() {
        let s = Conv1dShape {
            batch: 1,
            c_in: 1,
            t_in: 2,
            c_out: 1,
            k: 5,
            padding: 0,
            dilation: 1,
        };
        assert!(s.t_out().is_none());
        assert!(conv1d(s, &[0.0; 2], &[0.0; 5], None, Fused::default()).is_none());
        let s = Conv1dShape { k: 1, ..s };
        assert!(
            conv1d(s, &[0.0; 3], &[0.0; 1], None, Fused::default()).is_none(),
            "x too long"
        );
    }
}
