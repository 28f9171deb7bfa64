//! `edgeflow bench control`: the zenoh round trip through the raw API and
//! through our stages in the same run, and the controller's wake-up jitter
//! at a fixed rate, idle and with a compute load beside it.

use crate::error::{Error, Result};
use crate::rt::percentiles_us;
use crate::session::{SessionConfig, SharedSession};
use crate::wire::{self, Body, Header};
use edgeflow_graph::{ActionChunk, Event, Payload, Pipeline, Registry};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zenoh::Wait;

/// Bench settings.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Round trips per variant.
    pub round_trips: usize,
    /// Controller run length per variant.
    pub seconds: f64,
    /// Controller rate.
    pub rate_hz: f64,
    /// SCHED_FIFO priority the controller tries.
    pub rt_priority: i32,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            round_trips: 2000,
            seconds: 60.0,
            rate_hz: 100.0,
            rt_priority: 50,
        }
    }
}

/// Round-trip latency in µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rtt {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Worst.
    pub max_us: f64,
}

/// Controller timing of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Jitter {
    /// Label.
    pub label: String,
    /// Periods run.
    pub periods: u64,
    /// Wake-up jitter (actual - scheduled), µs.
    pub p50_us: f64,
    /// p99.
    pub p99_us: f64,
    /// Max.
    pub max_us: f64,
    /// Missed periods.
    pub missed: u64,
    /// Queue underruns.
    pub underruns: u64,
    /// Whether SCHED_FIFO was granted.
    pub fifo: bool,
}

/// The whole report.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// Raw zenoh API, both ends.
    pub raw: Rtt,
    /// host_in -> zenoh_pub ... raw echo ... zenoh_sub -> host_out.
    pub stages: Rtt,
    /// Controller runs.
    pub jitter: Vec<Jitter>,
    /// CPU model.
    pub cpu: String,
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::Zenoh(format!("cannot find a free port: {e}")))?;
    Ok(l.local_addr()
        .map_err(|e| Error::Zenoh(e.to_string()))?
        .port())
}

fn zerr(e: impl std::fmt::Display) -> Error {
    Error::Zenoh(e.to_string())
}

fn rtt(mut s: Vec<u64>) -> Rtt {
    let (p50_us, p99_us, max_us) = percentiles_us(&mut s);
    Rtt {
        p50_us,
        p99_us,
        max_us,
    }
}

fn sample_msg() -> Result<Vec<u8>> {
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

/// Round trips through the raw API and through our stages; the echo side is
/// the same raw zenoh echo (another session, over TCP on 127.0.0.1) in both.
pub fn round_trips(n: usize) -> Result<(Rtt, Rtt)> {
    let port = free_port()?;
    let ep = format!("tcp/127.0.0.1:{port}");
    let echo = SharedSession::open(&SessionConfig::peer(&[&ep], &[]))?;
    let pong = echo
        .session()
        .declare_publisher("bench/pong")
        .express(true)
        .wait()
        .map_err(zerr)?;
    let _echo_sub = echo
        .session()
        .declare_subscriber("bench/ping")
        .callback(move |s| {
            let _ = pong.put(s.payload().clone()).wait();
        })
        .wait()
        .map_err(zerr)?;
    // Raw: a second session (its own runtime) connects to the echo.
    let raw = {
        let me = SharedSession::open(&SessionConfig::peer(&["tcp/127.0.0.1:0"], &[&ep]))?;
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
                return Err(Error::Zenoh("raw round trip: no echo within 10 s".into()));
            }
        }
        let mut s = Vec::with_capacity(n);
        for i in 0..n + 100 {
            let t0 = wire::mono_ns();
            ping.put(msg.clone()).wait().map_err(zerr)?;
            match sub.recv_timeout(Duration::from_secs(1)).map_err(zerr)? {
                Some(_) if i >= 100 => s.push(wire::mono_ns() - t0),
                Some(_) => {}
                None => return Err(Error::Zenoh("raw round trip: echo lost".into())),
            }
        }
        rtt(s)
    };
    // Through our stages, with their own session connecting to the echo.
    let yaml = format!(
        r#"
stages:
  - {{ id: src, kind: host_in, params: {{ type: tensor }} }}
  - {{ id: ping, kind: zenoh_pub, params: {{ key: bench/ping, type: robot_state, express: true, token: "", connect: ["{ep}"], listen: ["tcp/127.0.0.1:0"] }} }}
  - {{ id: pong, kind: zenoh_sub, params: {{ key: bench/pong, type: robot_state, policy: drop_oldest, token: "", connect: ["{ep}"], listen: ["tcp/127.0.0.1:0"] }} }}
  - {{ id: out, kind: host_out, params: {{ type: tensor }} }}
edges:
  - {{ from: src.out, to: ping.in }}
  - {{ from: pong.out, to: out.in }}
"#
    );
    let mut reg = Registry::builtin();
    crate::register(&mut reg);
    let running = Pipeline::from_yaml(&yaml, &reg)
        .map_err(zerr)?
        .start()
        .map_err(zerr)?;
    let state = || {
        edgeflow_runtime::Tensor::from_vec(vec![0.1, 0.2, 0.3, 0.4], &[4])
            .map(Payload::Tensor)
            .map_err(zerr)
    };
    let t_up = Instant::now() + Duration::from_secs(10);
    loop {
        running.push("src", state()?).map_err(zerr)?;
        if running
            .pull("out", Duration::from_millis(50))
            .ok()
            .flatten()
            .is_some()
        {
            break;
        }
        if Instant::now() > t_up {
            return Err(Error::Zenoh("stage round trip: no echo within 10 s".into()));
        }
    }
    while running
        .pull("out", Duration::from_millis(20))
        .ok()
        .flatten()
        .is_some()
    {}
    let mut s = Vec::with_capacity(n);
    for i in 0..n + 100 {
        let p = state()?;
        let t0 = wire::mono_ns();
        running.push("src", p).map_err(zerr)?;
        match running.pull("out", Duration::from_secs(1)).ok().flatten() {
            Some(_) if i >= 100 => s.push(wire::mono_ns() - t0),
            Some(_) => {}
            None => return Err(Error::Zenoh("stage round trip: echo lost".into())),
        }
    }
    running.stop();
    Ok((raw, rtt(s)))
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
pub fn controller_jitter(o: &BenchOptions, load: bool) -> Result<Jitter> {
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
    crate::register(&mut reg);
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
        .ok_or_else(|| Error::Zenoh("no controller metrics".into()))?;
    let v = |k: &str| st.values.get(k);
    let j =
        v("jitter_us").ok_or_else(|| Error::Zenoh("the controller recorded no periods".into()))?;
    Ok(Jitter {
        label: if load {
            "with compute load".into()
        } else {
            "idle".into()
        },
        periods: j.count,
        p50_us: j.p50,
        p99_us: j.p99,
        max_us: j.max,
        missed: v("missed_periods").map_or(0, |x| x.last as u64),
        underruns: v("underruns").map_or(0, |x| x.last as u64),
        fifo: v("rt_fifo").is_some_and(|x| x.last > 0.5),
    })
}

/// The CPU model from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Run everything.
pub fn run(o: &BenchOptions) -> Result<BenchReport> {
    let (raw, stages) = round_trips(o.round_trips)?;
    let jitter = vec![controller_jitter(o, false)?, controller_jitter(o, true)?];
    Ok(BenchReport {
        raw,
        stages,
        jitter,
        cpu: cpu_model(),
    })
}

impl BenchReport {
    /// A text table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "CPU: {} ({} threads)",
            self.cpu,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        let _ = writeln!(
            s,
            "zenoh round trip, 80-byte robot_state, TCP on 127.0.0.1:"
        );
        let _ = writeln!(
            s,
            "  {:<28} {:>9} {:>9} {:>9}",
            "", "p50 us", "p99 us", "max us"
        );
        for (name, r) in [
            ("raw zenoh API", self.raw),
            ("through zenoh_pub/zenoh_sub", self.stages),
        ] {
            let _ = writeln!(
                s,
                "  {:<28} {:>9.1} {:>9.1} {:>9.1}",
                name, r.p50_us, r.p99_us, r.max_us
            );
        }
        let _ = writeln!(
            s,
            "  ratio stages / raw: p50 {:.2}x, p99 {:.2}x",
            self.stages.p50_us / self.raw.p50_us.max(1e-9),
            self.stages.p99_us / self.raw.p99_us.max(1e-9)
        );
        let _ = writeln!(s, "controller wake-up jitter (actual - scheduled):");
        let _ = writeln!(
            s,
            "  {:<20} {:>8} {:>9} {:>9} {:>9} {:>7} {:>10} {:>5}",
            "", "periods", "p50 us", "p99 us", "max us", "missed", "underruns", "fifo"
        );
        for j in &self.jitter {
            let _ = writeln!(
                s,
                "  {:<20} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>10} {:>5}",
                j.label,
                j.periods,
                j.p50_us,
                j.p99_us,
                j.max_us,
                j.missed,
                j.underruns,
                if j.fifo { "yes" } else { "no" }
            );
        }
        s
    }
}
