//! The graph crate's error type.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// One problem found in a pipeline file: where, what, and how to fix it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Diagnostic {
    /// The pipeline file, when parsing from a file.
    pub file: Option<PathBuf>,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// What it concerns: ``stage `asr` ``, ``edge `mic.out -> vad.in` ``...
    pub context: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub fix: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line, self.column) {
            (Some(p), Some(l), Some(c)) => write!(f, "{}:{l}:{c}: ", p.display())?,
            (Some(p), Some(l), None) => write!(f, "{}:{l}: ", p.display())?,
            (Some(p), None, _) => write!(f, "{}: ", p.display())?,
            (None, Some(l), Some(c)) => write!(f, "line {l}, column {c}: ")?,
            _ => {}
        }
        if !self.context.is_empty() {
            write!(f, "{}: ", self.context)?;
        }
        f.write_str(&self.message)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n  fix: {fix}")?;
        }
        Ok(())
    }
}

/// Errors of the dataflow engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The pipeline file is malformed or inconsistent (one or more problems).
    #[error("invalid pipeline:\n{}", .0.iter().map(|d| format!("  {d}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Diagnostic>),
    /// Reading a file failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why (not a `source`: the message already includes it once).
        error: std::io::Error,
    },
    /// A stage could not be built (model missing, device busy...).
    #[error("stage `{stage}` could not start: {msg}")]
    Build {
        /// Stage id.
        stage: String,
        /// Why, and what to do.
        msg: String,
    },
    /// A stage returned an error while running; the pipeline was stopped.
    #[error("stage `{stage}` failed: {msg}")]
    StageFailed {
        /// Stage id.
        stage: String,
        /// The stage's error.
        msg: String,
    },
    /// A stage panicked; the pipeline was stopped.
    #[error("stage `{stage}` panicked: {msg}")]
    StagePanicked {
        /// Stage id.
        stage: String,
        /// Panic message.
        msg: String,
    },
    /// A host port (push/pull) does not exist.
    #[error("no host port `{0}`: add a stage of kind `host_in` / `host_out` with that id")]
    NoHostPort(String),
    /// A wait ran out of time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The pipeline has stopped.
    #[error("the pipeline has stopped")]
    Stopped,
    /// The pipeline cannot be split into the part asked for.
    #[error("cannot run the part: {0}")]
    Split(String),
}

impl Error {
    /// A single diagnostic as an error.
    pub fn invalid(d: Diagnostic) -> Self {
        Error::Invalid(vec![d])
    }
}

/// Result alias for the graph crate.
pub type Result<T> = std::result::Result<T, Error>;
