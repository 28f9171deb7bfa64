//! The crate's one error type.

use std::path::PathBuf;

/// What can go wrong writing, reading or replaying a recording.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be created, written or read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// The MCAP library refused a write.
    #[error("{path}: writing the recording failed: {msg}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What the MCAP writer said.
        msg: String,
    },
    /// The file ends early: it was cut short (a crash, a full disk, a copy
    /// still in progress).
    #[error("{path}: truncated at byte {offset}: expected {expected}; the recording was cut short (a crash or a full disk?); `edgeflow inspect --partial` reads what is complete")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Where the file ends or the incomplete record starts.
        offset: u64,
        /// What should have been there.
        expected: String,
    },
    /// Bytes that do not parse as what they should be.
    #[error("{path}: corrupt at byte {offset}: expected {expected}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The start of the offending record (or field).
        offset: u64,
        /// What should have been there, and what was found.
        expected: String,
    },
    /// A valid MCAP file that is not an edgeflow recording, or lacks part of one.
    #[error("{path}: not an edgeflow recording: {msg}")]
    NotARecording {
        /// The file.
        path: PathBuf,
        /// What is missing.
        msg: String,
    },
    /// The recording was made with another pipeline or edgeflow version.
    #[error("the recording does not match: {0}")]
    Mismatch(String),
    /// A replay request that cannot be honoured (unknown stage, ...).
    #[error("{0}")]
    Replay(String),
    /// The recorded pipeline did not validate or run.
    #[error(transparent)]
    Graph(#[from] edgeflow_graph::Error),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
