//! Subcommands. Each lives in its own file.

use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

mod bench;
mod models;
mod run;

/// `edgeflow <command>`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a pipeline until its sources end (or Ctrl-C / --timeout).
    Run(run::RunArgs),
    /// Check a pipeline file without running it.
    Validate {
        /// Pipeline YAML file.
        file: PathBuf,
        /// Override a param: STAGE.PARAM=VALUE (repeatable).
        #[arg(long = "set", value_name = "STAGE.PARAM=VALUE")]
        set: Vec<String>,
    },
    /// Print the pipeline graph as Graphviz dot or Mermaid.
    Graph {
        /// Pipeline YAML file.
        file: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "dot")]
        format: GraphFormat,
    },
    /// List every stage kind with its ports and params.
    Stages {
        /// Only this kind.
        kind: Option<String>,
        /// Machine-readable JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON schema of the pipeline format.
    Schema,
    /// List compute backends, their adapters and probe results.
    Devices {
        /// Re-run the probes instead of using the cached results.
        #[arg(long)]
        refresh: bool,
    },
    /// Benchmarks that print ratios against a baseline measured in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Fetch model weights into the local cache, or list what is cached.
    #[command(subcommand)]
    Models(models::ModelsCommand),
}

/// Graph output formats.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum GraphFormat {
    /// Graphviz dot.
    Dot,
    /// Mermaid flowchart.
    Mermaid,
}

/// Run a subcommand.
pub fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Run(a) => run::run(a),
        Command::Bench(b) => bench::run(b),
        Command::Models(m) => models::run(m),
        Command::Validate { .. }
        | Command::Graph { .. }
        | Command::Stages { .. }
        | Command::Schema
        | Command::Devices { .. } => {
            anyhow::bail!("this command is being wired up")
        }
    }
}
