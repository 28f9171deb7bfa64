//! `edgeflow eval policy`: an action-head checkpoint alone in closed loop
//! against the push simulator, in simulated time and in this process
//! (`super::rollout`), for every execution mode and injected delay: success
//! per goal variant beside the expert's, task time, jump and jerk at chunk
//! boundaries, the wrong-instruction check, a success-vs-delay plot.

use super::eval::cpu_name;
use anyhow::Context;
use edgeflow_action::train::plot::{plot_lines, Series};
use std::path::PathBuf;

/// `edgeflow eval policy` options.
#[derive(Debug, clap::Args)]
pub(crate) struct PolicyEvalArgs {
    /// The action head checkpoint. Several (comma-separated, or the option
    /// repeated) run as one ensemble: heads trained on the same data whose
    /// chunks are averaged at every flow step.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "pipelines/data/vla-policy.safetensors"
    )]
    pub checkpoint: Vec<PathBuf>,
    /// Episodes (consecutive seeds).
    #[arg(long, default_value_t = 40)]
    pub episodes: u64,
    /// Instead of --episodes: the seeds from --seed on until every goal
    /// variant has this many episodes (a seed of a full variant is
    /// skipped).
    #[arg(long, conflicts_with = "episodes")]
    pub per_variant: Option<u64>,
    /// First seed (training recordings use seeds below 100000).
    #[arg(long, default_value_t = 100_000)]
    pub seed: u64,
    /// Actions run from each chunk before the next observation.
    #[arg(long, default_value_t = 8)]
    pub execute: usize,
    /// Flow (Euler) steps per chunk.
    #[arg(long, default_value_t = 10)]
    pub flow_steps: usize,
    /// Also run the first mode at the first delay with every instruction
    /// swapped to another goal's: success must drop if the policy reads it.
    #[arg(long)]
    pub wrong_instruction: bool,
    /// Episode timeout, simulated seconds.
    #[arg(long, default_value_t = 20.0)]
    pub episode_seconds: f64,
    /// Scale of the head's starting noise (1: the trained distribution; 0:
    /// one deterministic chunk per observation).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Execution modes, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sync")]
    pub modes: Vec<super::rollout::Mode>,
    /// Show the head the camera frame from this many control periods
    /// before each observation, beside the current state, as live (where
    /// the frame is 5-12 periods old at 50 Hz).
    #[arg(long, default_value_t = 0)]
    pub frame_age: usize,
    /// Injected inference delays in control periods, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub delays: Vec<usize>,
    /// Success-against-delay plot (PNG), written when more than one delay
    /// runs.
    #[arg(long, default_value = "policy-eval.png")]
    pub plot: PathBuf,
    /// Also write every figure as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Print one line per chunk: the pusher, the head's keypoints beside
    /// the true blocks and zones, the expert's plan beside the head's chunk.
    #[arg(long)]
    pub trace: bool,
}

/// `edgeflow eval policy`: every mode at every delay, then the wrong
/// instruction, in simulated time.
pub(super) fn eval_policy(a: &PolicyEvalArgs) -> anyhow::Result<()> {
    use super::rollout::{rollout, RolloutOptions};
    let seeds = match a.per_variant {
        Some(n) => format!("seeds from {} until each goal variant has {n}", a.seed),
        None => format!("seeds {}..{}", a.seed, a.seed + a.episodes),
    };
    println!(
        "{}: {seeds}, execute {} of each chunk, {} flow steps, frames {} periods old, simulated time [{}]",
        super::rollout::names(&a.checkpoint),
        a.execute,
        a.flow_steps,
        a.frame_age,
        cpu_name()
    );
    let mut rows = Vec::new();
    let mut expert = None;
    for &mode in &a.modes {
        for &delay in &a.delays {
            let opts = RolloutOptions {
                seed: a.seed,
                episodes: a.episodes,
                per_variant: a.per_variant,
                execute: a.execute,
                flow_steps: a.flow_steps,
                wrong_instruction: false,
                mode,
                delay,
                frame_age: a.frame_age,
                temperature: a.temperature,
                episode_seconds: a.episode_seconds,
                trace: a.trace,
                record: None,
            };
            let r = rollout(&a.checkpoint, &opts, |o| {
                eprintln!(
                    "{} delay {delay} seed {} {}: {} in {:.1} s, block {:.3} -> {:.3} m from its target",
                    mode.name(),
                    o.seed,
                    o.variant,
                    if o.success { "solved" } else { "failed" },
                    o.seconds,
                    o.start_distance,
                    o.end_distance,
                )
            })?;
            let (s, e, n) = r.totals();
            let (at, off) = r.smoothness();
            expert.get_or_insert((e, n));
            println!(
                "{:<5} delay {delay} | success {:>5.1} % ({s}/{n}; {}) | task {:.2} s | boundary jump {:.2} mm jerk {:.0} m/s^3 (elsewhere {:.2} mm, {:.0}) | {:.0} s",
                mode.name(),
                100.0 * s as f64 / n.max(1) as f64,
                r.per_variant()
                    .iter()
                    .map(|(v, (k, n))| format!("{v} {k}/{n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                r.task_seconds(),
                at.jump_mm,
                at.jerk,
                off.jump_mm,
                off.jerk,
                r.wall_s
            );
            rows.push(serde_json::json!({
                "mode": mode.name(), "delay": delay, "frame_age": a.frame_age, "successes": s, "episodes": n,
                "task_seconds": r.task_seconds(), "boundary": at, "elsewhere": off,
                "per_variant": r.per_variant(), "wall_s": r.wall_s,
            }));
        }
    }
    if let Some((e, n)) = expert {
        println!(
            "expert on the same seeds: {e}/{n} ({:.1} %)",
            100.0 * e as f64 / n.max(1) as f64
        );
    }
    let mut wrong = None;
    if a.wrong_instruction {
        let opts = RolloutOptions {
            seed: a.seed,
            episodes: a.episodes,
            per_variant: a.per_variant,
            execute: a.execute,
            flow_steps: a.flow_steps,
            wrong_instruction: true,
            mode: a
                .modes
                .first()
                .copied()
                .unwrap_or(super::rollout::Mode::Sync),
            delay: a.delays.first().copied().unwrap_or(0),
            frame_age: a.frame_age,
            temperature: a.temperature,
            episode_seconds: a.episode_seconds,
            trace: a.trace,
            record: None,
        };
        let r = rollout(&a.checkpoint, &opts, |_| {})?;
        let (s, _, n) = r.totals();
        println!(
            "wrong instruction (another goal's): success {:.1} % ({s}/{n})",
            100.0 * s as f64 / n.max(1) as f64
        );
        wrong = Some(serde_json::json!({"successes": s, "episodes": n}));
    }
    if a.delays.len() > 1 {
        let series: Vec<Series> = a
            .modes
            .iter()
            .enumerate()
            .map(|(k, m)| Series {
                rgb: [[40, 40, 40], [220, 120, 30], [30, 110, 220]][k % 3],
                points: rows
                    .iter()
                    .filter(|r| r["mode"] == m.name())
                    .map(|r| {
                        let s = r["successes"].as_f64().unwrap_or(0.0);
                        let n = r["episodes"].as_f64().unwrap_or(1.0).max(1.0);
                        (
                            r["delay"].as_f64().unwrap_or(0.0) as f32,
                            (100.0 * s / n) as f32,
                        )
                    })
                    .collect(),
            })
            .collect();
        let x_max = a.delays.iter().copied().max().unwrap_or(1).max(1) as f32;
        plot_lines(&series, x_max, 100.0, &a.plot)?;
        println!(
            "wrote {} (x: injected delay, periods 0..{x_max}; y: success % 0..100; {})",
            a.plot.display(),
            a.modes
                .iter()
                .map(|m| m.name())
                .collect::<Vec<_>>()
                .join(" / ")
        );
    }
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "cpu": cpu_name(),
            "checkpoint": super::rollout::names(&a.checkpoint),
            // Consecutive seeds [first, end), or from the first seed on
            // until each variant has `per_variant`.
            "seeds": match a.per_variant {
                Some(_) => serde_json::json!([a.seed]),
                None => serde_json::json!([a.seed, a.seed + a.episodes]),
            },
            "per_variant": a.per_variant,
            "expert": expert,
            "runs": rows,
            "wrong_instruction": wrong,
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
        println!("wrote {}", p.display());
    }
    Ok(())
}
