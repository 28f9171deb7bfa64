//! A validated, resolved pipeline: what the executor runs.

use crate::port::Ports;
use crate::registry::{BuildEnv, Params, StageFactory};
use crate::spec::Policy;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// One stage, resolved: factory found, params defaulted and checked, ports known.
#[derive(Clone)]
pub struct PlannedStage {
    /// Stage id.
    pub id: String,
    /// Kind name.
    pub kind: String,
    /// The factory that builds it.
    pub factory: Arc<dyn StageFactory>,
    /// Params with defaults and overrides applied.
    pub params: Params,
    /// Placement, threads, base dir.
    pub env: BuildEnv,
    /// Resolved ports.
    pub ports: Ports,
    /// Run on the producer's thread.
    pub inline: bool,
    /// Is a source (polled, no inputs).
    pub source: bool,
}

impl fmt::Debug for PlannedStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlannedStage")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("params", &self.params)
            .finish()
    }
}

/// One edge, resolved to stage and port indices.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedEdge {
    /// Producer (stage index, output port index).
    pub from: (usize, usize),
    /// Consumer (stage index, input port index).
    pub to: (usize, usize),
    /// Queue capacity.
    pub capacity: usize,
    /// Full-queue policy.
    pub policy: Policy,
    /// Age limit.
    pub max_age: Option<Duration>,
    /// Declared feedback edge.
    pub back_edge: bool,
    /// `from -> to` as written, for metrics and errors.
    pub label: String,
}

/// A validated pipeline.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Pipeline name.
    pub name: String,
    /// Stages in file order.
    pub stages: Vec<PlannedStage>,
    /// Edges in file order.
    pub edges: Vec<PlannedEdge>,
}

impl Plan {
    /// Index of a stage by id.
    pub fn stage_index(&self, id: &str) -> Option<usize> {
        self.stages.iter().position(|s| s.id == id)
    }
}
