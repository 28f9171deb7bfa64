//! Stages at the pipeline's edge: `stdout`, and the host ports (`host_in`,
//! `host_out`) through which library code pushes and pulls messages.

use super::{in_port, out_port, HOST_IN, HOST_OUT};
use crate::message::{Message, Payload};
use crate::port::{PortType, Ports};
use crate::registry::{BuildEnv, ParamInfo, ParamType, Params, StageFactory, StageInfo};
use crate::stage::{Input, Poll, Stage, StageCtx, StageError, StageResult};
use std::io::Write;
use std::time::Duration;

pub(super) struct StdoutKind;

impl StageFactory for StdoutKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "stdout",
            doc: "Prints what it receives: text as is (streamed pieces joined), other payloads as a one-line summary.",
            params: vec![ParamInfo::new(
                "newline",
                ParamType::Bool,
                true,
                "end each message with a newline (false: stream text pieces on one line until end of stream)",
            )],
            ports: in_port(PortType::Any, "anything"),
            source: false,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Ok(Box::new(Stdout {
            newline: p.get_or("newline", true)?,
            wrote: false,
        }))
    }
}

struct Stdout {
    newline: bool,
    wrote: bool,
}

impl Stage for Stdout {
    fn process(&mut self, input: Input, _ctx: &mut StageCtx) -> StageResult {
        let mut out = std::io::stdout().lock();
        let r = match &input.msg.payload {
            Payload::Text(t) if !self.newline => write!(out, "{t}"),
            Payload::Text(t) => writeln!(out, "{t}"),
            other => writeln!(
                out,
                "[epoch {} #{}] {other:?}",
                input.msg.epoch, input.msg.seq
            ),
        };
        self.wrote = true;
        r.and_then(|_| out.flush())
            .map_err(|e| StageError::msg(format!("writing stdout: {e}")))
    }

    fn finish(&mut self, _ctx: &mut StageCtx) -> StageResult {
        if !self.newline && self.wrote {
            println!();
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- host ports

pub(super) struct HostInKind;

impl StageFactory for HostInKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: HOST_IN,
            doc: "Data pushed from host code with `Running::push(id, payload)`; ends when the host calls `close_input(id)` or the pipeline is waited on.",
            params: vec![ParamInfo::new("type", ParamType::String, "any", "port type: audio, text, tokens, tensor, image, actions, control or any")],
            ports: out_port(PortType::Any, "what the host pushes"),
            source: true,
        }
    }

    fn ports(&self, p: &Params, _env: &BuildEnv) -> Result<Ports, StageError> {
        Ok(out_port(parse_type(p)?, "what the host pushes"))
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Err(StageError::msg("host_in is built by the executor"))
    }
}

fn parse_type(p: &Params) -> Result<PortType, StageError> {
    let t: String = p.get_or("type", "any".to_string())?;
    Ok(match t.as_str() {
        "audio" => PortType::AUDIO_ANY,
        "text" => PortType::Text,
        "tokens" => PortType::Tokens,
        "tensor" => PortType::Tensor,
        "image" => PortType::Image,
        "actions" => PortType::Actions,
        "control" => PortType::Control,
        "any" => PortType::Any,
        other => {
            return Err(p
                .error("type", format!("unknown port type `{other}`; use audio, text, tokens, tensor, image, actions, control or any"))
                .into())
        }
    })
}

pub(crate) struct HostIn {
    rx: crossbeam_channel::Receiver<Message>,
}

impl HostIn {
    pub(crate) fn new(rx: crossbeam_channel::Receiver<Message>) -> Self {
        HostIn { rx }
    }
}

impl Stage for HostIn {
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        match self.rx.recv_timeout(Duration::from_millis(20)) {
            Ok(m) => {
                ctx.emit_msg(0, m)?;
                Ok(Poll::Continue)
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Ok(Poll::Idle),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Ok(Poll::Done),
        }
    }
}

pub(super) struct HostOutKind;

impl StageFactory for HostOutKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: HOST_OUT,
            doc: "Delivers messages to host code via `Running::pull(id, timeout)`; blocks (backpressure) when the host does not keep up.",
            params: vec![
                ParamInfo::new("type", ParamType::String, "any", "port type: audio, text, tokens, tensor, image, actions, control or any"),
                ParamInfo::new("capacity", ParamType::Int, 1024, "messages buffered for the host"),
            ],
            ports: in_port(PortType::Any, "what the host pulls"),
            source: false,
        }
    }

    fn ports(&self, p: &Params, _env: &BuildEnv) -> Result<Ports, StageError> {
        Ok(in_port(parse_type(p)?, "what the host pulls"))
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Err(StageError::msg("host_out is built by the executor"))
    }
}

pub(crate) struct HostOut {
    tx: crossbeam_channel::Sender<Message>,
}

impl HostOut {
    pub(crate) fn new(tx: crossbeam_channel::Sender<Message>) -> Self {
        HostOut { tx }
    }
}

impl Stage for HostOut {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let mut m = input.msg;
        loop {
            match self.tx.send_timeout(m, Duration::from_millis(20)) {
                Ok(()) => return Ok(()),
                Err(crossbeam_channel::SendTimeoutError::Timeout(back)) => {
                    ctx.check()?;
                    m = back;
                }
                // Host dropped its end: discard.
                Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => return Ok(()),
            }
        }
    }
}
