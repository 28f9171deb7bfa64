//! Piper voices: their model cards, their config, the text front end
//! (normalization, sentence splitting, espeak-ng phonemes, phoneme ids) and
//! the stages that speak.

pub mod cards;
pub mod config;
pub mod phonemize;
pub mod stage;
pub mod text;

pub use config::{InferenceScales, VoiceConfig};
pub use phonemize::{EspeakPhonemizer, FrontEnd, PhonemizedSentence};
