//! The crate's single error type.

use std::path::PathBuf;

/// Everything that can go wrong in the Omni speech path: reading a
/// checkpoint or config, and the models themselves.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor op failed in the runtime. (Not a `source`: the message
    /// already includes it once, so `{:#}` chains do not print it twice.)
    #[error("runtime: {0}")]
    Runtime(edgeflow_runtime::Error),
    /// A shared layer failed in another way (see [`edgeflow_nn::Error`]).
    #[error(transparent)]
    Layers(edgeflow_nn::Error),
    /// A model is not in the cache, or fetching it failed (the model
    /// registry's error: it says what to run or where to put which file).
    #[error(transparent)]
    Models(#[from] edgeflow_models::Error),
    /// A weight or config file is malformed or does not match the model.
    #[error("{path}: {msg}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong (names the tensor or field concerned).
        msg: String,
    },
    /// Inputs do not fit the model (shape, length, parameters).
    #[error("{0}")]
    BadInput(String),
    /// A cancel arrived between two steps (ODE steps or tokens).
    #[error("cancelled after {steps} of {total} steps")]
    Cancelled {
        /// Steps completed.
        steps: usize,
        /// Steps the run would have taken.
        total: usize,
    },
    /// I/O failure with the path concerned.
    #[error("{path}: {error}")]
    Io {
        /// File or folder.
        path: PathBuf,
        /// Underlying error (not a `source`: the message already includes it once).
        error: std::io::Error,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error,
        }
    }

    /// An [`Error::BadFile`] for `path`.
    pub fn bad_file(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::BadFile {
            path: path.into(),
            msg: msg.into(),
        }
    }
}

impl From<edgeflow_runtime::Error> for Error {
    fn from(e: edgeflow_runtime::Error) -> Self {
        // I/O errors read the same in both crates; only op failures are
        // worth the "runtime:" prefix.
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
            edgeflow_nn::Error::Weights { path, name, msg } => Error::BadFile {
                path,
                msg: format!("tensor `{name}` {msg}"),
            },
            edgeflow_nn::Error::BadInput(msg) => Error::BadInput(msg),
            edgeflow_nn::Error::Cancelled { steps, total } => Error::Cancelled { steps, total },
            other => Error::Layers(other),
        }
    }
}

impl From<edgeflow_runtime::candle_core::Error> for Error {
    fn from(e: edgeflow_runtime::candle_core::Error) -> Self {
        Error::Runtime(edgeflow_runtime::Error::Candle(e))
    }
}
