//! `passthrough` (forward unchanged) and `discard` (consume and count).

use super::in_port;
use crate::port::{PortSpec, PortType, Ports};
use crate::registry::{BuildEnv, Params, StageFactory, StageInfo};
use crate::stage::{Input, Stage, StageCtx, StageError, StageResult};

pub(super) struct PassthroughKind;

impl StageFactory for PassthroughKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "passthrough",
            doc: "Forwards every message unchanged (shares the payload). Useful to tap or fan out an edge, and for latency benchmarks.",
            params: vec![],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Any, "anything")],
                outputs: vec![PortSpec::new("out", PortType::Any, "the same messages")],
            },
            source: false,
        }
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Ok(Box::new(Passthrough))
    }
}

struct Passthrough;

impl Stage for Passthrough {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        ctx.emit_msg(0, input.msg)
    }
}

pub(super) struct NullKind;

impl StageFactory for NullKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "discard",
            doc: "Consumes and discards everything (counts it in metrics).",
            params: vec![],
            ports: in_port(PortType::Any, "anything"),
            source: false,
        }
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Ok(Box::new(Null))
    }
}

struct Null;

impl Stage for Null {
    fn process(&mut self, _input: Input, _ctx: &mut StageCtx) -> StageResult {
        Ok(())
    }
}
