//! # edgeflow-stages
//!
//! Model stages written against the edgeflow tensor runtime.
//!
//! - [`piper`]: Piper voices (fetching, text front end) and the TTS stages;
//! - [`vits`]: the VITS model (text encoder, stochastic duration predictor,
//!   flow, HiFi-GAN decoder) on the runtime's `Device` API;
//! - [`onnx_proto`]: a minimal ONNX reader used to extract Piper's weights.

mod error;
pub mod onnx_proto;
pub mod piper;
pub mod vits;

pub use error::{Error, Result};

use edgeflow_graph::Registry;

/// Register every model stage kind.
pub fn register(r: &mut Registry) {
    piper::stage::register(r);
}
