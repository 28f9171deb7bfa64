//! `edgeflow bench dataflow`: the engine against a raw crossbeam-channel
//! chain measured in the same run, on the 17-stage topology that copper-rs
//! and dora-rs publish figures for.

use super::{Bench, BenchReport, Row};
use anyhow::Context as _;
use edgeflow_graph::metrics::Histogram;
use edgeflow_graph::{Payload, Pipeline, Policy, Registry};
use edgeflow_runtime::Tensor;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Options of `edgeflow bench dataflow`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DataflowArgs {
    /// Stages in the chain (source and sink included; at least 2).
    #[arg(long, default_value_t = 17)]
    pub stages: usize,
    /// Messages timed one at a time for latency (a quarter of them, at
    /// least 10, for the tensor hops).
    #[arg(long, default_value_t = 2000)]
    pub latency_msgs: usize,
    /// Messages pushed back to back for throughput.
    #[arg(long, default_value_t = 100_000)]
    pub throughput_msgs: usize,
    /// Only the rows across two processes (the split chain and one
    /// cross-process hop), e.g. to compare builds back to back.
    #[arg(long)]
    pub split_only: bool,
}

impl Default for DataflowArgs {
    fn default() -> Self {
        DataflowArgs {
            stages: 17,
            latency_msgs: 2000,
            throughput_msgs: 100_000,
            split_only: false,
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone)]
struct Config {
    name: String,
    /// End-to-end latency p50, microseconds.
    p50_us: f64,
    /// End-to-end latency p99, microseconds.
    p99_us: f64,
    /// Messages per second, back to back.
    msgs_per_s: f64,
}

impl Bench for DataflowArgs {
    fn name(&self) -> &'static str {
        "dataflow"
    }

    fn compares(&self) -> &'static str {
        "the graph engine on a chain of stages vs the same chain on raw crossbeam channels"
    }

    fn args(&self) -> Vec<String> {
        let d = DataflowArgs::default();
        let mut a = Vec::new();
        if self.stages != d.stages {
            a.extend(["--stages".into(), self.stages.to_string()]);
        }
        if self.latency_msgs != d.latency_msgs {
            a.extend(["--latency-msgs".into(), self.latency_msgs.to_string()]);
        }
        if self.throughput_msgs != d.throughput_msgs {
            a.extend(["--throughput-msgs".into(), self.throughput_msgs.to_string()]);
        }
        if self.split_only {
            a.push("--split-only".into());
        }
        a
    }

    fn run(&self) -> anyhow::Result<BenchReport> {
        if self.stages < 2 {
            anyhow::bail!(
                "--stages {}: the chain needs a source and a sink (at least 2)",
                self.stages
            );
        }
        if self.split_only {
            return self.run_split();
        }
        eprintln!("measuring the raw baseline and the engine...");
        let base = raw_crossbeam(self);
        let engines = [
            engine(self, false, "edgeflow, thread per stage")?,
            engine(self, true, "edgeflow, inline passthroughs")?,
        ];
        let recorded = recorded_overhead(self)?;
        eprintln!("measuring the chain split across two processes...");
        let split = split_chain(self, self.stages.max(3))?;
        let hop = split_chain(self, 3)?;
        let tiny = tensor_hops(&[16], self.latency_msgs / 4)?;
        let big = tensor_hops(&[1 << 20], self.latency_msgs / 4)?;

        let mut r = BenchReport::new(
            format!(
                "edgeflow bench dataflow: {}-stage chain (thread per stage unless inline), small messages",
                self.stages
            ),
            "raw crossbeam-channel",
            "ours / baseline",
        );
        r.context.push(format!(
            "{} messages timed one at a time, {} back to back",
            self.latency_msgs, self.throughput_msgs
        ));
        for e in &engines {
            r.rows.push(
                Row::new(format!("{}: latency p50", e.name), e.p50_us, "us")
                    .baseline(base.p50_us)
                    .ratio(e.p50_us / base.p50_us.max(1e-9)),
            );
            r.rows.push(
                Row::new(format!("{}: latency p99", e.name), e.p99_us, "us")
                    .baseline(base.p99_us)
                    .ratio(e.p99_us / base.p99_us.max(1e-9)),
            );
            r.rows.push(
                Row::new(format!("{}: throughput", e.name), e.msgs_per_s, "msgs/s")
                    .baseline(base.msgs_per_s)
                    .ratio(e.msgs_per_s / base.msgs_per_s.max(1e-9)),
            );
        }
        split_rows(&mut r, &split, &hop, Some(engines[0].p50_us));
        let hops = self.stages.max(2) - 1;
        r.rows.push(
            Row::new(
                "recorded to MCAP (--record), 1 kHz: latency p50",
                recorded.1,
                "us",
            )
            .baseline(recorded.0)
            .ratio(recorded.1 / recorded.0.max(1e-9))
            .note(format!(
                "baseline: same chain unrecorded, same run; per hop {:+.2} us on {:.2} us",
                (recorded.1 - recorded.0) / hops as f64,
                recorded.0 / hops as f64
            )),
        );
        r.rows.push(
            Row::new("4 MB tensor through 8 hops, latency p50", big, "us")
                .baseline(tiny)
                .ratio(big / tiny.max(1e-9))
                .note("baseline: a 16-float tensor, same hops (shared, not copied)"),
        );
        r.notes.push(
            "ratio = ours / the raw chain: latency lower is better, throughput higher".into(),
        );
        Ok(r)
    }
}

impl DataflowArgs {
    /// `--split-only`: the split chain and the hop, nothing else.
    fn run_split(&self) -> anyhow::Result<BenchReport> {
        eprintln!("measuring the chain split across two processes...");
        let split = split_chain(self, self.stages.max(3))?;
        let hop = split_chain(self, 3)?;
        let mut r = BenchReport::new(
            format!(
                "edgeflow bench dataflow --split-only: {}-stage chain across two processes, small messages",
                self.stages
            ),
            "the same chain in one process",
            "ours / baseline",
        );
        r.context.push(format!(
            "{} messages timed one at a time",
            self.latency_msgs
        ));
        split_rows(&mut r, &split, &hop, None);
        Ok(r)
    }
}

/// The rows of the split chain and the cross-process hop; `one_process`:
/// the whole chain's p50 in one process, as the baseline.
fn split_rows(r: &mut BenchReport, split: &Config, hop: &Config, one_process: Option<f64>) {
    let mut row = Row::new(
        format!("{}, split in two processes: latency p50", split.name),
        split.p50_us,
        "us",
    );
    if let Some(b) = one_process {
        row = row.baseline(b).ratio(split.p50_us / b.max(1e-9));
    }
    r.rows.push(row.note(format!(
        "p99 {:.0} us; baseline: the same chain in one process; crosses zenoh on 127.0.0.1 twice",
        split.p99_us
    )));
    r.rows.push(
        Row::new(
            "one cross-process hop (half a 3-stage a->b->a round trip): p50",
            hop.p50_us / 2.0,
            "us",
        )
        .note(format!(
            "round trip p50 {:.0} us, p99 {:.0} us; zenoh TCP on 127.0.0.1, `block` edges with credit windows",
            hop.p50_us, hop.p99_us
        )),
    );
}

fn raw_crossbeam(o: &DataflowArgs) -> Config {
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
    Config {
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

/// The `n`-stage chain split into two parts: the source, the first half
/// and the sink in this process (part `a`), the second half in a child
/// `edgeflow run --part b`, so every message crosses zenoh on 127.0.0.1
/// twice (a -> b -> a). Latency only: capture times cross with the
/// messages and both processes read the same monotonic clock.
fn split_chain(o: &DataflowArgs, n: usize) -> anyhow::Result<Config> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut y = format!(
        "name: bench-split\nparts:\n  a: {{ listen: [\"tcp/127.0.0.1:{port}\"] }}\n  b: {{ connect: [\"tcp/127.0.0.1:{port}\"] }}\nstages:\n  - {{ id: s0, kind: host_in, part: a, params: {{ type: text }} }}\n"
    );
    for i in 1..n - 1 {
        let part = if i < n / 2 { "a" } else { "b" };
        let _ = writeln!(y, "  - {{ id: s{i}, kind: passthrough, part: {part} }}");
    }
    let _ = writeln!(
        y,
        "  - {{ id: s{}, kind: host_out, part: a, params: {{ capacity: 8 }} }}\nedges:",
        n - 1
    );
    for i in 0..n - 1 {
        let _ = writeln!(
            y,
            "  - {{ from: s{i}.out, to: s{}.in, capacity: 8 }}",
            i + 1
        );
    }
    let file = std::env::temp_dir().join(format!(
        "edgeflow-bench-split-{}-{port}.yaml",
        std::process::id()
    ));
    std::fs::write(&file, &y)?;
    let registry = edgeflow::registry();
    let part = crate::cli::parts::Part::load(
        &file,
        &registry,
        &[],
        "a",
        crate::cli::parts::OnPartLost::Wait,
    )?;
    let running = part.pipeline.clone().start()?;
    let presence = part.join(|m| eprintln!("bench: {m}"))?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["run"])
        .arg(&file)
        .args(["--part", "b", "--quiet", "--timeout", "600"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting part b")?;
    let result = (|| -> anyhow::Result<Config> {
        let up = Instant::now() + Duration::from_secs(20);
        while !presence.others().iter().any(|p| p == "b") {
            anyhow::ensure!(Instant::now() < up, "part b did not join within 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        let last = format!("s{}", n - 1);
        let timeout = Duration::from_secs(10);
        // Exact samples: the histogram's buckets (a few percent apart) are
        // coarser than the differences between builds looked for here.
        let mut lat: Vec<f64> = Vec::with_capacity(o.latency_msgs);
        for i in 0..o.latency_msgs + 50 {
            running.push("s0", Payload::text(""))?;
            match running.pull(&last, timeout)? {
                Some(m) if i >= 50 => lat.push(m.timestamp.elapsed().as_secs_f64() * 1e6),
                Some(_) => {}
                None => anyhow::bail!("the split chain ended early"),
            }
        }
        lat.sort_by(f64::total_cmp);
        let q = |f: f64| {
            lat.get(((lat.len() as f64 * f) as usize).min(lat.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0)
        };
        Ok(Config {
            name: format!("{n}-stage chain"),
            p50_us: q(0.5),
            p99_us: q(0.99),
            msgs_per_s: 0.0,
        })
    })();
    running.stop();
    let _ = running.wait(Some(Duration::from_secs(5)));
    let _ = child.kill();
    let _ = child.wait();
    drop(presence);
    let _ = std::fs::remove_file(&file);
    result
}

fn engine(o: &DataflowArgs, inline: bool, name: &str) -> anyhow::Result<Config> {
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
    std::thread::scope(|sc| -> anyhow::Result<()> {
        let r = &running;
        let pusher = sc.spawn(move || -> edgeflow_graph::Result<()> {
            for _ in 0..o.throughput_msgs {
                r.push("s0", Payload::text(""))?;
            }
            Ok(())
        });
        for _ in 0..o.throughput_msgs {
            running.pull(&last, timeout)?;
        }
        pusher
            .join()
            .map_err(|_| anyhow::anyhow!("the pushing thread panicked"))?
            .context("pushing messages")
    })?;
    let el = t0.elapsed();
    running.stop();
    let _ = running.wait(Some(Duration::from_secs(5)));
    let s = h.summary();
    Ok(Config {
        name: name.into(),
        p50_us: s.p50_us,
        p99_us: s.p99_us,
        msgs_per_s: o.throughput_msgs as f64 / el.as_secs_f64(),
    })
}

/// End-to-end latency p50 of small messages pushed at 1 kHz through the
/// thread-per-stage chain, without and with every edge recorded to an MCAP
/// file; three rounds each, alternating, averaged. Returns (plain, recorded).
fn recorded_overhead(o: &DataflowArgs) -> anyhow::Result<(f64, f64)> {
    let n = o.stages.max(2);
    let yaml = chain_yaml(n, false, "any");
    let msgs = (o.latency_msgs / 2).max(100);
    let file = std::env::temp_dir().join(format!("edgeflow-bench-{}.mcap", std::process::id()));
    let mut p50 = [0.0f64; 2];
    for round in 0..6 {
        let record = round % 2 == 1;
        let p = Pipeline::from_yaml(&yaml, &Registry::builtin())?;
        let recorder = if record {
            let info = edgeflow_record::RunInfo {
                pipeline_text: yaml.clone(),
                ..Default::default()
            };
            Some(edgeflow_record::Recorder::create(
                &file,
                p.plan(),
                info,
                edgeflow_record::RecordOptions::default(),
            )?)
        } else {
            None
        };
        let running = match &recorder {
            Some(r) => p.start_with_tap(r.tap())?,
            None => p.start()?,
        };
        let last = format!("s{}", n - 1);
        let timeout = Duration::from_secs(10);
        // Exact samples: the histogram's buckets are coarser than the
        // difference measured here.
        let mut lat: Vec<f64> = Vec::with_capacity(msgs);
        let period = Duration::from_millis(1);
        let mut next = Instant::now();
        for i in 0..msgs + 50 {
            next += period;
            running.push("s0", Payload::text("0123456789abcdef"))?;
            if let Some(m) = running.pull(&last, timeout)? {
                if i >= 50 {
                    lat.push(m.timestamp.elapsed().as_secs_f64() * 1e6);
                }
            }
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        running.stop();
        let _ = running.wait(Some(Duration::from_secs(5)));
        if let Some(r) = recorder {
            let stats = r.finish()?;
            if stats.messages == 0 || !stats.warnings().is_empty() {
                anyhow::bail!("the recorded chain did not record cleanly: {stats:?}");
            }
        }
        lat.sort_by(f64::total_cmp);
        p50[usize::from(record)] += lat.get(lat.len() / 2).copied().unwrap_or(0.0) / 3.0;
    }
    let _ = std::fs::remove_file(&file);
    Ok((p50[0], p50[1]))
}

fn tensor_hops(dims: &[usize], msgs: usize) -> anyhow::Result<f64> {
    let yaml = chain_yaml(9, false, "tensor"); // 8 hops
    let running = Pipeline::from_yaml(&yaml, &Registry::builtin())?.start()?;
    let t = Tensor::zeros(dims)?;
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
