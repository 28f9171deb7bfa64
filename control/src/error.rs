//! The control crate's error type.

/// Errors of the control stages. Each message says what went wrong and how
/// to fix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// zenoh refused a session, publisher, subscriber or token.
    #[error("zenoh: {0}")]
    Zenoh(String),
    /// A message could not be encoded or decoded.
    #[error("wire: {0}")]
    Wire(#[from] crate::wire::WireError),
    /// A payload this stage cannot send as configured.
    #[error("{0}")]
    Payload(String),
    /// Test hosts (network namespaces) could not be made.
    #[error("test hosts: {0}")]
    Host(String),
    /// A controller journal entry that cannot be read.
    #[error("controller journal: {0}")]
    Journal(String),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
