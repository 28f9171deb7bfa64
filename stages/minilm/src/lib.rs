//! # edgeflow-minilm
//!
//! The instruction encoder: all-MiniLM-L6-v2 sentence embeddings on the
//! edgeflow tensor runtime, equal to sentence-transformers' within float
//! rounding (the same token ids, cosine > 0.99999).
//!
//! | kind | what |
//! |---|---|
//! | `text_encoder` | text in, its 384-d unit-length embedding out (a `[384]` f32 tensor), cached per distinct text |
//!
//! The parts are plain types usable without a pipeline:
//! [`Encoder`] (text to embedding: [`Tokenizer`], [`BertModel`], pooling,
//! normalisation), [`tokenizer::Tokenizer`] (BERT WordPiece from a
//! `tokenizer.json`), [`model::BertModel`] (`Config`, `load(vb, &cfg)`,
//! `forward(ids, mask)`). [`cards`] describes the model for the model
//! registry (`edgeflow models fetch minilm-l6`).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu)?;
//! let encoder = edgeflow_minilm::Encoder::from_cache(&dev)?;
//! let v: Vec<f32> = encoder.embed("push the red block onto the green target")?;
//! assert_eq!(v.len(), encoder.dim());
//! # Ok(()) }
//! ```

pub mod cards;
mod encoder;
mod error;
pub mod model;
pub mod stage;
pub mod tokenizer;

pub use edgeflow_nn::VarBuilder;
pub use encoder::{Embedded, Encoder, Pooling};
pub use error::{Error, Result};
pub use model::{BertModel, Config};
pub use tokenizer::{Encoding, Tokenizer};

use edgeflow_graph::Registry;

/// The model cards of this crate (`edgeflow models list`).
pub fn cards() -> &'static [edgeflow_models::ModelCard] {
    cards::CARDS
}

/// Register the stage kinds of this crate (`text_encoder`).
pub fn register(r: &mut Registry) {
    r.register(stage::TextEncoderKind);
}
