//! # edgeflow-nn
//!
//! The layers edgeflow's model files are built from, written once against
//! the runtime's [`Device`](edgeflow_runtime::Device) /
//! [`Tensor`](edgeflow_runtime::Tensor) op API (so every layer runs on
//! every backend, with the runtime's per-op placement and fallback), and
//! [`VarBuilder`], which fetches a checkpoint's tensors by name on top of
//! the runtime's [`WeightStore`](edgeflow_runtime::weights::WeightStore).
//! It plays the part candle-nn plays for candle-transformers.
//!
//! - [`Linear`] (f32, f16, Q4_0 / Q4_1 / Q8_0, optional bias),
//!   [`Embedding`], [`stack_rows`] for fused projections;
//! - [`LayerNorm`], [`RmsNorm`];
//! - [`RotaryEmbedding`] in both layouts ([`RopeLayout`]);
//! - [`Attention`]: multi-head / grouped-query attention over the
//!   runtime's fused attention op and its [`KvCache`];
//! - [`Decoder`]: the Llama / Qwen2 decoder layer stack (RMSNorm, GQA with
//!   RoPE, optional Q/K/V biases and a KV cache, SiLU-gated MLP) under
//!   llama.cpp's GGUF names or Hugging Face's ([`DecoderNames`]);
//! - [`Conv1d`], [`Pointwise`], [`ConvTranspose1d`], weight-norm folding
//!   ([`fold_weight_norm`]);
//! - [`HifiGanGenerator`]: the HiFi-GAN generator (VITS's decoder and the
//!   HiFi-GAN vocoders);
//! - [`MelStream`]: a spectrogram vocoded as it arrives, chunk by chunk
//!   with context, by any [`MelVocoder`];
//! - [`ode`]: a flow-matching ODE sampler (Euler, midpoint, RK4 classic and
//!   3/8 rule), cancellable between steps.
//!
//! A model file has a `Config`, a `load(vb: &VarBuilder, cfg: &Config)`
//! whose tensor names mirror the checkpoint, and `forward` (or `step` and
//! `reset` for stateful models); see this crate's README.

mod attention;
mod conv;
mod decoder;
mod error;
mod hifigan;
mod linear;
mod mel_stream;
mod norm;
pub mod ode;
mod rope;
mod var_builder;

pub use attention::{attend, merge_heads, split_heads, Attention, Masking, Projections};
pub use conv::{
    fold_weight_norm, load_conv_weight, Conv1d, Conv1dConfig, ConvTranspose1d, Pointwise,
};
pub use decoder::{Decoder, DecoderConfig, DecoderLayer, DecoderNames, QkvBias, WeightFormat};
pub use edgeflow_runtime::{ConvCfg, ConvTransposeCfg, KvCache};
pub use error::{Error, Result};
pub use hifigan::{HifiGanConfig, HifiGanGenerator};
pub use linear::{stack_rows, Embedding, Linear};
pub use mel_stream::{MelStream, MelVocoder};
pub use norm::{LayerNorm, RmsNorm};
pub use ode::{OdeMethod, OdeSampler, Schedule};
pub use rope::{RopeAt, RopeLayout, RotaryEmbedding};
pub use var_builder::VarBuilder;
