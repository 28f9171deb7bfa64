//! `edgeflow schema`: the JSON schema of the pipeline format.

use std::process::ExitCode;

/// Print the schema (the same text as the committed `pipelines/schema.json`).
pub(super) fn run() -> anyhow::Result<ExitCode> {
    print!("{}", edgeflow_graph::spec::json_schema_text());
    Ok(ExitCode::SUCCESS)
}
