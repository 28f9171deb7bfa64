//! `edgeflow bench ...`.

use std::process::ExitCode;

/// Benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Dataflow engine: 17-stage chain latency, throughput, 4 MB tensor hops,
    /// against a raw crossbeam-channel baseline.
    Dataflow,
}

/// Run a benchmark.
pub fn run(b: BenchCommand) -> anyhow::Result<ExitCode> {
    match b {
        BenchCommand::Dataflow => anyhow::bail!("being wired up"),
    }
}
