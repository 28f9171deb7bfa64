//! Piper voices: fetching them, their config, the text front end
//! (normalization, sentence splitting, espeak-ng phonemes, phoneme ids) and
//! the stages that speak.

pub mod fetch;
