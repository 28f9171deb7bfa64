//! `edgeflow inspect FILE.mcap`: what a recording holds, per edge.

use crate::format::keys;
use crate::reader::Recording;
use std::fmt::Write as _;

/// One edge's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EdgeSummary {
    /// `from.port->to.port`.
    pub topic: String,
    /// Edge policy.
    pub policy: String,
    /// Port type.
    pub ty: String,
    /// Messages recorded.
    pub messages: u64,
    /// Mean rate over the edge's own first-to-last span, Hz.
    pub rate_hz: Option<f64>,
    /// Longest interval between two messages, ms.
    pub max_gap_ms: Option<f64>,
    /// When that gap started, seconds from the recording's first message.
    pub max_gap_at_s: Option<f64>,
    /// Intervals longer than 3x the median interval.
    pub gaps: u64,
    /// Epochs seen (distinct).
    pub epochs: u64,
    /// Mean message size in bytes (wire format).
    pub mean_bytes: f64,
}

/// A whole recording's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    /// The file.
    pub file: String,
    /// Bytes on disk.
    pub size: u64,
    /// Pipeline name.
    pub pipeline: String,
    /// sha256 of the pipeline file.
    pub pipeline_sha256: String,
    /// Pipeline file path at record time.
    pub pipeline_file: String,
    /// edgeflow version that recorded.
    pub edgeflow_version: String,
    /// Rotation part (0 = first file).
    pub part: String,
    /// Messages in the file.
    pub messages: u64,
    /// First to last message, seconds.
    pub span_s: f64,
    /// Per edge, in pipeline order.
    pub edges: Vec<EdgeSummary>,
    /// Journal entries per journaling stage (replay reproduces these
    /// stages from their journals).
    pub journals: std::collections::BTreeMap<String, u64>,
    /// The recorder's closing note (drops, size limit), when it finished.
    pub end: Option<std::collections::BTreeMap<String, String>>,
    /// Set when read with `--partial` from a cut-short file.
    pub truncated: Option<String>,
}

impl Summary {
    /// Summarise `rec`.
    pub fn of(rec: &Recording) -> Summary {
        let t0 = rec.messages.iter().map(|m| m.log_time).min().unwrap_or(0);
        let t1 = rec.messages.iter().map(|m| m.log_time).max().unwrap_or(0);
        let mut order: Vec<usize> = (0..rec.edges.len()).collect();
        order.sort_by_key(|&i| rec.edges[i].index);
        let edges = order
            .into_iter()
            .map(|i| {
                let e = &rec.edges[i];
                let ms: Vec<_> = rec.messages.iter().filter(|m| m.edge == i).collect();
                let times: Vec<u64> = ms.iter().map(|m| m.log_time).collect();
                let mut epochs: Vec<u64> = ms
                    .iter()
                    .filter_map(|m| m.data.get(8..16))
                    .map(|b| {
                        let mut a = [0u8; 8];
                        a.copy_from_slice(b);
                        u64::from_le_bytes(a)
                    })
                    .collect();
                epochs.sort_unstable();
                epochs.dedup();
                let bytes: usize = ms.iter().map(|m| m.data.len()).sum();
                let mut ivals: Vec<u64> = times
                    .windows(2)
                    .map(|w| w[1].saturating_sub(w[0]))
                    .collect();
                let (mut max_gap, mut max_at) = (None, None);
                for (k, &d) in ivals.iter().enumerate() {
                    if max_gap.is_none_or(|g| d > g) {
                        max_gap = Some(d);
                        max_at = Some(times[k]);
                    }
                }
                let span = match (times.first(), times.last()) {
                    (Some(a), Some(b)) if b > a => Some((b - a) as f64 / 1e9),
                    _ => None,
                };
                ivals.sort_unstable();
                let median = ivals.get(ivals.len() / 2).copied().unwrap_or(0);
                let gaps = if median > 0 {
                    ivals.iter().filter(|&&d| d > 3 * median).count() as u64
                } else {
                    0
                };
                EdgeSummary {
                    topic: e.topic.clone(),
                    policy: e.name.policy.clone(),
                    ty: e.name.ty.clone(),
                    messages: ms.len() as u64,
                    rate_hz: span.map(|s| (ms.len() - 1) as f64 / s),
                    max_gap_ms: max_gap.map(|g| g as f64 / 1e6),
                    max_gap_at_s: max_at.map(|t| t.saturating_sub(t0) as f64 / 1e9),
                    gaps,
                    epochs: epochs.len() as u64,
                    mean_bytes: if ms.is_empty() {
                        0.0
                    } else {
                        bytes as f64 / ms.len() as f64
                    },
                }
            })
            .collect();
        Summary {
            file: rec.path.display().to_string(),
            size: rec.size,
            pipeline: rec.pipeline_name().into(),
            pipeline_sha256: rec.meta(keys::PIPELINE_SHA256).into(),
            pipeline_file: rec.meta(keys::FILE).into(),
            edgeflow_version: rec.meta(keys::EDGEFLOW_VERSION).into(),
            part: rec.meta(keys::PART).into(),
            messages: rec.messages.len() as u64,
            span_s: t1.saturating_sub(t0) as f64 / 1e9,
            edges,
            journals: rec
                .journals
                .iter()
                .map(|(k, v)| (k.clone(), v.len() as u64))
                .collect(),
            end: rec.end.clone(),
            truncated: rec.truncated.clone(),
        }
    }

    /// As a table for a terminal.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "recording  {} ({:.1} KB)",
            self.file,
            self.size as f64 / 1e3
        );
        let _ = writeln!(
            s,
            "pipeline   {} (sha256 {}, file {})",
            self.pipeline,
            self.pipeline_sha256
                .get(..16)
                .unwrap_or(&self.pipeline_sha256),
            if self.pipeline_file.is_empty() {
                "-"
            } else {
                &self.pipeline_file
            }
        );
        let _ = writeln!(
            s,
            "edgeflow   {}{}",
            self.edgeflow_version,
            if self.part != "0" && !self.part.is_empty() {
                format!(" (rotated part {})", self.part)
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            s,
            "span       {:.3} s, {} messages on {} edges",
            self.span_s,
            self.messages,
            self.edges.len()
        );
        let w = self
            .edges
            .iter()
            .map(|e| e.topic.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            s,
            "\n{:<w$}  {:>8}  {:>9}  {:>11}  {:>9}  {:>4}  {:>6}  {:>9}  type/policy",
            "edge", "messages", "rate Hz", "max gap ms", "at s", "gaps", "epochs", "bytes",
        );
        let opt = |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or("-".into());
        for e in &self.edges {
            let _ = writeln!(
                s,
                "{:<w$}  {:>8}  {:>9}  {:>11}  {:>9}  {:>4}  {:>6}  {:>9.0}  {}/{}",
                e.topic,
                e.messages,
                opt(e.rate_hz, 1),
                opt(e.max_gap_ms, 2),
                opt(e.max_gap_at_s, 3),
                e.gaps,
                e.epochs,
                e.mean_bytes,
                e.ty,
                e.policy
            );
        }
        for (stage, n) in &self.journals {
            let _ = writeln!(
                s,
                "journal    `{stage}`: {n} entries (`edgeflow replay` reruns it from them)"
            );
        }
        match &self.end {
            Some(end) => {
                let g = |k: &str| end.get(k).map(String::as_str).unwrap_or("?");
                if g("stopped_at_limit") == "true" {
                    let _ = writeln!(
                        s,
                        "\nwarning: the size limit stopped this recording; {} later messages were not recorded",
                        g("dropped_after_limit")
                    );
                }
                if g("dropped_queue_full") != "0" {
                    let _ = writeln!(
                        s,
                        "\nwarning: {} messages were not recorded (the writer fell behind)",
                        g("dropped_queue_full")
                    );
                }
            }
            None => {
                let _ = writeln!(
                    s,
                    "\nnote: the recorder did not finish this file (no end record)"
                );
            }
        }
        if let Some(t) = &self.truncated {
            let _ = writeln!(s, "warning: {t}");
        }
        s
    }
}
