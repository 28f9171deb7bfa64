//! Subcommands. Each lives in its own file.

use clap::Subcommand;
use std::process::ExitCode;

mod bench;
mod devices;
mod eval;
mod eval_policy;
mod eval_thinker;
mod graph;
mod inspect;
mod models;
pub(crate) mod parts;
mod replay;
mod rollout;
mod run;
mod schema;
mod sim;
mod stages;
mod train;
mod validate;

/// `edgeflow <command>`.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a pipeline until its sources end (or Ctrl-C / --timeout).
    Run(run::RunArgs),
    /// Check a pipeline file without running it.
    ///
    /// Prints a one-line summary, or every problem with its
    /// file:line:column, stage or edge, and fix (exit code 1).
    Validate(validate::ValidateArgs),
    /// Print the pipeline graph as Graphviz dot or Mermaid.
    ///
    /// Stages are nodes (id, kind, device); edges are labelled with their
    /// ports, policy and capacity; back-edges are dashed.
    Graph(graph::GraphArgs),
    /// List every stage kind with its ports and params.
    Stages(stages::StagesArgs),
    /// Print the JSON schema of the pipeline format.
    ///
    /// The same text as the committed pipelines/schema.json; point your
    /// editor's YAML language server at it.
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
    /// Simulated robots, each in its own process, reached over zenoh.
    #[command(subcommand)]
    Sim(sim::SimCommand),
    /// Run a recording (`run --record`) again, with chosen stages replaced
    /// by their recorded outputs.
    Replay(replay::ReplayArgs),
    /// Summarise a recording (`run --record`): pipeline, edges, message
    /// counts, rates, gaps.
    Inspect(inspect::InspectArgs),
    /// Train models here (the action head, on recorded episodes).
    #[command(subcommand)]
    Train(train::TrainCommand),
    /// Evaluate a policy pipeline end to end against the simulator.
    #[command(subcommand)]
    Eval(eval::EvalCommand),
}

/// Run a subcommand.
pub(crate) fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Run(a) => run::run(a),
        Command::Bench(b) => bench::run(b),
        Command::Models(m) => models::run(m),
        Command::Sim(c) => sim::run(c),
        Command::Train(c) => train::run(c),
        Command::Eval(c) => eval::run(c),
        Command::Validate(a) => validate::run(a),
        Command::Graph(a) => graph::run(a),
        Command::Stages(a) => stages::run(a),
        Command::Schema => schema::run(),
        Command::Devices { refresh } => devices::run(refresh, false),
        Command::Replay(a) => replay::run(a),
        Command::Inspect(a) => inspect::run(a),
    }
}
