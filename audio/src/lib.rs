//! # edgeflow-audio
//!
//! Audio stages: WAV files, streaming resampling, cpal microphone and
//! speaker, Whisper-compatible log-mel, RNNoise denoise, small utilities.

use edgeflow_graph::Registry;

/// Register every audio stage kind.
pub fn register(r: &mut Registry) {
    let _ = r;
}
