//! The YAML pipeline format, as serde types. Every field is documented here;
//! `edgeflow schema` (and the committed `pipelines/schema.json`) is generated
//! from these types, so editors can check pipelines as you type, e.g. with
//! the YAML language server's modeline on a file's first line:
//!
//! ```yaml
//! # yaml-language-server: $schema=../schema.json
//! ```
//!
//! The types stay plain (no source spans): they are also built in code
//! ([`crate::PipelineBuilder`]) and serialized. Validation finds the line and
//! column of each stage, edge and field by mapping the same text a second
//! time (see `validate`), and `edgeflow validate FILE` prints them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// A pipeline file: named stages (actors) and the edges (bounded channels)
/// between their ports. Check one with `edgeflow validate FILE`.
///
/// ```yaml
/// name: hello
/// stages:
///   - id: tick
///     kind: timer
///     params: { rate_hz: 10, count: 5 }
///   - id: show
///     kind: stdout
/// edges:
///   - { from: tick.out, to: show.in }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Pipeline name, shown in logs and metrics.
    #[serde(default)]
    pub name: Option<String>,
    /// Free text describing what the pipeline does.
    #[serde(default)]
    pub description: Option<String>,
    /// The stages (actors), at least one. Ids must be unique.
    pub stages: Vec<StageSpec>,
    /// The edges (bounded channels) between stage ports. Every required
    /// input must be fed by one; cycles need a `back_edge: true`.
    #[serde(default)]
    pub edges: Vec<EdgeSpec>,
    /// How the parts of a split pipeline reach each other, by part name
    /// (see [`StageSpec::part`]). A part missing here uses the defaults.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parts: BTreeMap<String, PartSpec>,
}

/// Where one part of a split pipeline listens and whom it connects to.
/// Every edge between two parts becomes a zenoh publication and
/// subscription; peers are named explicitly (no multicast discovery).
///
/// ```yaml
/// parts:
///   robot: { listen: ["tcp/10.0.0.1:7447"] }
///   brain: { connect: ["tcp/10.0.0.1:7447"] }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PartSpec {
    /// Endpoints this part listens on (`tcp/HOST:PORT`).
    #[serde(default)]
    pub listen: Vec<String>,
    /// Endpoints this part connects to (retried until they answer).
    #[serde(default)]
    pub connect: Vec<String>,
}

/// One stage: an actor of some `kind` with its params and placement.
///
/// ```yaml
/// - id: asr
///   kind: whisper
///   device: gpu:0
///   threads: 2
///   params: { model: models/whisper-tiny }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// Unique id, used in edges as `id.port` and in `--set id.param=value`.
    /// No `.` or spaces.
    #[schemars(pattern(r"^[^.\s]+$"))]
    pub id: String,
    /// Stage kind (`edgeflow stages` lists them).
    pub kind: String,
    /// Where model stages compute: `cpu`, `gpu`, `gpu:N`, `npu`, `npu:N` or
    /// `auto` (best available by probe). Default: `cpu`.
    #[serde(default)]
    #[schemars(pattern(r"^(cpu|auto|gpu(:[0-9]+)?|npu(:[0-9]+)?)$"))]
    pub device: Option<String>,
    /// Threads the stage may use for its own compute, 1..=256 (default 1).
    #[serde(default)]
    #[schemars(range(min = 1, max = 256))]
    pub threads: Option<usize>,
    /// Run this stage on its producer's thread instead of its own. Only for
    /// cheap stages with exactly one input edge; saves a thread hop.
    #[serde(default)]
    pub inline: bool,
    /// The part (process or host) this stage runs in, e.g. `robot` or
    /// `brain`; unset means the default part. `edgeflow run FILE --part P`
    /// runs part P's stages only; edges between parts cross over zenoh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[A-Za-z0-9_-]+$"))]
    pub part: Option<String>,
    /// Kind-specific parameters (`edgeflow stages KIND` documents each).
    /// Relative paths resolve against the pipeline file's folder; any param
    /// can be overridden with `--set id.param=value`.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, serde_json::Value>")]
    pub params: BTreeMap<String, serde_json::Value>,
}

/// What a full edge does with a new message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Lossless: the producer waits (backpressure). Default; right for audio and tokens.
    #[default]
    Block,
    /// Drop the oldest queued message to make room (counted).
    DropOldest,
    /// Keep only the newest message: each new one replaces what is queued
    /// (counted). Right for camera frames and observations.
    Latest,
    /// Drop the new message (counted).
    DropNewest,
}

impl Policy {
    /// Name as written in YAML.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Block => "block",
            Policy::DropOldest => "drop_oldest",
            Policy::Latest => "latest",
            Policy::DropNewest => "drop_newest",
        }
    }
}

/// A duration: seconds as a number, or a string with a unit
/// (`250us`, `20ms`, `1.5s`, `2m`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum DurationSpec {
    /// Seconds.
    Seconds(f64),
    /// Number with unit: us, ms, s, m.
    Text(String),
}

impl DurationSpec {
    /// Parse to a `Duration`.
    pub fn to_duration(&self) -> Result<Duration, String> {
        match self {
            DurationSpec::Seconds(s) => seconds(*s),
            DurationSpec::Text(t) => parse_duration(t),
        }
    }
}

fn seconds(s: f64) -> Result<Duration, String> {
    if !s.is_finite() || !(0.0..=1e9).contains(&s) {
        return Err(format!(
            "duration {s} s is not a finite, non-negative number of seconds"
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Parse `20ms`, `1.5s`, `250us`, `2m` or a bare number of seconds.
pub fn parse_duration(t: &str) -> Result<Duration, String> {
    let t = t.trim();
    let idx = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == 'e'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(idx);
    let v: f64 = num.parse().map_err(|_| {
        format!("`{t}` is not a duration: write a number with a unit, e.g. 20ms, 1.5s, 250us")
    })?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        other => {
            return Err(format!(
                "`{t}`: unknown duration unit `{other}`; use ns, us, ms, s or m"
            ))
        }
    };
    seconds(v * scale)
}

/// Parse a duration given as a JSON value (number of seconds, or string).
pub fn parse_duration_value(v: &serde_json::Value) -> Result<Duration, String> {
    match v {
        serde_json::Value::Number(n) => seconds(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(s) => parse_duration(s),
        other => Err(format!(
            "expected a duration like `20ms` or a number of seconds, got {other}"
        )),
    }
}

/// An edge: a bounded channel from an output port to an input port.
///
/// ```yaml
/// - { from: cam.frames, to: vla.image, capacity: 1, policy: latest, max_age: 100ms }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EdgeSpec {
    /// Producer as `stage.port` (`stage` alone means its only output).
    pub from: String,
    /// Consumer as `stage.port` (`stage` alone means its only input).
    pub to: String,
    /// Queue capacity in messages, 1..=65536 (default 8).
    #[serde(default)]
    #[schemars(range(min = 1, max = 65536))]
    pub capacity: Option<usize>,
    /// What a full queue does with a new message (default `block`).
    #[serde(default)]
    pub policy: Option<Policy>,
    /// Drop messages older than this (by capture timestamp) when dequeued;
    /// counted as `age` drops.
    #[serde(default)]
    pub max_age: Option<DurationSpec>,
    /// Marks a deliberate feedback edge (e.g. a flow limiter's back-edge);
    /// cycles are rejected unless one of their edges is marked.
    #[serde(default)]
    pub back_edge: bool,
    /// The zenoh key expression this edge uses when it joins two parts
    /// (default `edgeflow/<pipeline>/<from stage>.<port>/<to stage>.<port>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Default queue capacity.
pub const DEFAULT_CAPACITY: usize = 8;
/// Largest accepted queue capacity.
pub const MAX_CAPACITY: usize = 65_536;

/// The JSON schema of the pipeline format, generated from these types (doc
/// comments become descriptions). Committed as `pipelines/schema.json` so
/// editors can validate pipeline files; `edgeflow schema` prints it.
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(PipelineSpec);
    schema.to_value()
}

/// [`json_schema`] as pretty-printed JSON text with a trailing newline, exactly
/// as committed in `pipelines/schema.json`.
pub fn json_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&json_schema()).unwrap_or_default();
    text.push('\n');
    text
}
