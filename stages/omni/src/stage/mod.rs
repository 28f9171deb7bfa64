//! The Omni speech path's stage kinds: `talker` (thinker hidden states in,
//! codec tokens out), `dit` (codec tokens in, mel frames out) and
//! `bigvgan` (mel frames in, 24 kHz audio out), each placed on its own
//! device by the pipeline file and streamed chunk by chunk over bounded
//! edges.
//!
//! Without a checkpoint (`model_dir`), each runs seeded random weights at a
//! small configuration (`model: random-small`, the default) or at
//! Qwen2.5-Omni's real one (`model: random-real`), and says so in one line
//! at start: no Qwen2.5-Omni weights can be had offline. With `model_dir`
//! pointing at a Qwen2.5-Omni checkpoint folder they run the real model.

pub mod bigvgan;
pub mod dit;
pub mod source;
pub mod talker;

pub use bigvgan::BigVganKind;
pub use dit::DitKind;
pub use source::Source;
pub use talker::TalkerKind;
