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
    /// Run only this part of a split pipeline (stages with `part: NAME`;
    /// `default` for stages without one); edges to other parts cross over
    /// zenoh. Without it the whole pipeline runs in this process.
    #[arg(long, value_name = "NAME")]
    pub part: Option<String>,
    /// With --part: what to do when a part this one receives from is gone:
    /// `wait` for it (its edges resume when it comes back), or `stop`: the
    /// streams from it end, and a part still running 2 s later (a live
    /// source such as a microphone keeps it going) is stopped, exit status
    /// 1 naming the lost part.
    #[arg(long, value_enum, default_value = "wait")]
    pub on_part_lost: super::parts::OnPartLost,
    /// Record every message of every edge into this MCAP file.
    ///
    /// One channel per edge (`from.port->to.port`), messages in the edgeflow
    /// wire format with epoch, seq, capture time and deadline, plus the
    /// pipeline file and the resolved params. Opens in Foxglove and the
    /// `mcap` tools; `edgeflow inspect FILE` summarises it and
    /// `edgeflow replay FILE` runs it again.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Size limit of one recording file in MB: past it the recording stops
    /// with a warning (or rotates, see --record-rotate).
    #[arg(long, value_name = "N", default_value_t = 1024, requires = "record")]
    pub record_max_mb: u64,
    /// At the size limit, continue in FILE.1.mcap, FILE.2.mcap... up to N
    /// more files, then stop with a warning. Disk use stays under
    /// (N + 1) x --record-max-mb.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "record")]
    pub record_rotate: u32,
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
    let part = match &a.part {
        Some(name) => Some(super::parts::Part::load(
            &a.file,
            &registry,
            &overrides,
            name,
            a.on_part_lost,
        )?),
        None => None,
    };
    let p = match &part {
        Some(pt) => pt.pipeline.clone(),
        None => edgeflow_graph::Pipeline::from_file(&a.file, &registry, &overrides)?,
    };
    let timeout = match a.timeout {
        Some(t) if !(t.is_finite() && t > 0.0) => {
            anyhow::bail!("--timeout must be a positive number of seconds, got {t}")
        }
        t => t.map(std::time::Duration::from_secs_f64),
    };
    let recorder = match &a.record {
        Some(path) => Some(start_recording(path, &p, &a)?),
        None => None,
    };
    let running = match &recorder {
        Some(r) => p.start_with_tap(r.tap())?,
        None => p.start()?,
    };
    // Declared once the stages are built, so the other parts find this
    // part's subscribers in place when they see it.
    let mismatch: std::sync::Arc<std::sync::Mutex<Option<String>>> = Default::default();
    let presence = match &part {
        Some(pt) => {
            let (stop, seen) = (running.stop_handle(), mismatch.clone());
            Some(pt.join(move |m| {
                eprintln!("edgeflow: {m}");
                if let Ok(mut s) = seen.lock() {
                    s.get_or_insert(m);
                }
                stop.stop();
            }))
        }
        None => None,
    };
    let presence = match presence.transpose().and_then(|p| {
        p.map(|mut p| p.carry_cancels(&running).map(|()| p))
            .transpose()
            .map_err(Into::into)
    }) {
        Ok(p) => p,
        Err(e) => {
            running.stop();
            return Err(e);
        }
    };
    let stop = running.stop_handle();
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = interrupted.clone();
    // Ctrl-C stops the pipeline cleanly (sinks discard partial output).
    let _ = ctrlc::set_handler(move || {
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        stop.stop();
    });
    // `--on-part-lost stop`: the streams from a lost part end, which ends a
    // part fed only by them; one that a live source keeps running (a
    // microphone, a timer) is stopped if it has not ended within
    // STOP_GRACE, and exits with status 1 naming the lost part.
    const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
    let lost: std::sync::Mutex<Option<String>> = Default::default();
    let finished = std::sync::atomic::AtomicBool::new(false);
    let (metrics, result) = std::thread::scope(|sc| {
        if let (Some(p), super::parts::OnPartLost::Stop) = (&presence, a.on_part_lost) {
            let stop = running.stop_handle();
            let (lost, finished) = (&lost, &finished);
            let ended = || finished.load(std::sync::atomic::Ordering::SeqCst);
            sc.spawn(move || {
                let mut before = p.others();
                while !ended() {
                    let now = p.others();
                    if let Some(gone) = before.iter().find(|b| !now.contains(b)) {
                        let t = std::time::Instant::now();
                        while !ended() && t.elapsed() < STOP_GRACE {
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        }
                        if ended() {
                            return;
                        }
                        eprintln!(
                            "edgeflow: part `{gone}` is gone: stopping this part (--on-part-lost stop)"
                        );
                        if let Ok(mut l) = lost.lock() {
                            *l = Some(gone.clone());
                        }
                        stop.stop();
                        return;
                    }
                    before = now;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            });
        }
        let r = running.finish(timeout);
        finished.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    });
    // Normal end, Ctrl-C, timeout or a stage error: the file is finalised.
    let recorded = recorder.map(|r| finish_recording(r, a.quiet));
    // Split run: publish this part's metrics and gather the others' (this
    // also lets zenoh flush what the last stages published before the
    // session closes with this process).
    let gathered = match &presence {
        Some(p) => {
            std::thread::sleep(std::time::Duration::from_millis(100));
            p.exchange_metrics(
                &serde_json::to_value(&metrics)?,
                std::time::Duration::from_secs(2),
            )
        }
        None => Default::default(),
    };
    drop(presence);
    if let Some(m) = mismatch.lock().ok().and_then(|m| m.clone()) {
        anyhow::bail!("stopped: {m}");
    }
    if let Some(path) = &a.metrics_out {
        let mut v = serde_json::to_value(&metrics)?;
        if let (Some(o), Some(pt)) = (v.as_object_mut(), &part) {
            o.insert("part".into(), serde_json::json!(pt.name()));
            o.insert("parts".into(), serde_json::to_value(&gathered)?);
        }
        write_atomically(path, serde_json::to_string_pretty(&v)?.as_bytes())?;
    }
    if !a.quiet {
        eprint!("{}", metrics.summary());
        if let Some(pt) = &part {
            eprint!("{}", super::parts::gathered_summary(pt, &gathered));
        }
    }
    if let Some(gone) = lost.lock().ok().and_then(|l| l.clone()) {
        anyhow::bail!("stopped: part `{gone}` is gone (--on-part-lost stop)");
    }
    if interrupted.load(std::sync::atomic::Ordering::SeqCst) {
        eprintln!("edgeflow: interrupted");
        return Ok(ExitCode::from(130));
    }
    match result {
        Ok(()) if matches!(recorded, Some(Err(_))) => Ok(ExitCode::FAILURE),
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(edgeflow_graph::Error::Timeout(t)) => {
            eprintln!("edgeflow: stopped after --timeout {:.3} s", t.as_secs_f64());
            Ok(ExitCode::from(124))
        }
        Err(e) => Err(e.into()),
    }
}

/// Create the recording file (before anything starts).
fn start_recording(
    path: &std::path::Path,
    p: &edgeflow_graph::Pipeline,
    a: &RunArgs,
) -> anyhow::Result<edgeflow_record::Recorder> {
    use anyhow::Context;
    if a.record_max_mb == 0 {
        anyhow::bail!("--record-max-mb must be at least 1");
    }
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let info = edgeflow_record::RunInfo {
        pipeline_text: text,
        file: Some(a.file.display().to_string()),
        overrides: a.set.clone(),
    };
    let opts = edgeflow_record::RecordOptions {
        max_bytes: a.record_max_mb.saturating_mul(1 << 20),
        rotate: a.record_rotate,
        ..Default::default()
    };
    Ok(edgeflow_record::Recorder::create(
        path,
        p.plan(),
        info,
        opts,
    )?)
}

/// Finalise the recording and say what it holds (warnings always).
fn finish_recording(
    r: edgeflow_record::Recorder,
    quiet: bool,
) -> Result<edgeflow_record::RecordStats, ()> {
    match r.finish() {
        Ok(stats) => {
            for w in stats.warnings() {
                eprintln!("edgeflow: warning: {w}");
            }
            if !quiet {
                let files: Vec<String> = stats
                    .files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect();
                eprintln!(
                    "edgeflow: recorded {} messages ({:.1} MB) to {}",
                    stats.messages,
                    stats.bytes as f64 / 1e6,
                    files.join(", ")
                );
            }
            Ok(stats)
        }
        Err(e) => {
            eprintln!("edgeflow: error: the recording failed: {e}");
            Err(())
        }
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
