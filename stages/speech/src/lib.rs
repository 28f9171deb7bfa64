//! # edgeflow-speech
//!
//! Speech-in stages: `vad` (Silero VAD v6) and `asr` (Whisper).

use edgeflow_graph::Registry;

/// Register the stage kinds of this crate.
pub fn register(r: &mut Registry) {
    let _ = r;
}
