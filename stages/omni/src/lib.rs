//! # edgeflow-omni
//!
//! The Omni speech path of Qwen2.5-Omni on the edgeflow tensor runtime:
//! thinker hidden states -> codec talker -> codec tokens -> token2wav DiT
//! (a flow-matching ODE over mel frames) -> BigVGAN -> audio.
//!
//! - [`talker`]: the codec talker, a Qwen2 decoder over codec tokens fed
//!   the thinker's hidden states and text embeddings;
//! - [`dit`]: token2wav's DiT (codec embedding, speaker conditioning with
//!   [`ecapa`], block-wise attention masks, time embedding) and its sampler
//!   on the shared flow-matching ODE sampler;
//! - [`bigvgan`]: token2wav's BigVGAN vocoder (anti-aliased Snake
//!   activations, upsampling blocks);
//! - [`stage`]: the `talker`, `dit` and `bigvgan` stage kinds, streamed in
//!   chunks, each on its own device.
//!
//! Loaders read the upstream checkpoint's tensor names, so the real
//! Qwen2.5-Omni weights run when given; parity with `transformers` is
//! tested on small random-initialised configurations.

pub mod bigvgan;
pub mod dit;
pub mod ecapa;
mod error;
pub mod stage;
pub mod talker;

pub use edgeflow_nn::{VarBuilder, WeightFormat};
pub use error::{Error, Result};

/// Register the stage kinds of this crate (`talker`, `dit`, `bigvgan`).
pub fn register(r: &mut edgeflow_graph::Registry) {
    r.register(stage::TalkerKind);
    r.register(stage::DitKind);
    r.register(stage::BigVganKind);
}
