//! `edgeflow replay FILE.mcap`: run a recorded pipeline again, with chosen
//! stages replaced by their recorded outputs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `edgeflow replay`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// A recording made by `edgeflow run --record`.
    pub file: PathBuf,
    /// Stages to replace by their recorded outputs (comma-separated ids);
    /// the others run for real.
    #[arg(long, value_delimiter = ',', value_name = "STAGE,...")]
    pub stub: Vec<String>,
    /// Stages that journaled while recorded (controllers) to run live
    /// instead of from their journals (comma-separated ids): their own
    /// clock then ticks, so commands may differ where a chunk and a tick
    /// raced.
    #[arg(long, value_delimiter = ',', value_name = "STAGE,...")]
    pub live: Vec<String>,
    /// 1 = recorded timing (0.5 half speed, 2 twice as fast), `max` = as
    /// fast as the pipeline takes them.
    #[arg(long, default_value = "1", value_parser = parse_speed)]
    pub speed: edgeflow_record::Speed,
    /// The pipeline file the recording should come from: refuse to replay
    /// when it differs (the difference is named). Without it, the
    /// pipeline stored in the recording runs.
    #[arg(long, value_name = "YAML")]
    pub pipeline: Option<PathBuf>,
    /// Replay a recording made by another edgeflow version.
    #[arg(long)]
    pub allow_version_mismatch: bool,
    /// Record the replayed run too (to compare it with the original).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
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

fn parse_speed(s: &str) -> Result<edgeflow_record::Speed, String> {
    s.parse()
}

/// Replay a recording.
pub(super) fn run(a: ReplayArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let rec = edgeflow_record::Recording::open(&a.file)?;
    let version = rec.meta(edgeflow_record::format::keys::EDGEFLOW_VERSION);
    match &a.pipeline {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            if let Err(e) = rec.check_matches(&text) {
                let only_version = version != edgeflow_record::format::EDGEFLOW_VERSION
                    && rec.check_matches(&rec.pipeline_text).is_err()
                    && edgeflow_record::format::pipeline_hash(&text)
                        == rec.meta(edgeflow_record::format::keys::PIPELINE_SHA256);
                if !(only_version && a.allow_version_mismatch) {
                    anyhow::bail!("{e} (replay without --pipeline runs the recorded version)");
                }
            }
        }
        None if version != edgeflow_record::format::EDGEFLOW_VERSION
            && !a.allow_version_mismatch =>
        {
            anyhow::bail!(
                "{} was recorded by edgeflow {version}, this is edgeflow {}: stage behaviour may differ (--allow-version-mismatch replays it anyway)",
                a.file.display(),
                edgeflow_record::format::EDGEFLOW_VERSION
            );
        }
        None => {}
    }
    let timeout = match a.timeout {
        Some(t) if !(t.is_finite() && t > 0.0) => {
            anyhow::bail!("--timeout must be a positive number of seconds, got {t}")
        }
        t => t.map(std::time::Duration::from_secs_f64),
    };
    // Relative paths in params resolve as they did: against the recorded
    // pipeline file's folder when it is still there.
    let recorded_file = rec.meta(edgeflow_record::format::keys::FILE);
    let base = Path::new(recorded_file)
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && d.is_dir())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let registry = edgeflow::registry();
    let r = edgeflow_record::prepare(&rec, &registry, &a.stub, &a.live, a.speed, &base)?;
    if !a.quiet {
        for (id, n) in &r.stubbed {
            eprintln!("edgeflow: `{id}` replays {n} recorded messages");
        }
        for (id, n) in &r.journaled {
            eprintln!(
                "edgeflow: `{id}` reruns from its journal ({n} entries; --live {id} runs it on its own clock)"
            );
        }
    }
    let recorder = match &a.record {
        Some(path) => Some(edgeflow_record::Recorder::create(
            path,
            r.pipeline.plan(),
            edgeflow_record::RunInfo {
                pipeline_text: rec.pipeline_text.clone(),
                file: Some(recorded_file.to_string()),
                overrides: rec.overrides(),
            },
            edgeflow_record::RecordOptions::default(),
        )?),
        None => None,
    };
    let running = match &recorder {
        Some(t) => r.pipeline.start_with_tap(t.tap())?,
        None => r.pipeline.start()?,
    };
    let stop = running.stop_handle();
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = interrupted.clone();
    let _ = ctrlc::set_handler(move || {
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        stop.stop();
    });
    let (metrics, result) = running.finish(timeout);
    if let Some(t) = recorder {
        let stats = t.finish()?;
        for w in stats.warnings() {
            eprintln!("edgeflow: warning: {w}");
        }
    }
    if let Some(path) = &a.metrics_out {
        std::fs::write(path, serde_json::to_string_pretty(&metrics)?)
            .with_context(|| format!("writing {}", path.display()))?;
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
