//! The crate's error type.

use std::path::PathBuf;

/// Everything the DINOv2 encoder can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A weight file that is not the model this crate expects.
    #[error("{path}: {msg}")]
    BadModel {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// Input that does not fit the model (what, and how to fix it).
    #[error("{0}")]
    BadInput(String),
    /// A layer or its weights failed.
    #[error(transparent)]
    Nn(#[from] edgeflow_nn::Error),
    /// The tensor runtime failed.
    #[error(transparent)]
    Runtime(#[from] edgeflow_runtime::Error),
    /// Image decoding or preprocessing failed.
    #[error(transparent)]
    Vision(#[from] edgeflow_vision::Error),
    /// The model is not in the cache (names the fetch command).
    #[error(transparent)]
    Models(#[from] edgeflow_models::Error),
}

impl Error {
    pub(crate) fn bad_model(path: &std::path::Path, msg: impl Into<String>) -> Self {
        Error::BadModel {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
