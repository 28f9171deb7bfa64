//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong reading or preparing an image.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Bytes that are not a PNG / JPEG this crate can decode (unknown
    /// format, truncated or corrupt data).
    #[error("cannot decode image {what}: {msg}")]
    Decode {
        /// The file or source of the bytes.
        what: String,
        /// What the decoder said.
        msg: String,
    },
    /// An image (or a file) larger than the configured limits.
    #[error("image {what} is too large: {msg}")]
    TooLarge {
        /// The file or source of the bytes.
        what: String,
        /// Sizes found and allowed, and how to raise the limit.
        msg: String,
    },
    /// Arguments or frames that do not fit (zero sizes, a frame whose
    /// bytes do not match its dimensions, a crop larger than the image).
    #[error("{0}")]
    BadInput(String),
    /// A tensor operation failed.
    #[error(transparent)]
    Runtime(#[from] edgeflow_runtime::Error),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
