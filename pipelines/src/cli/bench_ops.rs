//! `edgeflow bench ops`: the tensor runtime's CPU kernels against raw candle
//! and against the memory bandwidth measured in the same run.

use std::process::ExitCode;
use std::time::Duration;

/// Options of `edgeflow bench ops`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchOpsArgs {
    /// Weight bytes streamed per GEMV pass and size of the bandwidth buffer, MB.
    #[arg(long, default_value_t = 256)]
    pub working_set_mb: usize,
    /// Minimum measuring time per row, ms.
    #[arg(long, default_value_t = 600)]
    pub min_time_ms: u64,
    /// Parts the bandwidth ceiling is read in, on the worker pool (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Run only these row groups (comma-separated: gemm, gemv, matmul, conv,
    /// attention).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// Run the op benchmark and print its table.
pub fn run(args: BenchOpsArgs) -> anyhow::Result<ExitCode> {
    let defaults = edgeflow_backends::opbench::BenchOptions::default();
    let o = edgeflow_backends::opbench::BenchOptions {
        working_set_mb: args.working_set_mb.max(1),
        min_time: Duration::from_millis(args.min_time_ms),
        threads: args.threads.map_or(defaults.threads, |t| t.max(1)),
        only: args.only,
    };
    let report = edgeflow_backends::opbench::run(&o, |what| eprintln!("measuring {what}..."))?;
    print!("{}", report.render());
    println!(
        "\nratio = candle time / runtime time (targets: >= 0.95x; decode GEMV >= 70% of bandwidth)"
    );
    Ok(ExitCode::SUCCESS)
}
