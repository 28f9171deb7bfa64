//! Training data: per episode, the instruction embedding, cached vision
//! features of some of its frames, and the recorded states and actions.

use crate::config::{Config, Normalizer, MIN_STD};
use crate::{Error, Result};

/// One recorded episode, with its frozen encoder features.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeFeatures {
    /// Instruction embedding `[feature_dim]`.
    pub instruction: Vec<f32>,
    /// `(step, pooled vision tokens [vision_tokens * feature_dim])`, in
    /// increasing step order. Not every step needs a frame: a sample at
    /// step `i` sees the newest frame at or before `i` (the camera runs
    /// slower than the control loop, as it does live).
    pub frames: Vec<(usize, Vec<f32>)>,
    /// Robot states `[steps * state_dim]`, row `i` observed at step `i`.
    pub states: Vec<f32>,
    /// Commanded actions `[steps * action_dim]`, row `i` at step `i`.
    pub actions: Vec<f32>,
}

impl EpisodeFeatures {
    /// Control steps.
    pub fn steps(&self, cfg: &Config) -> usize {
        self.actions.len() / cfg.action_dim.max(1)
    }

    /// The newest frame at or before `step` (the first one before it).
    pub fn frame_at(&self, step: usize) -> &[f32] {
        let i = self.frames.partition_point(|(s, _)| *s <= step);
        &self.frames[i.saturating_sub(1)].1
    }

    /// The `horizon` actions from `step`, the last one repeated past the
    /// end (the robot holds where the episode ended).
    pub fn chunk_at(&self, cfg: &Config, step: usize) -> Vec<f32> {
        let (n, d) = (self.steps(cfg), cfg.action_dim);
        (0..cfg.horizon)
            .flat_map(|k| {
                let i = (step + k).min(n - 1);
                self.actions[i * d..(i + 1) * d].iter().copied()
            })
            .collect()
    }

    /// State row `step`.
    pub fn state_at(&self, cfg: &Config, step: usize) -> &[f32] {
        &self.states[step * cfg.state_dim..(step + 1) * cfg.state_dim]
    }
}

/// A training set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dataset {
    /// The episodes.
    pub episodes: Vec<EpisodeFeatures>,
}

impl Dataset {
    /// Check sizes against `cfg` (each error names the episode and what).
    pub fn validate(&self, cfg: &Config) -> Result<()> {
        if self.episodes.is_empty() {
            return Err(Error::Data(
                "no episodes (record some with `edgeflow sim push --record DIR`)".into(),
            ));
        }
        let vt = cfg.vision_tokens() * cfg.feature_dim;
        for (k, e) in self.episodes.iter().enumerate() {
            let bad = |m: String| Err(Error::Data(format!("episode {k}: {m}")));
            let n = e.steps(cfg);
            if n == 0 || e.actions.len() != n * cfg.action_dim {
                return bad(format!(
                    "{} action values is not a non-empty whole number of {}-wide rows",
                    e.actions.len(),
                    cfg.action_dim
                ));
            }
            if e.states.len() != n * cfg.state_dim {
                return bad(format!(
                    "{} state values for {n} steps of {} (states and actions must have the same rows)",
                    e.states.len(),
                    cfg.state_dim
                ));
            }
            if e.instruction.len() != cfg.feature_dim {
                return bad(format!(
                    "instruction embedding of {} values, expected {}",
                    e.instruction.len(),
                    cfg.feature_dim
                ));
            }
            if e.frames.is_empty() {
                return bad("no vision features".into());
            }
            if let Some((s, f)) = e.frames.iter().find(|(_, f)| f.len() != vt) {
                return bad(format!(
                    "frame at step {s} has {} values, expected {} pooled tokens of {} ({vt})",
                    f.len(),
                    cfg.vision_tokens(),
                    cfg.feature_dim
                ));
            }
            if e.frames.windows(2).any(|w| w[1].0 <= w[0].0) {
                return bad("frames are not in increasing step order".into());
            }
            let finite = e
                .states
                .iter()
                .chain(&e.actions)
                .chain(&e.instruction)
                .chain(e.frames.iter().flat_map(|(_, f)| f))
                .all(|v| v.is_finite());
            if !finite {
                return bad("holds a non-finite value".into());
            }
        }
        Ok(())
    }

    /// Training samples (one per recorded step).
    pub fn samples(&self, cfg: &Config) -> usize {
        self.episodes.iter().map(|e| e.steps(cfg)).sum()
    }

    /// Mean and standard deviation of the states, and of every chunk's
    /// actions relative to the state it starts from.
    pub fn fit_normalizer(&self, cfg: &Config) -> Normalizer {
        let (sd, ad) = (cfg.state_dim, cfg.action_dim);
        let mut s = Moments::new(sd);
        let mut a = Moments::new(ad);
        for e in &self.episodes {
            for i in 0..e.steps(cfg) {
                let st = e.state_at(cfg, i);
                s.add(st);
                let c = e.chunk_at(cfg, i);
                for row in c.chunks(ad) {
                    let d: Vec<f32> = row.iter().zip(st).map(|(x, p)| x - p).collect();
                    a.add(&d);
                }
            }
        }
        let (state_mean, state_std) = s.finish();
        let (action_mean, action_std) = a.finish();
        Normalizer {
            state_mean,
            state_std,
            action_mean,
            action_std,
        }
    }
}

struct Moments {
    n: f64,
    sum: Vec<f64>,
    sq: Vec<f64>,
}

impl Moments {
    fn new(d: usize) -> Self {
        Moments {
            n: 0.0,
            sum: vec![0.0; d],
            sq: vec![0.0; d],
        }
    }
    fn add(&mut self, v: &[f32]) {
        self.n += 1.0;
        for (k, x) in v.iter().enumerate() {
            self.sum[k] += *x as f64;
            self.sq[k] += (*x as f64).powi(2);
        }
    }
    fn finish(&self) -> (Vec<f32>, Vec<f32>) {
        let n = self.n.max(1.0);
        let mean: Vec<f64> = self.sum.iter().map(|s| s / n).collect();
        let std = self
            .sq
            .iter()
            .zip(&mean)
            .map(|(q, m)| ((q / n - m * m).max(0.0).sqrt() as f32).max(MIN_STD))
            .collect();
        (mean.iter().map(|m| *m as f32).collect(), std)
    }
}
