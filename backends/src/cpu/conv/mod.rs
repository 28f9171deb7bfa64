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
//! AVX-512 registers (6 or 4 x 48 in 12 or 8 AVX2 registers, as three
//! thirds), and each (input channel, tap) step costs 3 input loads and 8
//! weight broadcasts for 24 fused multiply-adds, so the kernel is bound by
//! FMA throughput, not memory.
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

mod depthwise;
mod pack;
mod rows;
#[cfg(test)]
mod tests;
mod tile;

pub(crate) use depthwise::depthwise;
use pack::source_channel;
pub(crate) use pack::PackedWeights;
use rayon::prelude::*;
use rows::{fill_row, store_rows};
use tile::{tile, Geo};

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
    pub(super) fn t_out(&self) -> Option<usize> {
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
// SAFETY: as for Send: shared use only writes disjoint regions.
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
        6 => blocked::<6>(w.isa, s, t_out, x, (&w.data, &w.taps), bias, fused),
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

/// Spans from which a convolution pads its input span by span, inside the
/// tasks (enough tasks to keep every thread of a small machine busy).
const LOCAL_SPANS: usize = 8;
