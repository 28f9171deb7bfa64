//! # edgeflow-audio
//!
//! Everything a voice pipeline needs between the air and the models, as
//! stages usable from YAML:
//!
//! | kind | what |
//! |---|---|
//! | `wav_source` | streams a WAV file (any common PCM / float format) as f32 chunks at its rate |
//! | `wav_sink` | writes a WAV file atomically (temp file + rename at end of stream) |
//! | `resample` | streaming windowed-sinc rate conversion, chunking-invariant |
//! | `mic` | cpal capture, fixed-size chunks stamped with capture time |
//! | `speaker` | cpal playback through a jitter buffer; underruns counted; cancel flushes |
//! | `mel` | Whisper-compatible log-mel features, or HiFi-GAN's (`features: hifigan`) |
//! | `denoise` | RNNoise (nnnoiseless) at 48 kHz with resampling around it |
//! | `gain`, `channel_mix`, `chunker` | small utilities |
//!
//! The signal-processing pieces are also plain types usable without a
//! pipeline: [`StreamResampler`], [`LogMel`], [`Denoiser`], [`Chunker`],
//! [`wav::read_wav`] / [`wav::write_wav`].

pub mod denoise;
pub mod device;
mod error;
pub mod mel;
pub mod mel_hifigan;
pub mod resample;
pub mod util;
pub mod wav;

pub use denoise::Denoiser;
pub use error::{Error, Result};
pub use mel::LogMel;
pub use mel_hifigan::{HifiganMel, HifiganMelConfig, HifiganMelStream};
pub use resample::StreamResampler;
pub use util::Chunker;

use edgeflow_graph::Registry;

/// Register every audio stage kind.
pub fn register(r: &mut Registry) {
    r.register(wav::WavSourceKind);
    r.register(wav::WavSinkKind);
    r.register(resample::ResampleKind);
    r.register(device::MicKind);
    r.register(device::SpeakerKind);
    r.register(mel::MelKind);
    r.register(denoise::DenoiseKind);
    r.register(util::GainKind);
    r.register(util::ChannelMixKind);
    r.register(util::ChunkerKind);
}

/// A registry with the engine's built-in kinds plus every audio kind.
pub fn registry() -> Registry {
    let mut r = Registry::builtin();
    register(&mut r);
    r
}
