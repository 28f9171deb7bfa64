//! The audio crate's error type.

use std::path::PathBuf;

/// Errors of the audio stages. Every message says what went wrong, where,
/// and how to fix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A WAV file could not be read or written as asked.
    #[error("{}: {msg}", path.display())]
    Wav {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        msg: String,
    },
    /// A file operation failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why (not a `source`: the message already includes it once).
        error: std::io::Error,
    },
    /// A sample rate or channel count the stage cannot work with.
    #[error("{0}")]
    Format(String),
    /// The resampler could not be built or failed.
    #[error("resampler: {0}")]
    Resample(String),
    /// An audio device is missing, busy or refused the configuration.
    #[error("{0}")]
    Device(String),
    /// A pipeline run by this crate (the benchmark) failed.
    #[error("pipeline: {0}")]
    Pipeline(String),
}

/// Result alias for the audio crate.
pub type Result<T> = std::result::Result<T, Error>;
