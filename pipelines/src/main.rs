//! The `edgeflow` command line.

use clap::Parser;
use std::process::ExitCode;

mod bench;
mod cli;

/// Large allocations (weights, big activations) fault in on 2 MB pages.
#[global_allocator]
static ALLOC: edgeflow_backends::HugePageAlloc = edgeflow_backends::HugePageAlloc;

/// Run multimodal agent pipelines (speech, voice loops, robot control) from YAML.
#[derive(Debug, Parser)]
#[command(name = "edgeflow", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: cli::Command,
}

fn main() -> ExitCode {
    // Allocator settings first (process-wide; see the function's docs).
    edgeflow_backends::keep_freed_memory();
    // Before any thread starts: candle otherwise re-reads /proc/cpuinfo on
    // every CPU matmul to find its thread count. `bench tts` sets the count
    // from its own --threads flag instead.
    let args: Vec<String> = std::env::args().collect();
    if !args.windows(2).any(|w| w[0] == "bench" && w[1] == "tts") {
        edgeflow_backends::pin_cpu_threads();
    }
    let cli = Cli::parse();
    match cli::dispatch(cli.cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
