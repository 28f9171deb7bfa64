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
        BenchCommand::Dataflow => {
            let o = edgeflow_graph::bench::DataflowBenchOptions::default();
            eprintln!("measuring the raw baseline and the engine (about 10 s)...");
            let r = edgeflow_graph::bench::run_dataflow_bench(&o)?;
            print!("{}", r.render());
            Ok(ExitCode::SUCCESS)
        }
    }
}
