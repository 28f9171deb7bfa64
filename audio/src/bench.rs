//! `edgeflow bench audio`.

use crate::error::Result;

/// Run the audio benchmark and return a printable report.
pub fn run_bench() -> Result<String> {
    Ok(String::new())
}
