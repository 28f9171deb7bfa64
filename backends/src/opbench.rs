//! The op benchmark behind `edgeflow bench ops`: the runtime's CPU path
//! against raw candle calls on the same shapes, and against a memory
//! bandwidth ceiling measured in the same run.
//!
//! ## Method
//! - Every measurement alternates the runtime call and the raw candle call
//!   (A, B, A, B...) so machine noise hits both alike, and reports medians.
//! - Decode-shaped GEMVs rotate through enough copies of the weight matrix
//!   to cover [`BenchOptions::working_set_mb`], as a model's layers do, so
//!   weights stream from memory instead of sitting in cache; their
//!   achieved GB/s counts weight bytes only.
//! - Prefill-shaped quantized matmuls (`m` activation rows) reuse one weight
//!   matrix, as a prompt's rows do, and report GFLOP/s.
//! - The bandwidth ceiling is a multi-threaded f32 sum over a buffer of the
//!   same size (read-only, like a GEMV) on huge pages, best of 8 passes
//!   that alternate a plain loop and one that prefetches ahead in software
//!   as the GEMV kernels do.
//! - The run's ceiling, probed at both ends, is the best of 8 passes each
//!   time; the higher counts (a busy moment can only lower a probe) and
//!   the lower is printed too, so a reader sees how much the machine
//!   moved. Every GEMV row's "% of BW" is against it.
//! - "of BW then" is the same row against the bandwidth of the moments it
//!   ran: one probe pass after every pair of its blocks (5 ms after, once
//!   both sides' threads have stopped spinning), the median pass against
//!   the median call. On this shared VM the probes of one run spread 17-27
//!   GB/s, so a ceiling taken a minute away says less about a row; a pass
//!   is also one 10 ms sample where the ceiling is the best of 8.
//! - ratio = candle time / runtime time: 1.0 means no overhead.

use crate::cpu_backend;
use candle_core::quantized::QMatMul;
use candle_core::{Module, Tensor as CTensor};
use edgeflow_runtime::{ConvCfg, DType, Device, Result, Tensor};
use rayon::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Benchmark settings.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Bytes of weights a GEMV pass streams, and of the bandwidth buffer, in MB.
    pub working_set_mb: usize,
    /// Minimum measuring time per row.
    pub min_time: Duration,
    /// Parts the bandwidth ceiling splits its buffer into, run on rayon's
    /// pool (where candle's kernels run too).
    pub threads: usize,
    /// Row groups to run (`gemm`, `gemv`, `matmul`, `conv`, `attention`);
    /// empty runs them all.
    pub only: Vec<String>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            working_set_mb: 256,
            min_time: Duration::from_millis(600),
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            only: Vec::new(),
        }
    }
}

/// The row groups [`run`] knows, in the order it runs them.
pub const GROUPS: [&str; 5] = ["gemm", "gemv", "matmul", "conv", "attention"];

/// What a row's throughput counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Throughput {
    /// Floating-point operations per call.
    Flops(f64),
    /// Weight bytes streamed per call.
    Bytes(f64),
    /// Nothing (timing only).
    None,
}

/// One benchmark row.
#[derive(Debug, Clone)]
pub struct BenchRow {
    /// What was measured.
    pub name: String,
    /// Median seconds per call through the runtime (`Device` on the CPU backend).
    pub runtime_s: f64,
    /// Median seconds per call of the raw candle baseline.
    pub candle_s: f64,
    /// What a call does, for GFLOP/s or GB/s.
    pub throughput: Throughput,
    /// The bandwidth probed while this row ran (the median of single
    /// probe passes between its blocks), for its "of BW then" reading;
    /// None for rows without one. "% of BW" is always against the run's
    /// ceiling.
    pub ceiling_gbs: Option<f64>,
}

impl BenchRow {
    /// candle time / runtime time (>= 1 is no overhead).
    pub fn ratio(&self) -> f64 {
        self.candle_s / self.runtime_s
    }
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// Measured read bandwidth ceiling, GB/s: the highest probe.
    pub bandwidth_gbs: f64,
    /// The lowest probe of the run, GB/s.
    pub bandwidth_low_gbs: f64,
    /// Probes taken.
    pub probes: usize,
    /// Threads used for the ceiling.
    pub threads: usize,
    /// Rows.
    pub rows: Vec<BenchRow>,
}

impl BenchReport {
    /// A text table.
    pub fn render(&self) -> String {
        let mut s = format!(
            "memory bandwidth ceiling (f32 sum, {} threads): {:.1} GB/s (best of {} probes; lowest {:.1})\n\n{:<44} {:>10} {:>10} {:>8} {:>14}  {:<20}\n",
            self.threads,
            self.bandwidth_gbs,
            self.probes,
            self.bandwidth_low_gbs,
            "op",
            "runtime",
            "candle",
            "ratio",
            "throughput",
            "% of BW (of BW then)"
        );
        for r in &self.rows {
            let (tp, bw) = match r.throughput {
                Throughput::Flops(f) => (
                    format!("{:.1} GFLOP/s", f / r.runtime_s / 1e9),
                    String::new(),
                ),
                Throughput::Bytes(b) => {
                    let gbs = b / r.runtime_s / 1e9;
                    let then = match r.ceiling_gbs {
                        Some(c) => format!(" ({:.0}% of {c:.1})", 100.0 * gbs / c),
                        None => String::new(),
                    };
                    (
                        format!("{gbs:.1} GB/s"),
                        format!("{:.0}%{then}", 100.0 * gbs / self.bandwidth_gbs),
                    )
                }
                Throughput::None => (String::new(), String::new()),
            };
            s.push_str(&format!(
                "{:<44} {:>10} {:>10} {:>7.2}x {:>14}  {:<20}\n",
                r.name,
                fmt_time(r.runtime_s),
                fmt_time(r.candle_s),
                r.ratio(),
                tp,
                bw
            ));
        }
        s
    }
}

fn fmt_time(s: f64) -> String {
    if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Alternate `a` and `b` until both have run for `min_time`; medians.
fn ab(
    dev: &Device,
    min_time: Duration,
    a: impl FnMut() -> Result<()> + Send,
    b: impl FnMut() -> Result<()> + Send,
) -> Result<(f64, f64)> {
    let (ta, tb, _) = ab_probed(dev, min_time, a, b, None)?;
    Ok((ta, tb))
}

/// [`ab`], with one pass of `probe` (a reading, e.g. GB/s) after every
/// pair of blocks: readings of the machine at the moments the row ran;
/// their median is the third value.
fn ab_probed(
    dev: &Device,
    min_time: Duration,
    mut a: impl FnMut() -> Result<()> + Send,
    mut b: impl FnMut() -> Result<()> + Send,
    mut probe: Option<&mut dyn FnMut() -> f64>,
) -> Result<(f64, f64, Option<f64>)> {
    // Alternating blocks of calls rather than alternating calls: a side's
    // threads keep running a little after its call returns (candle's pool
    // spins at a barrier; ours are held awake for a batch), which would
    // slow the other side's next call on a small machine. Ours run inside
    // Device::batch, as a model's forward pass issues its ops; candle's on
    // a worker of rayon's pool (where its GEMMs fork), without our batch.
    const BLOCK: Duration = Duration::from_millis(40);
    let block = |f: &mut dyn FnMut() -> Result<()>, times: &mut Vec<f64>| -> Result<()> {
        let start = Instant::now();
        loop {
            let t = Instant::now();
            f()?;
            times.push(t.elapsed().as_secs_f64());
            if start.elapsed() >= BLOCK || times.len() >= 10_000 {
                return Ok(());
            }
        }
    };
    let (mut ta, mut tb, mut tp) = (Vec::new(), Vec::new(), Vec::new());
    dev.batch(&mut a)?;
    rayon::scope(|_| b())?;
    let start = Instant::now();
    while start.elapsed() < min_time * 2 || ta.len() < 5 || tb.len() < 5 {
        dev.batch(|| block(&mut a, &mut ta))?;
        rayon::scope(|_| block(&mut b, &mut tb))?;
        if let Some(p) = probe.as_mut() {
            // After both sides' threads have stopped spinning: right
            // after candle's block a pass read 13-18 GB/s against 20-22
            // two or more milliseconds later (same runs).
            std::thread::sleep(Duration::from_millis(5));
            tp.push(p());
        }
        if ta.len() >= 10_000 || tb.len() >= 10_000 {
            break;
        }
    }
    let p = (!tp.is_empty()).then(|| median(&mut tp));
    Ok((median(&mut ta), median(&mut tb), p))
}

/// Read bandwidth: `threads` threads summing disjoint parts of an `mb` MB
/// f32 buffer; best of eight passes (plain and prefetching loops in
/// turn), in GB/s.
pub fn bandwidth_gbs(mb: usize, threads: usize) -> f64 {
    stream(&probe_buffer(mb), threads, 0, 8)
}

/// `mb` MB of f32 on the pages weights get (Device::place): the ceiling
/// is what the machine streams at its best.
fn probe_buffer(mb: usize) -> Vec<f32> {
    let n = mb * (1 << 20) / 4;
    let buf: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    crate::cpu::huge_pages::advise_range(buf.as_ptr() as usize, 4 * n);
    buf
}

/// [`bandwidth_gbs`] over `buf`: best of `passes` (from pass number
/// `first`, which picks the loops). A pass reads at least 64 MB: a
/// smaller buffer (`--working-set-mb 1`, weights in cache) is read over
/// several times, so dispatching the pass does not dominate it.
fn stream(buf: &[f32], threads: usize, first: usize, passes: usize) -> f64 {
    let n = buf.len();
    let threads = threads.max(1);
    let chunk = n.div_ceil(threads).max(1);
    let reps = (64usize << 20).div_ceil((4 * n).max(1));
    let mut best = f64::INFINITY;
    let mut sink = 0.0f32;
    for pass in first..first + passes {
        let prefetch = pass % 2 == 1;
        let t = Instant::now();
        // On rayon's warm workers (threads spawned per pass read 1-2 GB/s
        // less at the run's ends, same runs).
        let total: f32 = buf
            .par_chunks(chunk)
            .map(|part| (0..reps).map(|_| sum(part, prefetch)).sum::<f32>())
            .sum();
        best = best.min(t.elapsed().as_secs_f64());
        sink += total;
    }
    std::hint::black_box(sink);
    (n * 4 * reps) as f64 / best / 1e9
}

/// The sum of `part`, prefetching ahead in software where asked and the
/// machine has AVX2.
fn sum(part: &[f32], prefetch: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if prefetch && std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        return unsafe { sum_prefetching(part) };
    }
    let _ = prefetch;
    let mut acc = [0f32; 16];
    let mut it = part.chunks_exact(16);
    for c in &mut it {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += *x;
        }
    }
    acc.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
}

/// [`sum`] in 128-byte steps, each prefetching the two lines 512 bytes
/// ahead (the GEMV kernels prefetch two tiles, a few hundred bytes, ahead
/// of each row stream).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_prefetching(part: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    const AHEAD: usize = 512;
    let mut it = part.chunks_exact(32);
    // SAFETY: each chunk holds 32 floats, read as 4 unaligned vectors;
    // prefetches never fault.
    unsafe {
        let mut a = [_mm256_setzero_ps(); 4];
        for c in &mut it {
            let p = c.as_ptr();
            let b = p.cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(AHEAD));
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(AHEAD + 64));
            for (v, acc) in a.iter_mut().enumerate() {
                *acc = _mm256_add_ps(*acc, _mm256_loadu_ps(p.add(8 * v)));
            }
        }
        let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), s);
        lanes.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
    }
}

/// The ceiling probes of a run (one buffer): the highest and lowest reading.
struct Probes {
    buf: Vec<f32>,
    threads: usize,
    high: f64,
    low: f64,
    count: usize,
    /// Single passes taken.
    passes: usize,
}

impl Probes {
    fn new(mb: usize, threads: usize) -> Self {
        Probes {
            buf: probe_buffer(mb),
            threads,
            high: 0.0,
            low: f64::INFINITY,
            count: 0,
            passes: 0,
        }
    }

    /// A full probe (best of 8 passes), counted in the run's range.
    fn probe(&mut self) {
        let g = stream(&self.buf, self.threads, 0, 8);
        self.high = self.high.max(g);
        self.low = self.low.min(g);
        self.count += 1;
    }

    /// One pass (the loops in turn), for a row's interleaved readings.
    fn pass(&mut self) -> f64 {
        self.passes += 1;
        stream(&self.buf, self.threads, self.passes, 1)
    }
}

fn randn(dims: &[usize], seed: u64) -> Result<Tensor> {
    edgeflow_runtime::rng::rand_normal_host(dims, 0.0, 1.0, seed)
}

fn c(t: &Tensor) -> Result<CTensor> {
    Ok(t.candle("bench")?.clone())
}

fn gemm(dev: &Device, n: usize, o: &BenchOptions) -> Result<BenchRow> {
    let (a, b) = (randn(&[n, n], 1)?, randn(&[n, n], 2)?);
    let (ca, cb) = (c(&a)?, c(&b)?);
    let (r, k) = ab(
        dev,
        o.min_time,
        || dev.matmul(&a, &b).map(|_| ()),
        || ca.matmul(&cb).map(|_| ()).map_err(Into::into),
    )?;
    Ok(BenchRow {
        name: format!("gemm f32 {n}x{n}x{n}"),
        runtime_s: r,
        candle_s: k,
        throughput: Throughput::Flops(2.0 * (n * n * n) as f64),
        ceiling_gbs: None,
    })
}

/// Decode GEMV `x[1, k] @ w[n, k]^T` over enough weight copies to stream
/// `working_set_mb` per pass.
fn gemv(
    dev: &Device,
    k: usize,
    n: usize,
    dt: DType,
    o: &BenchOptions,
    probes: &mut Probes,
) -> Result<BenchRow> {
    let x = randn(&[1, k], 3)?;
    let cx = c(&x)?;
    let w0 = randn(&[n, k], 4)?;
    let one = match dt {
        DType::F32 => w0.size_bytes(),
        _ => dev.cast(&w0, dt)?.size_bytes(),
    };
    let copies = (o.working_set_mb * (1 << 20)).div_ceil(one).clamp(1, 1024);
    let mut ws = Vec::with_capacity(copies);
    let mut unplaced = Vec::with_capacity(copies);
    for i in 0..copies {
        let w = randn(&[n, k], 100 + i as u64)?;
        let w = if dt == DType::F32 {
            w
        } else {
            dev.cast(&w, dt)?
        };
        // Placed as a stage places its weights at load (huge pages on the
        // CPU; quantized matrices packed into the kernels' tiles). Raw
        // candle below reads GGML's layout: the same memory for f32, the
        // unplaced tensor on huge pages too for quantized weights.
        ws.push(dev.place(&w)?);
        crate::cpu::huge_pages::advise(&w);
        unplaced.push(w);
    }
    // The raw candle calls: what candle_nn::Linear / QMatMul do.
    enum Raw {
        F(Vec<CTensor>),
        Q(Vec<QMatMul>),
    }
    let raw = if dt == DType::F32 {
        Raw::F(unplaced.iter().map(c).collect::<Result<_>>()?)
    } else {
        let mut v = Vec::new();
        for w in &unplaced {
            let edgeflow_runtime::Storage::Quantized(q) = w.storage() else {
                return Err(edgeflow_runtime::Error::bad_input(
                    "bench",
                    "expected quantized weights",
                ));
            };
            v.push(QMatMul::from_arc(Arc::clone(q))?);
        }
        Raw::Q(v)
    };
    let (mut i, mut j) = (0usize, 0usize);
    let mut pass = || probes.pass();
    let (r, kk, ceiling) = ab_probed(
        dev,
        o.min_time,
        || {
            let w = &ws[i % copies];
            i += 1;
            dev.linear(&x, w, None).map(|_| ())
        },
        || {
            j += 1;
            match &raw {
                Raw::F(v) => cx.matmul(&v[j % copies].t()?).map(|_| ())?,
                Raw::Q(v) => v[j % copies].forward(&cx).map(|_| ())?,
            }
            Ok(())
        },
        Some(&mut pass),
    )?;
    Ok(BenchRow {
        name: format!("gemv {dt} 1x{k}x{n} ({copies} weight copies)"),
        runtime_s: r,
        candle_s: kk,
        throughput: Throughput::Bytes(one as f64),
        ceiling_gbs: ceiling,
    })
}

/// Prefill-shaped quantized linear `x[m, k] @ w[n, k]^T` (one weight
/// matrix, so it stays in cache as a prompt's rows do) against candle's
/// `QMatMul` on the same rows.
fn qmatmul(
    dev: &Device,
    m: usize,
    k: usize,
    n: usize,
    dt: DType,
    o: &BenchOptions,
) -> Result<BenchRow> {
    let x = randn(&[m, k], 13)?;
    let cx = c(&x)?;
    let w = dev.cast(&randn(&[n, k], 14)?, dt)?;
    // Ours placed as a stage places its weights (packed into the kernels'
    // tiles where they read them packed); candle's QMatMul reads GGML's
    // layout.
    let placed = dev.place(&w)?;
    let edgeflow_runtime::Storage::Quantized(q) = w.storage() else {
        return Err(edgeflow_runtime::Error::bad_input(
            "bench",
            "expected quantized weights",
        ));
    };
    let mm = QMatMul::from_arc(Arc::clone(q))?;
    let (r, kk) = ab(
        dev,
        o.min_time,
        || dev.linear(&x, &placed, None).map(|_| ()),
        || {
            mm.forward(&cx)?;
            Ok(())
        },
    )?;
    Ok(BenchRow {
        name: format!("matmul {dt} {m}x{k}x{n}"),
        runtime_s: r,
        candle_s: kk,
        throughput: Throughput::Flops(2.0 * (m * k * n) as f64),
        ceiling_gbs: None,
    })
}

fn conv(dev: &Device, o: &BenchOptions) -> Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    // (c_in, c_out, k, dilation, length): a VITS flow / text-encoder conv,
    // the flow's WaveNet input and 1x1 convs on a sentence's frames and the
    // text encoder's FFN convs on its phonemes (Piper's costliest conv1d
    // calls in `bench tts --profile-ops`), then the
    // HiFi-GAN residual convs of Piper's medium voices at each upsampling
    // stage (one second of audio), and Whisper's first conv.
    let shapes: [(usize, usize, usize, usize, usize); 9] = [
        (192, 192, 5, 1, 1024),
        (192, 384, 5, 1, 363),
        (192, 384, 1, 1, 363),
        (192, 768, 3, 1, 193),
        (768, 192, 3, 1, 193),
        (128, 128, 5, 2, 689),
        (64, 64, 7, 3, 5512),
        (32, 32, 7, 12, 22050),
        (80, 384, 3, 1, 3000),
    ];
    for (i, &(ci, co, kk, d, l)) in shapes.iter().enumerate() {
        let seed = 5 + 3 * i as u64;
        let (x, w, b) = (
            randn(&[1, ci, l], seed)?,
            randn(&[co, ci, kk], seed + 1)?,
            randn(&[co], seed + 2)?,
        );
        let (cx, cw, cb) = (c(&x)?, c(&w)?, c(&b)?.reshape((1, co, 1))?);
        let pad = d * (kk - 1) / 2;
        let cfg = ConvCfg {
            padding: pad,
            dilation: d,
            ..ConvCfg::default()
        };
        let (r, k) = ab(
            dev,
            o.min_time,
            || dev.conv1d(&x, &w, Some(&b), cfg).map(|_| ()),
            || {
                cx.conv1d(&cw, pad, 1, d, 1)?.broadcast_add(&cb)?;
                Ok(())
            },
        )?;
        rows.push(BenchRow {
            name: format!("conv1d {ci}->{co} k{kk} d{d} l{l}"),
            runtime_s: r,
            candle_s: k,
            throughput: Throughput::Flops(2.0 * (ci * co * kk * l) as f64),
            ceiling_gbs: None,
        });
    }
    // Vocoder upsampling: 256 -> 128 channels, stride 8, kernel 16.
    let (x, w) = (randn(&[1, 256, 200], 8)?, randn(&[256, 128, 16], 9)?);
    let (cx, cw) = (c(&x)?, c(&w)?);
    let tcfg = edgeflow_runtime::ConvTransposeCfg {
        stride: 8,
        padding: 4,
        ..Default::default()
    };
    let (r, k) = ab(
        dev,
        o.min_time,
        || dev.conv_transpose1d(&x, &w, None, tcfg).map(|_| ()),
        || {
            cx.conv_transpose1d(&cw, 4, 0, 8, 1, 1)?;
            Ok(())
        },
    )?;
    rows.push(BenchRow {
        name: "conv_transpose1d 256->128 k16 s8 l200".into(),
        runtime_s: r,
        candle_s: k,
        throughput: Throughput::Flops(2.0 * 256.0 * 128.0 * 16.0 * 200.0),
        ceiling_gbs: None,
    });
    Ok(rows)
}

/// The same attention written directly in candle (GQA folded into rows);
/// also the CPU attention kernel's test reference.
pub(crate) fn candle_attention(
    q: &CTensor,
    k: &CTensor,
    v: &CTensor,
    scale: f64,
    causal: bool,
) -> Result<CTensor> {
    let (b, h, s, d) = q.dims4()?;
    let (_, hk, t, _) = k.dims4()?;
    let rep = h / hk;
    let qg = q.reshape((b, hk, rep * s, d))?;
    let sc = (qg.matmul(&k.t()?)? * scale)?.reshape((b, h, s, t))?;
    let sc = if causal {
        let m: Vec<f32> = (0..s)
            .flat_map(|i| {
                (0..t).map(move |j| {
                    if j > i + t - s {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        sc.broadcast_add(&CTensor::from_vec(m, (s, t), q.device())?)?
    } else {
        sc
    };
    let p = candle_nn::ops::softmax_last_dim(&sc)?.reshape((b, hk, rep * s, t))?;
    Ok(p.matmul(v)?.reshape((b, h, s, d))?)
}

fn attention(dev: &Device, s: usize, t: usize, o: &BenchOptions) -> Result<BenchRow> {
    let (h, hk, d) = (9, 3, 64);
    let q = randn(&[1, h, s, d], 10)?;
    let k = randn(&[1, hk, t, d], 11)?;
    let v = randn(&[1, hk, t, d], 12)?;
    let (cq, ck, cv) = (c(&q)?, c(&k)?, c(&v)?);
    let scale = 1.0 / (d as f64).sqrt();
    let (r, kk) = ab(
        dev,
        o.min_time,
        || dev.attention(&q, &k, &v, None, scale, true).map(|_| ()),
        || candle_attention(&cq, &ck, &cv, scale, true).map(|_| ()),
    )?;
    Ok(BenchRow {
        name: format!("attention causal h{h}/{hk} d{d} s{s} t{t}"),
        runtime_s: r,
        candle_s: kk,
        throughput: Throughput::Flops(4.0 * (h * s * t * d) as f64),
        ceiling_gbs: None,
    })
}

/// Run the benchmark; `progress` is told what is being measured.
pub fn run(o: &BenchOptions, mut progress: impl FnMut(&str)) -> Result<BenchReport> {
    if let Some(g) = o.only.iter().find(|g| !GROUPS.contains(&g.as_str())) {
        return Err(edgeflow_runtime::Error::bad_input(
            "bench ops",
            format!("unknown row group `{g}`; choose from {}", GROUPS.join(", ")),
        ));
    }
    let want = |g: &str| o.only.is_empty() || o.only.iter().any(|w| w == g);
    let cpu = cpu_backend();
    let dev = Device::new(cpu.clone(), cpu);
    progress("memory bandwidth");
    let mut probes = Probes::new(o.working_set_mb, o.threads);
    probes.probe();
    let mut rows = Vec::new();
    // Each row's calls run in blocks (see `ab`): ours inside Device::batch,
    // as a model's forward pass issues them, candle's on a rayon worker.
    for n in [512, 1024].into_iter().filter(|_| want("gemm")) {
        progress(&format!("gemm {n}"));
        rows.push(gemm(&dev, n, o)?);
    }
    for (k, n) in [(576, 1536), (896, 4864)]
        .into_iter()
        .filter(|_| want("gemv"))
    {
        for dt in [DType::F32, DType::Q8_0, DType::Q4_1, DType::Q4_0] {
            progress(&format!("gemv {dt} 1x{k}x{n}"));
            rows.push(gemv(&dev, k, n, dt, o, &mut probes)?);
        }
    }
    for dt in [DType::Q4_1, DType::Q8_0]
        .into_iter()
        .filter(|_| want("matmul"))
    {
        progress(&format!("matmul {dt} 128x576x1536"));
        rows.push(qmatmul(&dev, 128, 576, 1536, dt, o)?);
    }
    if want("conv") {
        progress("conv");
        rows.extend(conv(&dev, o)?);
    }
    if want("attention") {
        progress("attention");
        rows.push(attention(&dev, 128, 128, o)?);
        rows.push(attention(&dev, 1, 512, o)?);
    }
    // The highest probe is the ceiling (a busy machine can only lower it).
    progress("memory bandwidth again");
    probes.probe();
    Ok(BenchReport {
        bandwidth_gbs: probes.high,
        bandwidth_low_gbs: probes.low,
        probes: probes.count,
        threads: o.threads,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GEMV row reads against the run's ceiling and, in brackets,
    /// against the bandwidth probed while it ran; other rows get neither.
    #[test]
    fn gemv_rows_read_against_both_ceilings() {
        let row = |name: &str, throughput, ceiling_gbs| BenchRow {
            name: name.into(),
            runtime_s: 1e-4,
            candle_s: 2e-4,
            throughput,
            ceiling_gbs,
        };
        let report = BenchReport {
            bandwidth_gbs: 25.0,
            bandwidth_low_gbs: 20.0,
            probes: 2,
            threads: 2,
            rows: vec![
                row("gemv a", Throughput::Bytes(2e6), Some(16.0)),
                row("gemv b", Throughput::Bytes(2e6), None),
                row("gemm", Throughput::Flops(1e9), None),
            ],
        };
        let text = report.render();
        assert!(
            text.contains("25.0 GB/s (best of 2 probes; lowest 20.0)"),
            "{text}"
        );
        let line = |n: &str| {
            text.lines()
                .find(|l| l.starts_with(n))
                .expect(n)
                .to_string()
        };
        // 2 MB in 100 us: 20 GB/s, 80% of 25 and 125% of 16.
        assert!(line("gemv a").contains("80% (125% of 16.0)"), "{text}");
        assert!(line("gemv b").trim_end().ends_with("80%"), "{text}");
        assert!(!line("gemm").contains('%'), "{text}");
        assert!(line("gemm").contains("2.00x"), "{text}");
    }

    #[test]
    fn an_unknown_row_group_is_refused_before_measuring() {
        let o = BenchOptions {
            only: vec!["gemv".into(), "gemvv".into()],
            ..BenchOptions::default()
        };
        let mut measured = Vec::new();
        let e = run(&o, |w| measured.push(w.to_string())).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("gemvv") && msg.contains("attention"), "{msg}");
        assert!(measured.is_empty());
    }

    #[test]
    fn only_runs_the_named_groups() {
        let o = BenchOptions {
            working_set_mb: 1,
            min_time: Duration::from_millis(1),
            threads: 1,
            only: vec!["attention".into()],
        };
        let r = run(&o, |_| {}).unwrap();
        assert_eq!(r.rows.len(), 2);
        assert!(r.rows.iter().all(|row| row.name.starts_with("attention")));
    }
}
