//! `edgeflow bench control`: the robot-control path's two costs, each next
//! to a baseline measured in the same run:
//!
//! - a zenoh round trip of an 80-byte `robot_state` over TCP on 127.0.0.1
//!   through our `zenoh_pub` / `zenoh_sub` stages (a stage pings through an
//!   inline `zenoh_pub` and gets the pong from `zenoh_sub`), against the
//!   same round trip through the raw zenoh API (one thread that puts and
//!   waits on its subscriber); the echo side is one raw zenoh session in
//!   both;
//! - with `--veth`, the same two round trips across two network namespaces
//!   joined by a veth pair (the echo on one host, the pinger on the other,
//!   each a child process: real IP between two hosts);
//! - the `controller` stage's wake-up jitter (actual minus scheduled) and
//!   missed periods at `--rate-hz` for `--seconds`, idle and with a matmul
//!   thread computing beside it, against a bare absolute-deadline sleep loop
//!   (the same clock, no engine) under the same load.

use super::{Bench, BenchReport, Row};
use anyhow::Context as _;
use edgeflow_control::rt::{percentiles_us, try_realtime, Metronome};
use edgeflow_control::session::{SessionConfig, SharedSession};
use edgeflow_control::wire::{self, Body, Header};
use edgeflow_graph::{
    ActionChunk, BuildEnv, Event, Input, Params, Payload, Pipeline, PortSpec, PortType, Ports,
    Registry, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zenoh::Wait;

/// Options of `edgeflow bench control`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ControlArgs {
    /// Seconds the controller runs in each variant (idle, loaded); the bare
    /// sleep loop runs as long.
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Controller rate in Hz.
    #[arg(long, default_value_t = 100.0)]
    pub rate_hz: f64,
    /// Timed round trips per variant (after 100 untimed).
    #[arg(long, default_value_t = 2000)]
    pub round_trips: usize,
    /// SCHED_FIFO priority the controller tries (0: do not).
    #[arg(long, default_value_t = 50)]
    pub rt_priority: i32,
    /// Also measure both round trips across two network namespaces joined
    /// by a veth pair (needs root or CAP_NET_ADMIN and iproute2).
    #[arg(long)]
    pub veth: bool,
    /// Internal (--veth's echo host): run only a raw zenoh echo listening
    /// on this endpoint until stdin closes.
    #[arg(long, hide = true, value_name = "ENDPOINT")]
    pub zenoh_echo: Option<String>,
    /// Internal (--veth's pinging host): measure both round trips against
    /// the echo at this endpoint and print them as one JSON line.
    #[arg(long, hide = true, value_name = "ENDPOINT")]
    pub round_trips_to: Option<String>,
    /// Internal: the address the pinging sessions listen on.
    #[arg(long, hide = true, default_value = "127.0.0.1")]
    pub listen_ip: String,
}

impl Default for ControlArgs {
    fn default() -> Self {
        ControlArgs {
            seconds: 60.0,
            rate_hz: 100.0,
            round_trips: 2000,
            rt_priority: 50,
            veth: false,
            zenoh_echo: None,
            round_trips_to: None,
            listen_ip: "127.0.0.1".into(),
        }
    }
}

/// Round-trip latency in µs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rtt {
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
}

/// Wake-up timing of one run.
#[derive(Debug, Clone, PartialEq)]
struct Jitter {
    periods: u64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    missed: u64,
    underruns: u64,
    fifo: bool,
}

impl Bench for ControlArgs {
    fn name(&self) -> &'static str {
        "control"
    }

    fn compares(&self) -> &'static str {
        "zenoh round trip through our stages vs the raw zenoh API; controller wake-up jitter vs a bare sleep loop"
    }

    fn args(&self) -> Vec<String> {
        let d = ControlArgs::default();
        let mut a = Vec::new();
        if self.seconds != d.seconds {
            a.extend(["--seconds".into(), self.seconds.to_string()]);
        }
        if self.rate_hz != d.rate_hz {
            a.extend(["--rate-hz".into(), self.rate_hz.to_string()]);
        }
        if self.round_trips != d.round_trips {
            a.extend(["--round-trips".into(), self.round_trips.to_string()]);
        }
        if self.rt_priority != d.rt_priority {
            a.extend(["--rt-priority".into(), self.rt_priority.to_string()]);
        }
        if self.veth {
            a.push("--veth".into());
        }
        a
    }

    fn run(&self) -> anyhow::Result<BenchReport> {
        if !self.rate_hz.is_finite() || self.rate_hz <= 0.0 || self.rate_hz > 10_000.0 {
            anyhow::bail!("--rate-hz {}: choose a rate in (0, 10000]", self.rate_hz);
        }
        if !self.seconds.is_finite() || self.seconds <= 0.0 || self.round_trips == 0 {
            anyhow::bail!("--seconds and --round-trips must be positive");
        }
        eprintln!(
            "measuring {} zenoh round trips (raw, stages), then {} Hz for 4 x {} s \
             (bare loop and controller, idle and loaded)...",
            self.round_trips, self.rate_hz, self.seconds
        );
        let (raw, stages) = round_trips(self.round_trips)?;
        let veth = if self.veth {
            eprintln!("measuring both round trips across a veth pair...");
            Some(veth_round_trips(self.round_trips)?)
        } else {
            None
        };
        let mut r = BenchReport::new(
            "robot control: zenoh hop and controller timing",
            "raw zenoh / bare sleep loop",
            "ours / baseline",
        );
        r.context.push(format!(
            "round trip: 80-byte robot_state over TCP on 127.0.0.1, {} timed; baseline: the raw zenoh API",
            self.round_trips
        ));
        r.context.push(format!(
            "controller: {} Hz for {} s per variant; baseline: a bare clock_nanosleep loop on the same clock",
            self.rate_hz, self.seconds
        ));
        for (what, o, b) in [
            ("p50", stages.p50_us, raw.p50_us),
            ("p99", stages.p99_us, raw.p99_us),
            ("max", stages.max_us, raw.max_us),
        ] {
            r.rows.push(
                Row::new(format!("round trip {what}, zenoh_pub/zenoh_sub"), o, "us")
                    .baseline(b)
                    .ratio(o / b.max(1e-9)),
            );
        }
        if let Some((raw, stages)) = veth {
            r.context.push(
                "across veth: the echo in one network namespace, the pinger in another, joined by a veth pair (TCP over real IP, no multicast); baseline: the raw zenoh API across the same pair".into(),
            );
            for (what, o, b) in [
                ("p50", stages.p50_us, raw.p50_us),
                ("p99", stages.p99_us, raw.p99_us),
                ("max", stages.max_us, raw.max_us),
            ] {
                r.rows.push(
                    Row::new(
                        format!("round trip {what} across veth, zenoh_pub/zenoh_sub"),
                        o,
                        "us",
                    )
                    .baseline(b)
                    .ratio(o / b.max(1e-9)),
                );
            }
        }
        for load in [false, true] {
            let label = if load { "with compute load" } else { "idle" };
            let bare = bare_jitter(self, load)?;
            let ours = controller_jitter(self, load)?;
            for (what, o, b) in [
                ("p50", ours.p50_us, bare.p50_us),
                ("p99", ours.p99_us, bare.p99_us),
                ("max", ours.max_us, bare.max_us),
            ] {
                r.rows.push(
                    Row::new(format!("wake-up jitter {what}, {label}"), o, "us")
                        .baseline(b)
                        .ratio(o / b.max(1e-9)),
                );
            }
            r.rows.push(
                Row::new(format!("missed periods, {label}"), ours.missed as f64, "")
                    .baseline(bare.missed as f64)
                    .note(format!(
                        "of {} periods; {} queue underruns; SCHED_FIFO {}",
                        ours.periods,
                        ours.underruns,
                        if ours.fifo {
                            "granted"
                        } else {
                            "not permitted"
                        }
                    )),
            );
        }
        Ok(r)
    }
}

/// The baseline for the controller: a thread that only sleeps to absolute
/// deadlines on the same clock, with the same scheduling request
/// (SCHED_FIFO at `--rt-priority`, locked memory), beside the same load.
fn bare_jitter(o: &ControlArgs, load: bool) -> anyhow::Result<Jitter> {
    let stop = Arc::new(AtomicBool::new(false));
    let loader = load.then(|| {
        let s = stop.clone();
        std::thread::spawn(move || compute_load(s))
    });
    let period = (1e9 / o.rate_hz) as u64;
    let n = (o.seconds * o.rate_hz).ceil() as usize;
    let priority = o.rt_priority;
    let timer = std::thread::spawn(move || {
        let fifo = try_realtime(priority, true).fifo.is_ok();
        let mut m = Metronome::new(period);
        let mut j = Vec::with_capacity(n);
        let mut missed = 0;
        for _ in 0..n {
            let w = m.wait();
            j.push(w.jitter_ns);
            missed += w.missed;
        }
        (j, missed, fifo)
    });
    let (mut j, missed, fifo) = timer
        .join()
        .map_err(|_| anyhow::anyhow!("the bare timing thread panicked"))?;
    stop.store(true, Ordering::Relaxed);
    if let Some(l) = loader {
        let _ = l.join();
    }
    let (p50_us, p99_us, max_us) = percentiles_us(&mut j);
    Ok(Jitter {
        periods: n as u64,
        p50_us,
        p99_us,
        max_us,
        missed,
        underruns: 0,
        fifo,
    })
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(l.local_addr().context("cannot find a free port")?.port())
}

fn zerr(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

fn rtt(mut s: Vec<u64>) -> Rtt {
    let (p50_us, p99_us, max_us) = percentiles_us(&mut s);
    Rtt {
        p50_us,
        p99_us,
        max_us,
    }
}

fn sample_msg() -> anyhow::Result<Vec<u8>> {
    Ok(wire::encode(
        &Header {
            epoch: 0,
            seq: 1,
            capture_ns: wire::mono_ns(),
            deadline_ns: None,
        },
        &Body::RobotState {
            step: 1,
            values: vec![0.1, 0.2, 0.3, 0.4],
        },
    )?)
}

/// A raw zenoh echo: a session listening on an endpoint that puts every
/// `bench/ping` back on `bench/pong`. Lives as long as the value.
struct Echo {
    _sub: zenoh::pubsub::Subscriber<()>,
    _session: SharedSession,
}

fn echo(listen: &str) -> anyhow::Result<Echo> {
    let session = SharedSession::open(&SessionConfig::peer(&[listen], &[]))?;
    let pong = session
        .session()
        .declare_publisher("bench/pong")
        .express(true)
        .wait()
        .map_err(zerr)?;
    let sub = session
        .session()
        .declare_subscriber("bench/ping")
        .callback(move |s| {
            let _ = pong.put(s.payload().clone()).wait();
        })
        .wait()
        .map_err(zerr)?;
    Ok(Echo {
        _sub: sub,
        _session: session,
    })
}

/// Round trips through the raw API and through our stages; the echo side is
/// the same raw zenoh echo (another session, over TCP on 127.0.0.1) in both.
fn round_trips(n: usize) -> anyhow::Result<(Rtt, Rtt)> {
    let port = free_port()?;
    let ep = format!("tcp/127.0.0.1:{port}");
    let _echo = echo(&ep)?;
    let raw = raw_round_trips(&ep, "127.0.0.1", n)?;
    let stages = stage_round_trips(&ep, "127.0.0.1", n)?;
    Ok((raw, stages))
}

/// Round trips through the raw API: a session of its own (listening on
/// `listen_ip`) connects to the echo at `ep`; one thread puts and waits.
fn raw_round_trips(ep: &str, listen_ip: &str, n: usize) -> anyhow::Result<Rtt> {
    let listen = format!("tcp/{listen_ip}:0");
    let me = SharedSession::open(&SessionConfig::peer(&[listen.as_str()], &[ep]))?;
    let sub = me
        .session()
        .declare_subscriber("bench/pong")
        .wait()
        .map_err(zerr)?;
    let ping = me
        .session()
        .declare_publisher("bench/ping")
        .express(true)
        .wait()
        .map_err(zerr)?;
    let msg = sample_msg()?;
    // Warm up until the link is up.
    let t_up = Instant::now() + Duration::from_secs(10);
    loop {
        ping.put(msg.clone()).wait().map_err(zerr)?;
        if sub
            .recv_timeout(Duration::from_millis(50))
            .map_err(zerr)?
            .is_some()
        {
            break;
        }
        if Instant::now() > t_up {
            anyhow::bail!("raw round trip: no echo from {ep} within 10 s");
        }
    }
    let mut s = Vec::with_capacity(n);
    for i in 0..n + 100 {
        let t0 = wire::mono_ns();
        ping.put(msg.clone()).wait().map_err(zerr)?;
        match sub.recv_timeout(Duration::from_secs(1)).map_err(zerr)? {
            Some(_) if i >= 100 => s.push(wire::mono_ns() - t0),
            Some(_) => {}
            None => anyhow::bail!("raw round trip: echo lost"),
        }
    }
    Ok(rtt(s))
}

/// Both round trips across two hosts: network namespaces joined by a veth
/// pair, the echo (`--zenoh-echo`) on one, the pinger
/// (`--round-trips-to`) on the other, each a child process of this one.
fn veth_round_trips(n: usize) -> anyhow::Result<(Rtt, Rtt)> {
    use std::io::BufRead as _;
    use std::process::Stdio;
    let pair =
        edgeflow_control::netns::VethPair::create("efbc", 232, std::process::id() % 250 + 1)?;
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let ep = format!("tcp/{}:7447", pair.ip_b);
    let mut echo = pair
        .command(&pair.b, &exe)
        .args(["bench", "control", "--zenoh-echo", &ep])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the echo host")?;
    let mut line = String::new();
    if let Some(out) = echo.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    let measured = if line.trim() == "ready" {
        pair.command(&pair.a, &exe)
            .args(["bench", "control", "--round-trips-to", &ep])
            .args(["--listen-ip", &pair.ip_a, "--round-trips", &n.to_string()])
            .stderr(Stdio::inherit())
            .output()
            .context("cannot start the pinging host")
    } else {
        Err(anyhow::anyhow!(
            "the echo host did not start (said {line:?})"
        ))
    };
    // Closing its stdin ends the echo.
    drop(echo.stdin.take());
    let _ = echo.kill();
    let _ = echo.wait();
    let out = measured?;
    if !out.status.success() {
        anyhow::bail!("the pinging host failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .with_context(|| format!("the pinging host printed {text:?}"))?;
    let get = |k: &str| -> anyhow::Result<Rtt> {
        let f = |q: &str| {
            v[k][q]
                .as_f64()
                .ok_or_else(|| anyhow::anyhow!("the pinging host's `{k}.{q}` is missing"))
        };
        Ok(Rtt {
            p50_us: f("p50_us")?,
            p99_us: f("p99_us")?,
            max_us: f("max_us")?,
        })
    };
    Ok((get("raw")?, get("stages")?))
}

impl ControlArgs {
    /// True for the internal helper modes of `--veth`.
    pub(crate) fn is_helper(&self) -> bool {
        self.zenoh_echo.is_some() || self.round_trips_to.is_some()
    }

    /// Run a helper mode: the echo host (until stdin closes) or the
    /// pinging host (one JSON line of both round trips).
    pub(crate) fn run_helper(&self) -> anyhow::Result<()> {
        use std::io::{Read as _, Write as _};
        if let Some(ep) = &self.zenoh_echo {
            let _echo = echo(ep)?;
            println!("ready");
            std::io::stdout().flush()?;
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            return Ok(());
        }
        if let Some(ep) = &self.round_trips_to {
            let raw = raw_round_trips(ep, &self.listen_ip, self.round_trips)?;
            let stages = stage_round_trips(ep, &self.listen_ip, self.round_trips)?;
            let j = |r: Rtt| serde_json::json!({"p50_us": r.p50_us, "p99_us": r.p99_us, "max_us": r.max_us});
            println!(
                "{}",
                serde_json::json!({"raw": j(raw), "stages": j(stages)})
            );
        }
        Ok(())
    }
}

/// The same round trip with the ping sent by a pipeline stage through an
/// inline `zenoh_pub` and the pong received by `zenoh_sub` into that stage:
/// the loop closes inside the graph, so, as in the raw loop (one thread
/// that puts and then waits on its subscriber's channel), the send happens
/// on the pinging thread and the receive costs one hop to it. The host only
/// kicks the first ping (until the link is up) and collects the times.
fn stage_round_trips(ep: &str, listen_ip: &str, n: usize) -> anyhow::Result<Rtt> {
    let yaml = format!(
        r#"
stages:
  - {{ id: kick, kind: host_in, params: {{ type: control }} }}
  - {{ id: pinger, kind: bench_pinger }}
  - {{ id: ping, kind: zenoh_pub, inline: true, params: {{ key: bench/ping, type: robot_state, express: true, token: "", connect: ["{ep}"], listen: ["tcp/{listen_ip}:0"] }} }}
  - {{ id: pong, kind: zenoh_sub, params: {{ key: bench/pong, type: robot_state, policy: latest, token: "", connect: ["{ep}"], listen: ["tcp/{listen_ip}:0"] }} }}
edges:
  - {{ from: kick.out, to: pinger.kick }}
  - {{ from: pinger.ping, to: ping.in }}
  - {{ from: pong.out, to: pinger.pong, policy: latest, capacity: 1 }}
"#
    );
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut reg = Registry::builtin();
    edgeflow_control::register(&mut reg);
    reg.register(PingerKind { tx });
    let running = Pipeline::from_yaml(&yaml, &reg)
        .map_err(zerr)?
        .start()
        .map_err(zerr)?;
    let kick = || Payload::event(Event::Named("kick".into(), serde_json::Value::Null));
    // Kick until the first pong: pings sent before the link is up are lost.
    let t_up = Instant::now() + Duration::from_secs(10);
    loop {
        running.push("kick", kick()).map_err(zerr)?;
        if rx.recv_timeout(Duration::from_millis(50)).is_ok() {
            break;
        }
        if Instant::now() > t_up {
            running.stop();
            anyhow::bail!("stage round trip: no echo within 10 s");
        }
    }
    let mut s = Vec::with_capacity(n);
    let mut warm = 0;
    while s.len() < n {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(_) if warm < 100 => warm += 1,
            Ok(ns) => s.push(ns),
            Err(_) => {
                running.stop();
                anyhow::bail!("stage round trip: echo lost");
            }
        }
    }
    running.stop();
    Ok(rtt(s))
}

/// `bench_pinger`: on a kick or a pong, sends the time since its last ping
/// to the host (pongs only) and pings again.
struct PingerKind {
    tx: crossbeam_channel::Sender<u64>,
}

impl StageFactory for PingerKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "bench_pinger",
            doc: "bench only: pings on a kick or a pong and reports each round trip",
            params: vec![],
            ports: Ports {
                inputs: vec![
                    PortSpec::new("pong", PortType::Tensor, "the echoed state"),
                    PortSpec::new("kick", PortType::Control, "send a first ping"),
                ],
                outputs: vec![PortSpec::new("ping", PortType::Tensor, "the state to echo")],
            },
            source: false,
        }
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let state = edgeflow_runtime::Tensor::from_vec(vec![0.1f32, 0.2, 0.3, 0.4], &[4])
            .map_err(|e| StageError::msg(e.to_string()))?;
        Ok(Box::new(Pinger {
            tx: self.tx.clone(),
            state,
            sent_ns: 0,
        }))
    }
}

struct Pinger {
    tx: crossbeam_channel::Sender<u64>,
    state: edgeflow_runtime::Tensor,
    sent_ns: u64,
}

impl std::fmt::Debug for Pinger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinger").finish_non_exhaustive()
    }
}

impl Stage for Pinger {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        if input.port == 0 && self.tx.send(wire::mono_ns() - self.sent_ns).is_err() {
            return Ok(());
        }
        self.sent_ns = wire::mono_ns();
        ctx.emit(0, Payload::Tensor(self.state.clone()))
    }
}

/// A compute load: a naive f32 matrix multiply, repeated until `stop`.
fn compute_load(stop: Arc<AtomicBool>) {
    let n = 192;
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.1).collect();
    let b = a.clone();
    let mut c = vec![0f32; n * n];
    while !stop.load(Ordering::Relaxed) {
        for i in 0..n {
            for k in 0..n {
                let x = a[i * n + k];
                for j in 0..n {
                    c[i * n + j] += x * b[k * n + j];
                }
            }
        }
        std::hint::black_box(&c);
    }
}

/// Run the `controller` stage at `rate_hz` for `seconds`, fed by a policy
/// that answers every request at once; with `load`, a matmul thread runs
/// beside it.
fn controller_jitter(o: &ControlArgs, load: bool) -> anyhow::Result<Jitter> {
    let yaml = format!(
        r#"
stages:
  - {{ id: chunks, kind: host_in, params: {{ type: actions }} }}
  - {{ id: ctl, kind: controller, params: {{ rate_hz: {}, horizon: 20, threshold: 0.5, rt_priority: {}, grace: 1s, max_obs_age: 1s }} }}
  - {{ id: reqs, kind: host_out, params: {{ type: control }} }}
  - {{ id: sink, kind: discard }}
edges:
  - {{ from: chunks.out, to: ctl.actions }}
  - {{ from: ctl.request, to: reqs.in }}
  - {{ from: ctl.command, to: sink.in, policy: latest, capacity: 4 }}
"#,
        o.rate_hz, o.rt_priority
    );
    let mut reg = Registry::builtin();
    edgeflow_control::register(&mut reg);
    let stop = Arc::new(AtomicBool::new(false));
    let loader = if load {
        let s = stop.clone();
        Some(std::thread::spawn(move || compute_load(s)))
    } else {
        None
    };
    let running = Pipeline::from_yaml(&yaml, &reg)
        .map_err(zerr)?
        .start()
        .map_err(zerr)?;
    let end = Instant::now() + Duration::from_secs_f64(o.seconds);
    let dt = Duration::from_secs_f64(1.0 / o.rate_hz);
    while Instant::now() < end {
        if let Some(m) = running
            .pull("reqs", Duration::from_millis(50))
            .ok()
            .flatten()
        {
            if let Some(Event::Named(name, v)) = m.payload.as_event() {
                if name == "chunk_request" {
                    let step = v["step"].as_u64().unwrap_or(0);
                    let actions: Vec<f32> = (0..40).map(|i| i as f32).collect();
                    running
                        .push(
                            "chunks",
                            Payload::Actions(Arc::new(ActionChunk {
                                start_step: step,
                                dt,
                                dim: 2,
                                actions,
                            })),
                        )
                        .map_err(zerr)?;
                }
            }
        }
    }
    let m = running.metrics();
    running.stop();
    stop.store(true, Ordering::Relaxed);
    if let Some(l) = loader {
        let _ = l.join();
    }
    let st = m
        .stages
        .iter()
        .find(|s| s.id == "ctl")
        .ok_or_else(|| anyhow::anyhow!("no controller metrics"))?;
    let v = |k: &str| st.values.get(k);
    let j = v("jitter_us").ok_or_else(|| anyhow::anyhow!("the controller recorded no periods"))?;
    Ok(Jitter {
        periods: j.count,
        p50_us: j.p50,
        p99_us: j.p99,
        max_us: j.max,
        missed: v("missed_periods").map_or(0, |x| x.last as u64),
        underruns: v("underruns").map_or(0, |x| x.last as u64),
        fifo: v("rt_fifo").is_some_and(|x| x.last > 0.5),
    })
}
