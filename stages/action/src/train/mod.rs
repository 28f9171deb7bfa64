//! Training the head with candle's autograd and AdamW (see
//! [`train`]): flow matching with a random frozen prefix per sample
//! (real-time chunking, training-time variant), a fixed seed, the loss of
//! every step kept for the curve ([`plot::plot_loss`]).

mod data;
mod net;
pub mod plot;

pub use data::{Dataset, EpisodeFeatures};
pub use net::{write_checkpoint, Conditioned, TrainNet};

use crate::config::{Config, Normalizer, Prediction};
use crate::rng::Rng;
use crate::{Error, Result};
use candle_nn::Optimizer;
use std::path::Path;
use std::time::Instant;

/// Training settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOptions {
    /// The head's shape.
    pub config: Config,
    /// Optimiser steps.
    pub steps: usize,
    /// Samples per step.
    pub batch: usize,
    /// Peak learning rate (linear warm-up, then cosine to 10 %).
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Seed of the weights, batches, noise and flow times.
    pub seed: u64,
    /// Fraction of samples trained with no frozen prefix; the others freeze
    /// `d ~ U{1..=max_prefix}` actions (real-time chunking). A frozen prefix
    /// shows the head the motion in progress, which it can continue without
    /// looking at the scene (the copycat shortcut); a chunk from nothing
    /// must come from the observation, and it is what synchronous execution
    /// and every first chunk ask for.
    pub unprefixed: f64,
    /// Each sample sees the newest frame at or before `step - age`, with
    /// `age ~ U{0..=frame_age}` control periods, beside the state at
    /// `step`: live, the camera and the vision encoder lag the robot state
    /// by several periods, and a head trained only on fresh frames reads
    /// a stale frame as a different scene. 0: the newest frame.
    pub frame_age: usize,
    /// How flow times are drawn for training.
    pub flow_times: FlowTimes,
    /// Weight of the auxiliary keypoint loss (mean squared error of the
    /// first keypoints against the episodes' `frame_targets`, in keypoint
    /// coordinates) beside the flow loss. Used when the config has
    /// keypoints and the data has targets.
    pub keypoint_weight: f64,
    /// Weight of the auxiliary angle loss (mean squared error of the
    /// angle read-outs against the episodes' `frame_angles`) beside the
    /// flow loss. Used when the config has `keypoint_angles`.
    pub angle_weight: f64,
    /// Decay of an exponential moving average of the weights (0: none).
    /// With it, the trained head is the average (each step
    /// `ema = d ema + (1 - d) w`, with `d = min(ema_decay, (1 + step) /
    /// (10 + step))` so early steps are not held back by the fresh
    /// weights), as diffusion and flow policies are usually evaluated: one
    /// step's weights carry that step's batch noise, which a closed loop
    /// amplifies. [`Trained::raw`] keeps the last step's own weights.
    pub ema_decay: f64,
    /// Report progress every this many steps.
    pub log_every: usize,
    /// Start from this checkpoint's weights and normaliser instead of
    /// fresh weights and a normaliser fitted on the data (fine-tuning, as
    /// each DAgger round does on the grown dataset). Its config must equal
    /// `config`.
    pub init: Option<std::path::PathBuf>,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            config: Config::default(),
            steps: 2000,
            batch: 32,
            lr: 5e-4,
            warmup: 100,
            weight_decay: 0.01,
            seed: 0,
            unprefixed: 0.5,
            frame_age: 0,
            flow_times: FlowTimes::default(),
            keypoint_weight: 10.0,
            angle_weight: 1.0,
            ema_decay: 0.0,
            log_every: 50,
            init: None,
        }
    }
}

impl TrainOptions {
    /// Check the settings.
    pub fn validate(&self) -> Result<()> {
        self.config.validate()?;
        if self.steps == 0 || self.batch == 0 || self.batch > 4096 {
            return Err(Error::Config(format!(
                "steps ({}) must be > 0 and batch ({}) in 1..=4096",
                self.steps, self.batch
            )));
        }
        if !(0.0..=1.0).contains(&self.unprefixed) {
            return Err(Error::Config(format!(
                "unprefixed ({}) must be a fraction in [0, 1]",
                self.unprefixed
            )));
        }
        if !(self.keypoint_weight.is_finite() && self.keypoint_weight >= 0.0) {
            return Err(Error::Config(format!(
                "keypoint_weight ({}) must be finite and >= 0",
                self.keypoint_weight
            )));
        }
        if !(self.angle_weight.is_finite() && self.angle_weight >= 0.0) {
            return Err(Error::Config(format!(
                "angle_weight ({}) must be finite and >= 0",
                self.angle_weight
            )));
        }
        if !(0.0..1.0).contains(&self.ema_decay) {
            return Err(Error::Config(format!(
                "ema_decay ({}) must be in [0, 1) (0: no weight average; 0.999 averages about the last 1000 steps)",
                self.ema_decay
            )));
        }
        if !(self.lr > 0.0 && self.lr < 1.0 && (0.0..1.0).contains(&self.weight_decay)) {
            return Err(Error::Config(format!(
                "lr ({}) must be in (0, 1) and weight_decay ({}) in [0, 1)",
                self.lr, self.weight_decay
            )));
        }
        Ok(())
    }

    /// The learning rate at `step`.
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let span = (self.steps - self.warmup.min(self.steps)).max(1) as f64;
        let p = ((step - self.warmup) as f64 / span).min(1.0);
        self.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
    }
}

/// The distribution of training flow times (`t = 0` noise, `t = 1` the
/// chunk).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FlowTimes {
    /// `t ~ U(0, 1)`.
    #[default]
    Uniform,
    /// pi0's: `t = 0.999 (1 - y)` with `y ~ Beta(1.5, 1)`: more of the
    /// noisy times, where the chunk must come from the observation alone,
    /// and none within 0.001 of the data.
    Pi0,
}

impl FlowTimes {
    /// One flow time from `rng`.
    fn draw(self, rng: &mut Rng) -> f32 {
        match self {
            FlowTimes::Uniform => rng.uniform(),
            // Beta(a, 1) by inversion: y = u^(1/a).
            FlowTimes::Pi0 => 0.999 * (1.0 - rng.uniform().powf(1.0 / 1.5)),
        }
    }
}

/// Progress after a logging window.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Steps done.
    pub step: usize,
    /// Of.
    pub steps: usize,
    /// Mean loss over the window (flow plus weighted keypoint loss).
    pub loss: f32,
    /// Root mean squared keypoint error over the window, keypoint
    /// coordinates (`None` without keypoint supervision).
    pub keypoint_rmse: Option<f32>,
    /// Root mean squared error of the angle read-outs over the window, in
    /// `(cos 4a, sin 4a)` units (`None` without them).
    pub angle_rmse: Option<f32>,
    /// Learning rate of the last step.
    pub lr: f64,
    /// Seconds since training began.
    pub seconds: f64,
}

/// The outcome of [`train`].
#[derive(Debug)]
pub struct Trained {
    /// The trained network: with [`TrainOptions::ema_decay`], the moving
    /// average of its weights.
    pub net: TrainNet,
    /// With [`TrainOptions::ema_decay`]: the last step's own weights.
    pub raw: Option<TrainNet>,
    /// The normalisation fitted on the data.
    pub norm: Normalizer,
    /// Loss of every step.
    pub losses: Vec<f32>,
    /// Wall time, seconds.
    pub seconds: f64,
}

impl Trained {
    /// Write the checkpoint (safetensors; loads with
    /// [`crate::policy::Policy::load`]).
    pub fn save(&self, path: &Path) -> Result<()> {
        self.net.save(&self.norm, path)
    }

    /// Write the last step's own weights (with a moving average; `false`
    /// and nothing written without one).
    pub fn save_raw(&self, path: &Path) -> Result<bool> {
        match &self.raw {
            Some(raw) => raw.save(&self.norm, path).map(|()| true),
            None => Ok(false),
        }
    }

    /// Mean loss of the first and the last `n` steps.
    pub fn loss_drop(&self, n: usize) -> (f32, f32) {
        let n = n.clamp(1, self.losses.len().max(1));
        let mean = |s: &[f32]| s.iter().sum::<f32>() / s.len().max(1) as f32;
        (
            mean(&self.losses[..n.min(self.losses.len())]),
            mean(&self.losses[self.losses.len().saturating_sub(n)..]),
        )
    }
}

/// One batch, host-side.
struct Batch {
    vision: Vec<f32>,
    text: Vec<f32>,
    state: Vec<f32>,
    x: Vec<f32>,
    times: Vec<f32>,
    target: Vec<f32>,
    mask: Vec<f32>,
    keypoint_target: Vec<f32>,
    angle_target: Vec<f32>,
    origin: Vec<f32>,
}

/// Draw a batch of `opts.batch` samples: for each a uniformly drawn
/// recorded step, its chunk of actions, a flow time (`opts.flow_times`),
/// noise, and, for a fraction `1 - opts.unprefixed` of them, a frozen
/// prefix of `d ~ U{1..=max_prefix}` actions given clean (`t = 1`) and left
/// out of the loss.
fn draw_batch(
    data: &Dataset,
    opts: &TrainOptions,
    norm: &Normalizer,
    index: &[(usize, usize)],
    rng: &mut Rng,
) -> Batch {
    let (cfg, batch, unprefixed) = (&opts.config, opts.batch, opts.unprefixed);
    let (h, ad) = (cfg.horizon, cfg.action_dim);
    let mut b = Batch {
        vision: Vec::with_capacity(batch * cfg.vision_tokens() * cfg.vision_width()),
        text: Vec::with_capacity(batch * cfg.feature_dim),
        state: Vec::with_capacity(batch * cfg.state_dim),
        x: Vec::with_capacity(batch * h * ad),
        times: Vec::with_capacity(batch * h),
        target: Vec::with_capacity(batch * h * ad),
        mask: Vec::with_capacity(batch * h),
        keypoint_target: Vec::new(),
        angle_target: Vec::with_capacity(batch * 2 * cfg.keypoint_angles),
        origin: Vec::with_capacity(batch * 2),
    };
    for _ in 0..batch {
        let (e, i) = index[rng.below(index.len())];
        let ep = &data.episodes[e];
        let st = ep.state_at(cfg, i);
        let at = b.vision.len();
        let age = match opts.frame_age {
            0 => 0,
            n => rng.below(n + 1),
        };
        let f = ep.frame_index_at(i.saturating_sub(age));
        b.vision.extend_from_slice(&ep.frames[f].1);
        if let Some(t) = ep.frame_targets.get(f) {
            b.keypoint_target.extend_from_slice(t);
        }
        if cfg.keypoint_angles > 0 {
            // Validated: one row per frame, at least this wide.
            b.angle_target
                .extend_from_slice(&ep.frame_angles[f][..2 * cfg.keypoint_angles]);
        }
        norm.vision(cfg, &mut b.vision[at..]);
        b.text.extend(norm.text(&ep.instruction));
        b.state.extend(norm.state(st));
        b.origin.extend(cfg.keypoint_origin(st));
        let a = norm.actions(st, &ep.chunk_at(cfg, i));
        let t = opts.flow_times.draw(rng);
        let d = if (rng.uniform() as f64) < unprefixed || cfg.max_prefix == 0 {
            0
        } else {
            1 + rng.below(cfg.max_prefix)
        };
        for j in 0..h {
            let frozen = j < d;
            b.times.push(if frozen { 1.0 } else { t });
            b.mask.push(if frozen { 0.0 } else { 1.0 });
            for k in 0..ad {
                let av = a[j * ad + k];
                let n = rng.normal();
                if frozen {
                    b.x.push(av);
                } else {
                    b.x.push(t * av + (1.0 - t) * n);
                }
                b.target.push(match cfg.prediction {
                    Prediction::Velocity => av - n,
                    Prediction::Sample => av,
                });
            }
        }
    }
    b
}

/// [`batch_loss`]'s loss and, alone, its auxiliary parts.
struct BatchLoss {
    loss: candle_core::Tensor,
    keypoint: Option<f32>,
    angle: Option<f32>,
}

/// The masked flow-matching loss of a batch plus the weighted keypoint and
/// angle losses, as a candle scalar, and the auxiliary losses alone.
fn batch_loss(net: &TrainNet, b: Batch, batch: usize, opts: &TrainOptions) -> Result<BatchLoss> {
    let cfg = net.config();
    let (h, ad) = (cfg.horizon, cfg.action_dim);
    let vision = net.tensor(b.vision, &[batch, cfg.vision_tokens(), cfg.vision_width()])?;
    let text = net.tensor(b.text, &[batch, 1, cfg.feature_dim])?;
    let state = net.tensor(b.state, &[batch, 1, cfg.state_dim])?;
    let x = net.tensor(b.x, &[batch, h, ad])?;
    let (temb, tdims) = cfg.time_input(&b.times);
    let temb = net.tensor(temb, &tdims)?;
    let target = net.tensor(b.target, &[batch, h, ad])?;
    let kept: f32 = b.mask.iter().sum();
    let mask = net.tensor(b.mask, &[batch, h, 1])?;
    let origin = net.tensor(b.origin, &[batch, 1, 2])?;
    let parts = net.condition_parts(&vision, &text, &state, &origin)?;
    // The velocity, or the clean chunk: either way the target's kind.
    let v = net.forward(&parts.cond, &x, &temb)?;
    let err = (v - target)?.broadcast_mul(&mask)?;
    let mut loss = (err.sqr()?.sum_all()? / (kept.max(1.0) as f64 * ad as f64))?;
    let supervised = b.keypoint_target.len() / batch.max(1) / 2;
    let mut keypoint = None;
    if let Some(kp) = parts.keypoints {
        if opts.keypoint_weight > 0.0 && supervised > 0 {
            let t = net.tensor(b.keypoint_target, &[batch, supervised, 2])?;
            let mse = (kp.narrow(1, 0, supervised)? - t)?.sqr()?.mean_all()?;
            keypoint = Some(mse.to_scalar::<f32>()?);
            loss = (loss + (mse * opts.keypoint_weight)?)?;
        }
    }
    let mut angle = None;
    if let Some(ang) = parts.angles {
        let t = net.tensor(b.angle_target, &[batch, cfg.keypoint_angles, 2])?;
        let mse = (ang - t)?.sqr()?.mean_all()?;
        angle = Some(mse.to_scalar::<f32>()?);
        if opts.angle_weight > 0.0 {
            loss = (loss + (mse * opts.angle_weight)?)?;
        }
    }
    Ok(BatchLoss {
        loss,
        keypoint,
        angle,
    })
}

/// Train a head on `data` (sizes checked first). `progress` is called every
/// `log_every` steps and after the last.
pub fn train(
    data: &Dataset,
    opts: &TrainOptions,
    mut progress: impl FnMut(&Progress),
) -> Result<Trained> {
    opts.validate()?;
    let cfg = &opts.config;
    data.validate(cfg)?;
    let (net, norm) = match &opts.init {
        Some(path) => {
            let (net, norm) = TrainNet::from_checkpoint(path)?;
            if net.config() != cfg {
                return Err(Error::Config(format!(
                    "{} was trained with another head config ({:?}) than asked for ({cfg:?})",
                    path.display(),
                    net.config()
                )));
            }
            (net, norm)
        }
        None => (TrainNet::init(cfg, opts.seed)?, data.fit_normalizer(cfg)),
    };
    let index: Vec<(usize, usize)> = data
        .episodes
        .iter()
        .enumerate()
        .flat_map(|(e, ep)| (0..ep.steps(cfg)).map(move |i| (e, i)))
        .collect();
    let mut opt = candle_nn::AdamW::new(
        net.vars(),
        candle_nn::ParamsAdamW {
            lr: opts.lr_at(0),
            weight_decay: opts.weight_decay,
            ..Default::default()
        },
    )?;
    let mut ema = if opts.ema_decay > 0.0 {
        Some(net.weights()?)
    } else {
        None
    };
    let mut rng = Rng::new(opts.seed.wrapping_add(1));
    let mut losses = Vec::with_capacity(opts.steps);
    let t0 = Instant::now();
    let mut window = 0f32;
    let mut in_window = 0usize;
    let (mut kp_window, mut kp_in_window) = (0f32, 0usize);
    let (mut ang_window, mut ang_in_window) = (0f32, 0usize);
    for step in 0..opts.steps {
        let lr = opts.lr_at(step);
        opt.set_learning_rate(lr);
        let b = draw_batch(data, opts, &norm, &index, &mut rng);
        let BatchLoss {
            loss,
            keypoint,
            angle,
        } = batch_loss(&net, b, opts.batch, opts)?;
        if let Some(m) = keypoint {
            kp_window += m;
            kp_in_window += 1;
        }
        if let Some(m) = angle {
            ang_window += m;
            ang_in_window += 1;
        }
        opt.backward_step(&loss)?;
        if let Some(avg) = &mut ema {
            let d = opts.ema_decay.min((1 + step) as f64 / (10 + step) as f64);
            for (a, v) in avg.values_mut().zip(net.named_vars().values()) {
                // Detached: the average must not grow a graph step by step.
                *a = (a.affine(d, 0.0)? + v.as_tensor().affine(1.0 - d, 0.0)?)?.detach();
            }
        }
        let l = loss.to_scalar::<f32>()?;
        if !l.is_finite() {
            return Err(Error::Data(format!(
                "the loss became {l} at step {step}: lower the learning rate (now {lr:e})"
            )));
        }
        losses.push(l);
        window += l;
        in_window += 1;
        if (step + 1) % opts.log_every.max(1) == 0 || step + 1 == opts.steps {
            progress(&Progress {
                step: step + 1,
                steps: opts.steps,
                loss: window / in_window as f32,
                keypoint_rmse: (kp_in_window > 0).then(|| (kp_window / kp_in_window as f32).sqrt()),
                angle_rmse: (ang_in_window > 0).then(|| (ang_window / ang_in_window as f32).sqrt()),
                lr,
                seconds: t0.elapsed().as_secs_f64(),
            });
            window = 0.0;
            in_window = 0;
            kp_window = 0.0;
            kp_in_window = 0;
            ang_window = 0.0;
            ang_in_window = 0;
        }
    }
    let raw = match ema {
        Some(avg) => {
            let raw = net.duplicate()?;
            net.set_weights(&avg)?;
            Some(raw)
        }
        None => None,
    };
    Ok(Trained {
        net,
        raw,
        norm,
        losses,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::data::EpisodeFeatures;

    /// The frame each sample of a batch saw, and the step of its state: one
    /// episode whose frame at step k has keypoint target k and whose state
    /// at step i is (i, 0), read back through the keypoint origin.
    fn seen_and_now(frame_age: usize) -> Vec<(f32, f32)> {
        let cfg = Config {
            keypoint_relative_scale: 1.0,
            ..Config::default()
        };
        let n = 40;
        let frame = vec![0.0; cfg.vision_tokens() * cfg.vision_width()];
        let ep = EpisodeFeatures {
            instruction: vec![0.0; cfg.feature_dim],
            frames: (0..n).map(|k| (k, frame.clone())).collect(),
            frame_targets: (0..n).map(|k| vec![k as f32, 0.0]).collect(),
            frame_angles: Vec::new(),
            states: (0..n)
                .flat_map(|i| {
                    let mut row = vec![0.0; cfg.state_dim];
                    row[0] = i as f32;
                    row
                })
                .collect(),
            actions: vec![0.0; n * cfg.action_dim],
            labels: Vec::new(),
        };
        let data = Dataset { episodes: vec![ep] };
        let opts = TrainOptions {
            config: cfg.clone(),
            batch: 400,
            frame_age,
            ..TrainOptions::default()
        };
        let index: Vec<(usize, usize)> = (0..n).map(|i| (0, i)).collect();
        let b = draw_batch(
            &data,
            &opts,
            &Normalizer::identity(&cfg),
            &index,
            &mut Rng::new(3),
        );
        b.keypoint_target
            .chunks(2)
            .zip(b.origin.chunks(2))
            .map(|(t, o)| (t[0], o[0]))
            .collect()
    }

    /// A small dataset of `n` steps of one episode for `cfg`.
    fn one_episode(cfg: &Config, n: usize) -> Dataset {
        let mut rng = Rng::new(11);
        let frame = rng.normals(cfg.vision_tokens() * cfg.vision_width());
        Dataset {
            episodes: vec![EpisodeFeatures {
                instruction: rng.normals(cfg.feature_dim),
                frames: (0..n).map(|k| (k, frame.clone())).collect(),
                frame_targets: Vec::new(),
                frame_angles: Vec::new(),
                states: rng.normals(n * cfg.state_dim),
                actions: rng.normals(n * cfg.action_dim),
                labels: Vec::new(),
            }],
        }
    }

    #[test]
    fn the_angle_read_out_needs_its_targets_and_learns_them() {
        let cfg = Config {
            keypoint_angles: 2,
            d_model: 32,
            n_layers: 1,
            mlp_dim: 32,
            keypoint_hidden: 16,
            ..Config::default()
        };
        let mut data = one_episode(&cfg, 40);
        let opts = TrainOptions {
            config: cfg.clone(),
            steps: 60,
            batch: 8,
            lr: 1e-2,
            warmup: 1,
            log_every: 20,
            ..TrainOptions::default()
        };
        let e = train(&data, &opts, |_| {}).expect_err("no angle targets");
        assert!(e.to_string().contains("angle target rows"), "{e}");
        // Wider rows are cut to the head's two keypoints.
        data.episodes[0].frame_angles = vec![vec![0.6, -0.8, -0.28, 0.96, 5.0, 5.0]; 40];
        let mut rmse = Vec::new();
        train(&data, &opts, |p| {
            rmse.push(p.angle_rmse.expect("angle rmse"))
        })
        .expect("train");
        assert_eq!(rmse.len(), 3);
        assert!(rmse[2] < 0.5 * rmse[0], "angle rmse {rmse:?}");
    }

    #[test]
    fn the_weight_average_follows_its_recurrence_and_keeps_the_raw_weights() {
        let cfg = Config {
            keypoints: 0,
            ..Config::default()
        };
        let data = one_episode(&cfg, 40);
        let opts = TrainOptions {
            config: cfg.clone(),
            steps: 1,
            batch: 4,
            lr: 1e-2,
            warmup: 1,
            ema_decay: 0.999,
            ..TrainOptions::default()
        };
        let fresh = TrainNet::init(&cfg, opts.seed)
            .expect("init")
            .weights()
            .expect("w");
        let t = train(&data, &opts, |_| {}).expect("train");
        let raw = t
            .raw
            .as_ref()
            .expect("raw weights kept")
            .weights()
            .expect("w");
        let avg = t.net.weights().expect("w");
        // Step 0: d = min(0.999, 1 / 10).
        let mut moved = 0usize;
        for (name, w0) in &fresh {
            let (w0, w1, a) = (
                w0.flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .expect("w0"),
                raw[name]
                    .flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .expect("w1"),
                avg[name]
                    .flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .expect("avg"),
            );
            for ((w0, w1), a) in w0.iter().zip(&w1).zip(&a) {
                let want = 0.1 * w0 + 0.9 * w1;
                assert!(
                    (a - want).abs() <= 1e-6 * (1.0 + want.abs()),
                    "{name}: {a} vs {want}"
                );
                moved += usize::from(w0 != w1);
            }
        }
        assert!(moved > 1000, "the step moved only {moved} weights");
        // Without the average: no raw copy, and the net is the last step's.
        let plain = train(
            &data,
            &TrainOptions {
                ema_decay: 0.0,
                ..opts.clone()
            },
            |_| {},
        )
        .expect("train");
        assert!(plain.raw.is_none());
        let w = plain.net.weights().expect("w");
        for (name, r) in &raw {
            let d = (r - &w[name])
                .and_then(|d| d.abs()?.max_all()?.to_scalar::<f32>())
                .expect("diff");
            assert_eq!(d, 0.0, "{name}");
        }
        let bad = TrainOptions {
            ema_decay: 1.0,
            ..opts
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("ema_decay"));
    }

    #[test]
    fn aged_frames_lag_the_state_by_up_to_frame_age_periods() {
        assert!(seen_and_now(0).iter().all(|(seen, now)| seen == now));
        let ages: Vec<usize> = seen_and_now(5)
            .iter()
            .map(|(seen, now)| (now - seen) as usize)
            .collect();
        assert!(ages.iter().all(|&a| a <= 5), "{ages:?}");
        for a in 0..=5 {
            assert!(ages.contains(&a), "no sample {a} periods old");
        }
    }

    #[test]
    fn pi0_flow_times_lean_to_the_noise_and_stay_off_the_data() {
        let mut rng = Rng::new(7);
        let n = 20_000;
        let t: Vec<f32> = (0..n).map(|_| FlowTimes::Pi0.draw(&mut rng)).collect();
        assert!(t.iter().all(|&t| (0.0..=0.999).contains(&t)));
        // t = 0.999 (1 - y), y ~ Beta(1.5, 1): E[t] = 0.999 * 0.4.
        let mean = t.iter().sum::<f32>() / n as f32;
        assert!((mean - 0.3996).abs() < 0.01, "mean {mean}");
        let noisy = t.iter().filter(|&&t| t < 0.5).count() as f32 / n as f32;
        // P(t < 0.5) = P(y > 0.4995) = 1 - 0.4995^1.5 ~ 0.647.
        assert!((noisy - 0.647).abs() < 0.02, "{noisy}");
        let mut rng = Rng::new(7);
        let u: Vec<f32> = (0..n).map(|_| FlowTimes::Uniform.draw(&mut rng)).collect();
        let mean = u.iter().sum::<f32>() / n as f32;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }
}
