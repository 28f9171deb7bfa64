//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in this crate: a bad configuration, a bad
/// argument, or an episode folder that cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A [`crate::PushConfig`] field is out of range.
    #[error("invalid PushConfig.{field} = {value}: {why}")]
    Config {
        /// The field's name.
        field: &'static str,
        /// Its value, as text.
        value: String,
        /// What is wrong and what is accepted.
        why: String,
    },
    /// An argument to a recording call does not fit the episode.
    #[error("{what}")]
    Argument {
        /// What is wrong and how to fix it.
        what: String,
    },
    /// A file system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("create", "read", "rename" ...).
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// An episode folder's content does not match its `meta.json`, or
    /// `meta.json` itself is malformed.
    #[error("episode {path}: {what}")]
    Format {
        /// The file or folder at fault.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, SimError>;

impl SimError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Self::Format {
            path: path.into(),
            what: what.into(),
        }
    }
}
