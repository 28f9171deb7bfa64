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

/// The head, its device, its sampler and its noise: everything that turns
/// observations into chunks.
#[derive(Debug)]
pub struct Policy {
    head: ActionHead,
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
        Self::new(head, dev, steps, rtc, seed)
    }

    /// Over a loaded head.
    pub fn new(
        head: ActionHead,
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
        Ok(Policy {
            head,
            dev: dev.clone(),
            sampler: OdeSampler::new(OdeMethod::Euler, Schedule::uniform(steps)?),
            rtc,
            temperature: 1.0,
            rng: Rng::new(seed),
        })
    }

    /// The head's config.
    pub fn config(&self) -> &Config {
        self.head.config()
    }

    /// The head.
    pub fn head(&self) -> &ActionHead {
        &self.head
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
        let mut vision = self.check(obs)?;
        let cfg = self.head.config().clone();
        self.head.normalizer().vision(&cfg, &mut vision);
        let (h, ad) = (cfg.horizon, cfg.action_dim);
        if !prefix.len().is_multiple_of(ad) || prefix.iter().any(|v| !v.is_finite()) {
            return Err(Error::BadInput(format!(
                "prefix has {} values: not finite rows of {ad}",
                prefix.len()
            )));
        }
        let frozen = self.frozen_len(delay, prefix.len() / ad);
        let norm: &Normalizer = self.head.normalizer();
        let dev = &self.dev;
        let place = |v: Vec<f32>, dims: &[usize]| -> Result<Tensor> {
            Ok(dev.place(&Tensor::from_vec(v, dims)?)?)
        };
        let state_n = norm.state(&obs.state[..cfg.state_dim]);
        let cond = self.head.condition(
            dev,
            &place(vision, &[1, cfg.vision_tokens(), cfg.vision_width()])?,
            &place(norm.text(&obs.instruction), &[1, 1, cfg.feature_dim])?,
            &place(state_n, &[1, 1, cfg.state_dim])?,
            &cfg.keypoint_origin(&obs.state),
        )?;
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
        let head = &self.head;
        let x = self.sampler.sample::<Error, _, _>(
            dev,
            &place(x0, &[1, h, ad])?,
            |x, t| {
                let times: Vec<f32> = (0..h).map(|j| if j < frozen { 1.0 } else { t }).collect();
                head.velocity(dev, &cond, x, &times)
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
