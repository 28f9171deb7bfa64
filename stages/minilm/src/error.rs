//! The one error type of this crate.

use std::path::{Path, PathBuf};

/// Everything that can go wrong in the instruction encoder.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model is not in the cache, or fetching it failed (the model
    /// registry's error: it says what to run or where to put which file).
    #[error(transparent)]
    Models(#[from] edgeflow_models::Error),
    /// A file could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error (not a `source`: the message already includes it once).
        error: std::io::Error,
    },
    /// A model file is present but its content is not what the encoder
    /// needs (a malformed JSON, a missing tensor, an unsupported option).
    #[error("{}: {msg}", path.display())]
    BadModel {
        /// The file.
        path: PathBuf,
        /// What does not match, and what would.
        msg: String,
    },
    /// Input the encoder cannot take (an empty text where one is required,
    /// a token id outside the vocabulary, a batch of ragged masks...).
    #[error("{0}")]
    BadInput(String),
    /// A tensor runtime error (op failure, weight reader error).
    #[error(transparent)]
    Runtime(edgeflow_runtime::Error),
    /// A shared layer failed in another way (see [`edgeflow_nn::Error`]).
    #[error(transparent)]
    Layers(edgeflow_nn::Error),
}

impl Error {
    /// An I/O error about `path`.
    pub fn io(path: &Path, error: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            error,
        }
    }

    /// A model-content error about `path`.
    pub fn bad_model(path: &Path, msg: impl Into<String>) -> Self {
        Error::BadModel {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }
}

impl From<edgeflow_runtime::Error> for Error {
    fn from(e: edgeflow_runtime::Error) -> Self {
        // The runtime's I/O errors are this crate's own kind.
        match e {
            edgeflow_runtime::Error::Io { path, error } => Error::Io { path, error },
            other => Error::Runtime(other),
        }
    }
}

impl From<edgeflow_nn::Error> for Error {
    fn from(e: edgeflow_nn::Error) -> Self {
        match e {
            edgeflow_nn::Error::Runtime(e) => e.into(),
            edgeflow_nn::Error::Weights { path, name, msg } => Error::BadModel {
                path,
                msg: format!("tensor `{name}` {msg}"),
            },
            edgeflow_nn::Error::BadInput(msg) => Error::BadInput(msg),
            other => Error::Layers(other),
        }
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;
