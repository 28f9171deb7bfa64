//! The one error type of this crate.

use std::path::PathBuf;

/// Errors of the shared layers: weights that do not fit the layer, bad
/// arguments, runtime failures, and a cancelled sampler.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The tensor runtime failed (an op, a weight file).
    #[error(transparent)]
    Runtime(edgeflow_runtime::Error),
    /// A checkpoint tensor is missing or does not fit the layer.
    #[error("weights {path}: tensor `{name}` {msg}")]
    Weights {
        /// The weight file (empty when the store has none).
        path: PathBuf,
        /// The full tensor name.
        name: String,
        /// What is wrong, and what the layer expects.
        msg: String,
    },
    /// A bad argument or configuration (what, and how to fix it).
    #[error("{0}")]
    BadInput(String),
    /// [`crate::ode::OdeSampler::sample`] stopped because its check closure
    /// reported a cancel, after `steps` of `total` steps.
    #[error("cancelled after {steps} of {total} sampler steps")]
    Cancelled {
        /// Steps completed before the cancel.
        steps: usize,
        /// Steps the schedule has.
        total: usize,
    },
}

impl From<edgeflow_runtime::Error> for Error {
    fn from(e: edgeflow_runtime::Error) -> Self {
        Error::Runtime(e)
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
