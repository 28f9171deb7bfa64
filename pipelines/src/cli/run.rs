//! `edgeflow run`.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `edgeflow run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Pipeline YAML file.
    pub file: PathBuf,
    /// Override a param: STAGE.PARAM=VALUE (repeatable).
    #[arg(long = "set", value_name = "STAGE.PARAM=VALUE")]
    pub set: Vec<String>,
    /// Write metrics as JSON to this file at exit.
    #[arg(long, value_name = "FILE")]
    pub metrics_out: Option<PathBuf>,
    /// Stop after this many seconds (exit code 124 if still running).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Do not print the metrics summary at exit.
    #[arg(long)]
    pub quiet: bool,
}

/// Run a pipeline.
pub fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let overrides = a
        .set
        .iter()
        .map(|s| {
            s.parse::<edgeflow_graph::Override>()
                .map_err(anyhow::Error::msg)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let registry = edgeflow::registry();
    let p = edgeflow_graph::Pipeline::from_file(&a.file, &registry, &overrides)?;
    let timeout = a.timeout.map(std::time::Duration::from_secs_f64);
    let metrics = p.run(timeout)?;
    if let Some(path) = &a.metrics_out {
        std::fs::write(path, serde_json::to_string_pretty(&metrics)?)?;
    }
    if !a.quiet {
        eprint!("{}", metrics.summary());
    }
    Ok(ExitCode::SUCCESS)
}
