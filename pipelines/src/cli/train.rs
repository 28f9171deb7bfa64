//! `edgeflow train policy`: train the flow-matching action head on
//! episodes recorded by `edgeflow sim push --record DIR`, with the frozen
//! DINOv2 vision encoder and MiniLM instruction encoder run once over the
//! recordings (features cached in memory) and the head trained by
//! `edgeflow_action::train`.

use anyhow::{bail, Context};
use edgeflow_action::config::{Arch, Config, Prediction};
use edgeflow_action::train::{plot::plot_loss, train, Dataset, EpisodeFeatures, TrainOptions};
use edgeflow_sim::record::EpisodeReader;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// What to train.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum TrainCommand {
    /// The action head (`action_head` stage) from recorded expert episodes.
    ///
    /// Record with the simulator and the expert pipeline, then train:
    ///   edgeflow sim push --listen tcp/127.0.0.1:7447 --episodes 100 --seed 1000
    ///     --record eps --wait-for edgeflow/alive/cmd &
    ///   edgeflow run pipelines/robot-expert.yaml
    ///   edgeflow train policy --episodes eps --out policy.safetensors
    /// The encoders come from the model cache (`edgeflow models fetch
    /// dinov2-vits14 minilm-l6`). DAgger rounds: let the head drive while
    /// the expert labels, then fine-tune on both:
    ///   edgeflow sim record --policy policy.safetensors --out dagger1
    ///   edgeflow train policy --episodes eps --episodes dagger1
    ///     --init policy.safetensors --out policy1.safetensors
    Policy(PolicyArgs),
}

/// `edgeflow train policy` options.
#[derive(Debug, clap::Args)]
pub(crate) struct PolicyArgs {
    /// Folder of recorded episodes (`episode_*/`, the simulator's format);
    /// repeat it to train on several (the expert's, then each DAgger
    /// round's from `edgeflow sim record --policy`).
    #[arg(long, required = true)]
    pub episodes: Vec<PathBuf>,
    /// Checkpoint to write (safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Optimiser steps.
    #[arg(long, default_value_t = 2000)]
    pub steps: usize,
    /// Seed of the weights, batches and noise.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Samples per step.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 5e-4)]
    pub lr: f64,
    /// Actions per chunk H.
    #[arg(long, default_value_t = 16)]
    pub horizon: usize,
    /// Encode every K-th frame (samples between see the newest encoded frame,
    /// as the 30 Hz camera is older than the 50 Hz state live).
    #[arg(long, default_value_t = 3)]
    pub frame_stride: usize,
    /// Vision encoder input side (the pipeline's vision_encoder image_size).
    #[arg(long, default_value_t = 112)]
    pub image_size: u32,
    /// Side of the head's vision token grid (the encoder's patch grid, 8 at
    /// 112 px, when the head uses keypoints).
    #[arg(long, default_value_t = 8)]
    pub vision_grid: usize,
    /// Patches per token side: 1 averages each bin of patches, k > 1
    /// stacks k x k patches into one token (the patch grid must then be
    /// exactly k * vision_grid: 8 x 8 at 112 px).
    #[arg(long, default_value_t = 1)]
    pub vision_stack: usize,
    /// Spatial-softmax keypoints the head reads from the patch grid (0: the
    /// patch tokens themselves). The first four are trained, beside the
    /// flow loss, to land on the red and blue blocks and the green and
    /// yellow zones, whose positions come from replaying each recorded
    /// episode in the simulator; the policy never sees them at run time.
    #[arg(long, default_value_t = 8)]
    pub keypoints: usize,
    /// Weight of that keypoint loss (0: keypoints learned from the flow
    /// loss alone).
    #[arg(long, default_value_t = 10.0)]
    pub keypoint_weight: f64,
    /// Each keypoint's token also carries the patch tokens under it
    /// (averaged with its softmax weights): how a block is turned, not only
    /// where it is.
    #[arg(long)]
    pub keypoint_features: bool,
    /// The first N keypoints (the red and blue blocks: at most 2) also read
    /// out how their block is turned, trained towards (cos 4a, sin 4a) of
    /// the block's angle from the replayed episode (0: off).
    #[arg(long, default_value_t = 0)]
    pub keypoint_angles: usize,
    /// Weight of that angle loss.
    #[arg(long, default_value_t = 1.0)]
    pub angle_weight: f64,
    /// Leave DINOv2's CLS token out (its slot reads zeros): the head sees
    /// the scene only through its keypoints.
    #[arg(long)]
    pub no_cls: bool,
    /// Feed the raw instruction embedding instead of standardising it per
    /// channel (how checkpoints were trained before `text_norm`).
    #[arg(long)]
    pub no_text_norm: bool,
    /// What the network predicts: `velocity` (the flow velocity, pi0's
    /// choice) or `sample` (the clean chunk; the sampler's velocity is
    /// derived from it, and the loss is the chunk's own error, which suits
    /// a deterministic expert).
    #[arg(long, default_value = "velocity", value_parser = parse_prediction)]
    pub prediction: Prediction,
    /// The network between the conditioning and the chunk: `transformer`
    /// (pi0's action expert, one token per action) or `mlp` (one MLP over
    /// the whole chunk, 3 layers 512 wide unless --layers / --mlp-dim say
    /// otherwise; it fits the expert far more closely per step).
    #[arg(long, default_value = "transformer", value_parser = parse_arch)]
    pub arch: Arch,
    /// Transformer blocks or MLP layers (default: 4 blocks, 3 layers).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Hidden width of each block's MLP or of each MLP layer (default: 384
    /// in a transformer, 512 in an MLP).
    #[arg(long)]
    pub mlp_dim: Option<usize>,
    /// Robot state values the head reads: 2 = the pusher's position only, 4 =
    /// position and velocity. With the velocity in its input the head learns
    /// to continue the pusher's current motion (the recorded actions follow
    /// it closely) instead of reading the scene, and stalls in closed loop
    /// (the "copycat" failure of behaviour cloning).
    #[arg(long, default_value_t = 2)]
    pub state_dim: usize,
    /// Train a diagnostic head on the simulator's true state (robot, blocks,
    /// zones: what perfect perception would give) instead of the camera:
    /// if it cannot follow the expert either, the fault is in imitation,
    /// not perception. The vision options are then ignored; `--state-dim 2`
    /// (the default) leaves the pusher's velocity out of the true state as
    /// it does out of the robot state, 4 keeps it. `edgeflow eval policy`
    /// feeds such a head the true state. It cannot run on a robot.
    #[arg(long)]
    pub privileged: bool,
    /// With --privileged: give the blocks' and zones' positions relative
    /// to the pusher (the head's `privileged_relative`).
    #[arg(long, requires = "privileged")]
    pub relative: bool,
    /// Longest frozen prefix trained (real-time chunking), in actions;
    /// default half the horizon. A head run live with a longer inference
    /// delay than this (in control periods) freezes only this many.
    #[arg(long)]
    pub max_prefix: Option<usize>,
    /// Train on camera frames up to this many control periods older than
    /// the robot state (uniformly 0..=N), as they are live, where the
    /// camera and the vision encoder lag the state.
    #[arg(long, default_value_t = 0)]
    pub frame_age: usize,
    /// Fraction of training samples with no frozen prefix (the rest train
    /// real-time chunking's inpainting of a frozen prefix).
    #[arg(long, default_value_t = 0.5)]
    pub unprefixed: f64,
    /// Add the instruction and state tokens to every action token (see the
    /// action head's `condition_actions`).
    #[arg(long)]
    pub condition_actions: bool,
    /// Training flow times: `uniform` in (0, 1), or `pi0` (Beta(1.5, 1)
    /// towards the noise, none within 0.001 of the data, as pi0 trains).
    #[arg(long, default_value = "uniform", value_parser = parse_flow_times)]
    pub flow_times: edgeflow_action::train::FlowTimes,
    /// Use failed episodes too (default: successful ones only).
    #[arg(long)]
    pub include_failed: bool,
    /// Cache of the encoded features: reused when it was made from the
    /// same episodes with the same encoder settings, written otherwise
    /// (encoding is most of a short run's time). One per --episodes
    /// folder, in the same order, when several are given.
    #[arg(long)]
    pub features: Vec<PathBuf>,
    /// After training, roll the checkpoint out in closed loop for this many
    /// held-out seeds (from 100000) in simulated time and print its success
    /// rate beside the expert's (`edgeflow eval policy` does the same).
    #[arg(long, default_value_t = 0)]
    pub eval_seeds: u64,
    /// Loss curve PNG (default: OUT with extension .png).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Fine-tune this checkpoint (its weights, normaliser and shape; the
    /// shape options are then ignored) instead of training fresh weights.
    #[arg(long)]
    pub init: Option<PathBuf>,
    /// Write an exponential moving average of the weights (decay per step,
    /// 0: none; 0.999 averages about the last 1000 steps) as OUT, and the
    /// last step's own weights beside it as OUT with extension
    /// `raw.safetensors`, so the two can be compared.
    #[arg(long, default_value_t = 0.0)]
    pub ema_decay: f64,
}

/// Keep freed memory in the process while training. Every training step
/// allocates and frees the same few-megabyte tensors; glibc by default
/// serves blocks that size with fresh mmaps and trims the heap top back to
/// the kernel, so each step page-faults its memory in again (and, on
/// several cores, flushes other cores' TLBs). A fixed 32 MB mmap threshold
/// and a 1 GB trim threshold let the heap reuse them: 200 steps of a
/// privileged head at batch 64 took 23-25 s instead of 50-54 s (runs
/// interleaved with a build without this call) on a 2-core AMD EPYC
/// (Zen 4). The cost is up to 1 GB of freed memory kept until exit.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets glibc allocator tunables, under glibc's own
    // lock; it takes no pointers and is valid at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// Run a trainer.
pub(super) fn run(c: TrainCommand) -> anyhow::Result<ExitCode> {
    let TrainCommand::Policy(a) = c;
    keep_freed_memory();
    let s = train_policy(&a, |p| {
        let kp = p.keypoint_rmse.map_or(String::new(), |e| {
            format!(
                " keypoint rmse {:.1} cm",
                e * edgeflow_sim::TABLE_HALF * 100.0
            )
        });
        let ang = p
            .angle_rmse
            .map_or(String::new(), |e| format!(" angle rmse {e:.3}"));
        println!(
            "step {:>6}/{} loss {:.4}{kp}{ang} lr {:.2e} {:>6.0} s",
            p.step, p.steps, p.loss, p.lr, p.seconds
        );
    })?;
    println!(
        "trained {} steps in {:.0} s: loss {:.4} -> {:.4} (mean of the first / last 100 steps); \
         wrote {} and {} (x: steps 0..{}, 10 ticks; y: log10 loss {}..{}, a long tick per decade)",
        s.steps,
        s.seconds,
        s.first_loss,
        s.last_loss,
        a.out.display(),
        s.plot.display(),
        s.steps,
        s.y_decades.0,
        s.y_decades.1
    );
    if a.eval_seeds > 0 {
        let opts = super::rollout::RolloutOptions {
            frame_age: 0,
            seed: 100_000,
            episodes: a.eval_seeds,
            per_variant: None,
            execute: (a.horizon / 2).max(1),
            flow_steps: 10,
            wrong_instruction: false,
            mode: super::rollout::Mode::Sync,
            delay: 0,
            temperature: 1.0,
            episode_seconds: 20.0,
            trace: false,
            record: None,
        };
        let r = super::rollout::rollout(std::slice::from_ref(&a.out), &opts, |_| {})?;
        println!(
            "closed loop, seeds 100000..{}: {}",
            100_000 + a.eval_seeds,
            r.summary()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What a training run did.
#[derive(Debug)]
struct Summary {
    steps: usize,
    seconds: f64,
    first_loss: f32,
    last_loss: f32,
    plot: PathBuf,
    y_decades: (i32, i32),
}

/// Encode the episodes, train, write the checkpoint and the plot.
fn train_policy(
    a: &PolicyArgs,
    progress: impl FnMut(&edgeflow_action::train::Progress),
) -> anyhow::Result<Summary> {
    if !matches!(a.state_dim, 2 | 4) {
        bail!(
            "--state-dim {}: the robot state is x, y, vx, vy; give 2 (position) or 4 (with velocity)",
            a.state_dim
        );
    }
    let cfg = match &a.init {
        Some(p) => {
            let c =
                Config::from_checkpoint(p).with_context(|| format!("--init {}", p.display()))?;
            eprintln!(
                "fine-tuning {}: its shape (horizon {}, keypoints {}, image {} px) replaces the shape options",
                p.display(),
                c.horizon,
                c.keypoints,
                c.image_size
            );
            c
        }
        None => shape_config(a),
    };
    cfg.validate()?;
    if a.frame_stride == 0 {
        bail!("--frame-stride must be at least 1");
    }
    if !a.features.is_empty() && a.features.len() != a.episodes.len() {
        bail!(
            "{} --features for {} --episodes: give one cache per episode folder, in the same order, or none",
            a.features.len(),
            a.episodes.len()
        );
    }
    let t0 = Instant::now();
    let mut data = Dataset::default();
    for (k, dir) in a.episodes.iter().enumerate() {
        let episodes = list_episodes(dir)?;
        let key = serde_json::json!({
            "image_size": cfg.image_size,
            "vision_grid": cfg.vision_grid,
            "vision_stack": cfg.vision_stack,
            "frame_stride": a.frame_stride,
            "keypoint_targets": "blocks red, blue; zones green, yellow; v1",
            "angle_targets": "blocks red, blue: cos 4a, sin 4a; v1",
            "labels": cfg.horizon,
            "include_failed": a.include_failed,
            // The true state's layout, when the cache holds it.
            "privileged": cfg.privileged.then_some(if cfg.privileged_relative {
                "pusher x, y; blocks and zones relative to it; pusher vx, vy; v2"
            } else {
                "pusher x, y; blocks; zones; pusher vx, vy; v2"
            }),
            "episodes": episodes
                .iter()
                .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()).display().to_string())
                .collect::<Vec<_>>(),
        })
        .to_string();
        let cache = a.features.get(k);
        let cached = match cache {
            Some(f) => Dataset::load(f, &key)?,
            None => None,
        };
        let d = match (cached, cache) {
            (Some(d), Some(f)) => {
                eprintln!("features: reusing {}", f.display());
                d
            }
            _ => {
                let d = encode_episodes(&episodes, &cfg, a)?;
                if let Some(f) = cache {
                    d.save(f, &key)?;
                }
                d
            }
        };
        data.episodes.extend(d.episodes);
    }
    eprintln!(
        "features: {} episodes, {} samples, {:.0} s",
        data.episodes.len(),
        data.samples(&cfg),
        t0.elapsed().as_secs_f64()
    );
    // The cache keeps every recorded state value; the head reads the first
    // state_dim of each row.
    for e in &mut data.episodes {
        let w = e.states.len() / (e.actions.len() / cfg.action_dim).max(1);
        if w > cfg.state_dim {
            e.states = e
                .states
                .chunks(w)
                .flat_map(|r| r[..cfg.state_dim].iter().copied())
                .collect();
        }
        // Likewise every keypoint target: the head pulls its first
        // `keypoints` towards the first targets (none without keypoints).
        let k = 2 * cfg.keypoints;
        for t in &mut e.frame_targets {
            t.truncate(k);
        }
        if k == 0 {
            e.frame_targets.clear();
        }
        // Only the blocks have an angle.
        for t in &mut e.frame_angles {
            t.truncate(2 * cfg.keypoint_angles);
        }
    }
    let opts = TrainOptions {
        config: cfg,
        steps: a.steps,
        batch: a.batch,
        lr: a.lr,
        seed: a.seed,
        unprefixed: a.unprefixed,
        frame_age: a.frame_age,
        flow_times: a.flow_times,
        keypoint_weight: a.keypoint_weight,
        angle_weight: a.angle_weight,
        init: a.init.clone(),
        ema_decay: a.ema_decay,
        ..TrainOptions::default()
    };
    let trained = train(&data, &opts, progress)?;
    trained.save(&a.out)?;
    let raw = raw_path(&a.out);
    if trained.save_raw(&raw)? {
        eprintln!(
            "wrote the weight average (decay {}) as {} and the last step's weights as {}",
            a.ema_decay,
            a.out.display(),
            raw.display()
        );
    }
    let plot = a
        .plot
        .clone()
        .unwrap_or_else(|| a.out.with_extension("png"));
    let info = plot_loss(&trained.losses, &plot)?;
    let (first_loss, last_loss) = trained.loss_drop(100);
    Ok(Summary {
        steps: trained.losses.len(),
        seconds: trained.seconds,
        first_loss,
        last_loss,
        plot,
        y_decades: (info.y_min_decade, info.y_max_decade),
    })
}

/// Where `--ema-decay` writes the last step's own weights: OUT with
/// extension `raw.safetensors`.
fn raw_path(out: &Path) -> PathBuf {
    out.with_extension("raw.safetensors")
}

fn parse_flow_times(s: &str) -> Result<edgeflow_action::train::FlowTimes, String> {
    use edgeflow_action::train::FlowTimes;
    match s {
        "uniform" => Ok(FlowTimes::Uniform),
        "pi0" => Ok(FlowTimes::Pi0),
        _ => Err(format!("`{s}`: expected uniform or pi0")),
    }
}

fn parse_arch(s: &str) -> Result<Arch, String> {
    match s {
        "transformer" => Ok(Arch::Transformer),
        "mlp" => Ok(Arch::Mlp),
        _ => Err(format!("`{s}`: give `transformer` or `mlp`")),
    }
}

fn parse_prediction(s: &str) -> Result<Prediction, String> {
    match s {
        "velocity" => Ok(Prediction::Velocity),
        "sample" => Ok(Prediction::Sample),
        _ => Err(format!("`{s}`: give `velocity` or `sample`")),
    }
}

/// The head's shape from the shape options.
fn shape_config(a: &PolicyArgs) -> Config {
    let c = Config {
        horizon: a.horizon,
        vision_grid: a.vision_grid,
        vision_stack: a.vision_stack,
        keypoints: a.keypoints,
        keypoint_features: a.keypoint_features,
        keypoint_angles: a.keypoint_angles,
        cls_token: !a.no_cls,
        text_norm: !a.no_text_norm,
        prediction: a.prediction,
        arch: a.arch,
        n_layers: a.layers.unwrap_or(match a.arch {
            Arch::Transformer => Config::default().n_layers,
            Arch::Mlp => 3,
        }),
        mlp_dim: a.mlp_dim.unwrap_or(match a.arch {
            Arch::Transformer => Config::default().mlp_dim,
            Arch::Mlp => 512,
        }),
        condition_actions: a.condition_actions,
        state_dim: a.state_dim,
        image_size: a.image_size,
        max_prefix: a
            .max_prefix
            .unwrap_or((a.horizon / 2).max(1).min(a.horizon.saturating_sub(1))),
        ..Config::default()
    };
    if !a.privileged {
        return c;
    }
    // No image: the CLS slot and one zero vision token, unscaled.
    Config {
        privileged: true,
        privileged_relative: a.relative,
        // The velocity comes last in the true state: reading all but its
        // two values leaves it out.
        state_dim: edgeflow_sim::PRIVILEGED_DIM - (4 - a.state_dim),
        vision_grid: 1,
        vision_stack: 1,
        vision_norm: false,
        keypoints: 0,
        keypoint_features: false,
        keypoint_angles: 0,
        cls_token: true,
        ..c
    }
}

fn list_episodes(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("episode_"))
        })
        .collect();
    v.sort();
    if v.is_empty() {
        bail!(
            "{}: no episode_* folders; record some with `edgeflow sim push --record {}`",
            dir.display(),
            dir.display()
        );
    }
    Ok(v)
}

/// Where the first four keypoints should be for a state: the red and blue
/// blocks' and the green and yellow zones' centres, in the keypoints'
/// coordinates (the camera sees exactly the table: metres / TABLE_HALF).
fn keypoint_targets(s: &edgeflow_sim::TrueState) -> Vec<f32> {
    let h = edgeflow_sim::TABLE_HALF;
    s.blocks
        .iter()
        .map(|b| b.pos)
        .chain(s.zones.iter().map(|z| z.pos))
        .flat_map(|p| [p[0] / h, p[1] / h])
        .collect()
}

/// How each block (red, blue) is turned, as the angle read-out is trained
/// to give it: `(cos 4a, sin 4a)`, the same for every quarter turn, as the
/// square looks in the image.
fn angle_targets(s: &edgeflow_sim::TrueState) -> Vec<f32> {
    s.blocks
        .iter()
        .flat_map(|b| [(4.0 * b.angle).cos(), (4.0 * b.angle).sin()])
        .collect()
}

fn encode_episodes(paths: &[PathBuf], cfg: &Config, a: &PolicyArgs) -> anyhow::Result<Dataset> {
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu)?;
    // A privileged head sees no image: no vision encoder.
    let vision = match cfg.privileged {
        true => None,
        false => Some(edgeflow_dinov2::VisionEncoder::new(
            edgeflow_dinov2::load(&edgeflow_dinov2::default_weights()?, &dev)?,
            edgeflow_vision::Preprocess::square(cfg.image_size),
            dev.clone(),
        )),
    };
    let text = edgeflow_minilm::Encoder::from_cache(&dev)?;
    let mut instructions: HashMap<String, Vec<f32>> = HashMap::new();
    let mut ds = Dataset::default();
    let mut skipped = 0;
    for (k, p) in paths.iter().enumerate() {
        let r = EpisodeReader::open(p).with_context(|| format!("episode {}", p.display()))?;
        let meta = r.meta().clone();
        // A labelled (DAgger) episode teaches from wherever the policy
        // went, failed or not: that is its point.
        if !meta.success && !a.include_failed && meta.labels.is_none() {
            skipped += 1;
            continue;
        }
        let instruction = match instructions.get(&meta.instruction) {
            Some(v) => v.clone(),
            None => {
                let v = text.embed(&meta.instruction)?;
                instructions.insert(meta.instruction.clone(), v.clone());
                v
            }
        };
        let mut frames = Vec::new();
        let steps: Vec<u64> = (0..r.len()).step_by(a.frame_stride).collect();
        let sim_cfg = edgeflow_sim::PushConfig {
            control_hz: meta.control_hz,
            physics_hz: meta.physics_hz,
            ..edgeflow_sim::PushConfig::default()
        };
        let truth = r
            .true_states(&sim_cfg)
            .with_context(|| format!("replaying {} for keypoint targets", p.display()))?;
        let (frame_targets, frame_angles, states) = match vision {
            // One all-zero frame; the state is the true state.
            None => {
                frames.push((0, vec![0.0; cfg.vision_tokens() * cfg.vision_width()]));
                (
                    Vec::new(),
                    Vec::new(),
                    truth
                        .iter()
                        .flat_map(|t| super::rollout::true_state_input(cfg, t))
                        .collect(),
                )
            }
            Some(_) => (
                steps
                    .iter()
                    .map(|&i| keypoint_targets(&truth[i as usize]))
                    .collect(),
                steps
                    .iter()
                    .map(|&i| angle_targets(&truth[i as usize]))
                    .collect(),
                r.states()?.concat(),
            ),
        };
        // Several frames per forward pass: larger products, faster per
        // frame (a privileged head has none).
        if let Some(vision) = &vision {
            for batch in steps.chunks(16) {
                let imgs = batch
                    .iter()
                    .map(|&i| {
                        let img = r.frame(i)?;
                        edgeflow_vision::RgbImage::from_raw(img.width, img.height, img.rgb)
                            .context("frame size")
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let (tokens, gh, gw) = vision.tokens_batch(&imgs)?;
                if gh != gw {
                    bail!(
                        "{}: a {gh}x{gw} patch grid; the head takes square grids",
                        p.display()
                    );
                }
                for (&i, t) in batch.iter().zip(&tokens) {
                    frames.push((i as usize, cfg.pool(t)?));
                }
            }
        }
        ds.episodes.push(EpisodeFeatures {
            instruction,
            frames,
            frame_targets,
            frame_angles,
            states,
            actions: r.actions()?.concat(),
            labels: match r.labels()? {
                None => Vec::new(),
                Some((h, v)) if h == cfg.horizon => v,
                Some((h, _)) => bail!(
                    "{}: labelled with {h}-target chunks, the head's horizon is {}; record it with --horizon {}",
                    p.display(),
                    cfg.horizon,
                    cfg.horizon
                ),
            },
        });
        eprintln!(
            "encoded {}/{} {} ({} steps)",
            k + 1,
            paths.len(),
            p.display(),
            r.len()
        );
    }
    if skipped > 0 {
        eprintln!("skipped {skipped} failed episodes (--include-failed keeps them)");
    }
    Ok(ds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeflow_action::policy::{Observation, Policy, RtcMode};
    use edgeflow_sim::record::EpisodeWriter;
    use edgeflow_sim::{Expert, PushConfig, PushSim};

    /// A chunk from DINOv2 tokens at 56 px (1 + 4 x 4 of 384, pooled to
    /// 2 x 2 inside): 16 actions of 2 values.
    fn chunk_of_32(p: &mut Policy) {
        let c = p
            .chunk(
                &Observation {
                    vision: vec![0.1; 17 * 384],
                    instruction: vec![0.05; 384],
                    state: vec![0.0; 4],
                },
                &[],
                0,
                || false,
            )
            .expect("chunk");
        assert_eq!(c.actions.len(), 32);
    }

    /// Needs the encoders in the model cache (`edgeflow models fetch
    /// dinov2-vits14 minilm-l6`).
    #[test]
    fn train_policy_encodes_recorded_episodes_and_writes_a_loadable_head() {
        let dir = tempfile::tempdir().expect("tmp");
        let eps = dir.path().join("eps");
        let cfg = PushConfig::default();
        let mut sim = PushSim::new(cfg.clone()).expect("sim");
        let mut expert = Expert::new(&cfg);
        for seed in 0..2 {
            let info = sim.reset(seed);
            expert.reset();
            let mut w = EpisodeWriter::create(eps.join(format!("episode_{seed:06}")), &info, &cfg)
                .expect("writer");
            for _ in 0..40 {
                for target in expert.chunk(&sim.true_state(), 8) {
                    w.push(
                        sim.true_state().time,
                        &sim.render(),
                        sim.robot_state(),
                        target,
                    )
                    .expect("push");
                    sim.step(target);
                }
            }
            w.finish(false).expect("finish");
        }
        let a = PolicyArgs {
            episodes: vec![eps],
            out: dir.path().join("head.safetensors"),
            steps: 20,
            seed: 0,
            batch: 8,
            lr: 1e-3,
            horizon: 16,
            frame_stride: 40,
            image_size: 56,
            vision_grid: 4,
            vision_stack: 1,
            keypoints: 4,
            keypoint_weight: 10.0,
            keypoint_features: false,
            keypoint_angles: 0,
            angle_weight: 1.0,
            no_cls: false,
            no_text_norm: false,
            prediction: Prediction::Velocity,
            arch: Arch::Transformer,
            layers: None,
            mlp_dim: None,
            state_dim: 2,
            privileged: false,
            relative: false,
            max_prefix: None,
            frame_age: 0,
            unprefixed: 0.5,
            flow_times: edgeflow_action::train::FlowTimes::Pi0,
            condition_actions: true,
            include_failed: true,
            features: vec![dir.path().join("features.safetensors")],
            eval_seeds: 0,
            plot: None,
            init: None,
            ema_decay: 0.0,
        };
        let mut logs = 0;
        let s = train_policy(&a, |_| logs += 1).expect("train");
        assert_eq!((s.steps, logs), (20, 1));
        assert!(s.first_loss.is_finite() && s.last_loss.is_finite());
        assert!(s.plot.is_file());
        let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu");
        let mut p = Policy::load(&a.out, &dev, 10, RtcMode::Prefix, 0).expect("load");
        assert_eq!(p.config().image_size, 56);
        assert!(p.config().text_norm && p.config().keypoints == 4);
        chunk_of_32(&mut p);
        // The same cached features (keypoint targets included) train a head
        // without keypoints and with the raw instruction embedding.
        let b = PolicyArgs {
            out: dir.path().join("plain.safetensors"),
            keypoints: 0,
            no_text_norm: true,
            ..a
        };
        train_policy(&b, |_| {}).expect("train without keypoints");
        assert!(
            !raw_path(&b.out).exists(),
            "raw weights without --ema-decay"
        );
        let p = Policy::load(&b.out, &dev, 10, RtcMode::Prefix, 0).expect("load");
        assert!(!p.config().text_norm && p.config().keypoints == 0);
        // An MLP head on keypoints, 2 layers 64 wide.
        let m = PolicyArgs {
            out: dir.path().join("mlp.safetensors"),
            keypoints: 4,
            arch: Arch::Mlp,
            layers: Some(2),
            mlp_dim: Some(64),
            max_prefix: Some(12),
            frame_age: 6,
            condition_actions: false,
            prediction: Prediction::Sample,
            ema_decay: 0.9,
            keypoint_features: true,
            // The blocks' angle read-outs, trained from the cached
            // angle targets.
            keypoint_angles: 2,
            // The scene through the keypoints alone.
            no_cls: true,
            ..b
        };
        train_policy(&m, |_| {}).expect("train an mlp");
        // The weight average as OUT, the last step's weights beside it:
        // both load, and they differ.
        let raw = raw_path(&m.out);
        assert_eq!(
            raw.file_name().and_then(|n| n.to_str()),
            Some("mlp.raw.safetensors")
        );
        Policy::load(&raw, &dev, 10, RtcMode::Prefix, 0).expect("load the raw weights");
        assert_ne!(
            std::fs::read(&raw).expect("raw"),
            std::fs::read(&m.out).expect("avg")
        );
        let mut p = Policy::load(&m.out, &dev, 10, RtcMode::Prefix, 0).expect("load");
        let mc = p.config();
        assert!(mc.arch == Arch::Mlp && (mc.n_layers, mc.mlp_dim) == (2, 64));
        assert!(mc.keypoint_features && mc.keypoint_angles == 2 && !mc.cls_token);
        assert_eq!((mc.max_prefix, p.config().horizon), (12, 16));
        chunk_of_32(&mut p);
        // A privileged MLP head from the same recordings: the true state,
        // no image (and no vision encoder), then driven in closed loop by
        // the true state.
        let c = PolicyArgs {
            out: dir.path().join("privileged.safetensors"),
            privileged: true,
            relative: true,
            keypoints: 0,
            features: Vec::new(),
            layers: None,
            mlp_dim: None,
            ..m
        };
        train_policy(&c, |_| {}).expect("train privileged");
        let p = Policy::load(&c.out, &dev, 10, RtcMode::Prefix, 0).expect("load");
        let pc = p.config();
        assert!(pc.privileged && pc.privileged_relative && pc.keypoints == 0 && !pc.vision_norm);
        assert_eq!((pc.n_layers, pc.mlp_dim), (3, 512));
        // --state-dim 2: the true state without the pusher's velocity.
        assert_eq!(pc.state_dim, edgeflow_sim::PRIVILEGED_DIM - 2);
        let opts = super::super::rollout::RolloutOptions {
            frame_age: 0,
            seed: 100_000,
            episodes: 1,
            execute: 8,
            per_variant: None,
            flow_steps: 2,
            wrong_instruction: false,
            mode: super::super::rollout::Mode::Sync,
            delay: 0,
            temperature: 1.0,
            episode_seconds: 0.5,
            trace: true,
            record: None,
        };
        let r = super::super::rollout::rollout(std::slice::from_ref(&c.out), &opts, |_| {})
            .expect("rollout");
        assert_eq!(r.outcomes.len(), 1);
        assert!((r.outcomes[0].seconds - 0.5).abs() < 0.03);
        // The camera head in closed loop on frames 3 periods old, with
        // real-time chunking at a delay of 2.
        let aged = super::super::rollout::RolloutOptions {
            frame_age: 3,
            mode: super::super::rollout::Mode::Rtc,
            delay: 2,
            trace: false,
            ..opts
        };
        let r = super::super::rollout::rollout(std::slice::from_ref(&m.out), &aged, |_| {})
            .expect("aged rollout");
        assert_eq!(r.outcomes.len(), 1);
        assert!((r.outcomes[0].seconds - 0.5).abs() < 0.03);
    }
}
