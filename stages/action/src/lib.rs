//! # edgeflow-action
//!
//! A flow-matching action head (pi0's action expert at small scale), its
//! training, and real-time chunking, as the `action_head` stage.
//!
//! - [`config`]: the [`Config`], the state / action [`Normalizer`], vision
//!   token pooling and the flow-time embedding, shared by both twins;
//! - [`model`]: the head on edgeflow's runtime ([`ActionHead`]: `load(vb,
//!   &cfg)`, `condition`, `velocity`), built from edgeflow-nn layers;
//! - [`policy`]: chunks through the shared ODE sampler, with real-time
//!   chunking ([`RtcMode`]);
//! - [`train`]: the candle twin with autograd, AdamW, the loss curve;
//! - [`stage`]: the `action_head` stage kind.
//!
//! Flow convention: `x_t = t a + (1 - t) noise`, velocity `a - noise`,
//! sampled from `t = 0` (noise) to `t = 1` (actions); see [`config`].

pub mod config;
mod error;
pub mod model;
pub mod policy;
pub mod rng;
pub mod stage;
pub mod train;

pub use config::{Config, Normalizer, Prediction};
pub use error::{Error, Result};
pub use model::ActionHead;
pub use policy::{Chunk, Observation, Policy, RtcMode};

use edgeflow_graph::Registry;

/// The model cards of this crate (`edgeflow models list`): none, the
/// head's weights are trained here (`edgeflow train policy`).
pub fn cards() -> &'static [edgeflow_models::ModelCard] {
    &[]
}

/// Register the stage kinds of this crate (`action_head`).
pub fn register(r: &mut Registry) {
    r.register(stage::ActionHeadKind);
}
