//! The `edgeflow` command line.

use clap::Parser;
use std::process::ExitCode;

mod cli;

/// Run multimodal agent pipelines (speech, voice loops, robot control) from YAML.
#[derive(Debug, Parser)]
#[command(name = "edgeflow", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: cli::Command,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli::dispatch(cli.cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
