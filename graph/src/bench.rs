//! `edgeflow bench dataflow`: the engine against a raw crossbeam-channel
//! chain measured in the same run, on the 17-stage topology that copper-rs
//! and dora-rs publish figures for.

use crate::metrics::Histogram;
use crate::{Payload, Pipeline, Policy, Registry};
use edgeflow_runtime::Tensor;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Benchmark options.
#[derive(Debug, Clone)]
pub struct DataflowBenchOptions {
    /// Stages in the chain (source and sink included).
    pub stages: usize,
    /// Messages timed one at a time for latency.
    pub latency_msgs: usize,
    /// Messages pushed back to back for throughput.
    pub throughput_msgs: usize,
}

impl Default for DataflowBenchOptions {
    fn default() -> Self {
        DataflowBenchOptions {
            stages: 17,
            latency_msgs: 2000,
            throughput_msgs: 100_000,
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRow {
    /// What ran.
    pub name: String,
    /// End-to-end latency p50, microseconds.
    pub p50_us: f64,
    /// End-to-end latency p99, microseconds.
    pub p99_us: f64,
    /// Messages per second, back to back.
    pub msgs_per_s: f64,
}

/// The whole report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DataflowBenchReport {
    /// Options used.
    pub stages: usize,
    /// Rows: baseline first.
    pub rows: Vec<BenchRow>,
    /// Latency of a tiny and a 4 MB tensor through 8 hops, microseconds (p50).
    pub tensor_tiny_p50_us: f64,
    /// See above.
    pub tensor_4mb_p50_us: f64,
}

impl DataflowBenchReport {
    /// Human-readable table with ratios against the baseline.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let base = &self.rows[0];
        let _ = writeln!(
            s,
            "dataflow: {}-stage chain (thread per stage unless inline), small messages",
            self.stages
        );
        let _ = writeln!(
            s,
            "{:<34} {:>10} {:>10} {:>12} {:>10} {:>10}",
            "configuration", "p50 us", "p99 us", "msgs/s", "p50/base", "tput/base"
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{:<34} {:>10.1} {:>10.1} {:>12.0} {:>9.2}x {:>9.2}x",
                r.name,
                r.p50_us,
                r.p99_us,
                r.msgs_per_s,
                r.p50_us / base.p50_us.max(1e-9),
                r.msgs_per_s / base.msgs_per_s.max(1e-9)
            );
        }
        let _ = writeln!(
            s,
            "tensor through 8 hops (p50): tiny {:.1} us, 4 MB {:.1} us, ratio {:.2}x (shared, not copied)",
            self.tensor_tiny_p50_us,
            self.tensor_4mb_p50_us,
            self.tensor_4mb_p50_us / self.tensor_tiny_p50_us.max(1e-9)
        );
        s
    }
}

/// Run the benchmark.
pub fn run_dataflow_bench(o: &DataflowBenchOptions) -> crate::Result<DataflowBenchReport> {
    let rows = vec![
        raw_crossbeam(o),
        engine(o, false, "edgeflow, thread per stage")?,
        engine(o, true, "edgeflow, inline passthroughs")?,
    ];
    let tiny = tensor_hops(&[16], o.latency_msgs / 4)?;
    let big = tensor_hops(&[1 << 20], o.latency_msgs / 4)?;
    Ok(DataflowBenchReport {
        stages: o.stages,
        rows,
        tensor_tiny_p50_us: tiny,
        tensor_4mb_p50_us: big,
    })
}

fn raw_crossbeam(o: &DataflowBenchOptions) -> BenchRow {
    // main -> s1 -> ... -> sN -> main, bounded(8) like the engine's default.
    let n = o.stages;
    let (first_tx, mut rx) = crossbeam_channel::bounded::<Instant>(8);
    let mut handles = Vec::new();
    for _ in 0..n {
        let (tx, next_rx) = crossbeam_channel::bounded::<Instant>(8);
        let my_rx = std::mem::replace(&mut rx, next_rx);
        handles.push(std::thread::spawn(move || {
            while let Ok(m) = my_rx.recv() {
                if tx.send(m).is_err() {
                    break;
                }
            }
        }));
    }
    let mut h = Histogram::default();
    for _ in 0..o.latency_msgs {
        let _ = first_tx.send(Instant::now());
        if let Ok(t) = rx.recv() {
            h.record(t.elapsed());
        }
    }
    let t0 = Instant::now();
    let pusher = {
        let tx = first_tx.clone();
        let m = o.throughput_msgs;
        std::thread::spawn(move || {
            for _ in 0..m {
                let _ = tx.send(Instant::now());
            }
        })
    };
    for _ in 0..o.throughput_msgs {
        let _ = rx.recv();
    }
    let el = t0.elapsed();
    let _ = pusher.join();
    drop(first_tx);
    for h in handles {
        let _ = h.join();
    }
    let s = h.summary();
    BenchRow {
        name: "raw crossbeam-channel (baseline)".into(),
        p50_us: s.p50_us,
        p99_us: s.p99_us,
        msgs_per_s: o.throughput_msgs as f64 / el.as_secs_f64(),
    }
}

fn chain_yaml(n: usize, inline: bool, ty: &str) -> String {
    let mut y = format!(
        "name: bench\nstages:\n  - {{ id: s0, kind: host_in, params: {{ type: {ty} }} }}\n"
    );
    for i in 1..n - 1 {
        let _ = writeln!(y, "  - {{ id: s{i}, kind: passthrough, inline: {inline} }}");
    }
    let _ = writeln!(
        y,
        "  - {{ id: s{}, kind: host_out, params: {{ capacity: 8 }} }}",
        n - 1
    );
    y.push_str("edges:\n");
    for i in 0..n - 1 {
        let _ = writeln!(
            y,
            "  - {{ from: s{i}.out, to: s{}.in, capacity: 8, policy: {} }}",
            i + 1,
            Policy::Block.name()
        );
    }
    y
}

fn engine(o: &DataflowBenchOptions, inline: bool, name: &str) -> crate::Result<BenchRow> {
    let n = o.stages.max(2);
    let yaml = chain_yaml(n, inline, "any");
    let running = Pipeline::from_yaml(&yaml, &Registry::builtin())?.start()?;
    let last = format!("s{}", n - 1);
    let mut h = Histogram::default();
    let timeout = Duration::from_secs(10);
    // Warm-up.
    for _ in 0..50 {
        running.push("s0", Payload::text(""))?;
        running.pull(&last, timeout)?;
    }
    for _ in 0..o.latency_msgs {
        running.push("s0", Payload::text(""))?;
        if let Some(m) = running.pull(&last, timeout)? {
            h.record(m.timestamp.elapsed());
        }
    }
    let t0 = Instant::now();
    std::thread::scope(|sc| -> crate::Result<()> {
        let r = &running;
        let pusher = sc.spawn(move || -> crate::Result<()> {
            for _ in 0..o.throughput_msgs {
                r.push("s0", Payload::text(""))?;
            }
            Ok(())
        });
        for _ in 0..o.throughput_msgs {
            running.pull(&last, timeout)?;
        }
        pusher.join().map_err(|_| crate::Error::Stopped)?
    })?;
    let el = t0.elapsed();
    running.stop();
    let _ = running.wait(Some(Duration::from_secs(5)));
    let s = h.summary();
    Ok(BenchRow {
        name: name.into(),
        p50_us: s.p50_us,
        p99_us: s.p99_us,
        msgs_per_s: o.throughput_msgs as f64 / el.as_secs_f64(),
    })
}

fn tensor_hops(dims: &[usize], msgs: usize) -> crate::Result<f64> {
    let yaml = chain_yaml(9, false, "tensor"); // 8 hops
    let running = Pipeline::from_yaml(&yaml, &Registry::builtin())?.start()?;
    let t = Tensor::zeros(dims).map_err(|e| crate::Error::Build {
        stage: "bench".into(),
        msg: e.to_string(),
    })?;
    let mut h = Histogram::default();
    let timeout = Duration::from_secs(10);
    for i in 0..msgs.max(10) + 20 {
        running.push("s0", Payload::Tensor(t.clone()))?;
        if let Some(m) = running.pull("s8", timeout)? {
            if i >= 20 {
                h.record(m.timestamp.elapsed());
            }
        }
    }
    running.stop();
    let _ = running.wait(Some(Duration::from_secs(5)));
    Ok(h.summary().p50_us)
}
