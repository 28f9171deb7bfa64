//! `edgeflow run FILE --part NAME`: run one part of a split pipeline.
//!
//! The whole file is validated first (so a port mismatch between two parts
//! is reported naming both stages), then the engine selects the part's
//! stages and the control crate's zenoh bridge carries every edge to or
//! from another part. Once the part's stages are built it joins the other
//! parts: a liveliness token that carries the file's hash (a part started
//! from another file is refused), and a report of each part that goes or
//! comes back.

use edgeflow_control::parts::{file_hash, OnLost, PartPresence, ZenohBridge};
use edgeflow_graph::{parse_spec, parts, validate, Override, Pipeline, Registry};
use std::path::Path;

/// What to do when a part this one receives from is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OnPartLost {
    /// Keep running; its edges resume when it comes back.
    Wait,
    /// End the streams that came from it; a part still running 2 s later
    /// is stopped (exit status 1, naming the part that is gone).
    Stop,
}

/// A part ready to start, and how it will join the others.
pub(crate) struct Part {
    pub(crate) pipeline: Pipeline,
    name: String,
    pipeline_name: String,
    hash: String,
    session: edgeflow_control::session::SessionConfig,
    /// Every part the file names.
    all_parts: Vec<String>,
}

impl Part {
    /// Load `file`, validate it whole, and select part `name`.
    pub(crate) fn load(
        file: &Path,
        registry: &Registry,
        overrides: &[Override],
        name: &str,
        on_lost: OnPartLost,
    ) -> anyhow::Result<Part> {
        let whole = Pipeline::from_file(file, registry, overrides)?;
        let bytes = std::fs::read(file)?;
        let text = String::from_utf8_lossy(&bytes);
        let spec = parse_spec(&text, Some(file))?;
        let pipeline_name = whole.plan().name.clone();
        let bridge = ZenohBridge::new(
            &spec,
            &pipeline_name,
            match on_lost {
                OnPartLost::Wait => OnLost::Wait,
                OnPartLost::Stop => OnLost::Stop,
            },
        );
        let part_spec = parts::select_part(&spec, whole.plan(), name, &bridge)?;
        // Overrides of stages in other parts were checked with the whole file.
        let mine: Vec<Override> = overrides
            .iter()
            .filter(|o| part_spec.stages.iter().any(|s| s.id == o.stage))
            .cloned()
            .collect();
        let base = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let plan = validate(&part_spec, registry, base, &mine, Some(file), "")?;
        Ok(Part {
            pipeline: Pipeline::from_plan(plan),
            name: name.to_string(),
            pipeline_name,
            hash: file_hash(&bytes),
            session: bridge.session(name),
            all_parts: parts::part_names(&spec),
        })
    }

    /// This part's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Declare this part (after its stages are built) and watch the others;
    /// a part met later that runs another file calls `on_mismatch`.
    pub(crate) fn join(
        &self,
        on_mismatch: impl Fn(String) + Send + Sync + 'static,
    ) -> anyhow::Result<PartPresence> {
        eprintln!(
            "edgeflow: part `{}` of `{}` (file hash {}), zenoh listen {:?} connect {:?}",
            self.name, self.pipeline_name, self.hash, self.session.listen, self.session.connect
        );
        Ok(PartPresence::join(
            &self.session,
            &self.pipeline_name,
            &self.name,
            &self.hash,
            on_mismatch,
        )?)
    }
}

/// The other parts' stage lines for the end-of-run summary, from the
/// metrics they published (`PartPresence::exchange_metrics`); a part seen
/// in the file that sent none (lost, or not started) is named.
pub(crate) fn gathered_summary(
    me: &Part,
    gathered: &std::collections::BTreeMap<String, serde_json::Value>,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for name in &me.all_parts {
        if *name == me.name {
            continue;
        }
        let Some(v) = gathered.get(name) else {
            let _ = writeln!(s, "part `{name}`: no metrics (it was lost or did not run)");
            continue;
        };
        let _ = writeln!(
            s,
            "part `{name}`: {:.2} s",
            v["wall_s"].as_f64().unwrap_or(0.0)
        );
        for st in v["stages"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "  {:<14} {:>7} msgs  p50 {:>9.1} us  p99 {:>9.1} us",
                st["id"].as_str().unwrap_or("?"),
                st["processed"].as_u64().unwrap_or(0),
                st["processing"]["p50_us"].as_f64().unwrap_or(0.0),
                st["processing"]["p99_us"].as_f64().unwrap_or(0.0),
            );
        }
    }
    s
}
