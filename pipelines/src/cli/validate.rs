//! `edgeflow validate`: check a pipeline file without running it.

use anyhow::Context;
use edgeflow_graph::{Error, Override, Plan};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `edgeflow validate`.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Pipeline YAML file.
    pub file: PathBuf,
    /// Override a param: STAGE.PARAM=VALUE (repeatable).
    #[arg(long = "set", value_name = "STAGE.PARAM=VALUE")]
    pub set: Vec<String>,
}

/// Parse `--set` arguments.
pub fn overrides(set: &[String]) -> anyhow::Result<Vec<Override>> {
    set.iter()
        .map(|s| s.parse::<Override>().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()
        .context("bad --set")
}

/// Load and validate `file`. On validation errors, prints every diagnostic
/// to stderr and returns `Ok(None)`: the caller exits non-zero.
pub fn load(file: &Path, set: &[String]) -> anyhow::Result<Option<Plan>> {
    let overrides = overrides(set)?;
    let registry = edgeflow::registry();
    match edgeflow_graph::load_file(file, &registry, &overrides) {
        Ok(plan) => Ok(Some(plan)),
        Err(Error::Invalid(diags)) => {
            for d in &diags {
                eprintln!("error: {d}");
            }
            eprintln!(
                "{}: {} problem{} found",
                file.display(),
                diags.len(),
                if diags.len() == 1 { "" } else { "s" }
            );
            Ok(None)
        }
        Err(e @ Error::Io { .. }) => {
            // Printed without the error chain: the I/O error is already in it.
            eprintln!("error: {e}");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Validate a pipeline: prints a one-line summary, or every problem.
pub fn run(a: ValidateArgs) -> anyhow::Result<ExitCode> {
    let Some(plan) = load(&a.file, &a.set)? else {
        return Ok(ExitCode::FAILURE);
    };
    let sources = plan.stages.iter().filter(|s| s.source).count();
    let back = plan.edges.iter().filter(|e| e.back_edge).count();
    let mut extra = String::new();
    if back > 0 {
        extra = format!(", {back} back-edge{}", if back == 1 { "" } else { "s" });
    }
    println!(
        "OK {}: pipeline `{}`, {} stage{} ({} source{}), {} edge{}{extra}",
        a.file.display(),
        plan.name,
        plan.stages.len(),
        if plan.stages.len() == 1 { "" } else { "s" },
        sources,
        if sources == 1 { "" } else { "s" },
        plan.edges.len(),
        if plan.edges.len() == 1 { "" } else { "s" },
    );
    Ok(ExitCode::SUCCESS)
}
