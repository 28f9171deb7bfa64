//! # edgeflow-piper
//!
//! Piper text to speech on the edgeflow tensor runtime.
//!
//! - [`piper`]: Piper voices (model cards, text front end) and the TTS stages;
//! - [`vits`]: the VITS model (text encoder, stochastic duration predictor,
//!   flow, HiFi-GAN decoder) on the runtime's `Device` API.

mod error;
pub mod piper;
pub mod vits;

pub use edgeflow_nn::VarBuilder;
pub use error::{Error, Result};
pub use piper::cards::PIPER_JOE;

/// The model cards of every Piper voice (`edgeflow models list`).
pub fn cards() -> &'static [edgeflow_models::ModelCard] {
    piper::cards::CARDS
}

use edgeflow_graph::Registry;

/// Register every model stage kind.
pub fn register(r: &mut Registry) {
    piper::stage::register(r);
}
