//! The one error type of this crate.

use std::path::PathBuf;

/// Errors of the thinker: model files, tokenizer, template, runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model is not in the cache, or fetching it failed (the model
    /// registry's error: it says what to run or where to put which file).
    #[error(transparent)]
    Models(#[from] edgeflow_models::Error),
    /// The GGUF lacks something the model needs, or holds unsupported values.
    #[error("{path}: {msg}")]
    Model {
        /// The model file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// Tokenizer construction or use failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be rendered.
    #[error("chat template: {0}")]
    Template(String),
    /// A bad argument (empty prompt, context overflow, bad sampling params).
    #[error("{0}")]
    BadInput(String),
    /// The tensor runtime failed.
    #[error(transparent)]
    Runtime(edgeflow_runtime::Error),
    /// A shared layer failed in another way (see [`edgeflow_nn::Error`]).
    #[error(transparent)]
    Layers(edgeflow_nn::Error),
    /// File I/O.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause (not a `source`: the message already includes it once).
        error: std::io::Error,
    },
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
            edgeflow_nn::Error::Weights { path, name, msg } => Error::Model {
                path,
                msg: format!("tensor `{name}` {msg}"),
            },
            edgeflow_nn::Error::BadInput(msg) => Error::BadInput(msg),
            other => Error::Layers(other),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
