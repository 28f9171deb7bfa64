//! # edgeflow-record
//!
//! Record every edge of a running pipeline into an MCAP file, read it back,
//! summarise it and replay it.
//!
//! - [`Recorder`]: an edge tap ([`edgeflow_graph::EdgeTap`]) that writes each
//!   message sent on an edge to the file on its own thread. One MCAP channel
//!   per edge (topic `from.port->to.port`, message encoding
//!   [`format::MESSAGE_ENCODING`]: the edgeflow wire format v1 with epoch,
//!   seq, capture time and deadline in its header); log time = when it was
//!   sent, publish time = its capture time, both as Unix ns; MCAP sequence =
//!   the message's seq (low 32 bits). The pipeline file is an attachment,
//!   the run (name, file hash, versions, `--set` overrides) and the
//!   resolved params of every stage are metadata records. A size limit
//!   rotates into `NAME.1.mcap`... or stops recording with a warning.
//! - [`Recording`]: reads a file back; a truncated or corrupt file is an
//!   error naming the byte offset and what was expected.
//! - [`Summary`]: per edge counts, rates, gaps, epochs.
//! - [`replay::prepare`]: the recorded pipeline with chosen stages replaced by
//!   their recorded outputs.

mod error;
pub mod format;
mod reader;
pub mod replay;
mod summary;
mod writer;

pub use error::{Error, Result};
pub use reader::{JournalEntry, RecordedEdge, RecordedMessage, Recording};
pub use replay::{prepare, Replay, Speed};
pub use summary::{EdgeSummary, Summary};
pub use writer::{RecordOptions, RecordStats, Recorder, RunInfo};
