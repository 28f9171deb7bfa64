//! `edgeflow sim ...`: simulated robots in their own process, reached only
//! over zenoh. The loop lives in `edgeflow_control::sim_link`.

use std::path::PathBuf;
use std::process::ExitCode;

/// Simulators.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum SimCommand {
    /// The push task: a pusher that must push the named block onto the named
    /// target (rapier2d physics, 96 x 96 RGB camera). Publishes under
    /// PREFIX/{image,state,true_state,instruction,events}, takes PREFIX/cmd,
    /// prints one JSON line per episode and a summary line.
    Push(PushArgs),
    /// Record the push task's scripted expert for `edgeflow train policy`:
    /// in this process and in simulated time, so it takes seconds and the
    /// same seeds give the same files bit for bit. The expert plans
    /// --horizon targets from the true state and executes the first
    /// --execute, as a chunked policy would. One episode_<seed> folder per
    /// episode (the format `edgeflow sim push --record` writes). With
    /// --policy a trained head drives and the expert labels every step
    /// (DAgger).
    Record(RecordArgs),
}

/// `edgeflow sim record` options.
#[derive(Debug, clap::Args)]
pub(crate) struct RecordArgs {
    /// Folder to write episode_<seed>/ folders into.
    #[arg(long)]
    pub out: PathBuf,
    /// Episodes (consecutive seeds).
    #[arg(long, default_value_t = 100)]
    pub episodes: u64,
    /// First seed (`edgeflow eval` holds out 100000 and up).
    #[arg(long, default_value_t = 1000)]
    pub seed: u64,
    /// Targets the expert plans per chunk.
    #[arg(long, default_value_t = 16)]
    pub horizon: usize,
    /// Targets executed from each chunk before planning again.
    #[arg(long, default_value_t = 8)]
    pub execute: usize,
    /// Let this trained action head drive instead of the expert (in closed
    /// loop, synchronous chunks, simulated time) and label every step with
    /// the chunk the expert plans from the true state there: DAgger's data,
    /// the states the policy reaches with what it should have done, for
    /// `edgeflow train policy --episodes EXPERT --episodes THIS --init
    /// POLICY`. --horizon must be the head's.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Episode timeout, simulated seconds.
    #[arg(long, default_value_t = 20.0)]
    pub episode_seconds: f64,
    /// The expert's planner: `waypoints` (discrete plans with memory) or
    /// `field` (memoryless, continuous in the state).
    #[arg(long, value_enum, default_value = "waypoints")]
    pub expert: ExpertArg,
    /// Add noise to the expert's executed targets (DART): a Gaussian
    /// offset of this standard deviation (metres, per axis), held for
    /// --noise-hold steps; every step is then labelled with the chunk the
    /// expert plans from that state alone (`labels.f32`), which training
    /// targets. `--noise 0` records the expert as it is, labelled so.
    #[arg(long)]
    pub noise: Option<f32>,
    /// Control steps each noise offset is held.
    #[arg(long, default_value_t = 8)]
    pub noise_hold: usize,
}

/// The scripted expert's planner, on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum ExpertArg {
    /// [`edgeflow_sim::ExpertKind::Field`].
    Field,
    /// [`edgeflow_sim::ExpertKind::Waypoints`].
    Waypoints,
}

impl From<ExpertArg> for edgeflow_sim::ExpertKind {
    fn from(a: ExpertArg) -> Self {
        match a {
            ExpertArg::Field => edgeflow_sim::ExpertKind::Field,
            ExpertArg::Waypoints => edgeflow_sim::ExpertKind::Waypoints,
        }
    }
}

/// `edgeflow sim push` options.
#[derive(Debug, clap::Args)]
pub(crate) struct PushArgs {
    /// zenoh endpoint to listen on (repeatable).
    #[arg(long, default_value = "tcp/127.0.0.1:7447")]
    pub listen: Vec<String>,
    /// zenoh endpoint to connect to (repeatable).
    #[arg(long)]
    pub connect: Vec<String>,
    /// Key prefix.
    #[arg(long, default_value = "robot")]
    pub prefix: String,
    /// Episodes to run.
    #[arg(long, default_value_t = 20)]
    pub episodes: u64,
    /// Seed of the first episode (episode i uses SEED + i).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Episode timeout in simulated seconds.
    #[arg(long, default_value_t = 20.0)]
    pub episode_seconds: f64,
    /// Control rate in Hz (one command per period).
    #[arg(long, default_value_t = 50.0)]
    pub control_hz: f64,
    /// Record each episode (images, state, instruction, commands,
    /// timestamps) under this folder, in the sim crate's format.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Start only once a liveliness token matching this key expression is
    /// up (e.g. the pipeline's `edgeflow/alive/cmd`).
    #[arg(long)]
    pub wait_for: Option<String>,
}

/// Run a simulator.
pub(super) fn run(c: SimCommand) -> anyhow::Result<ExitCode> {
    let a = match c {
        SimCommand::Push(a) => a,
        SimCommand::Record(r) => return record(&r),
    };
    let listen: Vec<&str> = a.listen.iter().map(String::as_str).collect();
    let connect: Vec<&str> = a.connect.iter().map(String::as_str).collect();
    let o = edgeflow_control::sim_link::SimOptions {
        session: edgeflow_control::session::SessionConfig::peer(&listen, &connect),
        prefix: a.prefix,
        episodes: a.episodes,
        seed: a.seed,
        config: edgeflow_sim::PushConfig {
            episode_seconds: a.episode_seconds,
            control_hz: a.control_hz,
            ..Default::default()
        },
        record: a.record,
        wait_for: a.wait_for,
        ..Default::default()
    };
    let results = edgeflow_control::sim_link::run_push_sim(&o, |r| {
        if let Ok(line) = serde_json::to_string(r) {
            println!("{line}");
        }
    })?;
    let ok: Vec<_> = results.iter().filter(|r| r.success).collect();
    let mean = if ok.is_empty() {
        0.0
    } else {
        ok.iter().map(|r| r.seconds).sum::<f64>() / ok.len() as f64
    };
    println!(
        "{}",
        serde_json::json!({
            "summary": true,
            "episodes": results.len(),
            "successes": ok.len(),
            "success_rate": ok.len() as f64 / results.len().max(1) as f64,
            "mean_success_seconds": mean,
        })
    );
    Ok(ExitCode::SUCCESS)
}

/// `edgeflow sim record`.
fn record(a: &RecordArgs) -> anyhow::Result<ExitCode> {
    if a.horizon == 0 || a.execute == 0 || a.execute > a.horizon {
        anyhow::bail!(
            "--horizon ({}) and --execute ({}) must be at least 1, execute <= horizon",
            a.horizon,
            a.execute
        );
    }
    if let Some(noise) = a.noise {
        if a.policy.is_some() {
            anyhow::bail!("--noise perturbs the expert's commands; with --policy the head drives: use one or the other");
        }
        edgeflow_sim::Perturbation {
            sigma: noise,
            hold: a.noise_hold,
        }
        .validate()?;
    }
    if let Some(policy) = &a.policy {
        return record_policy(a, policy);
    }
    std::fs::create_dir_all(&a.out)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", a.out.display()))?;
    let cfg = edgeflow_sim::PushConfig {
        episode_seconds: a.episode_seconds,
        ..Default::default()
    };
    let mut sim = edgeflow_sim::PushSim::new(cfg.clone())?;
    let mut expert = edgeflow_sim::Expert::with_kind(&cfg, a.expert.into());
    let noise = a.noise.map(|sigma| edgeflow_sim::Perturbation {
        sigma,
        hold: a.noise_hold,
    });
    let t0 = std::time::Instant::now();
    let mut ok = 0;
    for seed in a.seed..a.seed + a.episodes {
        let dest = a.out.join(format!("episode_{seed:06}"));
        let info = match noise {
            Some(noise) => edgeflow_sim::record_perturbed_episode(
                &mut sim,
                &mut expert,
                seed,
                a.horizon,
                a.execute,
                noise,
                &dest,
            )?,
            None => edgeflow_sim::record::record_expert_episode(
                &mut sim,
                &mut expert,
                seed,
                a.horizon,
                a.execute,
                &dest,
            )?,
        };
        ok += sim.success() as u64;
        println!(
            "{}",
            serde_json::json!({
                "seed": seed,
                "variant": info.variant.name(),
                "success": sim.success(),
                "seconds": sim.true_state().time,
            })
        );
    }
    println!(
        "{}",
        serde_json::json!({
            "summary": true,
            "episodes": a.episodes,
            "successes": ok,
            "out": a.out.display().to_string(),
            "wall_seconds": t0.elapsed().as_secs_f64(),
        })
    );
    Ok(ExitCode::SUCCESS)
}

/// `edgeflow sim record --policy`: the head drives, the expert labels.
fn record_policy(a: &RecordArgs, policy: &std::path::Path) -> anyhow::Result<ExitCode> {
    let head = edgeflow_action::config::Config::from_checkpoint(policy)?;
    if head.horizon != a.horizon {
        anyhow::bail!(
            "{} plans {}-action chunks; record its labels with --horizon {}",
            policy.display(),
            head.horizon,
            head.horizon
        );
    }
    std::fs::create_dir_all(&a.out)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", a.out.display()))?;
    let opts = super::rollout::RolloutOptions {
        frame_age: 0,
        seed: a.seed,
        episodes: a.episodes,
        execute: a.execute,
        per_variant: None,
        flow_steps: 10,
        wrong_instruction: false,
        mode: super::rollout::Mode::Sync,
        delay: 0,
        temperature: 1.0,
        episode_seconds: a.episode_seconds,
        trace: false,
        record: Some(a.out.clone()),
    };
    let r = super::rollout::rollout(&[policy.to_path_buf()], &opts, |o| {
        println!(
            "{}",
            serde_json::json!({
                "seed": o.seed,
                "variant": o.variant,
                "success": o.success,
                "expert_success": o.expert_success,
                "seconds": o.seconds,
            })
        );
    })?;
    let (s, e, n) = r.totals();
    println!(
        "{}",
        serde_json::json!({
            "summary": true,
            "episodes": n,
            "successes": s,
            "expert_successes": e,
            "labelled_by": "expert",
            "out": a.out.display().to_string(),
            "wall_seconds": r.wall_s,
        })
    );
    Ok(ExitCode::SUCCESS)
}
