//! # edgeflow-piper
//!
//! Piper text to speech on the edgeflow tensor runtime.
//!
//! - [`piper`]: Piper voices (fetching, text front end) and the TTS stages;
//! - [`vits`]: the VITS model (text encoder, stochastic duration predictor,
//!   flow, HiFi-GAN decoder) on the runtime's `Device` API.

mod error;
pub mod piper;
pub mod vits;

pub use edgeflow_nn::VarBuilder;
pub use error::{Error, Result};

use edgeflow_graph::Registry;

/// Register every model stage kind.
pub fn register(r: &mut Registry) {
    piper::stage::register(r);
}
