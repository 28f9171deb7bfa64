//! The one error type of this crate.

use std::path::PathBuf;

/// Errors of the thinker: model files, tokenizer, template, runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model is not in the cache (or the given path does not exist).
    #[error("model `{model}` not found: {msg}")]
    ModelMissing {
        /// Model name.
        model: String,
        /// What is missing and how to get it.
        msg: String,
    },
    /// Fetching a model failed.
    #[error("fetching `{model}`: {msg}")]
    Fetch {
        /// Model name.
        model: String,
        /// What went wrong and what to do.
        msg: String,
    },
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

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error,
        }
    }
}

impl From<edgeflow_runtime::Error> for Error {
    fn from(e: edgeflow_runtime::Error) -> Self {
        // The runtime's model-cache errors are this crate's own kinds.
        match e {
            edgeflow_runtime::Error::Fetch { model, msg } => Error::Fetch { model, msg },
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
