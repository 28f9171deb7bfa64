//! # edgeflow
//!
//! The library entry point: every stage kind registered in one
//! [`registry()`], plus re-exports of the engine and runtime, so a host
//! program can build a pipeline from YAML or in code, push into and pull
//! from named ports, cancel an epoch and join.

pub use edgeflow_graph as graph;
pub use edgeflow_graph::{
    Message, MetricsSnapshot, Payload, Pipeline, PipelineBuilder, Registry, Running,
};
pub use edgeflow_runtime as runtime;

/// A registry with every stage kind that ships with edgeflow.
pub fn registry() -> Registry {
    let mut r = Registry::builtin();
    edgeflow_audio::register(&mut r);
    edgeflow_piper::register(&mut r);
    edgeflow_dialogue::register(&mut r);
    edgeflow_llm::register(&mut r);
    edgeflow_speech::register(&mut r);
    edgeflow_control::register(&mut r);
    r
}
