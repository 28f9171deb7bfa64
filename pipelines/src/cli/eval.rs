//! `edgeflow eval vla`: the learned policy (pipelines/vla.yaml) against the
//! push simulator, end to end. For every mode and injected delay it starts
//! `edgeflow sim push` as a child process on a free loopback port, runs the
//! pipeline in this process connected to it, and reads the simulator's
//! per-episode lines; a tap on the pipeline's edges gives chunk arrivals and
//! the commands sent, the stage metrics give latency and jitter. The
//! scripted expert (pipelines/robot-expert.yaml) runs on the same seeds for
//! comparison.

use anyhow::{bail, Context};
use edgeflow_action::train::plot::{plot_lines, Series};
use edgeflow_graph::{
    parse_spec, validate, BuildEnv, EdgeTap, Input, Message, MetricsSnapshot, Override, ParamInfo,
    Params, Payload, PipelineSpec, Plan, PortSpec, PortType, Ports, Registry, Running, Stage,
    StageCtx, StageFactory, StageInfo, StageResult, StageSpec, Timestamp,
};
use edgeflow_sim::{PushConfig, PushSim, Variant};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What to evaluate.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum EvalCommand {
    /// The vision-language-action pipeline against `edgeflow sim push`.
    ///
    /// Success rate per goal variant on held-out seeds (the expert's rate on
    /// the same seeds beside it), task time, action jump and jerk at chunk
    /// boundaries, observation-to-command latency and controller jitter, for
    /// synchronous / asynchronous / real-time-chunking execution and
    /// injected inference delays; optionally the same with the wrong
    /// instruction. Writes a PNG of success against delay.
    Vla(VlaArgs),
    /// A checkpoint alone in closed loop against the simulator, in
    /// simulated time and in this process (no zenoh, no real-time clock):
    /// success per goal variant, the expert's beside it, in seconds.
    Policy(super::eval_policy::PolicyEvalArgs),
    /// The thinker models on 20 short factual questions (greedy, through
    /// each model's chat template): how many answers contain the expected
    /// word, with tokens and time, as a table.
    Thinker(super::eval_thinker::ThinkerEvalArgs),
}

/// Execution modes compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// Wait for each chunk (controller threshold 0), no prefix freezing.
    Sync,
    /// Request the next chunk at half the queue (threshold 0.5), naive
    /// switching (`rtc: none`).
    Async,
    /// As async, with the executing prefix frozen (`rtc: prefix`).
    Rtc,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Async => "async",
            Mode::Rtc => "rtc",
        }
    }
}

/// `edgeflow eval vla` options.
#[derive(Debug, clap::Args)]
pub(crate) struct VlaArgs {
    /// The policy pipeline (zenoh stages, action_head, controller).
    #[arg(long, default_value = "pipelines/vla.yaml")]
    pub pipeline: PathBuf,
    /// The expert's pipeline, run on the same seeds.
    #[arg(long, default_value = "pipelines/robot-expert.yaml")]
    pub expert_pipeline: PathBuf,
    /// Held-out seeds per goal variant (the run covers consecutive seeds
    /// from --seed until every variant has this many).
    #[arg(long, default_value_t = 50)]
    pub seeds: usize,
    /// First seed (training recordings used 1000.. and 2000..).
    #[arg(long, default_value_t = 100_000)]
    pub seed: u64,
    /// Modes, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sync,async,rtc"
    )]
    pub modes: Vec<Mode>,
    /// Injected inference delays in control periods, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,2,4,8")]
    pub delays: Vec<u32>,
    /// Skip the expert's run.
    #[arg(long)]
    pub no_expert: bool,
    /// Also run the first mode at the first delay with every instruction
    /// swapped to another goal's (block and target colours both changed):
    /// success must drop if the policy reads the instruction.
    #[arg(long)]
    pub wrong_instruction: bool,
    /// Episode timeout, simulated seconds.
    #[arg(long, default_value_t = 20.0)]
    pub episode_seconds: f64,
    /// Success-against-delay plot (PNG).
    #[arg(long, default_value = "vla-eval.png")]
    pub plot: PathBuf,
    /// Also write every figure as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Extra overrides for the policy pipeline: STAGE.PARAM=VALUE
    /// (repeatable), e.g. enc.device=gpu.
    #[arg(long = "set")]
    pub set: Vec<String>,
}

/// Run an evaluation.
pub(super) fn run(c: EvalCommand) -> anyhow::Result<ExitCode> {
    match c {
        EvalCommand::Vla(a) => eval_vla(&a)?,
        EvalCommand::Policy(a) => super::eval_policy::eval_policy(&a)?,
        EvalCommand::Thinker(a) => super::eval_thinker::eval_thinker(&a)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// One simulated episode as `edgeflow sim push` reported it.
#[derive(Debug, Clone, serde::Serialize)]
struct Episode {
    seed: u64,
    variant: String,
    success: bool,
    seconds: f64,
}

/// One run: a pipeline over the seed range with fixed settings.
#[derive(Debug, Clone, serde::Serialize)]
struct RunReport {
    label: String,
    mode: Option<&'static str>,
    delay_periods: u32,
    episodes: Vec<Episode>,
    success_rate: f64,
    per_variant: BTreeMap<String, (usize, usize)>,
    mean_success_seconds: f64,
    boundary: Discontinuity,
    elsewhere: Discontinuity,
    obs_to_command_ms: (f64, f64),
    jitter_us: (f64, f64),
    inference_delay_periods: f64,
    head_ms: f64,
    wall_s: f64,
}

/// Mean command jump (mm) and jerk (m/s^3) over a set of control steps.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
struct Discontinuity {
    steps: usize,
    jump_mm: f64,
    jerk: f64,
}

pub(super) fn cpu_name() -> String {
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

/// Consecutive seeds from `first` until every variant has `per_variant`.
fn seed_range(first: u64, per_variant: usize, cfg: &PushConfig) -> anyhow::Result<u64> {
    let mut sim = PushSim::new(cfg.clone()).context("simulator")?;
    let mut counts = [0usize; 4];
    let mut n = 0u64;
    while counts.iter().any(|c| *c < per_variant) {
        counts[sim.reset(first + n).variant.index()] += 1;
        n += 1;
        if n > 100_000 {
            bail!("no seed range gives {per_variant} seeds of every variant");
        }
    }
    Ok(n)
}

fn eval_vla(a: &VlaArgs) -> anyhow::Result<()> {
    if a.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    if a.modes.is_empty() || a.delays.is_empty() {
        bail!("--modes and --delays need at least one value each");
    }
    let cfg = PushConfig {
        episode_seconds: a.episode_seconds,
        ..Default::default()
    };
    let n = seed_range(a.seed, a.seeds, &cfg)?;
    let period_ms = 1e3 / cfg.control_hz;
    let argv: Vec<String> = std::env::args().collect();
    println!(
        "edgeflow eval vla on {} ({} logical CPUs)",
        cpu_name(),
        num_cpus()
    );
    println!("command: {}", argv.join(" "));
    println!(
        "seeds {}..{} ({n} episodes per run, at least {} of each goal variant), episode timeout {} s, control period {period_ms} ms",
        a.seed,
        a.seed + n,
        a.seeds,
        a.episode_seconds
    );
    let mut reports = Vec::new();
    let expert = if a.no_expert {
        None
    } else {
        let r = run_pipeline(a, &a.expert_pipeline, "expert", None, 0, n, false)?;
        print_row(&r);
        Some(r)
    };
    for &mode in &a.modes {
        for &d in &a.delays {
            let r = run_pipeline(a, &a.pipeline, mode.name(), Some(mode), d, n, false)?;
            print_row(&r);
            reports.push(r);
        }
    }
    let wrong = if a.wrong_instruction {
        let r = run_pipeline(
            a,
            &a.pipeline,
            "wrong-instruction",
            Some(a.modes[0]),
            a.delays[0],
            n,
            true,
        )?;
        print_row(&r);
        Some(r)
    } else {
        None
    };
    summarise(a, &reports, expert.as_ref(), wrong.as_ref())?;
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "cpu": cpu_name(),
            "command": argv.join(" "),
            "seeds": [a.seed, a.seed + n],
            "expert": expert,
            "runs": reports,
            "wrong_instruction": wrong,
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn print_row(r: &RunReport) {
    let per: Vec<String> = r
        .per_variant
        .iter()
        .map(|(v, (ok, all))| format!("{v} {ok}/{all}"))
        .collect();
    println!(
        "{:<18} delay {} | success {:>5.1} % ({}) | task {:.2} s | boundary jump {:.2} mm jerk {:.0} m/s^3 (elsewhere {:.2} mm, {:.0}) | obs->cmd p50 {:.0} p99 {:.0} ms | jitter p50 {:.0} p99 {:.0} us | delay p50 {:.1} periods | head {:.1} ms | {:.0} s",
        r.label,
        r.delay_periods,
        100.0 * r.success_rate,
        per.join(", "),
        r.mean_success_seconds,
        r.boundary.jump_mm,
        r.boundary.jerk,
        r.elsewhere.jump_mm,
        r.elsewhere.jerk,
        r.obs_to_command_ms.0,
        r.obs_to_command_ms.1,
        r.jitter_us.0,
        r.jitter_us.1,
        r.inference_delay_periods,
        r.head_ms,
        r.wall_s,
    );
}

fn summarise(
    a: &VlaArgs,
    reports: &[RunReport],
    expert: Option<&RunReport>,
    wrong: Option<&RunReport>,
) -> anyhow::Result<()> {
    if let Some(e) = expert {
        println!(
            "expert on the same seeds: {:.1} % success, task {:.2} s",
            100.0 * e.success_rate,
            e.mean_success_seconds
        );
    }
    if let Some(w) = wrong {
        let right = reports
            .iter()
            .find(|r| r.mode == w.mode && r.delay_periods == w.delay_periods);
        println!(
            "wrong instruction ({} at delay {}): {:.1} % success against {:.1} % with the right one",
            w.mode.unwrap_or("?"),
            w.delay_periods,
            100.0 * w.success_rate,
            right.map_or(f64::NAN, |r| 100.0 * r.success_rate)
        );
    }
    let colours: [(Mode, [u8; 3], &str); 3] = [
        (Mode::Sync, [120, 120, 120], "grey"),
        (Mode::Async, [220, 90, 30], "orange"),
        (Mode::Rtc, [30, 90, 200], "blue"),
    ];
    let mut series = Vec::new();
    let mut legend = Vec::new();
    for (m, rgb, name) in colours {
        let pts: Vec<(f32, f32)> = reports
            .iter()
            .filter(|r| r.mode == Some(m.name()))
            .map(|r| (r.delay_periods as f32, r.success_rate as f32))
            .collect();
        if !pts.is_empty() {
            series.push(Series { points: pts, rgb });
            legend.push(format!("{} {name}", m.name()));
        }
    }
    let x_max = a.delays.iter().copied().max().unwrap_or(0).max(1) as f32;
    if let Some(e) = expert {
        let y = e.success_rate as f32;
        series.push(Series {
            points: vec![(0.0, y), (x_max, y)],
            rgb: [40, 160, 70],
        });
        legend.push("expert green (flat)".into());
    }
    plot_lines(&series, x_max, 1.0, &a.plot)?;
    println!(
        "wrote {} (x: injected delay 0..{x_max} periods, a tick per period; y: success rate 0..1, a grid line per 0.1; {})",
        a.plot.display(),
        legend.join(", ")
    );
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Stage ids by kind in a spec.
fn ids_of(spec: &PipelineSpec, kind: &str) -> Vec<String> {
    spec.stages
        .iter()
        .filter(|s| s.kind == kind)
        .map(|s| s.id.clone())
        .collect()
}

/// The policy pipeline with the overrides of a run, validated.
fn plan_for(
    path: &Path,
    registry: &Registry,
    port: u16,
    mode: Option<Mode>,
    delay_periods: u32,
    wrong: bool,
    extra: &[String],
) -> anyhow::Result<(Plan, String)> {
    let period_ms = 1e3 / PushConfig::default().control_hz;
    let source =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut spec = parse_spec(&source, Some(path))?;
    let ep = format!("tcp/127.0.0.1:{port}");
    let mut sets: Vec<String> = Vec::new();
    for id in ids_of(&spec, "zenoh_sub")
        .into_iter()
        .chain(ids_of(&spec, "zenoh_pub"))
    {
        sets.push(format!("{id}.connect={ep}"));
    }
    let ctl = ids_of(&spec, "controller");
    let head = ids_of(&spec, "action_head");
    if let Some(m) = mode {
        if head.is_empty() {
            bail!(
                "{}: no action_head stage to set the mode or delay on",
                path.display()
            );
        }
        for c in &ctl {
            let t = if m == Mode::Sync { 0.0 } else { 0.5 };
            sets.push(format!("{c}.threshold={t}"));
        }
        for h in &head {
            let rtc = if m == Mode::Rtc { "prefix" } else { "none" };
            sets.push(format!("{h}.rtc={rtc}"));
            sets.push(format!(
                "{h}.delay={}ms",
                (delay_periods as f64 * period_ms).round()
            ));
        }
        sets.extend(extra.iter().cloned());
    }
    // The simulator starts once the instruction subscriber is up (it
    // publishes the instruction once per episode), else once the command
    // publisher is.
    let wait_for = spec
        .stages
        .iter()
        .find(|s| {
            s.kind == "zenoh_sub"
                && s.params
                    .get("key")
                    .and_then(|k| k.as_str())
                    .is_some_and(|k| k.ends_with("instruction"))
        })
        .or_else(|| spec.stages.iter().find(|s| s.kind == "zenoh_pub"))
        .map(|s| format!("edgeflow/alive/{}", s.id))
        .context("the pipeline has no zenoh_pub stage for the commands")?;
    if wrong {
        let text = ids_of(&spec, "text_encoder");
        let Some(t) = text.first() else {
            bail!(
                "{}: no text_encoder stage to feed a wrong instruction",
                path.display()
            );
        };
        let (to_a, to_b) = (t.clone(), format!("{t}.in"));
        for e in &mut spec.edges {
            if e.to == to_a || e.to == to_b {
                e.to = "eval_swap.in".into();
            }
        }
        spec.stages.push(StageSpec {
            id: "eval_swap".into(),
            kind: SWAP_KIND.into(),
            device: None,
            threads: None,
            inline: false,
            part: None,
            params: BTreeMap::new(),
        });
        let mut e = spec
            .edges
            .first()
            .cloned()
            .context("the pipeline has no edges")?;
        e.from = "eval_swap.out".into();
        e.to = to_b;
        e.capacity = None;
        e.policy = None;
        e.max_age = None;
        e.back_edge = false;
        e.key = None;
        spec.edges.push(e);
    }
    let overrides: Vec<Override> = sets
        .iter()
        .map(|s| s.parse::<Override>())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("override: {e}"))?;
    let base = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let plan = validate(&spec, registry, base, &overrides, Some(path), &source)?;
    Ok((plan, wait_for))
}

/// What the tap saw: chunk arrivals at the controller and the commands it
/// sent (time, step, target).
#[derive(Default)]
struct Trace {
    chunk_edges: Vec<usize>,
    command_edges: Vec<usize>,
    chunks: Mutex<Vec<Timestamp>>,
    commands: Mutex<Vec<(Timestamp, u64, [f32; 2])>>,
}

impl EdgeTap for Trace {
    fn on_message(&self, edge: usize, msg: &Message, at: Timestamp) {
        if self.chunk_edges.contains(&edge) {
            self.chunks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(at);
        } else if self.command_edges.contains(&edge) {
            if let Payload::Actions(c) = &msg.payload {
                if c.actions.len() >= 2 {
                    self.commands
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((at, c.start_step, [c.actions[0], c.actions[1]]));
                }
            }
        }
    }
}

fn trace_for(plan: &Plan) -> Trace {
    let mut t = Trace::default();
    for (i, e) in plan.edges.iter().enumerate() {
        let (from, to) = (&plan.stages[e.from.0], &plan.stages[e.to.0]);
        if to.kind == "controller"
            && to
                .ports
                .inputs
                .get(e.to.1)
                .is_some_and(|p| p.name == "actions")
        {
            t.chunk_edges.push(i);
        }
        if from.kind == "controller"
            && from
                .ports
                .outputs
                .get(e.from.1)
                .is_some_and(|p| p.name == "command")
        {
            t.command_edges.push(i);
        }
    }
    t
}

/// Jump and jerk of the command sequence at the first command after each
/// chunk arrival, and at every other step; steps within 0.3 s of an episode
/// change (`resets`) are left out, as the pusher target jumps there.
fn discontinuity(
    trace: &Trace,
    resets: &[Timestamp],
    rate_hz: f64,
) -> (Discontinuity, Discontinuity) {
    let cmds = trace
        .commands
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let chunks = trace
        .chunks
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let near_reset = |t: Timestamp| {
        resets
            .iter()
            .any(|r| r.0.abs_diff(t.0) < Duration::from_millis(300).as_nanos() as u64)
    };
    let mut boundary_idx = std::collections::BTreeSet::new();
    for c in &chunks {
        if let Some(i) = cmds.iter().position(|(t, _, _)| t >= c) {
            boundary_idx.insert(i);
        }
    }
    let mut b = (0usize, 0f64, 0f64);
    let mut o = (0usize, 0f64, 0f64);
    for i in 3..cmds.len() {
        let w = &cmds[i - 3..=i];
        if !w.windows(2).all(|p| p[1].1 == p[0].1 + 1) || near_reset(cmds[i].0) {
            continue;
        }
        let (mut jump, mut jerk) = (0f64, 0f64);
        for d in 0..2 {
            let x: Vec<f64> = w.iter().map(|c| c.2[d] as f64).collect();
            jump += (x[3] - x[2]).powi(2);
            jerk += (x[3] - 3.0 * x[2] + 3.0 * x[1] - x[0]).powi(2);
        }
        let (jump, jerk) = (jump.sqrt() * 1e3, jerk.sqrt() * rate_hz.powi(3));
        let acc = if boundary_idx.contains(&i) {
            &mut b
        } else {
            &mut o
        };
        acc.0 += 1;
        acc.1 += jump;
        acc.2 += jerk;
    }
    let mk = |(n, j, k): (usize, f64, f64)| Discontinuity {
        steps: n,
        jump_mm: j / n.max(1) as f64,
        jerk: k / n.max(1) as f64,
    };
    (mk(b), mk(o))
}

fn value(
    m: &MetricsSnapshot,
    kind: &str,
    key: &str,
) -> Option<edgeflow_graph::metrics::ValueSummary> {
    m.stages
        .iter()
        .find(|s| s.kind == kind)?
        .values
        .get(key)
        .cloned()
}

fn start_sim(port: u16, n: u64, a: &VlaArgs, wait_for: &str) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("locating the edgeflow executable")?;
    Command::new(exe)
        .args(["sim", "push", "--listen", &format!("tcp/127.0.0.1:{port}")])
        .args(["--episodes", &n.to_string(), "--seed", &a.seed.to_string()])
        .args(["--episode-seconds", &a.episode_seconds.to_string()])
        .args(["--wait-for", wait_for])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting `edgeflow sim push`")
}

/// Read the simulator's lines until its summary; returns the episodes and
/// when each ended.
fn read_episodes(
    child: &mut Child,
    n: u64,
    episode_seconds: f64,
) -> anyhow::Result<(Vec<Episode>, Vec<Timestamp>)> {
    let out = child.stdout.take().context("simulator stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    // Wall time may run past simulated time on a loaded machine: generous.
    let timeout = Duration::from_secs_f64(n as f64 * (episode_seconds * 2.0 + 5.0) + 60.0);
    let end = Instant::now() + timeout;
    let (mut eps, mut ends) = (Vec::new(), Vec::new());
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                bail!(
                    "the simulator did not finish {n} episodes within {timeout:?} ({} done)",
                    eps.len()
                );
            }
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v.get("summary").is_some() {
            let _ = child.wait();
            return Ok((eps, ends));
        }
        ends.push(Timestamp::now());
        eps.push(Episode {
            seed: v["seed"].as_u64().unwrap_or(0),
            variant: v["variant"].as_str().unwrap_or("?").to_string(),
            success: v["success"] == true,
            seconds: v["seconds"].as_f64().unwrap_or(f64::NAN),
        });
    }
}

fn run_pipeline(
    a: &VlaArgs,
    path: &Path,
    label: &str,
    mode: Option<Mode>,
    delay_periods: u32,
    n: u64,
    wrong: bool,
) -> anyhow::Result<RunReport> {
    let mut registry = edgeflow::registry();
    registry.register(SwapInstructionKind);
    let port = free_port()?;
    let period_ms = 1e3 / PushConfig::default().control_hz;
    let (plan, wait_for) = plan_for(path, &registry, port, mode, delay_periods, wrong, &a.set)?;
    let trace = Arc::new(trace_for(&plan));
    let t0 = Instant::now();
    let mut child = start_sim(port, n, a, &wait_for)?;
    let running: Running =
        match edgeflow_graph::Pipeline::from_plan(plan).start_with_tap(trace.clone()) {
            Ok(r) => r,
            Err(e) => {
                let _ = child.kill();
                return Err(e.into());
            }
        };
    let res = read_episodes(&mut child, n, a.episode_seconds);
    let m = running.metrics();
    running.stop();
    let (episodes, ends) = res?;
    let (boundary, elsewhere) = discontinuity(&trace, &ends, 1e3 / period_ms);
    let mut per_variant: BTreeMap<String, (usize, usize)> =
        Variant::ALL.iter().map(|v| (v.name(), (0, 0))).collect();
    for e in &episodes {
        let c = per_variant.entry(e.variant.clone()).or_default();
        c.1 += 1;
        c.0 += usize::from(e.success);
    }
    let ok: Vec<f64> = episodes
        .iter()
        .filter(|e| e.success)
        .map(|e| e.seconds)
        .collect();
    let o2c = value(&m, "controller", "obs_to_command_ms");
    let jit = value(&m, "controller", "jitter_us");
    Ok(RunReport {
        label: label.to_string(),
        mode: mode.map(Mode::name),
        delay_periods,
        success_rate: ok.len() as f64 / episodes.len().max(1) as f64,
        // NaN (printed as such, null in JSON) when nothing succeeded.
        mean_success_seconds: ok.iter().sum::<f64>() / ok.len() as f64,
        episodes,
        per_variant,
        boundary,
        elsewhere,
        obs_to_command_ms: o2c.map_or((f64::NAN, f64::NAN), |v| (v.p50, v.p99)),
        jitter_us: jit.map_or((f64::NAN, f64::NAN), |v| (v.p50, v.p99)),
        inference_delay_periods: value(&m, "controller", "inference_delay_periods")
            .map_or(f64::NAN, |v| v.p50),
        head_ms: value(&m, "action_head", "head_ms").map_or(f64::NAN, |v| v.p50),
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

const SWAP_KIND: &str = "eval_wrong_instruction";

/// The wrong instruction for a goal: the other block onto the other target.
pub(super) fn wrong_instruction(text: &str) -> String {
    let t = text.trim();
    for v in Variant::ALL {
        if v.instruction() == t {
            let w = Variant::ALL[3 - v.index()];
            return w.instruction();
        }
    }
    // Not one of the simulator's instructions: swap the colour words.
    t.replace("red", "\u{0}")
        .replace("blue", "red")
        .replace('\u{0}', "blue")
}

/// Test-only stage kind: replaces each instruction with another goal's.
#[derive(Debug, Clone, Copy)]
struct SwapInstructionKind;

impl StageFactory for SwapInstructionKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: SWAP_KIND,
            doc: "Evaluation only: replaces each push instruction with another goal's (both colours changed).",
            params: Vec::<ParamInfo>::new(),
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Text, "instructions")],
                outputs: vec![PortSpec::new("out", PortType::Text, "the wrong instructions")],
            },
            source: false,
        }
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        Ok(Box::new(SwapInstruction))
    }
}

#[derive(Debug)]
struct SwapInstruction;

impl Stage for SwapInstruction {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let Some(t) = input.msg.payload.as_text() else {
            return Ok(());
        };
        let mut m = input.msg.clone();
        m.payload = Payload::Text(wrong_instruction(t).into());
        ctx.emit_msg(0, m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_instructions_name_another_goal() {
        for v in Variant::ALL {
            let w = wrong_instruction(&v.instruction());
            assert_ne!(w, v.instruction());
            assert!(Variant::ALL.iter().any(|x| x.instruction() == w), "{w}");
        }
    }

    #[test]
    fn seed_ranges_cover_every_variant() {
        let n = seed_range(100_000, 2, &PushConfig::default()).expect("range");
        assert!(n >= 8, "{n}");
    }
}
