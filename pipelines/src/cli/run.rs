//! `edgeflow run`.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `edgeflow run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// Pipeline YAML file.
    pub file: PathBuf,
    /// Override a param: STAGE.PARAM=VALUE (repeatable).
    ///
    /// `STAGE.device=cpu|gpu|gpu:N|npu|npu:N|auto`, `STAGE.threads=N` (1..=256)
    /// and `STAGE.inline=true|false` override the stage's placement like
    /// params (a kind with its own `device` param, such as `mic` or
    /// `speaker`, gets that param instead). Values are checked as in the file.
    /// Paths are relative to the current directory.
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
pub(super) fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
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
    let timeout = match a.timeout {
        Some(t) if !(t.is_finite() && t > 0.0) => {
            anyhow::bail!("--timeout must be a positive number of seconds, got {t}")
        }
        t => t.map(std::time::Duration::from_secs_f64),
    };
    let running = p.start()?;
    let stop = running.stop_handle();
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = interrupted.clone();
    // Ctrl-C stops the pipeline cleanly (sinks discard partial output).
    let _ = ctrlc::set_handler(move || {
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        stop.stop();
    });
    let (metrics, result) = running.finish(timeout);
    if let Some(path) = &a.metrics_out {
        write_atomically(path, serde_json::to_string_pretty(&metrics)?.as_bytes())?;
    }
    if !a.quiet {
        eprint!("{}", metrics.summary());
    }
    if interrupted.load(std::sync::atomic::Ordering::SeqCst) {
        eprintln!("edgeflow: interrupted");
        return Ok(ExitCode::from(130));
    }
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(edgeflow_graph::Error::Timeout(t)) => {
            eprintln!("edgeflow: stopped after --timeout {:.3} s", t.as_secs_f64());
            Ok(ExitCode::from(124))
        }
        Err(e) => Err(e.into()),
    }
}

/// Write a file so that it is either absent or complete: temp file + rename.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("metrics")
    ));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
