//! The runtime's single error type.

use std::path::PathBuf;

/// Everything that can go wrong in the tensor runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A kernel from candle failed. (Not a `source`: the message already
    /// includes it once, so `{:#}` chains do not print it twice.)
    #[error("candle: {0}")]
    Candle(candle_core::Error),
    /// Inputs do not fit the op (shape, dtype, arity).
    #[error("op `{op}`: {msg}")]
    BadInput {
        /// Op name.
        op: &'static str,
        /// What is wrong and how to fix it.
        msg: String,
    },
    /// A backend cannot run this op and no fallback was possible.
    #[error("backend `{backend}` cannot run op `{op}`: {msg}")]
    Unsupported {
        /// Backend name.
        backend: String,
        /// Op name.
        op: &'static str,
        /// Why.
        msg: String,
    },
    /// A device is not available (probe failed or not compiled in).
    #[error("device `{device}` is not available: {reason}")]
    DeviceUnavailable {
        /// The device as written (`gpu:0`).
        device: String,
        /// Why, and what to do.
        reason: String,
    },
    /// A device string in a pipeline could not be parsed.
    #[error("bad device `{0}`: expected cpu, gpu, gpu:N, npu, npu:N or auto")]
    BadDevice(String),
    /// A weight file is missing, truncated or corrupt.
    #[error("weights {path}: {msg}")]
    Weights {
        /// File.
        path: PathBuf,
        /// What is wrong (names the tensor where one is concerned).
        msg: String,
    },
    /// A backend-specific failure (driver, shader compile...).
    #[error("{backend}: {msg}")]
    Backend {
        /// Backend name.
        backend: String,
        /// What failed.
        msg: String,
    },
    /// I/O failure with the path concerned.
    #[error("{path}: {error}")]
    Io {
        /// File.
        path: PathBuf,
        /// Underlying error (not a `source`: the message already includes it once).
        error: std::io::Error,
    },
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Candle(e)
    }
}

/// Result alias for the runtime.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Shorthand for [`Error::BadInput`].
    pub fn bad_input(op: &'static str, msg: impl Into<String>) -> Self {
        Error::BadInput {
            op,
            msg: msg.into(),
        }
    }
}
