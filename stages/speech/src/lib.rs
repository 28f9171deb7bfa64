//! # edgeflow-speech
//!
//! Speech-in stages on the edgeflow tensor runtime:
//!
//! | kind | what |
//! |---|---|
//! | `vad` | Silero VAD v6 (16 kHz): speech probability per 32 ms window, SpeechStart / SpeechEnd events (silero-vad's `VADIterator` rules) |
//! | `asr` | Whisper (CTranslate2 tiny.en): transcribes each utterance at end of speech, greedy like faster-whisper with beam 1 |
//!
//! The models are plain types usable without a pipeline:
//! [`silero::SileroVad`], [`vad::VadStream`], [`whisper::Transcriber`].
//! [`cards`] describes the models for the model registry ([`cards()`]).

pub mod asr;
pub mod cards;
mod error;
pub mod silero;
pub mod vad;
pub mod whisper;

pub use edgeflow_nn::VarBuilder;
pub use error::{Error, Result};

/// The model cards of the speech models (`edgeflow models list`).
pub fn cards() -> &'static [edgeflow_models::ModelCard] {
    cards::CARDS
}

use edgeflow_graph::Registry;

/// Register the stage kinds of this crate (`vad`, `asr`).
pub fn register(r: &mut Registry) {
    r.register(vad::VadKind);
    r.register(asr::AsrKind);
}
