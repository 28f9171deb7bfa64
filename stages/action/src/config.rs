//! The head's [`Config`], the data [`Normalizer`], and the pure functions
//! both twins share: vision token pooling ([`pool_vision_tokens`]), the
//! flow-time embedding ([`time_embedding`]), and the checkpoint metadata.
//!
//! Flow convention (rectified flow, the one the shared ODE sampler
//! integrates by default, from `t = 0` to `t = 1`):
//! `x_t = t * a + (1 - t) * noise`, the target velocity is
//! `v = a - noise`, and sampling integrates `dx/dt = v(x, t)` from pure
//! noise at `t = 0` to the action chunk at `t = 1`. (pi0 writes the same
//! flow with time reversed: its `tau` is `1 - t`.) A token at `t = 1` is
//! clean: that is how real-time chunking hands the head a frozen prefix.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Safetensors metadata key holding the [`Config`] as JSON.
pub const CONFIG_KEY: &str = "edgeflow.action.config";
/// Safetensors metadata key holding the format tag.
pub const FORMAT_KEY: &str = "format";
/// Value of [`FORMAT_KEY`] in a checkpoint this crate writes.
pub const FORMAT: &str = "edgeflow-action-head-v1";

/// The head's shape. Stored as JSON in the checkpoint's metadata, so a
/// checkpoint carries its own config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Width of each vision token and of the instruction embedding (384
    /// for DINOv2 ViT-S/14 and all-MiniLM-L6-v2).
    pub feature_dim: usize,
    /// Robot state values (pusher x, y, vx, vy).
    pub state_dim: usize,
    /// Action values per step (pusher target x, y).
    pub action_dim: usize,
    /// The patch grid becomes `vision_grid x vision_grid` tokens, after
    /// the CLS token (see `vision_stack`).
    pub vision_grid: usize,
    /// How patches become the head's vision tokens. 1: each token is the
    /// average of its bin of patches (the grid may be any size at least
    /// `vision_grid`). `k > 1`: the patch grid must be exactly
    /// `k * vision_grid` wide and each token stacks its `k x k` patches
    /// side by side (`feature_dim * k * k` values, row-major), keeping
    /// where inside the bin a thing is: the CLS token is zero-padded to
    /// that width. Checkpoints from before this field read 1.
    #[serde(default = "one")]
    pub vision_stack: usize,
    /// Standardise every vision feature by its mean and standard deviation
    /// over the training frames (stored as `norm.vision_*`) before the head
    /// sees it. DINOv2's last hidden state carries large constant offsets
    /// in some channels (|mean| up to ~6 with std ~0.4 on the push task's
    /// frames): standardised, the differences between scenes are what
    /// `vision_in` sees. Checkpoints from before this field read false.
    #[serde(default)]
    pub vision_norm: bool,
    /// Standardise the instruction embedding by its per-channel mean and
    /// standard deviation over the training samples (stored as
    /// `norm.text_*`). The goal instructions differ in one or two words, so
    /// their sentence embeddings share most of their length (cosine ~0.9);
    /// standardised, the channels that tell them apart are what `text_in`
    /// sees, and the head reads which block and which zone it is asked
    /// for instead of the common part. Checkpoints from before this field
    /// read false.
    #[serde(default)]
    pub text_norm: bool,
    /// Spatial-softmax keypoints (0: off). With `K > 0` the patch tokens
    /// are not handed to the transformer one by one: a small per-patch MLP
    /// (`kp_fc1`, SiLU, `kp_fc2`, the same weights at every patch) scores
    /// each patch for `K` keypoints, a softmax over the patch grid turns
    /// each score map into an expected position (see [`patch_coords`]),
    /// and each position becomes a token (`kp_in`); the CLS token stays a
    /// token of its own (`vision_in`). Position is then explicit and the
    /// same detector works anywhere on the grid, which flattened patch
    /// tokens do not give from a few hundred training scenes: a linear
    /// read-out of the tokens placed the blocks no better than their mean
    /// position on held-out layouts, a spatial softmax to about 1 cm.
    /// Needs `vision_stack` 1 and `vision_grid` equal to the encoder's
    /// patch grid. Checkpoints from before this field read 0.
    #[serde(default)]
    pub keypoints: usize,
    /// State units per keypoint unit (for the push task: metres per half
    /// image, the table's half-width 0.3). When > 0, `kp_in` reads each
    /// keypoint both where it is and relative to the robot (the state's
    /// first two values divided by this): the chunk is predicted relative
    /// to the robot, and "go behind the block" is simplest in the robot's
    /// frame. 0: positions only. Checkpoints from before this field read 0.
    #[serde(default)]
    pub keypoint_relative_scale: f32,
    /// Hidden width of the keypoint scorer.
    #[serde(default = "keypoint_hidden")]
    pub keypoint_hidden: usize,
    /// Each keypoint's token also carries what the patches under it look
    /// like: the patch tokens averaged with that keypoint's softmax weights
    /// ([`spatial_softmax_weights`]), through `kp_feat` (`feature_dim` ->
    /// `d_model`), added to its `kp_in` output. A position says where a
    /// block is, not how it is turned; a pushed square turns, and where to
    /// push it from depends on that. Needs `keypoints` > 0. Checkpoints
    /// from before this field read false.
    #[serde(default)]
    pub keypoint_features: bool,
    /// Keypoints (the first `A`) that also read out how their object is
    /// turned (0: none): the patch tokens under each (pooled as for
    /// [`Config::keypoint_features`]) go through `kp_ang1` (SiLU) and
    /// `kp_ang2` to two values, trained towards `(cos 4a, sin 4a)` of the
    /// object's angle `a` (a square looks the same every quarter turn),
    /// and `kp_in` reads them beside the position. Two supervised numbers
    /// instead of a free appearance vector: the head learns the angle and
    /// nothing else that tells training scenes apart. Needs `keypoints` >=
    /// `A`. Checkpoints from before this field read 0.
    #[serde(default)]
    pub keypoint_angles: usize,
    /// With keypoints: whether the CLS slot reads DINOv2's CLS token
    /// (true), or zeros (false: a constant token, the head sees the scene
    /// only through its keypoints). The CLS token is a 384-wide summary of
    /// the whole image, enough for an MLP to tell a few hundred training
    /// scenes apart, as the appearance under the keypoints
    /// ([`Config::keypoint_features`]) was. The slot and its weights stay
    /// either way, so every shape is the same. Checkpoints from before
    /// this field read true.
    #[serde(default = "yes")]
    pub cls_token: bool,
    /// A diagnostic head that reads the simulator's true state (robot,
    /// blocks and zones; `edgeflow_sim::TrueState::privileged`) as its
    /// state instead of seeing the scene: its vision input is all zeros.
    /// Training one on the same episodes as a vision head tells an
    /// imitation fault (the head cannot follow the expert even knowing
    /// where everything is) from a perception fault. It cannot run on a
    /// robot. Needs `keypoints` 0. Checkpoints from before this field read
    /// false.
    #[serde(default)]
    pub privileged: bool,
    /// With `privileged`: the blocks' and zones' positions are given
    /// relative to the pusher (`edgeflow_sim::TrueState::privileged_relative`).
    /// Checkpoints from before this field read false.
    #[serde(default)]
    pub privileged_relative: bool,
    /// What the network's output is: the flow velocity (pi0's choice) or
    /// the clean chunk itself, from which the sampler's velocity follows.
    /// Checkpoints from before this field read `velocity`.
    #[serde(default)]
    pub prediction: Prediction,
    /// Add the instruction and state tokens (the last two conditioning
    /// tokens, with their positions) to every action token before the
    /// first block, as diffusion policies condition every step of their
    /// denoiser, instead of leaving attention alone to bring them there.
    /// Checkpoints from before this field read false.
    #[serde(default)]
    pub condition_actions: bool,
    /// The network between the conditioning and the chunk: pi0's
    /// transformer over action tokens, or an MLP over the whole chunk.
    /// Checkpoints from before this field read `transformer`.
    #[serde(default)]
    pub arch: Arch,
    /// Actions per chunk H.
    pub horizon: usize,
    /// Transformer width (and, with [`Arch::Mlp`], the width of each
    /// conditioning token and of the time embedding).
    pub d_model: usize,
    /// Transformer blocks (with [`Arch::Mlp`]: hidden layers).
    pub n_layers: usize,
    /// Attention heads (divide `d_model`).
    pub n_heads: usize,
    /// Hidden width of each block's MLP (with [`Arch::Mlp`]: of each
    /// hidden layer).
    pub mlp_dim: usize,
    /// Layer-norm epsilon.
    pub norm_eps: f64,
    /// Longest frozen prefix seen in training (real-time chunking); a
    /// longer one is cut to this at run time.
    pub max_prefix: usize,
    /// Control rate of the actions, Hz.
    pub control_hz: f64,
    /// Square input side (pixels) the vision encoder ran at when the
    /// training features were cached: the pipeline's `vision_encoder`
    /// must use the same `image_size` (and `resize: stretch`).
    pub image_size: u32,
}

/// What the action head's network predicts for each action token; either
/// way [`crate::model::ActionHead::velocity`] hands the ODE sampler a
/// velocity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Prediction {
    /// The flow velocity `x1 - x0` (trained on it directly, as pi0).
    #[default]
    Velocity,
    /// The clean chunk `x1`; the velocity at flow time `t` is
    /// `(x1_hat - x_t) / (1 - t)`, and the loss is on `x1_hat`. The loss is
    /// then the chunk's own error at every flow time, not an error that
    /// grows as `1 / (1 - t)` near the data: a regression-quality fit where
    /// the demonstrations are (nearly) deterministic, as a scripted
    /// expert's are.
    Sample,
}

impl Prediction {
    /// What the network's output (less `x_t` for [`Prediction::Sample`])
    /// is multiplied by to give the velocity of a token at flow time `t`:
    /// 1 for the velocity itself; `1 / (1 - t)` for a predicted chunk,
    /// capped so that `t` near 1 stays finite (the Euler sampler never
    /// evaluates `t = 1`). A frozen prefix token (`t = 1`) gets 0 either
    /// way.
    pub fn velocity_weight(self, t: f32) -> f32 {
        match self {
            _ if t >= 1.0 => 0.0,
            Prediction::Velocity => 1.0,
            Prediction::Sample => 1.0 / (1.0 - t).max(1e-3),
        }
    }
}

/// The network that maps the conditioning tokens and the noisy chunk to
/// the output ([`Prediction`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// pi0's action expert: one token per action, a pre-norm transformer
    /// over the conditioning and action tokens (`blocks.*`).
    #[default]
    Transformer,
    /// One MLP (`mlp.{i}`, SiLU, `n_layers` layers `mlp_dim` wide, then
    /// `action_out`) over the flattened conditioning tokens, the flattened
    /// noisy chunk, the flow time's embedding and which actions are frozen
    /// (real-time chunking): diffusion policy's small-task choice. On the
    /// push task's true state it fits the expert's chunks to a fraction of
    /// the transformer's error at a fraction of its cost per step.
    Mlp,
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

fn keypoint_hidden() -> usize {
    128
}

impl Default for Config {
    fn default() -> Self {
        Config {
            feature_dim: 384,
            state_dim: 4,
            action_dim: 2,
            vision_grid: 8,
            vision_stack: 1,
            vision_norm: true,
            text_norm: true,
            keypoints: 8,
            keypoint_relative_scale: 0.3,
            keypoint_hidden: 128,
            keypoint_features: false,
            keypoint_angles: 0,
            cls_token: true,
            privileged: false,
            privileged_relative: false,
            prediction: Prediction::Velocity,
            condition_actions: false,
            arch: Arch::Transformer,
            horizon: 16,
            d_model: 128,
            n_layers: 4,
            n_heads: 4,
            mlp_dim: 384,
            norm_eps: 1e-5,
            max_prefix: 8,
            control_hz: 50.0,
            image_size: 112,
        }
    }
}

impl Config {
    /// Vision rows the head takes as input: CLS + the pooled grid.
    pub fn vision_tokens(&self) -> usize {
        1 + self.vision_grid * self.vision_grid
    }

    /// Vision tokens the transformer sees: CLS + one per keypoint with
    /// [`Config::keypoints`], else every input row.
    pub fn head_vision_tokens(&self) -> usize {
        if self.keypoints > 0 {
            1 + self.keypoints
        } else {
            self.vision_tokens()
        }
    }

    /// Width of each vision token the head takes: `feature_dim *
    /// vision_stack^2`.
    pub fn vision_width(&self) -> usize {
        self.feature_dim * self.vision_stack * self.vision_stack
    }

    /// The head's vision tokens `[vision_tokens * vision_width]` from an
    /// encoder's `[1 + n * n, feature_dim]` (CLS, then the patch grid), by
    /// [`pool_vision_tokens`] with this config's grid and stack.
    pub fn pool(&self, tokens: &[f32]) -> Result<Vec<f32>> {
        pool_vision_tokens(
            tokens,
            self.feature_dim,
            self.vision_grid,
            self.vision_stack,
        )
    }

    /// Conditioning tokens: vision, instruction, state.
    pub fn cond_tokens(&self) -> usize {
        self.head_vision_tokens() + 2
    }

    /// All tokens: conditioning then the H action tokens.
    pub fn tokens(&self) -> usize {
        self.cond_tokens() + self.horizon
    }

    /// Values per keypoint that `kp_in` reads: `(x, y)`, with
    /// `keypoint_relative_scale` also `(x, y)` relative to the robot, and
    /// with `keypoint_angles` last the angle read-out (0 for the keypoints
    /// past the first `keypoint_angles`).
    pub fn keypoint_inputs(&self) -> usize {
        self.keypoint_position_inputs() + if self.keypoint_angles > 0 { 2 } else { 0 }
    }

    /// The position values of [`Self::keypoint_inputs`]: 4 with relative
    /// keypoints, else 2.
    pub fn keypoint_position_inputs(&self) -> usize {
        if self.keypoint_relative_scale > 0.0 {
            4
        } else {
            2
        }
    }

    /// The robot's position in keypoint units, `[2]`, from a raw state (0
    /// without relative keypoints).
    pub fn keypoint_origin(&self, state: &[f32]) -> [f32; 2] {
        if self.keypoint_relative_scale > 0.0 && state.len() >= 2 {
            [
                state[0] / self.keypoint_relative_scale,
                state[1] / self.keypoint_relative_scale,
            ]
        } else {
            [0.0; 2]
        }
    }

    /// Width of the flow-time input for `b` samples' per-token times
    /// `[b * H]`, and its values: with [`Arch::Transformer`] each token's
    /// [`time_embeddings`] (`[b, H, d_model]`); with [`Arch::Mlp`] one row
    /// per sample (`[b, 1, d_model + H]`): the embedding of the time of its
    /// unfrozen actions, then 1 for each frozen action (`t = 1`) and 0 for
    /// the others.
    pub fn time_input(&self, times: &[f32]) -> (Vec<f32>, [usize; 3]) {
        let (h, d) = (self.horizon, self.d_model);
        let b = times.len() / h.max(1);
        match self.arch {
            Arch::Transformer => (time_embeddings(times, d), [b, h, d]),
            Arch::Mlp => {
                let mut v = Vec::with_capacity(b * (d + h));
                for row in times.chunks(h) {
                    let t = row.iter().copied().fold(1.0f32, f32::min);
                    v.extend(time_embeddings(&[t], d));
                    v.extend(row.iter().map(|&t| if t >= 1.0 { 1.0 } else { 0.0 }));
                }
                (v, [b, 1, d + h])
            }
        }
    }

    /// Input width of the first layer of an [`Arch::Mlp`] head: the
    /// flattened conditioning tokens, the flattened chunk, and
    /// [`Self::time_input`]'s row.
    pub fn mlp_inputs(&self) -> usize {
        self.cond_tokens() * self.d_model
            + self.horizon * self.action_dim
            + self.d_model
            + self.horizon
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// Check every field (the error names it and its range).
    pub fn validate(&self) -> Result<()> {
        let bad = |f: &str, v: String, want: &str| {
            Err(Error::Config(format!("`{f}` is {v}, must be {want}")))
        };
        if self.feature_dim == 0 || self.feature_dim > 8192 {
            return bad("feature_dim", self.feature_dim.to_string(), "in 1..=8192");
        }
        if self.state_dim == 0 || self.state_dim > 64 {
            return bad("state_dim", self.state_dim.to_string(), "in 1..=64");
        }
        if self.state_dim < self.action_dim {
            return bad(
                "state_dim",
                self.state_dim.to_string(),
                "at least action_dim (actions are taken relative to the state's first values)",
            );
        }
        if self.privileged && self.keypoints > 0 {
            return bad(
                "keypoints",
                self.keypoints.to_string(),
                "0 in a privileged head (it reads the true state, not the image)",
            );
        }
        if self.privileged_relative && !self.privileged {
            return bad(
                "privileged_relative",
                "true".into(),
                "false in a head that is not privileged (it sees the scene, not the true state)",
            );
        }
        if self.action_dim == 0 || self.action_dim > 64 {
            return bad("action_dim", self.action_dim.to_string(), "in 1..=64");
        }
        if self.vision_grid == 0 || self.vision_grid > 32 {
            return bad("vision_grid", self.vision_grid.to_string(), "in 1..=32");
        }
        if self.vision_stack == 0 || self.vision_stack > 8 {
            return bad("vision_stack", self.vision_stack.to_string(), "in 1..=8");
        }
        if self.keypoints > 256 {
            return bad("keypoints", self.keypoints.to_string(), "in 0..=256");
        }
        if self.keypoints > 0 && self.vision_stack != 1 {
            return bad(
                "vision_stack",
                self.vision_stack.to_string(),
                "1 with keypoints (the keypoint scorer reads single patches)",
            );
        }
        if !(self.keypoint_relative_scale.is_finite() && self.keypoint_relative_scale >= 0.0) {
            return bad(
                "keypoint_relative_scale",
                self.keypoint_relative_scale.to_string(),
                "finite and >= 0",
            );
        }
        if self.keypoints > 0 && !(1..=4096).contains(&self.keypoint_hidden) {
            return bad(
                "keypoint_hidden",
                self.keypoint_hidden.to_string(),
                "in 1..=4096",
            );
        }
        if self.keypoint_angles > self.keypoints {
            return bad(
                "keypoint_angles",
                self.keypoint_angles.to_string(),
                "at most `keypoints` (each angle is read under one keypoint)",
            );
        }
        if self.keypoint_features && self.keypoints == 0 {
            return bad(
                "keypoint_features",
                "true".into(),
                "false without keypoints (it pools the patches under each keypoint)",
            );
        }
        if !self.cls_token && self.keypoints == 0 {
            return bad(
                "cls_token",
                "false".into(),
                "true without keypoints (the scene would reach the head through nothing)",
            );
        }
        if !(2..=256).contains(&self.horizon) {
            return bad("horizon", self.horizon.to_string(), "in 2..=256");
        }
        if self.d_model == 0 || self.d_model > 4096 || !self.d_model.is_multiple_of(2) {
            return bad("d_model", self.d_model.to_string(), "even, in 2..=4096");
        }
        if self.n_heads == 0 || !self.d_model.is_multiple_of(self.n_heads) {
            return bad("n_heads", self.n_heads.to_string(), "a divisor of d_model");
        }
        if self.n_layers == 0 || self.n_layers > 64 {
            return bad("n_layers", self.n_layers.to_string(), "in 1..=64");
        }
        if self.mlp_dim == 0 || self.mlp_dim > 16384 {
            return bad("mlp_dim", self.mlp_dim.to_string(), "in 1..=16384");
        }
        if !(self.norm_eps > 0.0 && self.norm_eps < 1.0) {
            return bad("norm_eps", self.norm_eps.to_string(), "in (0, 1)");
        }
        if self.arch == Arch::Mlp && self.condition_actions {
            return bad(
                "condition_actions",
                "true".into(),
                "false with `arch: mlp` (its one MLP reads the conditioning with every action)",
            );
        }
        if self.max_prefix >= self.horizon {
            return bad(
                "max_prefix",
                self.max_prefix.to_string(),
                "below horizon (some actions must be left to predict)",
            );
        }
        if !(self.control_hz > 0.0 && self.control_hz <= 10_000.0) {
            return bad("control_hz", self.control_hz.to_string(), "in (0, 10000]");
        }
        if !(14..=1036).contains(&self.image_size) {
            return bad("image_size", self.image_size.to_string(), "in 14..=1036");
        }
        Ok(())
    }

    /// The checkpoint metadata for this config.
    pub fn metadata(&self) -> Result<HashMap<String, String>> {
        let json = serde_json::to_string(self)
            .map_err(|e| Error::Config(format!("cannot serialise the config: {e}")))?;
        Ok(HashMap::from([
            (FORMAT_KEY.to_string(), FORMAT.to_string()),
            (CONFIG_KEY.to_string(), json),
        ]))
    }

    /// Read the config from a checkpoint's safetensors header.
    pub fn from_checkpoint(path: &std::path::Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let bad = |msg: String| Error::BadModel {
            path: path.to_path_buf(),
            msg,
        };
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let m = meta.metadata().as_ref().ok_or_else(|| {
            bad(
                "no metadata: not an action-head checkpoint (write one with `edgeflow train policy`)"
                    .into(),
            )
        })?;
        if m.get(FORMAT_KEY).map(String::as_str) != Some(FORMAT) {
            return Err(bad(format!(
                "metadata `{FORMAT_KEY}` is {:?}, expected {FORMAT:?} (write one with `edgeflow train policy`)",
                m.get(FORMAT_KEY)
            )));
        }
        let json = m
            .get(CONFIG_KEY)
            .ok_or_else(|| bad(format!("metadata lacks `{CONFIG_KEY}`")))?;
        let cfg: Config =
            serde_json::from_str(json).map_err(|e| bad(format!("metadata `{CONFIG_KEY}`: {e}")))?;
        cfg.validate().map_err(|e| bad(e.to_string()))?;
        Ok(cfg)
    }
}

/// Per-dimension normalisation of states and actions, fitted on the
/// training set and stored in the checkpoint (`norm.*`). Actions are
/// normalised relative to the state's first `action_dim` values (the
/// pusher position): the head predicts where to go from where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalizer {
    /// State mean.
    pub state_mean: Vec<f32>,
    /// State standard deviation (floored).
    pub state_std: Vec<f32>,
    /// Mean of `action - state[..action_dim]`.
    pub action_mean: Vec<f32>,
    /// Its standard deviation (floored).
    pub action_std: Vec<f32>,
    /// Per-channel mean of the vision features (`feature_dim` values;
    /// empty when the config's `vision_norm` is off).
    pub vision_mean: Vec<f32>,
    /// Their standard deviation (floored; empty likewise).
    pub vision_std: Vec<f32>,
    /// Per-channel mean of the instruction embeddings (`feature_dim`
    /// values; empty when the config's `text_norm` is off).
    pub text_mean: Vec<f32>,
    /// Their standard deviation (floored at a tenth of the channels' RMS
    /// deviation, so an instruction worded unlike the training ones is not
    /// blown up; empty likewise).
    pub text_std: Vec<f32>,
}

/// Smallest standard deviation a normaliser divides by.
pub const MIN_STD: f32 = 1e-3;

impl Normalizer {
    /// Identity normalisation for `cfg`.
    pub fn identity(cfg: &Config) -> Self {
        Normalizer {
            state_mean: vec![0.0; cfg.state_dim],
            state_std: vec![1.0; cfg.state_dim],
            action_mean: vec![0.0; cfg.action_dim],
            action_std: vec![1.0; cfg.action_dim],
            vision_mean: if cfg.vision_norm {
                vec![0.0; cfg.feature_dim]
            } else {
                Vec::new()
            },
            vision_std: if cfg.vision_norm {
                vec![1.0; cfg.feature_dim]
            } else {
                Vec::new()
            },
            text_mean: if cfg.text_norm {
                vec![0.0; cfg.feature_dim]
            } else {
                Vec::new()
            },
            text_std: if cfg.text_norm {
                vec![1.0; cfg.feature_dim]
            } else {
                Vec::new()
            },
        }
    }

    /// The standardised instruction embedding (unchanged without text
    /// statistics).
    pub fn text(&self, e: &[f32]) -> Vec<f32> {
        if self.text_mean.len() != e.len() || self.text_std.len() != e.len() {
            return e.to_vec();
        }
        e.iter()
            .zip(self.text_mean.iter().zip(&self.text_std))
            .map(|(v, (m, s))| (v - m) / s)
            .collect()
    }

    /// Standardise the head's vision tokens (`[vision_tokens *
    /// vision_width]`, as [`Config::pool`] gives them) in place, channel by
    /// channel; the CLS token's zero padding stays zero. No-op without
    /// vision statistics.
    pub fn vision(&self, cfg: &Config, tokens: &mut [f32]) {
        let d = self.vision_mean.len();
        if d == 0 || d != cfg.feature_dim || self.vision_std.len() != d {
            return;
        }
        let segs = cfg.vision_stack * cfg.vision_stack;
        for (k, seg) in tokens.chunks_mut(d).enumerate() {
            // Segment k belongs to token k / segs; the CLS token's padding
            // segments are 1..segs.
            if k > 0 && k < segs {
                continue;
            }
            for ((v, m), s) in seg.iter_mut().zip(&self.vision_mean).zip(&self.vision_std) {
                *v = (*v - m) / s;
            }
        }
    }

    /// The normalised state.
    pub fn state(&self, s: &[f32]) -> Vec<f32> {
        s.iter()
            .zip(self.state_mean.iter().zip(&self.state_std))
            .map(|(v, (m, sd))| (v - m) / sd)
            .collect()
    }

    /// Normalise absolute actions `a[steps * dim]` taken from state `s`.
    pub fn actions(&self, s: &[f32], a: &[f32]) -> Vec<f32> {
        let d = self.action_mean.len();
        a.iter()
            .enumerate()
            .map(|(i, v)| {
                let j = i % d;
                (v - s[j] - self.action_mean[j]) / self.action_std[j]
            })
            .collect()
    }

    /// Absolute actions from normalised ones (the inverse of [`Self::actions`]).
    pub fn denormalize_actions(&self, s: &[f32], x: &[f32]) -> Vec<f32> {
        let d = self.action_mean.len();
        x.iter()
            .enumerate()
            .map(|(i, v)| {
                let j = i % d;
                v * self.action_std[j] + self.action_mean[j] + s[j]
            })
            .collect()
    }
}

/// The head's vision tokens from encoder tokens `[1 + N, dim]` (CLS first,
/// then an `n x n` patch grid, row-major).
///
/// `stack == 1`: `[1 + g * g, dim]`, the CLS token then the grid
/// average-pooled to `g x g` (adaptive pooling: bin `i` covers patches
/// `floor(i n / g) .. ceil((i + 1) n / g)`).
///
/// `stack = k > 1`: `n` must be `k * g`; `[1 + g * g, dim * k * k]`, the
/// CLS token zero-padded, then per bin its `k x k` patches side by side
/// (row-major inside the bin), so nothing is averaged away.
///
/// Tokens already in the output shape pass through.
pub fn pool_vision_tokens(
    tokens: &[f32],
    dim: usize,
    grid: usize,
    stack: usize,
) -> Result<Vec<f32>> {
    if dim == 0 || stack == 0 || tokens.is_empty() || !tokens.len().is_multiple_of(dim) {
        return Err(Error::BadInput(format!(
            "vision tokens: {} values is not a whole number of {dim}-wide tokens",
            tokens.len()
        )));
    }
    let width = dim * stack * stack;
    if tokens.len() == (1 + grid * grid) * width {
        return Ok(tokens.to_vec());
    }
    let t = tokens.len() / dim;
    let patches = t - 1;
    let n = (patches as f64).sqrt().round() as usize;
    let fits = if stack == 1 {
        n >= grid
    } else {
        n == grid * stack
    };
    if n * n != patches || !fits {
        let want = if stack == 1 {
            format!("at least {grid} x {grid}")
        } else {
            let m = grid * stack;
            format!("exactly {m} x {m} (the head stacks {stack} x {stack} patches per token)")
        };
        return Err(Error::BadInput(format!(
            "vision tokens: {t} tokens is not CLS + a square patch grid of {want} \
             (expected 1 + n*n tokens, e.g. 65 for DINOv2 at 112 px)"
        )));
    }
    let mut out = Vec::with_capacity((1 + grid * grid) * width);
    out.extend_from_slice(&tokens[..dim]);
    out.resize(width, 0.0);
    let patch = |y: usize, x: usize| {
        let p = 1 + y * n + x;
        &tokens[p * dim..(p + 1) * dim]
    };
    if stack > 1 {
        for by in 0..grid {
            for bx in 0..grid {
                for y in by * stack..(by + 1) * stack {
                    for x in bx * stack..(bx + 1) * stack {
                        out.extend_from_slice(patch(y, x));
                    }
                }
            }
        }
        return Ok(out);
    }
    let bin = |i: usize| (i * n / grid, ((i + 1) * n).div_ceil(grid));
    let mut acc = vec![0f32; dim];
    for by in 0..grid {
        let (y0, y1) = bin(by);
        for bx in 0..grid {
            let (x0, x1) = bin(bx);
            acc.iter_mut().for_each(|v| *v = 0.0);
            for y in y0..y1 {
                for x in x0..x1 {
                    for (a, v) in acc.iter_mut().zip(patch(y, x)) {
                        *a += v;
                    }
                }
            }
            let c = ((y1 - y0) * (x1 - x0)) as f32;
            out.extend(acc.iter().map(|v| v / c));
        }
    }
    Ok(out)
}

/// The centre of every patch of an `n x n` grid in the keypoints'
/// coordinates, `[n * n * 2]` row-major `(x, y)`: the image spans `[-1, 1]`
/// on both axes, x to the right, y up (the top row is `+1`), so for the
/// push simulator's camera, which sees exactly the table, a keypoint at
/// `(x, y)` is the table point `(x, y) * TABLE_HALF`.
pub fn patch_coords(n: usize) -> Vec<f32> {
    let c = |i: usize| (2 * i + 1) as f32 / n as f32 - 1.0;
    (0..n)
        .flat_map(|r| (0..n).flat_map(move |col| [c(col), -c(r)]))
        .collect()
}

/// Keypoints from patch scores `logits[b, P, K]` (host, row-major): per
/// sample and keypoint a softmax over the `P = n * n` patches, then the
/// expected patch centre ([`patch_coords`]). Returns `[b, K, 2]`.
pub fn spatial_softmax(logits: &[f32], b: usize, n: usize, k: usize) -> Vec<f32> {
    let p = n * n;
    let coords = patch_coords(n);
    let mut out = vec![0f32; b * k * 2];
    for s in 0..b {
        let l = &logits[s * p * k..(s + 1) * p * k];
        for j in 0..k {
            let max = (0..p)
                .map(|i| l[i * k + j])
                .fold(f32::NEG_INFINITY, f32::max);
            let (mut z, mut x, mut y) = (0f32, 0f32, 0f32);
            for i in 0..p {
                let w = (l[i * k + j] - max).exp();
                z += w;
                x += w * coords[2 * i];
                y += w * coords[2 * i + 1];
            }
            out[(s * k + j) * 2] = x / z;
            out[(s * k + j) * 2 + 1] = y / z;
        }
    }
    out
}

/// The softmax over the patch grid behind [`spatial_softmax`]: `[b, K,
/// n * n]` weights (each keypoint's sum to 1) of the same `logits`, for
/// [`Config::keypoint_features`]. (Its positions keep their own loop, so
/// heads without keypoint features keep their bits.)
pub fn spatial_softmax_weights(logits: &[f32], b: usize, n: usize, k: usize) -> Vec<f32> {
    let p = n * n;
    let mut out = vec![0f32; b * k * p];
    for s in 0..b {
        let l = &logits[s * p * k..(s + 1) * p * k];
        for j in 0..k {
            let row = &mut out[(s * k + j) * p..(s * k + j + 1) * p];
            let max = (0..p)
                .map(|i| l[i * k + j])
                .fold(f32::NEG_INFINITY, f32::max);
            let mut z = 0f32;
            for (i, r) in row.iter_mut().enumerate() {
                *r = (l[i * k + j] - max).exp();
                z += *r;
            }
            row.iter_mut().for_each(|r| *r /= z);
        }
    }
    out
}

/// Sinusoidal embedding of a flow time `t` in `[0, 1]`, `dim` values:
/// `sin` then `cos` of `2 pi t / p` for periods `p` spaced geometrically
/// from 4e-3 to 4 (pi0's choice).
pub fn time_embedding(t: f32, dim: usize) -> Vec<f32> {
    let half = dim / 2;
    let (lo, hi) = (4e-3f64, 4.0f64);
    let mut out = vec![0f32; dim];
    for k in 0..half {
        let frac = if half > 1 {
            k as f64 / (half - 1) as f64
        } else {
            0.0
        };
        let period = lo * (hi / lo).powf(frac);
        let a = 2.0 * std::f64::consts::PI * t as f64 / period;
        out[k] = a.sin() as f32;
        out[half + k] = a.cos() as f32;
    }
    out
}

/// Time embeddings of a batch: `times[b * h]` -> `[b * h * dim]` values.
pub fn time_embeddings(times: &[f32], dim: usize) -> Vec<f32> {
    times.iter().flat_map(|&t| time_embedding(t, dim)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_averages_bins_and_keeps_cls() {
        // 1 + 4x4 tokens of width 1, patch value = its index; pooled to 2x2.
        let mut tok = vec![-1.0f32];
        tok.extend((0..16).map(|i| i as f32));
        let p = pool_vision_tokens(&tok, 1, 2, 1).expect("pool");
        // Top-left bin: patches 0, 1, 4, 5 -> 2.5.
        assert_eq!(p, vec![-1.0, 2.5, 4.5, 10.5, 12.5]);
        // Already pooled: unchanged.
        assert_eq!(pool_vision_tokens(&p, 1, 2, 1).expect("same"), p);
        // 16x16 DINOv2 grid to 4x4, width 3.
        let t: Vec<f32> = (0..257 * 3).map(|i| i as f32).collect();
        assert_eq!(pool_vision_tokens(&t, 3, 4, 1).expect("g").len(), 17 * 3);
        assert!(pool_vision_tokens(&t[..256 * 3], 3, 4, 1).is_err());
        assert!(pool_vision_tokens(&t[..7], 3, 4, 1).is_err());
    }

    #[test]
    fn stacking_keeps_every_patch_in_its_bin() {
        // 1 + 4x4 tokens of width 1 stacked 2x2 into a 2x2 grid of width 4.
        let mut tok = vec![-1.0f32];
        tok.extend((0..16).map(|i| i as f32));
        let p = pool_vision_tokens(&tok, 1, 2, 2).expect("stack");
        assert_eq!(
            p,
            vec![
                -1.0, 0.0, 0.0, 0.0, // CLS, zero-padded
                0.0, 1.0, 4.0, 5.0, // top-left bin
                2.0, 3.0, 6.0, 7.0, // top-right
                8.0, 9.0, 12.0, 13.0, // bottom-left
                10.0, 11.0, 14.0, 15.0, // bottom-right
            ]
        );
        assert_eq!(pool_vision_tokens(&p, 1, 2, 2).expect("same"), p);
        // Stacking needs the grid to be exactly stack * grid.
        let t: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let e = pool_vision_tokens(&t, 1, 2, 2).expect_err("6x6 is not 2 x 2");
        assert!(e.to_string().contains("exactly 4 x 4"), "{e}");
        let c = Config {
            vision_grid: 4,
            vision_stack: 2,
            keypoints: 0,
            ..Config::default()
        };
        assert_eq!(c.vision_width(), 4 * 384);
        assert_eq!(
            c.pool(&vec![0.5; 65 * 384]).expect("pool").len(),
            17 * 4 * 384
        );
    }

    #[test]
    fn config_checks_and_round_trips() {
        let c = Config::default();
        c.validate().expect("default");
        // CLS + 8 keypoints, instruction, state, 16 actions.
        assert_eq!(c.tokens(), 1 + 8 + 2 + 16);
        assert_eq!(c.vision_tokens(), 65);
        let stacked = Config {
            keypoints: 1,
            vision_stack: 2,
            ..c.clone()
        };
        assert!(stacked.validate().is_err());
        let bad = Config {
            max_prefix: 16,
            ..c.clone()
        };
        assert!(bad.validate().is_err());
        let seeing = Config {
            privileged: true,
            ..c.clone()
        };
        let e = seeing.validate().expect_err("privileged with keypoints");
        assert!(e.to_string().contains("privileged"), "{e}");
        let relative_seeing = Config {
            privileged_relative: true,
            ..c.clone()
        };
        let e = relative_seeing
            .validate()
            .expect_err("relative, not privileged");
        assert!(e.to_string().contains("privileged_relative"), "{e}");
        let m = c.metadata().expect("meta");
        let back: Config = serde_json::from_str(&m[CONFIG_KEY]).expect("json");
        assert_eq!(back, c);
        // A checkpoint written before `vision_stack` existed reads 1.
        let mut v: serde_json::Value = serde_json::from_str(&m[CONFIG_KEY]).expect("v");
        v.as_object_mut().expect("obj").remove("vision_stack");
        v.as_object_mut().expect("obj").remove("privileged");
        v.as_object_mut()
            .expect("obj")
            .remove("privileged_relative");
        v.as_object_mut().expect("obj").remove("prediction");
        v.as_object_mut().expect("obj").remove("arch");
        let old: Config = serde_json::from_value(v).expect("old");
        assert_eq!(old.arch, Arch::Transformer);
        assert_eq!(old.vision_stack, 1);
        assert!(!old.privileged && !old.privileged_relative);
        assert_eq!(old.prediction, Prediction::Velocity);
        // The prediction is written in lower case.
        let sample = Config {
            prediction: Prediction::Sample,
            ..c.clone()
        };
        let m = sample.metadata().expect("meta");
        assert!(m[CONFIG_KEY].contains(r#""prediction":"sample""#));
    }

    #[test]
    fn an_mlp_head_reads_one_time_row_with_the_frozen_actions_flagged() {
        let c = Config {
            arch: Arch::Mlp,
            horizon: 4,
            max_prefix: 2,
            d_model: 8,
            ..Config::default()
        };
        c.validate().expect("mlp");
        // Two samples: the first with 2 frozen actions at t = 0.3, the
        // second with none at t = 0.7.
        let times = [1.0, 1.0, 0.3, 0.3, 0.7, 0.7, 0.7, 0.7];
        let (v, dims) = c.time_input(&times);
        assert_eq!(dims, [2, 1, 8 + 4]);
        assert_eq!(&v[..8], time_embedding(0.3, 8).as_slice());
        assert_eq!(&v[8..12], &[1.0, 1.0, 0.0, 0.0]);
        assert_eq!(&v[12..20], time_embedding(0.7, 8).as_slice());
        assert_eq!(&v[20..24], &[0.0; 4]);
        // The transformer embeds every token.
        let t = Config {
            arch: Arch::Transformer,
            ..c.clone()
        };
        assert_eq!(t.time_input(&times).1, [2, 4, 8]);
        // Flattened tokens (CLS, 8 keypoints, text, state), chunk, time row.
        assert_eq!(c.mlp_inputs(), 11 * 8 + 4 * 2 + 8 + 4);
        // The written name is lower case; conditioning every action token is
        // a transformer option.
        assert!(c.metadata().expect("meta")[CONFIG_KEY].contains(r#""arch":"mlp""#));
        let e = Config {
            condition_actions: true,
            ..c
        }
        .validate()
        .expect_err("mlp with condition_actions");
        assert!(e.to_string().contains("condition_actions"), "{e}");
    }

    #[test]
    fn normaliser_round_trips_actions() {
        let n = Normalizer {
            state_mean: vec![0.1, -0.1, 0.0, 0.0],
            state_std: vec![0.2, 0.2, 0.1, 0.1],
            action_mean: vec![0.01, 0.02],
            action_std: vec![0.05, 0.04],
            vision_mean: vec![1.0, -2.0],
            vision_std: vec![0.5, 2.0],
            text_mean: vec![0.5, 0.0],
            text_std: vec![0.5, 2.0],
        };
        assert_eq!(n.text(&[1.0, 1.0]), vec![1.0, 0.5]);
        assert_eq!(n.text(&[1.0]), vec![1.0]);
        // Vision: 2-wide features stacked 2 x 2 into 1 + 1 tokens: the CLS
        // token's padding stays zero, every real segment is standardised.
        let cfg = Config {
            feature_dim: 2,
            vision_grid: 1,
            vision_stack: 2,
            ..Config::default()
        };
        let mut v = vec![2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        v.extend([1.0, -2.0, 2.0, 2.0, 0.0, 0.0, 1.5, -4.0]);
        n.vision(&cfg, &mut v);
        assert_eq!(&v[..8], &[2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(&v[8..], &[0.0, 0.0, 2.0, 2.0, -2.0, 1.0, 1.0, -1.0]);
        let s = [0.05, 0.1, 0.3, -0.2];
        let a = [0.1, 0.2, 0.12, 0.18];
        let x = n.actions(&s, &a);
        let b = n.denormalize_actions(&s, &x);
        for (u, v) in a.iter().zip(&b) {
            assert!((u - v).abs() < 1e-6);
        }
        let e = time_embedding(0.5, 8);
        // Patch centres: the top-left patch of a 2 x 2 grid is (-0.5, 0.5).
        assert_eq!(
            patch_coords(2),
            vec![-0.5, 0.5, 0.5, 0.5, -0.5, -0.5, 0.5, -0.5]
        );
        // A peaked score map puts the keypoint on its patch; flat, at the centre.
        let kp = spatial_softmax(&[0.0, 0.0, 0.0, 0.0, 0.0, 50.0, 0.0, 0.0], 1, 2, 2);
        assert!(kp[0].abs() < 1e-6 && kp[1].abs() < 1e-6, "{kp:?}");
        assert!(
            (kp[2] + 0.5).abs() < 1e-6 && (kp[3] + 0.5).abs() < 1e-6,
            "{kp:?}"
        );
        // Its weights: keypoint 0 is flat, keypoint 1 all on patch 2; the
        // positions are the weights' average of the patch centres.
        let w = spatial_softmax_weights(&[0.0, 0.0, 0.0, 0.0, 0.0, 50.0, 0.0, 0.0], 1, 2, 2);
        assert_eq!(w.len(), 8);
        assert!(w[..4].iter().all(|v| (v - 0.25).abs() < 1e-6), "{w:?}");
        assert!(
            (w[6] - 1.0).abs() < 1e-6 && w[4] + w[5] + w[7] < 1e-6,
            "{w:?}"
        );
        assert_eq!(e.len(), 8);
        assert!((e[0].powi(2) + e[4].powi(2) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn keypoint_features_need_keypoints_and_add_one_projection() {
        let c = Config {
            keypoint_features: true,
            ..Config::default()
        };
        c.validate().expect("with keypoints");
        let names: Vec<String> = crate::model::tensor_shapes(&c)
            .into_iter()
            .filter(|(n, _)| n.starts_with("kp_feat"))
            .map(|(n, d)| format!("{n} {d:?}"))
            .collect();
        assert_eq!(names, ["kp_feat.weight [128, 384]", "kp_feat.bias [128]"]);
        let e = Config { keypoints: 0, ..c }
            .validate()
            .expect_err("no keypoints");
        assert!(e.to_string().contains("keypoint_features"), "{e}");
        // Older checkpoints' metadata has no such field.
        let json = serde_json::to_string(&Config::default()).expect("json");
        let field = ",\"keypoint_features\":false";
        assert!(json.contains(field), "{json}");
        let old: Config = serde_json::from_str(&json.replace(field, "")).expect("old config");
        assert!(!old.keypoint_features);
    }

    #[test]
    fn cls_token_off_needs_keypoints_and_keeps_every_shape() {
        let on = Config::default();
        let off = Config {
            cls_token: false,
            ..on.clone()
        };
        off.validate().expect("with keypoints");
        let shapes = crate::model::tensor_shapes;
        assert_eq!(shapes(&on), shapes(&off));
        let e = Config {
            keypoints: 0,
            ..off
        }
        .validate()
        .expect_err("no keypoints");
        assert!(e.to_string().contains("cls_token"), "{e}");
        let json = serde_json::to_string(&on).expect("json");
        let field = ",\"cls_token\":true";
        assert!(json.contains(field), "{json}");
        let old: Config = serde_json::from_str(&json.replace(field, "")).expect("old config");
        assert!(old.cls_token);
    }

    #[test]
    fn keypoint_angles_read_two_more_inputs_under_at_most_every_keypoint() {
        let c = Config {
            keypoint_angles: 2,
            ..Config::default()
        };
        c.validate().expect("two of eight keypoints");
        assert_eq!((c.keypoint_inputs(), c.keypoint_position_inputs()), (6, 4));
        let names: Vec<String> = crate::model::tensor_shapes(&c)
            .into_iter()
            .filter(|(n, _)| n.starts_with("kp_ang") || n.starts_with("kp_in"))
            .map(|(n, d)| format!("{n} {d:?}"))
            .collect();
        assert_eq!(
            names,
            [
                "kp_in.weight [128, 6]",
                "kp_in.bias [128]",
                "kp_ang1.weight [128, 384]",
                "kp_ang1.bias [128]",
                "kp_ang2.weight [2, 128]",
                "kp_ang2.bias [2]"
            ]
        );
        let e = Config { keypoints: 1, ..c }
            .validate()
            .expect_err("more angles than keypoints");
        assert!(e.to_string().contains("keypoint_angles"), "{e}");
        let json = serde_json::to_string(&Config::default()).expect("json");
        let field = ",\"keypoint_angles\":0";
        assert!(json.contains(field), "{json}");
        let old: Config = serde_json::from_str(&json.replace(field, "")).expect("old config");
        assert_eq!(old.keypoint_angles, 0);
    }
}
