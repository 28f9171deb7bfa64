//! `edgeflow bench ops`: the runtime's CPU path against raw candle calls on
//! the same shapes, and against a memory bandwidth ceiling measured in the
//! same run.
//!
//! ## Method
//! - Every measurement alternates the runtime call and the raw candle call
//!   (A, B, A, B...) so machine noise hits both alike, and reports medians.
//! - Decode-shaped GEMVs rotate through enough copies of the weight matrix
//!   to cover `--working-set-mb`, as a model's layers do, so weights stream
//!   from memory instead of sitting in cache; their achieved GB/s counts
//!   weight bytes only.
//! - Prefill-shaped quantized matmuls (`m` activation rows) reuse one weight
//!   matrix, as a prompt's rows do, and report GFLOP/s.
//! - The bandwidth ceiling is [`edgeflow_backends::bandwidth`]'s probe: a
//!   multi-threaded f32 sum over a buffer of the same size (read-only, like
//!   a GEMV) on huge pages, best of 8 passes that alternate a plain loop and
//!   one that prefetches ahead in software as the GEMV kernels do.
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

use super::{Bench, BenchReport, Row};
use candle_core::quantized::QMatMul;
use candle_core::{Module, Tensor as CTensor};
use edgeflow_backends::bandwidth::BandwidthProbe;
use edgeflow_runtime::{ConvCfg, DType, Device, Result, Tensor};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The row groups the bench knows, in the order it runs them.
pub(crate) const GROUPS: [&str; 5] = ["gemm", "gemv", "matmul", "conv", "attention"];

/// Options of `edgeflow bench ops`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct OpsArgs {
    /// Weight bytes streamed per GEMV pass and size of the bandwidth buffer, MB.
    #[arg(long, default_value_t = 256)]
    pub working_set_mb: usize,
    /// Minimum measuring time per row, ms.
    #[arg(long, default_value_t = 600)]
    pub min_time_ms: u64,
    /// Parts the bandwidth ceiling is read in, on the worker pool (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Run only these row groups (comma-separated: gemm, gemv, matmul, conv,
    /// attention).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

impl Default for OpsArgs {
    fn default() -> Self {
        OpsArgs {
            working_set_mb: 256,
            min_time_ms: 600,
            threads: None,
            only: Vec::new(),
        }
    }
}

impl OpsArgs {
    fn threads(&self) -> usize {
        self.threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |t| t.max(1),
        )
    }

    fn min_time(&self) -> Duration {
        Duration::from_millis(self.min_time_ms)
    }
}

impl Bench for OpsArgs {
    fn name(&self) -> &'static str {
        "ops"
    }

    fn compares(&self) -> &'static str {
        "tensor ops on the CPU backend vs raw candle; decode GEMVs vs the measured memory bandwidth"
    }

    fn args(&self) -> Vec<String> {
        let mut a = vec![
            "--working-set-mb".into(),
            self.working_set_mb.to_string(),
            "--min-time-ms".into(),
            self.min_time_ms.to_string(),
        ];
        if let Some(t) = self.threads {
            a.extend(["--threads".into(), t.to_string()]);
        }
        if !self.only.is_empty() {
            a.extend(["--only".into(), self.only.join(",")]);
        }
        a
    }

    fn run(&self) -> anyhow::Result<BenchReport> {
        let o = OpsArgs {
            working_set_mb: self.working_set_mb.max(1),
            ..self.clone()
        };
        let run = measure(&o, |what| eprintln!("measuring {what}..."))?;
        Ok(run.report())
    }
}

/// What a row's throughput counts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Throughput {
    /// Floating-point operations per call.
    Flops(f64),
    /// Weight bytes streamed per call.
    Bytes(f64),
}

/// One measured op.
#[derive(Debug, Clone)]
struct OpRow {
    /// What was measured.
    name: String,
    /// Median seconds per call through the runtime (`Device` on the CPU backend).
    runtime_s: f64,
    /// Median seconds per call of the raw candle baseline.
    candle_s: f64,
    /// What a call does, for GFLOP/s or GB/s.
    throughput: Throughput,
    /// The bandwidth probed while this row ran (the median of single
    /// probe passes between its blocks), for its "of BW then" reading;
    /// None for rows without one. "% of BW" is always against the run's
    /// ceiling.
    ceiling_gbs: Option<f64>,
}

/// The whole run.
#[derive(Debug, Clone)]
struct OpsRun {
    /// Measured read bandwidth ceiling, GB/s: the highest probe.
    bandwidth_gbs: f64,
    /// The lowest probe of the run, GB/s.
    bandwidth_low_gbs: f64,
    /// Probes taken.
    probes: usize,
    /// Threads used for the ceiling.
    threads: usize,
    rows: Vec<OpRow>,
}

impl OpsRun {
    fn report(&self) -> BenchReport {
        let mut r = BenchReport::new(
            "edgeflow bench ops: the runtime's CPU kernels vs raw candle, same shapes, same run",
            "candle",
            "candle / runtime",
        );
        r.context.push(format!(
            "memory bandwidth ceiling (f32 sum, {} threads): {:.1} GB/s (best of {} probes; lowest {:.1})",
            self.threads, self.bandwidth_gbs, self.probes, self.bandwidth_low_gbs
        ));
        r.bandwidth_gbs = Some(self.bandwidth_gbs);
        for o in &self.rows {
            let note = match o.throughput {
                Throughput::Flops(f) => format!("{:.1} GFLOP/s", f / o.runtime_s / 1e9),
                Throughput::Bytes(b) => {
                    let gbs = b / o.runtime_s / 1e9;
                    let then = match o.ceiling_gbs {
                        Some(c) => format!(" ({:.0}% of {c:.1})", 100.0 * gbs / c),
                        None => String::new(),
                    };
                    format!(
                        "{gbs:.1} GB/s, {:.0}%{then}",
                        100.0 * gbs / self.bandwidth_gbs
                    )
                }
            };
            let (scale, unit) = if o.runtime_s >= 1e-3 {
                (1e3, "ms")
            } else {
                (1e6, "us")
            };
            r.rows.push(
                Row::new(&o.name, o.runtime_s * scale, unit)
                    .baseline(o.candle_s * scale)
                    .ratio(o.candle_s / o.runtime_s)
                    .note(note),
            );
        }
        r.notes.push(
            "ratio = candle time / runtime time (targets: >= 0.95x; decode GEMV >= 70% of bandwidth)"
                .into(),
        );
        r.notes.push(
            "GEMV notes: weight GB/s, % of the run's ceiling (% of the bandwidth probed while the row ran)"
                .into(),
        );
        r
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

/// The ceiling probes of a run (one buffer): the highest and lowest reading.
struct Probes {
    probe: BandwidthProbe,
    high: f64,
    low: f64,
    count: usize,
}

impl Probes {
    fn new(mb: usize, threads: usize) -> Self {
        Probes {
            probe: BandwidthProbe::new(mb, threads),
            high: 0.0,
            low: f64::INFINITY,
            count: 0,
        }
    }

    /// A full probe (best of 8 passes), counted in the run's range.
    fn probe(&mut self) {
        let g = self.probe.probe();
        self.high = self.high.max(g);
        self.low = self.low.min(g);
        self.count += 1;
    }

    /// One pass (the loops in turn), for a row's interleaved readings.
    fn pass(&mut self) -> f64 {
        self.probe.pass()
    }
}

fn randn(dims: &[usize], seed: u64) -> Result<Tensor> {
    edgeflow_runtime::rng::rand_normal_host(dims, 0.0, 1.0, seed)
}

fn c(t: &Tensor) -> Result<CTensor> {
    Ok(t.candle("bench")?.clone())
}

fn gemm(dev: &Device, n: usize, o: &OpsArgs) -> Result<OpRow> {
    let (a, b) = (randn(&[n, n], 1)?, randn(&[n, n], 2)?);
    let (ca, cb) = (c(&a)?, c(&b)?);
    let (r, k) = ab(
        dev,
        o.min_time(),
        || dev.matmul(&a, &b).map(|_| ()),
        || ca.matmul(&cb).map(|_| ()).map_err(Into::into),
    )?;
    Ok(OpRow {
        name: format!("gemm f32 {n}x{n}x{n}"),
        runtime_s: r,
        candle_s: k,
        throughput: Throughput::Flops(2.0 * (n * n * n) as f64),
        ceiling_gbs: None,
    })
}

/// The quantized storage of `w` (the GGML blocks candle's `QMatMul` reads).
fn quantized(w: &Tensor) -> Result<QMatMul> {
    let edgeflow_runtime::Storage::Quantized(q) = w.storage() else {
        return Err(edgeflow_runtime::Error::bad_input(
            "bench",
            "expected quantized weights",
        ));
    };
    Ok(QMatMul::from_arc(Arc::clone(q))?)
}

/// Decode GEMV `x[1, k] @ w[n, k]^T` over enough weight copies to stream
/// `working_set_mb` per pass.
fn gemv(
    dev: &Device,
    k: usize,
    n: usize,
    dt: DType,
    o: &OpsArgs,
    probes: &mut Probes,
) -> Result<OpRow> {
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
        edgeflow_backends::advise_huge_pages(&w);
        unplaced.push(w);
    }
    // Packed weights are a fresh allocation the backend moves after a
    // second without new loads.
    super::settle_huge_pages();
    // The raw candle calls: what candle_nn::Linear / QMatMul do.
    enum Raw {
        F(Vec<CTensor>),
        Q(Vec<QMatMul>),
    }
    let raw = if dt == DType::F32 {
        Raw::F(unplaced.iter().map(c).collect::<Result<_>>()?)
    } else {
        Raw::Q(unplaced.iter().map(quantized).collect::<Result<_>>()?)
    };
    let (mut i, mut j) = (0usize, 0usize);
    let mut pass = || probes.pass();
    let (r, kk, ceiling) = ab_probed(
        dev,
        o.min_time(),
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
    Ok(OpRow {
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
fn qmatmul(dev: &Device, m: usize, k: usize, n: usize, dt: DType, o: &OpsArgs) -> Result<OpRow> {
    let x = randn(&[m, k], 13)?;
    let cx = c(&x)?;
    let w = dev.cast(&randn(&[n, k], 14)?, dt)?;
    // Ours placed as a stage places its weights (packed into the kernels'
    // tiles where they read them packed); candle's QMatMul reads GGML's
    // layout.
    let placed = dev.place(&w)?;
    // Packed weights are a fresh allocation the backend moves after a
    // second without new loads.
    super::settle_huge_pages();
    let mm = quantized(&w)?;
    let (r, kk) = ab(
        dev,
        o.min_time(),
        || dev.linear(&x, &placed, None).map(|_| ()),
        || {
            mm.forward(&cx)?;
            Ok(())
        },
    )?;
    Ok(OpRow {
        name: format!("matmul {dt} {m}x{k}x{n}"),
        runtime_s: r,
        candle_s: kk,
        throughput: Throughput::Flops(2.0 * (m * k * n) as f64),
        ceiling_gbs: None,
    })
}

fn conv(dev: &Device, o: &OpsArgs) -> Result<Vec<OpRow>> {
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
            o.min_time(),
            || dev.conv1d(&x, &w, Some(&b), cfg).map(|_| ()),
            || {
                cx.conv1d(&cw, pad, 1, d, 1)?.broadcast_add(&cb)?;
                Ok(())
            },
        )?;
        rows.push(OpRow {
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
        o.min_time(),
        || dev.conv_transpose1d(&x, &w, None, tcfg).map(|_| ()),
        || {
            cx.conv_transpose1d(&cw, 4, 0, 8, 1, 1)?;
            Ok(())
        },
    )?;
    rows.push(OpRow {
        name: "conv_transpose1d 256->128 k16 s8 l200".into(),
        runtime_s: r,
        candle_s: k,
        throughput: Throughput::Flops(2.0 * 256.0 * 128.0 * 16.0 * 200.0),
        ceiling_gbs: None,
    });
    Ok(rows)
}

fn attention(dev: &Device, s: usize, t: usize, o: &OpsArgs) -> Result<OpRow> {
    let (h, hk, d) = (9, 3, 64);
    let q = randn(&[1, h, s, d], 10)?;
    let k = randn(&[1, hk, t, d], 11)?;
    let v = randn(&[1, hk, t, d], 12)?;
    let (cq, ck, cv) = (c(&q)?, c(&k)?, c(&v)?);
    let scale = 1.0 / (d as f64).sqrt();
    let (r, kk) = ab(
        dev,
        o.min_time(),
        || dev.attention(&q, &k, &v, None, scale, true).map(|_| ()),
        || edgeflow_backends::candle_attention(&cq, &ck, &cv, scale, true).map(|_| ()),
    )?;
    Ok(OpRow {
        name: format!("attention causal h{h}/{hk} d{d} s{s} t{t}"),
        runtime_s: r,
        candle_s: kk,
        throughput: Throughput::Flops(4.0 * (h * s * t * d) as f64),
        ceiling_gbs: None,
    })
}

/// Run the benchmark; `progress` is told what is being measured.
fn measure(o: &OpsArgs, mut progress: impl FnMut(&str)) -> Result<OpsRun> {
    if let Some(g) = o.only.iter().find(|g| !GROUPS.contains(&g.as_str())) {
        return Err(edgeflow_runtime::Error::bad_input(
            "bench ops",
            format!("unknown row group `{g}`; choose from {}", GROUPS.join(", ")),
        ));
    }
    let want = |g: &str| o.only.is_empty() || o.only.iter().any(|w| w == g);
    let cpu = edgeflow_backends::cpu_backend();
    let dev = Device::new(cpu.clone(), cpu);
    let threads = o.threads();
    progress("memory bandwidth");
    let mut probes = Probes::new(o.working_set_mb, threads);
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
    // Qwen2.5-0.5B's decode: its gate and up projections (one Q5_0 matrix
    // of 2 x 4864 rows); Qwen2.5-1.5B's (Q4_K_M): Q4_K gate / up
    // projections, Q6_K down projections in half its layers.
    for (dt, k, n) in [
        (DType::Q5_0, 896, 9728),
        (DType::Q4K, 1536, 8960),
        (DType::Q6K, 8960, 1536),
    ]
    .into_iter()
    .filter(|_| want("gemv"))
    {
        progress(&format!("gemv {dt} 1x{k}x{n}"));
        rows.push(gemv(&dev, k, n, dt, o, &mut probes)?);
    }
    for dt in [DType::Q4_1, DType::Q8_0]
        .into_iter()
        .filter(|_| want("matmul"))
    {
        progress(&format!("matmul {dt} 128x576x1536"));
        rows.push(qmatmul(&dev, 128, 576, 1536, dt, o)?);
    }
    // The prefill kernels on Qwen2.5's MLP shapes: the 0.5B keeps its gate /
    // up projections in Q5_0; Q4_K_M (the 1.5B) keeps them in Q4_K and half
    // the down projections in Q6_K.
    for (dt, k, n) in [
        (DType::Q5_0, 896, 4864),
        (DType::Q4K, 1536, 8960),
        (DType::Q6K, 8960, 1536),
    ]
    .into_iter()
    .filter(|_| want("matmul"))
    {
        progress(&format!("matmul {dt} 128x{k}x{n}"));
        rows.push(qmatmul(&dev, 128, k, n, dt, o)?);
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
    Ok(OpsRun {
        bandwidth_gbs: probes.high,
        bandwidth_low_gbs: probes.low,
        probes: probes.count,
        threads,
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
        let row = |name: &str, throughput, ceiling_gbs| OpRow {
            name: name.into(),
            runtime_s: 1e-4,
            candle_s: 2e-4,
            throughput,
            ceiling_gbs,
        };
        let run = OpsRun {
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
        let report = run.report();
        assert_eq!(report.bandwidth_gbs, Some(25.0));
        let text = report.render_text();
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
        // Times in the runtime's unit, baseline alongside.
        assert!(line("gemm").contains("100.0 us"), "{text}");
        assert!(line("gemm").contains("200.0 us"), "{text}");
    }

    #[test]
    fn an_unknown_row_group_is_refused_before_measuring() {
        let o = OpsArgs {
            only: vec!["gemv".into(), "gemvv".into()],
            ..OpsArgs::default()
        };
        let mut measured = Vec::new();
        let e = measure(&o, |w| measured.push(w.to_string())).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("gemvv") && msg.contains("attention"), "{msg}");
        assert!(measured.is_empty());
    }

    #[test]
    fn only_runs_the_named_groups() {
        let o = OpsArgs {
            working_set_mb: 1,
            min_time_ms: 1,
            threads: Some(1),
            only: vec!["attention".into()],
        };
        let r = measure(&o, |_| {}).unwrap();
        assert_eq!(r.rows.len(), 2);
        assert!(r.rows.iter().all(|row| row.name.starts_with("attention")));
    }

    #[test]
    fn args_reproduce_the_options() {
        let o = OpsArgs {
            working_set_mb: 64,
            min_time_ms: 150,
            threads: Some(2),
            only: vec!["gemv".into(), "conv".into()],
        };
        assert_eq!(
            super::super::command(&o),
            "edgeflow bench ops --working-set-mb 64 --min-time-ms 150 --threads 2 --only gemv,conv"
        );
    }
}
