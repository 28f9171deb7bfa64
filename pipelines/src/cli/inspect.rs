//! `edgeflow inspect FILE.mcap`: summarise a recording.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `edgeflow inspect`.
#[derive(Debug, clap::Args)]
pub(crate) struct InspectArgs {
    /// A recording made by `edgeflow run --record`.
    pub file: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Read what is complete of a recording cut short (a crash) instead of
    /// refusing it.
    #[arg(long)]
    pub partial: bool,
}

/// Print a recording's pipeline, edges, counts, rates and gaps.
pub(super) fn run(a: InspectArgs) -> anyhow::Result<ExitCode> {
    let rec = if a.partial {
        edgeflow_record::Recording::open_partial(&a.file)?
    } else {
        edgeflow_record::Recording::open(&a.file)?
    };
    let s = edgeflow_record::Summary::of(&rec);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", s.render());
    }
    Ok(ExitCode::SUCCESS)
}
