//! A trained action head in closed loop against the push simulator in
//! simulated time, in this process: no zenoh, no pipeline, no real-time
//! clock. The frozen encoders (DINOv2, MiniLM) see exactly what the
//! pipeline's stages see (the simulator's camera frame at the head's
//! `image_size`, the instruction text); each chunk is sampled from noise
//! and its first `execute` actions run open loop, then the next frame is
//! taken. It answers "does this checkpoint solve the task" in seconds, which
//! is what training needs (`edgeflow train policy --eval-seeds N`) and what
//! `edgeflow eval policy` prints; `edgeflow eval vla` measures the same
//! policy end to end through the real pipeline and its timing.

use anyhow::Context;
use edgeflow_action::config::Config;
use edgeflow_action::policy::{Observation, Policy, RtcMode};
use edgeflow_sim::record::EpisodeWriter;
use edgeflow_sim::{Expert, PushConfig, PushSim};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::Instant;

/// How to roll out.
#[derive(Debug, Clone)]
pub(crate) struct RolloutOptions {
    /// First seed.
    pub seed: u64,
    /// Episodes.
    pub episodes: u64,
    /// Instead of `episodes` consecutive seeds: the seeds from `seed` on
    /// until every goal variant has this many episodes (a seed whose
    /// variant is already full is skipped).
    pub per_variant: Option<u64>,
    /// Actions run from each chunk before the next observation.
    pub execute: usize,
    /// Flow (Euler) steps per chunk.
    pub flow_steps: usize,
    /// Give every episode another goal's instruction.
    pub wrong_instruction: bool,
    /// How chunks are executed.
    pub mode: Mode,
    /// Injected inference delay, control periods: the chunk for an
    /// observation taken at step k arrives at step k + delay.
    pub delay: usize,
    /// The head sees the camera frame from this many control periods
    /// before each observation, beside the current state, as it does live
    /// (the camera and the vision encoder lag the robot state).
    pub frame_age: usize,
    /// Scale of the head's starting noise.
    pub temperature: f32,
    /// Episode timeout, simulated seconds.
    pub episode_seconds: f64,
    /// Print one line per chunk ([`trace_line`] and the chunk's ends).
    pub trace: bool,
    /// Record every episode the policy drives into `DIR/episode_<seed>/`,
    /// each step labelled with the chunk the scripted expert plans from
    /// the true state there alone (`Expert::label`; DAgger: what the
    /// policy should have done in the states it reaches).
    pub record: Option<std::path::PathBuf>,
}

/// How chunks are executed (the controller's modes, in simulated time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// Observe, wait out the inference (the pusher holds), run `execute`
    /// actions, observe again.
    Sync,
    /// Observe while the current chunk runs; when the next chunk arrives
    /// (`delay` steps later) switch to it from its action `delay` on
    /// (naive switching).
    Async,
    /// As async, with the next chunk's first `delay` actions frozen to the
    /// ones that run meanwhile (real-time chunking, the head's trained
    /// prefix inpainting).
    Rtc,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Async => "async",
            Mode::Rtc => "rtc",
        }
    }
}

/// Mean command jump (mm) and jerk (m/s^3) over a set of control steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub(crate) struct Smoothness {
    pub steps: usize,
    pub jump_mm: f64,
    pub jerk: f64,
}

impl Smoothness {
    fn add(&mut self, jump: f64, jerk: f64) {
        self.steps += 1;
        self.jump_mm += 1e3 * jump;
        self.jerk += jerk;
    }
    fn mean(mut self) -> Self {
        let n = self.steps.max(1) as f64;
        self.jump_mm /= n;
        self.jerk /= n;
        self
    }
}

/// Jump and jerk of commands `c` (one per control step, `dt` apart) at the
/// steps in `boundaries` (the first command of each new chunk) and at every
/// other step from the fourth on.
pub(crate) fn smoothness(
    c: &[[f32; 2]],
    boundaries: &[usize],
    dt: f64,
) -> (Smoothness, Smoothness) {
    let (mut at, mut off) = (Smoothness::default(), Smoothness::default());
    let d = |a: [f32; 2], b: [f32; 2]| [(a[0] - b[0]) as f64, (a[1] - b[1]) as f64];
    for i in 3..c.len() {
        let j1 = d(c[i], c[i - 1]);
        let jump = j1[0].hypot(j1[1]);
        // Third difference of position over dt^3.
        let jx = (c[i][0] - 3.0 * c[i - 1][0] + 3.0 * c[i - 2][0] - c[i - 3][0]) as f64;
        let jy = (c[i][1] - 3.0 * c[i - 1][1] + 3.0 * c[i - 2][1] - c[i - 3][1]) as f64;
        let jerk = jx.hypot(jy) / dt.powi(3);
        if boundaries.binary_search(&i).is_ok() {
            at.add(jump, jerk);
        } else {
            off.add(jump, jerk);
        }
    }
    (at.mean(), off.mean())
}

/// One episode's outcome.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    pub seed: u64,
    pub variant: String,
    pub success: bool,
    pub expert_success: bool,
    pub seconds: f64,
    /// The named block's distance to the named zone at the start and at
    /// the end, metres.
    pub start_distance: f32,
    pub end_distance: f32,
    /// Command jump and jerk at chunk boundaries and elsewhere.
    pub boundary: Smoothness,
    pub elsewhere: Smoothness,
}

/// Outcomes of a rollout and how long it took.
#[derive(Debug, Clone)]
pub(crate) struct Rollout {
    pub outcomes: Vec<Outcome>,
    pub wall_s: f64,
}

impl Rollout {
    /// `(policy successes, expert successes, episodes)`.
    pub(super) fn totals(&self) -> (usize, usize, usize) {
        let s = self.outcomes.iter().filter(|o| o.success).count();
        let e = self.outcomes.iter().filter(|o| o.expert_success).count();
        (s, e, self.outcomes.len())
    }

    /// Per variant: `(policy successes, episodes)`.
    pub(super) fn per_variant(&self) -> BTreeMap<String, (usize, usize)> {
        let mut m: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for o in &self.outcomes {
            let e = m.entry(o.variant.clone()).or_default();
            e.0 += o.success as usize;
            e.1 += 1;
        }
        m
    }

    /// Mean simulated seconds of the solved episodes.
    pub(super) fn task_seconds(&self) -> f64 {
        let ok: Vec<f64> = self
            .outcomes
            .iter()
            .filter(|o| o.success)
            .map(|o| o.seconds)
            .collect();
        // (An empty f64 sum is -0.0.)
        ok.iter().fold(0.0, |a, b| a + b) / ok.len().max(1) as f64
    }

    /// Jump and jerk at chunk boundaries and elsewhere, over every episode.
    pub(super) fn smoothness(&self) -> (Smoothness, Smoothness) {
        let merge = |f: fn(&Outcome) -> Smoothness| {
            let mut m = Smoothness::default();
            for o in &self.outcomes {
                let x = f(o);
                m.jump_mm += x.jump_mm * x.steps as f64;
                m.jerk += x.jerk * x.steps as f64;
                m.steps += x.steps;
            }
            m.mean()
        };
        (merge(|o| o.boundary), merge(|o| o.elsewhere))
    }

    /// One line: policy and expert success, per variant, wall time.
    pub(super) fn summary(&self) -> String {
        let (s, e, n) = self.totals();
        let pv: Vec<String> = self
            .per_variant()
            .iter()
            .map(|(v, (k, n))| format!("{v} {k}/{n}"))
            .collect();
        format!(
            "policy {s}/{n} ({:.0} %), expert {e}/{n} on the same seeds; {}; {:.0} s",
            100.0 * s as f64 / n.max(1) as f64,
            pv.join(", "),
            self.wall_s
        )
    }
}

/// What a privileged head reads as its state: the true state, with the
/// blocks and zones relative to the pusher when its config says so.
pub(crate) fn true_state_input(cfg: &Config, t: &edgeflow_sim::TrueState) -> Vec<f32> {
    if cfg.privileged_relative {
        t.privileged_relative()
    } else {
        t.privileged()
    }
}

/// Roll the checkpoint(s) at `checkpoints` (one head, or an ensemble:
/// [`Policy::load_ensemble`]) out over `opts.episodes` seeds from
/// `opts.seed`; the scripted expert runs the same seeds for comparison.
/// `each` sees every finished episode.
pub(crate) fn rollout(
    checkpoints: &[PathBuf],
    opts: &RolloutOptions,
    mut each: impl FnMut(&Outcome),
) -> anyhow::Result<Rollout> {
    anyhow::ensure!(opts.execute >= 1, "execute at least one action per chunk");
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu)?;
    let rtc = if opts.mode == Mode::Rtc {
        RtcMode::Prefix
    } else {
        RtcMode::None
    };
    let names = names(checkpoints);
    let mut policy = Policy::load_ensemble(checkpoints, &dev, opts.flow_steps, rtc, opts.seed)
        .with_context(|| format!("loading {names}"))?;
    policy.temperature = opts.temperature;
    let cfg = policy.config().clone();
    anyhow::ensure!(
        opts.execute <= cfg.horizon,
        "execute ({}) is longer than the head's chunk ({})",
        opts.execute,
        cfg.horizon
    );
    // A privileged head reads the true state and no image.
    let vision = match cfg.privileged {
        true => {
            eprintln!(
                "{}: a privileged head, fed the simulator's true state (a diagnostic; it cannot run on a robot)",
                names
            );
            None
        }
        false => Some(edgeflow_dinov2::VisionEncoder::new(
            edgeflow_dinov2::load(&edgeflow_dinov2::default_weights()?, &dev)?,
            edgeflow_vision::Preprocess::square(cfg.image_size),
            dev.clone(),
        )),
    };
    let text = edgeflow_minilm::Encoder::from_cache(&dev)?;
    let sim_cfg = PushConfig {
        episode_seconds: opts.episode_seconds,
        ..PushConfig::default()
    };
    let mut sim = PushSim::new(sim_cfg.clone())?;
    let mut expert = Expert::new(&sim_cfg);
    let labeller = Expert::new(&sim_cfg);
    let mut embeddings: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    let t0 = Instant::now();
    let mut outcomes = Vec::new();
    for seed in seeds(&mut sim, opts)? {
        // The expert first, on its own copy of the episode.
        expert.run_episode(&mut sim, seed, cfg.horizon, opts.execute, |_, _| {
            anyhow::Ok(())
        })?;
        let expert_success = sim.success();
        let info = sim.reset(seed);
        let start_distance = sim.true_state().goal_distance();
        let instruction = if opts.wrong_instruction {
            super::eval::wrong_instruction(&info.instruction)
        } else {
            info.instruction.clone()
        };
        let emb = match embeddings.get(&instruction) {
            Some(e) => e.clone(),
            None => {
                let e = text.embed(&instruction)?;
                embeddings.insert(instruction.clone(), e.clone());
                e
            }
        };
        let mut queue: VecDeque<[f32; 2]> = VecDeque::new();
        let mut commands: Vec<[f32; 2]> = Vec::new();
        let mut boundaries: Vec<usize> = Vec::new();
        let mut hold = sim.hold_action();
        // With `frame_age`: the frames of the last `frame_age + 1` steps,
        // oldest first.
        let mut frames: VecDeque<edgeflow_sim::Image> = VecDeque::new();
        let mut writer = match &opts.record {
            Some(dir) => Some(
                EpisodeWriter::create(dir.join(format!("episode_{seed:06}")), &info, &sim_cfg)?
                    .with_labels(cfg.horizon)?,
            ),
            None => None,
        };
        // One control step: the next queued action, or hold the last one;
        // recorded with the expert's label when recording.
        let mut step = |sim: &mut PushSim,
                        queue: &mut VecDeque<[f32; 2]>,
                        commands: &mut Vec<[f32; 2]>,
                        frames: &mut VecDeque<edgeflow_sim::Image>|
         -> anyhow::Result<()> {
            if let Some(a) = queue.pop_front() {
                hold = a;
            }
            if let Some(w) = writer.as_mut() {
                let truth = sim.true_state();
                let label = labeller.label(&truth, cfg.horizon);
                w.push_labelled(truth.time, &sim.render(), sim.robot_state(), hold, &label)?;
            }
            commands.push(hold);
            sim.step(hold);
            if opts.frame_age > 0 && vision.is_some() {
                frames.push_back(sim.render());
                while frames.len() > opts.frame_age + 1 {
                    frames.pop_front();
                }
            }
            Ok(())
        };
        while !sim.done() {
            let obs = match &vision {
                Some(vision) => {
                    let img = match frames.front() {
                        Some(old) => old.clone(),
                        None => sim.render(),
                    };
                    let rgb = edgeflow_vision::RgbImage::from_raw(img.width, img.height, img.rgb)
                        .context("frame size")?;
                    Observation {
                        vision: vision.tokens(&rgb)?.0,
                        instruction: emb.clone(),
                        state: sim.robot_state().to_vec(),
                    }
                }
                None => Observation {
                    vision: vec![0.0; cfg.vision_tokens() * cfg.vision_width()],
                    instruction: emb.clone(),
                    state: true_state_input(&cfg, &sim.true_state()),
                },
            };
            let ad = cfg.action_dim;
            let trace = if opts.trace {
                trace_line(&policy, &dev, &obs, &sim, &sim_cfg)?
            } else {
                String::new()
            };
            let (chunk, skip) = match opts.mode {
                Mode::Sync => {
                    let c = policy.chunk(&obs, &[], 0, || false)?;
                    queue.clear();
                    for _ in 0..opts.delay {
                        if sim.done() {
                            break;
                        }
                        step(&mut sim, &mut queue, &mut commands, &mut frames)?;
                    }
                    (c, 0)
                }
                Mode::Async | Mode::Rtc => {
                    let prefix: Vec<f32> = queue.iter().flatten().copied().collect();
                    let c = policy.chunk(&obs, &prefix, opts.delay, || false)?;
                    // The current chunk runs while the next is computed.
                    for _ in 0..opts.delay {
                        if sim.done() {
                            break;
                        }
                        step(&mut sim, &mut queue, &mut commands, &mut frames)?;
                    }
                    (c, opts.delay.min(cfg.horizon - 1))
                }
            };
            if opts.trace {
                let a = &chunk.actions;
                let last = a.len() / ad - 1;
                println!(
                    "{trace} | policy [{:.3},{:.3}] -> [{:.3},{:.3}]",
                    a[0],
                    a[1],
                    a[last * ad],
                    a[last * ad + 1]
                );
            }
            queue = chunk
                .actions
                .chunks(ad)
                .skip(skip)
                .map(|a| [a[0], a[1]])
                .collect();
            boundaries.push(commands.len());
            let run = match opts.mode {
                Mode::Sync => opts.execute,
                _ => opts.execute.saturating_sub(opts.delay).max(1),
            };
            for _ in 0..run {
                if sim.done() {
                    break;
                }
                step(&mut sim, &mut queue, &mut commands, &mut frames)?;
            }
        }
        if let Some(w) = writer {
            w.finish(sim.success())?;
        }
        let (boundary, elsewhere) = smoothness(&commands, &boundaries, 1.0 / sim_cfg.control_hz);
        let o = Outcome {
            seed,
            variant: info.variant.name(),
            success: sim.success(),
            expert_success,
            seconds: sim.true_state().time,
            start_distance,
            end_distance: sim.true_state().goal_distance(),
            boundary,
            elsewhere,
        };
        each(&o);
        outcomes.push(o);
    }
    Ok(Rollout {
        outcomes,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// Checkpoint paths as given, comma-separated (one head, or an ensemble).
pub(crate) fn names(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The seeds [`rollout`] runs: `opts.episodes` from `opts.seed`, or with
/// `opts.per_variant` the first seeds from there that give every goal
/// variant that many episodes.
fn seeds(sim: &mut PushSim, opts: &RolloutOptions) -> anyhow::Result<Vec<u64>> {
    let Some(n) = opts.per_variant else {
        return Ok((opts.seed..opts.seed + opts.episodes).collect());
    };
    anyhow::ensure!(n >= 1, "--per-variant must be at least 1");
    let variants = edgeflow_sim::Variant::ALL.len();
    let mut count: BTreeMap<String, u64> = BTreeMap::new();
    let mut out = Vec::new();
    // Variants are drawn uniformly per seed; the bound only stops a
    // simulator that never draws one of them.
    for seed in opts.seed..opts.seed + 100 * n * variants as u64 {
        if count.len() == variants && count.values().all(|&c| c >= n) {
            return Ok(out);
        }
        let c = count.entry(sim.reset(seed).variant.name()).or_default();
        if *c < n {
            *c += 1;
            out.push(seed);
        }
    }
    anyhow::bail!(
        "seeds {}.. did not give every goal variant {n} episodes: {count:?}",
        opts.seed
    )
}

/// One chunk's diagnostics: the step, the pusher, the named block and zone,
/// the head's first four keypoints (metres) beside the true red and blue
/// blocks and green and yellow zones they are trained to find (heads with
/// keypoints), and what the scripted expert would plan from the same state
/// (its first and last target).
fn trace_line(
    policy: &Policy,
    dev: &edgeflow_runtime::Device,
    obs: &Observation,
    sim: &PushSim,
    sim_cfg: &PushConfig,
) -> anyhow::Result<String> {
    let cfg = policy.config();
    let kp = if cfg.keypoints > 0 {
        let mut v = cfg.pool(&obs.vision)?;
        policy.head().normalizer().vision(cfg, &mut v);
        let t =
            edgeflow_runtime::Tensor::from_vec(v, &[1, cfg.vision_tokens(), cfg.vision_width()])?;
        policy.head().keypoints(dev, &t)?
    } else {
        Vec::new()
    };
    let ts = sim.true_state();
    let truth: Vec<[f32; 2]> = ts
        .blocks
        .iter()
        .map(|b| b.pos)
        .chain(ts.zones.iter().map(|z| z.pos))
        .collect();
    let (b, z) = (ts.goal_block().pos, ts.goal_zone().pos);
    let mut line = format!(
        "step {:>4} pusher [{:.3},{:.3}] block [{:.3},{:.3}] zone [{:.3},{:.3}]",
        ts.step, obs.state[0], obs.state[1], b[0], b[1], z[0], z[1]
    );
    if !kp.is_empty() {
        line += " keypoint/true";
    }
    let h = edgeflow_sim::TABLE_HALF;
    for (i, p) in truth.iter().enumerate().take(kp.len() / 2) {
        line += &format!(
            " [{:.3},{:.3}]/[{:.3},{:.3}]",
            kp[2 * i] * h,
            kp[2 * i + 1] * h,
            p[0],
            p[1]
        );
    }
    let plan = Expert::new(sim_cfg).chunk(&ts, cfg.horizon);
    if let (Some(a), Some(b)) = (plan.first(), plan.last()) {
        line += &format!(
            " | expert [{:.3},{:.3}] -> [{:.3},{:.3}]",
            a[0], a[1], b[0], b[1]
        );
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(per_variant: Option<u64>) -> RolloutOptions {
        RolloutOptions {
            seed: 100_000,
            episodes: 5,
            per_variant,
            execute: 8,
            flow_steps: 10,
            wrong_instruction: false,
            mode: Mode::Sync,
            delay: 0,
            frame_age: 0,
            temperature: 1.0,
            episode_seconds: 1.0,
            trace: false,
            record: None,
        }
    }

    #[test]
    fn per_variant_seeds_fill_every_variant_and_keep_their_order() {
        let mut sim = PushSim::new(PushConfig::default()).expect("sim");
        assert_eq!(
            seeds(&mut sim, &opts(None)).expect("seeds"),
            (100_000..100_005).collect::<Vec<_>>()
        );
        let s = seeds(&mut sim, &opts(Some(3))).expect("seeds");
        assert_eq!(s.len(), 3 * edgeflow_sim::Variant::ALL.len());
        assert!(s.windows(2).all(|w| w[0] < w[1]) && s[0] >= 100_000);
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for &seed in &s {
            *count.entry(sim.reset(seed).variant.name()).or_default() += 1;
        }
        assert!(count.values().all(|&c| c == 3), "{count:?}");
        // A skipped seed belongs to a variant that was already full.
        let last = *s.last().expect("some");
        for seed in (100_000..last).filter(|x| !s.contains(x)) {
            let v = sim.reset(seed).variant.name();
            let before = s
                .iter()
                .filter(|&&x| x < seed)
                .filter(|&&x| sim.reset(x).variant.name() == v);
            assert_eq!(before.count(), 3, "seed {seed} ({v}) skipped too early");
        }
        assert!(seeds(&mut sim, &opts(Some(0))).is_err());
    }
}
