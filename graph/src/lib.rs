//! # edgeflow-graph
//!
//! The dataflow engine: a YAML [`spec`] is validated into a [`Plan`], which
//! runs as one actor per stage joined by bounded edges with a stated
//! [`Policy`]. Cancellation travels on a control lane that jumps the data
//! queues; every stage resets and acknowledges, and the engine reports how
//! long it took. Metrics cover every stage and edge.
//!
//! ```no_run
//! use edgeflow_graph::{Pipeline, Registry, Payload};
//! use std::time::Duration;
//! let yaml = r#"
//! stages:
//!   - { id: in, kind: host_in, params: { type: text } }
//!   - { id: out, kind: host_out, params: { type: text } }
//! edges:
//!   - { from: in.out, to: out.in }
//! "#;
//! let running = Pipeline::from_yaml(yaml, &Registry::builtin()).unwrap().start().unwrap();
//! running.push("in", Payload::text("hello")).unwrap();
//! let msg = running.pull("out", Duration::from_secs(1)).unwrap().unwrap();
//! assert_eq!(msg.payload.as_text(), Some("hello"));
//! ```

mod audio_out;
pub mod builtin;
mod error;
mod exec;
mod message;
pub mod metrics;
pub mod parts;
mod plan;
mod port;
mod registry;
pub mod spec;
mod stage;
mod validate;

pub use audio_out::AudioOut;
pub use error::{Diagnostic, Error, Result};
pub use exec::{CancelHandle, EdgeTap, Running, StopHandle};
pub use message::{
    ActionChunk, AudioChunk, Epoch, Event, ImageFrame, Message, Payload, PixelFormat, Timestamp,
};
pub use metrics::{CancelReport, MetricsSnapshot};
pub use plan::{Plan, PlannedEdge, PlannedStage};
pub use port::{PortSpec, PortType, Ports};
pub use registry::{
    BuildEnv, DeviceOpener, ParamError, ParamInfo, ParamType, Params, Registry, StageFactory,
    StageInfo,
};
pub use spec::{EdgeSpec, PipelineSpec, Policy, StageSpec};
pub use stage::{Input, Poll, Stage, StageCtx, StageError, StageHandle, StageResult, TryEmit};
pub use validate::{load_file, parse_spec, validate, Override};

use std::path::Path;
use std::time::Duration;

/// A validated pipeline, ready to start.
#[derive(Debug, Clone)]
pub struct Pipeline {
    plan: Plan,
}

impl Pipeline {
    /// Load and validate a YAML file, with `--set` style overrides.
    pub fn from_file(
        path: impl AsRef<Path>,
        registry: &Registry,
        overrides: &[Override],
    ) -> Result<Self> {
        Ok(Pipeline {
            plan: load_file(path.as_ref(), registry, overrides)?,
        })
    }

    /// Parse and validate YAML text (relative paths resolve against the
    /// current directory).
    pub fn from_yaml(yaml: &str, registry: &Registry) -> Result<Self> {
        let spec = parse_spec(yaml, None)?;
        Ok(Pipeline {
            plan: validate(&spec, registry, Path::new("."), &[], None, yaml)?,
        })
    }

    /// Validate a spec built in code.
    pub fn from_spec(spec: &PipelineSpec, registry: &Registry) -> Result<Self> {
        Ok(Pipeline {
            plan: validate(spec, registry, Path::new("."), &[], None, "")?,
        })
    }

    /// A plan [`validate`] returned (e.g. for a spec derived from a file,
    /// such as one part of a split pipeline).
    pub fn from_plan(plan: Plan) -> Self {
        Pipeline { plan }
    }

    /// The validated plan (stages, ports, edges).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Build every stage and start the threads.
    pub fn start(self) -> Result<Running> {
        Running::start(self.plan, None)
    }

    /// Start with `tap` shown every message sent on every edge (a recorder;
    /// see [`EdgeTap`]). Without a tap the executor pays nothing for this.
    pub fn start_with_tap(self, tap: std::sync::Arc<dyn EdgeTap>) -> Result<Running> {
        Running::start(self.plan, Some(tap))
    }

    /// Start, wait for the end of stream (or `timeout`), and return the metrics.
    pub fn run(self, timeout: Option<Duration>) -> Result<MetricsSnapshot> {
        self.start()?.wait(timeout)
    }
}

/// Build a pipeline spec in code.
///
/// ```
/// use edgeflow_graph::{PipelineBuilder, Registry};
/// let p = PipelineBuilder::new("demo")
///     .stage("tick", "timer", serde_json::json!({ "rate_hz": 100.0, "count": 3 }))
///     .stage("sink", "discard", serde_json::json!({}))
///     .edge("tick.out", "sink.in")
///     .build(&Registry::builtin())
///     .unwrap();
/// let metrics = p.run(None).unwrap();
/// assert_eq!(metrics.stages[1].processed, 3);
/// ```
#[derive(Debug, Clone)]
pub struct PipelineBuilder {
    spec: PipelineSpec,
}

impl PipelineBuilder {
    /// Start a pipeline called `name`.
    pub fn new(name: &str) -> Self {
        PipelineBuilder {
            spec: PipelineSpec {
                name: Some(name.to_string()),
                description: None,
                stages: vec![],
                edges: vec![],
                parts: Default::default(),
            },
        }
    }

    /// Add a stage with params given as a JSON object.
    pub fn stage(mut self, id: &str, kind: &str, params: serde_json::Value) -> Self {
        let params = match params {
            serde_json::Value::Object(m) => m.into_iter().collect(),
            _ => Default::default(),
        };
        self.spec.stages.push(StageSpec {
            id: id.into(),
            kind: kind.into(),
            device: None,
            threads: None,
            inline: false,
            part: None,
            params,
        });
        self
    }

    /// Run the most recently added stage inline on its producer's thread.
    pub fn inline(mut self) -> Self {
        if let Some(s) = self.spec.stages.last_mut() {
            s.inline = true;
        }
        self
    }

    /// Place the most recently added stage (`cpu`, `gpu`, `npu`, `auto`).
    pub fn device(mut self, device: &str) -> Self {
        if let Some(s) = self.spec.stages.last_mut() {
            s.device = Some(device.into());
        }
        self
    }

    /// Add a blocking edge of default capacity.
    pub fn edge(self, from: &str, to: &str) -> Self {
        self.edge_with(from, to, spec::DEFAULT_CAPACITY, Policy::Block)
    }

    /// Add an edge with capacity and policy.
    pub fn edge_with(mut self, from: &str, to: &str, capacity: usize, policy: Policy) -> Self {
        self.spec.edges.push(EdgeSpec {
            from: from.into(),
            to: to.into(),
            capacity: Some(capacity),
            policy: Some(policy),
            max_age: None,
            back_edge: false,
            key: None,
        });
        self
    }

    /// The spec so far.
    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    /// Validate against `registry`.
    pub fn build(self, registry: &Registry) -> Result<Pipeline> {
        Pipeline::from_spec(&self.spec, registry)
    }
}
