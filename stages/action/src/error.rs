//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong in the action head, its training and its
/// stage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// A checkpoint is present but not what the head needs.
    #[error("{}: {msg}", path.display())]
    BadModel {
        /// The file.
        path: PathBuf,
        /// What does not match.
        msg: String,
    },
    /// A configuration value out of range.
    #[error("action head config: {0}")]
    Config(String),
    /// Input the head cannot take (wrong sizes, non-finite values...).
    #[error("{0}")]
    BadInput(String),
    /// A training dataset that cannot train anything.
    #[error("training data: {0}")]
    Data(String),
    /// The work was cancelled between two ODE steps.
    #[error("cancelled")]
    Cancelled,
    /// A runtime error (op failure, weight reader error).
    #[error(transparent)]
    Runtime(#[from] edgeflow_runtime::Error),
    /// A shared layer failed.
    #[error(transparent)]
    Layers(edgeflow_nn::Error),
    /// candle (the training twin) failed.
    #[error("training: {0}")]
    Candle(#[from] candle_core::Error),
    /// The loss plot could not be drawn or written.
    #[error("loss plot: {0}")]
    Plot(String),
}

impl From<edgeflow_nn::Error> for Error {
    fn from(e: edgeflow_nn::Error) -> Self {
        match e {
            edgeflow_nn::Error::Cancelled { .. } => Error::Cancelled,
            other => Error::Layers(other),
        }
    }
}

impl Error {
    /// An I/O error about `path`.
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error,
        }
    }
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
