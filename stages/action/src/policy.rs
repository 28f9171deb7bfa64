//! Sampling action chunks from the head through the shared ODE sampler,
//! with real-time chunking ([`RtcMode`]).
//!
//! Real-time chunking here is the training-time variant: during training a
//! random-length prefix of each chunk is handed to the head clean (flow
//! time 1, the data end) and left out of the loss, so at run time the
//! head inpaints the rest of a chunk whose first `d` actions are frozen to
//! what the controller will execute while the head computes. It needs no
//! backward pass at run time (guided inpainting needs a vector-Jacobian
//! product through the head at every step, which the runtime's forward-only
//! ops do not give and which would double or triple each step's cost on a
//! 2-core machine), and the frozen actions are exact, not softly guided.

use crate::config::{Config, Normalizer};
use crate::model::ActionHead;
use crate::rng::Rng;
use crate::{Error, Result};
use edgeflow_nn::{OdeMethod, OdeSampler, Schedule, VarBuilder};
use edgeflow_runtime::{Device, Tensor};
use std::path::Path;

/// How a new chunk relates to the actions already queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RtcMode {
    /// Naive switching: every chunk is sampled from noise; the controller
    /// merges it with what it has queued.
    None,
    /// Real-time chunking: the first `d` actions (the measured delay,
    /// capped by the queued prefix and the trained maximum) are frozen to
    /// the queued ones and the rest inpainted.
    #[default]
    Prefix,
}

impl std::str::FromStr for RtcMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(RtcMode::None),
            "prefix" => Ok(RtcMode::Prefix),
            other => Err(Error::BadInput(format!(
                "rtc mode `{other}`: expected `none` or `prefix`"
            ))),
        }
    }
}

/// One observation, as the head's inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// Vision tokens `[T_v, feature_dim]` row-major: CLS + patch grid, or
    /// already the head's ([`crate::config::pool_vision_tokens`]).
    pub vision: Vec<f32>,
    /// Instruction embedding `[feature_dim]`.
    pub instruction: Vec<f32>,
    /// Robot state, at least `state_dim` values (pusher x, y, vx, vy): the
    /// head reads the first `state_dim` (a head trained on positions only
    /// ignores the velocities).
    pub state: Vec<f32>,
}

/// A sampled chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// `horizon * action_dim` absolute actions, row-major.
    pub actions: Vec<f32>,
    /// Leading actions frozen to the given prefix.
    pub frozen: usize,
}

/// The head (or an ensemble of heads), its device, its sampler and its
/// noise: everything that turns observations into chunks.
///
/// An ensemble ([`Policy::load_ensemble`]) is several heads trained on the
/// same data (same action normalisation, same chunk and inputs), typically
/// from different training seeds or options: each conditions on the
/// observation in its own way, and at every ODE step the sampler follows
/// the mean of their velocities (for sample-predicting heads, the mean of
/// their predicted chunks), from one shared starting noise. One encoder
/// pass feeds them all; each head adds its own (small) cost per step.
#[derive(Debug)]
pub struct Policy {
    heads: Vec<ActionHead>,
    dev: Device,
    sampler: OdeSampler,
    /// Real-time chunking mode.
    pub rtc: RtcMode,
    /// Scale of the starting noise (1 = the trained distribution; 0 =
    /// start every chunk from the noise mean, a deterministic chunk per
    /// observation that does not switch between ways of doing the task
    /// from one chunk to the next).
    pub temperature: f32,
    rng: Rng,
}

impl Policy {
    /// Load a checkpoint written by the trainer (its config is in the
    /// metadata) for `dev`, sampling with `steps` Euler steps.
    pub fn load(path: &Path, dev: &Device, steps: usize, rtc: RtcMode, seed: u64) -> Result<Self> {
        let cfg = Config::from_checkpoint(path)?;
        let vb = VarBuilder::open(&[path], dev)?;
        let head = ActionHead::load(&vb, &cfg)?;
        Self::new(vec![head], dev, steps, rtc, seed)
    }

    /// Load several checkpoints as one ensemble policy (see [`Policy`]);
    /// the first one's config and normalisation are the policy's. They
    /// must agree on everything the sampler and the observation share:
    /// chunk length, action and state sizes, the encoder's input and grid,
    /// the control rate, and the action normalisation (the same training
    /// data), else a clear error names the pair.
    pub fn load_ensemble(
        paths: &[impl AsRef<Path>],
        dev: &Device,
        steps: usize,
        rtc: RtcMode,
        seed: u64,
    ) -> Result<Self> {
        if paths.is_empty() || paths.len() > 16 {
            return Err(Error::BadInput(format!(
                "an ensemble takes 1 to 16 checkpoints, got {}",
                paths.len()
            )));
        }
        let mut heads = Vec::with_capacity(paths.len());
        for p in paths {
            let p = p.as_ref();
            let cfg = Config::from_checkpoint(p)?;
            let vb = VarBuilder::open(&[p], dev)?;
            let head = ActionHead::load(&vb, &cfg)?;
            if let Some(first) = heads.first() {
                compatible(first, &head).map_err(|why| {
                    Error::BadInput(format!(
                        "{} cannot join {} in an ensemble: {why}",
                        p.display(),
                        paths[0].as_ref().display()
                    ))
                })?;
            }
            heads.push(head);
        }
        Self::new(heads, dev, steps, rtc, seed)
    }

    /// Over loaded heads: one, or an ensemble (checked as in
    /// [`Policy::load_ensemble`]).
    pub fn new(
        heads: Vec<ActionHead>,
        dev: &Device,
        steps: usize,
        rtc: RtcMode,
        seed: u64,
    ) -> Result<Self> {
        if !(1..=1000).contains(&steps) {
            return Err(Error::BadInput(format!(
                "flow steps must be in 1..=1000, got {steps}"
            )));
        }
        let Some(first) = heads.first() else {
            return Err(Error::BadInput("a policy needs at least one head".into()));
        };
        for h in &heads[1..] {
            compatible(first, h)
                .map_err(|why| Error::BadInput(format!("heads cannot form an ensemble: {why}")))?;
        }
        Ok(Policy {
            heads,
            dev: dev.clone(),
            sampler: OdeSampler::new(OdeMethod::Euler, Schedule::uniform(steps)?),
            rtc,
            temperature: 1.0,
            rng: Rng::new(seed),
        })
    }

    /// The (first) head's config.
    pub fn config(&self) -> &Config {
        self.heads[0].config()
    }

    /// The (first) head.
    pub fn head(&self) -> &ActionHead {
        &self.heads[0]
    }

    /// Every head: one, or the ensemble's.
    pub fn heads(&self) -> &[ActionHead] {
        &self.heads
    }

    /// Check an observation's sizes and values; returns the pooled vision
    /// tokens.
    pub fn check(&self, obs: &Observation) -> Result<Vec<f32>> {
        let cfg = self.config();
        let vision = cfg.pool(&obs.vision)?;
        if obs.instruction.len() != cfg.feature_dim {
            return Err(Error::BadInput(format!(
                "instruction embedding has {} values, the head takes {}",
                obs.instruction.len(),
                cfg.feature_dim
            )));
        }
        if obs.state.len() < cfg.state_dim {
            return Err(Error::BadInput(format!(
                "robot state has {} values, the head takes the first {} of x, y, vx, vy",
                obs.state.len(),
                cfg.state_dim
            )));
        }
        if vision
            .iter()
            .chain(&obs.instruction)
            .chain(&obs.state)
            .any(|v| !v.is_finite())
        {
            return Err(Error::BadInput(
                "an observation holds a non-finite value".into(),
            ));
        }
        Ok(vision)
    }

    /// Frozen actions for a request: `min(delay, queued, max_prefix)` in
    /// [`RtcMode::Prefix`], none otherwise.
    pub fn frozen_len(&self, delay: usize, queued: usize) -> usize {
        match self.rtc {
            RtcMode::None => 0,
            RtcMode::Prefix => delay.min(queued).min(self.config().max_prefix),
        }
    }

    /// Sample one chunk of `horizon` absolute actions for `obs`. `prefix`
    /// holds the actions already queued for the chunk's first steps
    /// (`k * action_dim` values) and `delay` the measured inference delay
    /// in periods; `cancelled` is asked between ODE steps.
    pub fn chunk(
        &mut self,
        obs: &Observation,
        prefix: &[f32],
        delay: usize,
        cancelled: impl FnMut() -> bool,
    ) -> Result<Chunk> {
        let pooled = self.check(obs)?;
        let cfg = self.config().clone();
        let (h, ad) = (cfg.horizon, cfg.action_dim);
        if !prefix.len().is_multiple_of(ad) || prefix.iter().any(|v| !v.is_finite()) {
            return Err(Error::BadInput(format!(
                "prefix has {} values: not finite rows of {ad}",
                prefix.len()
            )));
        }
        let frozen = self.frozen_len(delay, prefix.len() / ad);
        let norm: &Normalizer = self.heads[0].normalizer();
        let dev = &self.dev;
        let place = |v: Vec<f32>, dims: &[usize]| -> Result<Tensor> {
            Ok(dev.place(&Tensor::from_vec(v, dims)?)?)
        };
        // Each head reads the observation through its own normalisation
        // and config.
        let mut conds = Vec::with_capacity(self.heads.len());
        for head in &self.heads {
            let (c, n) = (head.config(), head.normalizer());
            let mut vision = pooled.clone();
            n.vision(c, &mut vision);
            conds.push(head.condition(
                dev,
                &place(vision, &[1, c.vision_tokens(), c.vision_width()])?,
                &place(n.text(&obs.instruction), &[1, 1, c.feature_dim])?,
                &place(n.state(&obs.state[..c.state_dim]), &[1, 1, c.state_dim])?,
                &c.keypoint_origin(&obs.state),
            )?);
        }
        // x0: noise, with the frozen prefix (normalised) in place.
        let t = self.temperature;
        let mut x0: Vec<f32> = self
            .rng
            .normals(h * ad)
            .into_iter()
            .map(|v| v * t)
            .collect();
        let fixed = norm.actions(&obs.state, &prefix[..frozen * ad]);
        x0[..frozen * ad].copy_from_slice(&fixed);
        let heads = &self.heads;
        let x = self.sampler.sample::<Error, _, _>(
            dev,
            &place(x0, &[1, h, ad])?,
            |x, t| {
                let times: Vec<f32> = (0..h).map(|j| if j < frozen { 1.0 } else { t }).collect();
                let mut v = heads[0].velocity(dev, &conds[0], x, &times)?;
                if heads.len() == 1 {
                    return Ok(v);
                }
                for (head, cond) in heads.iter().zip(&conds).skip(1) {
                    v = dev.add(&v, &head.velocity(dev, cond, x, &times)?)?;
                }
                Ok(dev.scale(&v, 1.0 / heads.len() as f64)?)
            },
            cancelled,
        )?;
        let x = dev.to_host(&x)?.to_vec_f32()?;
        let mut actions = norm.denormalize_actions(&obs.state, &x);
        // Exactly the queued values (no round trip through normalisation).
        actions[..frozen * ad].copy_from_slice(&prefix[..frozen * ad]);
        Ok(Chunk { actions, frozen })
    }
}

/// Why `b` cannot join `a` in an ensemble, if it cannot.
fn compatible(a: &ActionHead, b: &ActionHead) -> std::result::Result<(), String> {
    let (x, y) = (a.config(), b.config());
    let shared = |c: &Config| {
        (
            c.horizon,
            c.action_dim,
            c.state_dim,
            c.feature_dim,
            c.vision_grid,
            c.vision_stack,
            c.image_size,
            c.privileged,
        )
    };
    if shared(x) != shared(y) {
        return Err(format!(
            "(horizon, action_dim, state_dim, feature_dim, vision_grid, vision_stack, image_size, privileged) {:?} against {:?}",
            shared(y),
            shared(x)
        ));
    }
    if x.control_hz != y.control_hz || x.max_prefix != y.max_prefix {
        return Err(format!(
            "control rate {} Hz / max prefix {} against {} Hz / {}",
            y.control_hz, y.max_prefix, x.control_hz, x.max_prefix
        ));
    }
    let (m, n) = (a.normalizer(), b.normalizer());
    if m.action_mean != n.action_mean || m.action_std != n.action_std {
        return Err(
            "its action normalisation differs (heads averaged in one normalised action space must be trained on the same data)"
                .into(),
        );
    }
    Ok(())
}
