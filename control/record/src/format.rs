//! What an edgeflow recording holds and how it is named inside the MCAP
//! file: one channel per edge, one schema naming the wire format, run
//! metadata and the pipeline file as an attachment.

use edgeflow_graph::Plan;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// MCAP header profile.
pub const PROFILE: &str = "edgeflow";
/// Channel message encoding: a message is one edgeflow wire-format v1
/// message (48-byte header with epoch, seq, capture time and deadline, then
/// the body), as `zenoh_pub` sends it.
pub const MESSAGE_ENCODING: &str = "edgeflow-wire-v1";
/// Schema name shared by every channel.
pub const SCHEMA_NAME: &str = "edgeflow.wire.v1";
/// Schema encoding: the schema data is a text description of the layout.
pub const SCHEMA_ENCODING: &str = "edgeflow-wire-doc";
/// Schema data: the layout in one paragraph.
pub const SCHEMA_TEXT: &str = "edgeflow wire format v1, little-endian: magic \"EF\", u8 version (1), u8 kind (1 audio, 2 tensor, 3 image, 4 robot_state, 5 actions, 6 text, 7 control), u32 flags (bit 0: deadline set), u64 epoch, u64 seq, u64 capture time (ns, CLOCK_MONOTONIC), u64 deadline (ns), u32 body length, u32 reserved; then the kind's body. See control/WIRE.md in the edgeflow repository.";
/// Message encoding of a stage's journal channel (topic
/// [`journal_topic`]): one entry per message, encoded by the stage (the
/// controller's: `edgeflow_control::journal`); channel metadata `stage`.
pub const JOURNAL_ENCODING: &str = "edgeflow-journal-v1";
/// Schema name of journal channels.
pub const JOURNAL_SCHEMA_NAME: &str = "edgeflow.journal.v1";
/// Schema data of journal channels.
pub const JOURNAL_SCHEMA_TEXT: &str = "edgeflow stage journal v1: one entry per message, what a stage applied and when beyond its input messages (for the controller: every call on its core with the clock reading it used, in order), encoded by the stage: see edgeflow_control::journal.";

/// The topic of stage `id`'s journal channel.
pub fn journal_topic(id: &str) -> String {
    format!("journal/{id}")
}

/// Metadata record describing the run (keys below).
pub const META_RUN: &str = "edgeflow.run";
/// Metadata record: stage id -> its resolved params as JSON.
pub const META_PARAMS: &str = "edgeflow.params";
/// Metadata record written at the end: counts, drops, whether a limit stopped it.
pub const META_END: &str = "edgeflow.end";
/// Attachment: the pipeline file's text.
pub const ATTACH_PIPELINE: &str = "pipeline.yaml";
/// Version of this layout (channels, metadata keys).
pub const RECORD_FORMAT: &str = "1";

/// Run metadata keys.
pub mod keys {
    /// Pipeline name.
    pub const PIPELINE: &str = "pipeline";
    /// sha256 of the pipeline file's text, hex.
    pub const PIPELINE_SHA256: &str = "pipeline_sha256";
    /// The edgeflow version that recorded.
    pub const EDGEFLOW_VERSION: &str = "edgeflow_version";
    /// [`super::RECORD_FORMAT`].
    pub const RECORD_FORMAT: &str = "record_format";
    /// The pipeline file's path as given.
    pub const FILE: &str = "file";
    /// `--set` overrides, a JSON array of strings.
    pub const OVERRIDES: &str = "overrides";
    /// Wall clock at the start, ns since the Unix epoch.
    pub const STARTED_UNIX_NS: &str = "started_unix_ns";
    /// Part number of a rotated recording (0 = the first file).
    pub const PART: &str = "part";
}

/// The edgeflow version written into recordings.
pub const EDGEFLOW_VERSION: &str = env!("CARGO_PKG_VERSION");

/// sha256 of a pipeline file's text, lowercase hex.
pub fn pipeline_hash(text: &str) -> String {
    let d = Sha256::digest(text.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// One edge as a recording names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeName {
    /// Producer stage id.
    pub from_stage: String,
    /// Producer port name.
    pub from_port: String,
    /// Consumer stage id.
    pub to_stage: String,
    /// Consumer port name.
    pub to_port: String,
    /// Edge policy (`block`, `latest`...).
    pub policy: String,
    /// Port type as the producer declares it.
    pub ty: String,
}

impl EdgeName {
    /// The MCAP topic: `from.port->to.port`.
    pub fn topic(&self) -> String {
        format!(
            "{}.{}->{}.{}",
            self.from_stage, self.from_port, self.to_stage, self.to_port
        )
    }

    /// Channel metadata.
    pub fn metadata(&self, index: usize) -> BTreeMap<String, String> {
        [
            ("edge", index.to_string()),
            ("from_stage", self.from_stage.clone()),
            ("from_port", self.from_port.clone()),
            ("to_stage", self.to_stage.clone()),
            ("to_port", self.to_port.clone()),
            ("policy", self.policy.clone()),
            ("type", self.ty.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Back from channel metadata (None when a key is missing).
    pub fn from_metadata(m: &BTreeMap<String, String>) -> Option<(usize, EdgeName)> {
        let g = |k: &str| m.get(k).cloned();
        Some((
            g("edge")?.parse().ok()?,
            EdgeName {
                from_stage: g("from_stage")?,
                from_port: g("from_port")?,
                to_stage: g("to_stage")?,
                to_port: g("to_port")?,
                policy: g("policy")?,
                ty: g("type").unwrap_or_default(),
            },
        ))
    }
}

/// Every edge of a plan, in plan order.
pub fn edge_names(plan: &Plan) -> Vec<EdgeName> {
    plan.edges
        .iter()
        .map(|e| {
            let (fs, fp) = (&plan.stages[e.from.0], e.from.1);
            let (ts, tp) = (&plan.stages[e.to.0], e.to.1);
            let out = fs.ports.outputs.get(fp);
            EdgeName {
                from_stage: fs.id.clone(),
                from_port: out.map(|p| p.name.clone()).unwrap_or_default(),
                to_stage: ts.id.clone(),
                to_port: ts
                    .ports
                    .inputs
                    .get(tp)
                    .map(|p| p.name.clone())
                    .unwrap_or_default(),
                policy: e.policy.name().to_string(),
                ty: out.map(|p| p.ty.to_string()).unwrap_or_default(),
            }
        })
        .collect()
}

/// Resolved params of every stage, as JSON text by stage id.
pub fn params_metadata(plan: &Plan) -> BTreeMap<String, String> {
    plan.stages
        .iter()
        .map(|s| {
            let v = serde_json::Value::Object(
                s.params
                    .values()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            );
            (s.id.clone(), v.to_string())
        })
        .collect()
}
