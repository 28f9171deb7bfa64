//! Replay: the recorded pipeline run again with some stages replaced by
//! their recorded outputs (kind `recorded`), so timing logic downstream can
//! be exercised without models, robots or microphones.
//!
//! A stub emits, per output port, the messages its first edge from that
//! port recorded, in recorded order, with their epochs, at their recorded
//! offsets from the first message of the recording (scaled by the speed,
//! or back to back at `--speed max`). Each message's age at emission
//! (send time minus capture time) and its deadline's distance from capture
//! are kept, so `max_age` and staleness checks downstream see what they saw.
//! A stub with inputs still accepts them and drops them.
//!
//! A stage that journaled while recorded (the `controller`: every call on
//! its core, with the clock readings it used, in order) is rerun from its
//! journal rather than live, unless named in `live`: its outputs are then
//! the recorded ones bit for bit, computed again by its own code from the
//! recorded inputs and ticks ([`edgeflow_control::journal`]).

use crate::error::{Error, Result};
use crate::reader::Recording;
use edgeflow_control::controller::{Controller, ControllerKind, JournalReplay};
use edgeflow_control::journal::Entry;
use edgeflow_control::wire;
use edgeflow_control::zenoh_io::body_to_payload;
use edgeflow_graph::{
    BuildEnv, Input, Message, Override, Params, Payload, Pipeline, Poll, PortType, Ports, Registry,
    Stage, StageCtx, StageError, StageFactory, StageHandle, StageInfo, StageResult, Timestamp,
};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The stage kind stubs are given.
pub const STUB_KIND: &str = "recorded";
/// The stage kind a controller replayed from its journal is given.
pub const JOURNAL_KIND: &str = "controller_replay";

/// How fast to replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Speed {
    /// Recorded timing scaled by this factor (1 = as recorded).
    Factor(f64),
    /// Every stub emits as fast as its edges take it.
    Max,
}

impl std::str::FromStr for Speed {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "max" {
            return Ok(Speed::Max);
        }
        match s.parse::<f64>() {
            Ok(f) if f.is_finite() && f > 0.0 => Ok(Speed::Factor(f)),
            _ => Err(format!(
                "--speed takes a positive factor (1 = recorded timing) or `max`, got `{s}`"
            )),
        }
    }
}

/// One message a stub will emit.
#[derive(Debug, Clone)]
struct Planned {
    port: usize,
    /// ns after the recording's first message.
    offset_ns: u64,
    epoch: u64,
    /// Send time minus capture time, ns.
    age_ns: u64,
    /// Deadline minus capture time, ns.
    deadline_ns: Option<u64>,
    payload: Payload,
}

/// What one stubbed stage replays.
#[derive(Debug)]
struct StubData {
    ports: Ports,
    messages: Vec<Planned>,
}

/// Shared replay clock: the instant every stub measures offsets from.
#[derive(Debug)]
struct Clock {
    origin: OnceLock<Instant>,
    speed: Speed,
}

impl Clock {
    fn due(&self, offset_ns: u64) -> Option<Instant> {
        let origin = *self.origin.get_or_init(Instant::now);
        match self.speed {
            Speed::Max => None,
            Speed::Factor(f) => Some(origin + Duration::from_secs_f64(offset_ns as f64 / 1e9 / f)),
        }
    }
}

/// The `recorded` kind: one factory serving every stub, by stage id.
struct StubFactory {
    stubs: HashMap<String, Arc<StubData>>,
    clock: Arc<Clock>,
}

impl StageFactory for StubFactory {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: STUB_KIND,
            doc: "Replay only: emits a recorded stage's outputs with their recorded timing (edgeflow replay --stub).",
            params: vec![],
            ports: Ports::default(),
            source: false,
        }
    }

    fn ports(&self, _params: &Params, env: &BuildEnv) -> std::result::Result<Ports, StageError> {
        self.stubs
            .get(&env.stage_id)
            .map(|s| s.ports.clone())
            .ok_or_else(|| StageError::msg(format!("`{}` is not a stubbed stage", env.stage_id)))
    }

    fn build(&self, _params: &Params, env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let data =
            self.stubs.get(&env.stage_id).cloned().ok_or_else(|| {
                StageError::msg(format!("`{}` is not a stubbed stage", env.stage_id))
            })?;
        Ok(Box::new(Stub {
            data,
            clock: self.clock.clone(),
            next: 0,
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        }))
    }
}

/// A stubbed stage.
struct Stub {
    data: Arc<StubData>,
    clock: Arc<Clock>,
    next: usize,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Planned {
    fn message(&self) -> Message {
        let now = Timestamp::now();
        let ts = Timestamp(now.0.saturating_sub(self.age_ns));
        Message {
            epoch: self.epoch,
            seq: 0,
            timestamp: ts,
            deadline: self.deadline_ns.map(|d| ts.plus(Duration::from_nanos(d))),
            payload: self.payload.clone(),
        }
    }
}

/// The helper thread of a stub that has inputs: emits on its own clock.
fn emit_all(data: Arc<StubData>, clock: Arc<Clock>, h: StageHandle, stop: Arc<AtomicBool>) {
    for m in &data.messages {
        if let Some(due) = clock.due(m.offset_ns) {
            loop {
                if stop.load(Ordering::Acquire) || h.should_stop() {
                    return;
                }
                let left = due.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(20)));
            }
        }
        if h.emit_msg(m.port, m.message()).is_err() {
            return;
        }
    }
}

impl Stage for Stub {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        // Start the shared clock with the first stub.
        let _ = self.clock.due(0);
        if self.data.ports.inputs.is_empty() {
            return Ok(());
        }
        let (data, clock, h, stop) = (
            self.data.clone(),
            self.clock.clone(),
            ctx.handle(),
            self.stop.clone(),
        );
        let t = std::thread::Builder::new()
            .name("ef-replay".into())
            .spawn(move || emit_all(data, clock, h, stop))
            .map_err(|e| {
                StageError::msg(format!("replay stub `{}`: cannot spawn: {e}", ctx.id()))
            })?;
        self.thread = Some(t);
        Ok(())
    }

    fn process(&mut self, _input: Input, _ctx: &mut StageCtx) -> StageResult {
        Ok(())
    }

    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        let Some(m) = self.data.messages.get(self.next) else {
            return Ok(Poll::Done);
        };
        if let Some(due) = self.clock.due(m.offset_ns) {
            if Instant::now() < due && !ctx.sleep_until(due) {
                // Woken early: stopping, or a control message to serve first.
                return Ok(if ctx.should_stop() {
                    Poll::Done
                } else {
                    Poll::Idle
                });
            }
        }
        self.next += 1;
        ctx.emit_msg(m.port, m.message())?;
        Ok(Poll::Continue)
    }

    fn finish(&mut self, _ctx: &mut StageCtx) -> StageResult {
        // Inputs ended: the recorded outputs still all go out.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        Ok(())
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The `controller_replay` kind: controllers rerun from their journals.
struct JournalFactory {
    journals: HashMap<String, Arc<Vec<(u64, Entry)>>>,
    clock: Arc<Clock>,
}

impl StageFactory for JournalFactory {
    fn info(&self) -> StageInfo {
        let live = ControllerKind.info();
        StageInfo {
            kind: JOURNAL_KIND,
            doc: "Replay only: a controller rerun from its recorded journal (edgeflow replay), commands bit-identical to the recorded ones.",
            ..live
        }
    }

    fn build(&self, params: &Params, env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let entries = self.journals.get(&env.stage_id).cloned().ok_or_else(|| {
            StageError::msg(format!("`{}` has no recorded journal", env.stage_id))
        })?;
        let cfg = edgeflow_control::controller::parse_config(params)?;
        let clock = self.clock.clone();
        Ok(Box::new(Controller::replaying(
            cfg,
            JournalReplay {
                entries: entries.as_ref().clone(),
                due: Box::new(move |offset| clock.due(offset)),
            },
        )))
    }
}

/// A prepared replay.
#[derive(Debug)]
pub struct Replay {
    /// The pipeline to start (stubs in place).
    pub pipeline: Pipeline,
    /// Messages each stub will emit, by stage id.
    pub stubbed: Vec<(String, usize)>,
    /// Stages rerun from their journals, with their entry counts.
    pub journaled: Vec<(String, usize)>,
}

/// Build the recorded pipeline with the stages in `stub` replaced by their
/// recorded outputs, and every journaled controller not in `live` rerun
/// from its journal. `registry` must know every stage kind the recording
/// uses (the stubbed ones too: their ports come from it). Relative paths
/// in params resolve against `base_dir`.
pub fn prepare(
    rec: &Recording,
    registry: &Registry,
    stub: &[String],
    live: &[String],
    speed: Speed,
    base_dir: &Path,
) -> Result<Replay> {
    let text = &rec.pipeline_text;
    let overrides = rec
        .overrides()
        .iter()
        .map(|s| s.parse::<Override>().map_err(Error::Replay))
        .collect::<Result<Vec<_>>>()?;
    let spec = edgeflow_graph::parse_spec(text, None)?;
    let plan = edgeflow_graph::validate(&spec, registry, base_dir, &overrides, None, text)?;
    let t0 = rec.messages.iter().map(|m| m.log_time).min().unwrap_or(0);
    let mut stubs = HashMap::new();
    let mut stubbed = Vec::new();
    for id in stub {
        let Some(i) = plan.stage_index(id) else {
            let ids: Vec<&str> = plan.stages.iter().map(|s| s.id.as_str()).collect();
            return Err(Error::Replay(format!(
                "--stub {id}: the recorded pipeline `{}` has no stage `{id}`; its stages: {}",
                plan.name,
                ids.join(", ")
            )));
        };
        let ports = plan.stages[i].ports.clone();
        // Per output port, the lowest-numbered recorded edge leaving it.
        let mut chan_of_port: Vec<Option<usize>> = vec![None; ports.outputs.len()];
        for (c, e) in rec.edges.iter().enumerate() {
            if e.name.from_stage != *id {
                continue;
            }
            let Some(p) = ports.output(&e.name.from_port) else {
                continue;
            };
            let better = chan_of_port[p].is_none_or(|old| rec.edges[old].index > e.index);
            if better {
                chan_of_port[p] = Some(c);
            }
        }
        let mut messages = Vec::new();
        for m in &rec.messages {
            let Some(port) = chan_of_port.iter().position(|c| *c == Some(m.edge)) else {
                continue;
            };
            let w = rec.decode(m)?;
            let deadline_ns = w
                .header
                .deadline_ns
                .map(|d| d.saturating_sub(w.header.capture_ns));
            let payload = match (&ports.outputs[port].ty, w.body) {
                // Tokens travel as i64 tensors on the wire.
                (
                    PortType::Tokens,
                    wire::Body::Tensor {
                        data: wire::TensorData::I64(v),
                        ..
                    },
                ) => Payload::Tokens(v.into_iter().map(|x| x as u32).collect()),
                (_, body) => body_to_payload(body).map_err(|e| {
                    Error::Replay(format!(
                        "a recorded message of `{id}` cannot be replayed: {e}"
                    ))
                })?,
            };
            messages.push(Planned {
                port,
                offset_ns: m.log_time.saturating_sub(t0),
                epoch: w.header.epoch,
                age_ns: m.log_time.saturating_sub(m.publish_time),
                deadline_ns,
                payload,
            });
        }
        // File order is send order per edge; merge ports by send time.
        messages.sort_by_key(|m| m.offset_ns);
        stubbed.push((id.clone(), messages.len()));
        stubs.insert(id.clone(), Arc::new(StubData { ports, messages }));
    }
    for id in live {
        if plan.stage_index(id).is_none() {
            return Err(Error::Replay(format!(
                "--live {id}: the recorded pipeline `{}` has no stage `{id}`",
                plan.name
            )));
        }
    }
    let mut journals = HashMap::new();
    let mut journaled = Vec::new();
    for st in &plan.stages {
        let Some(recorded) = rec.journals.get(&st.id) else {
            continue;
        };
        if st.kind != "controller" || stubs.contains_key(&st.id) || live.contains(&st.id) {
            continue;
        }
        let entries = recorded
            .iter()
            .enumerate()
            .map(|(i, j)| {
                Entry::decode(&j.data)
                    .map(|e| (j.log_time.saturating_sub(t0), e))
                    .map_err(|e| {
                        Error::Replay(format!(
                            "the journal of `{}`, entry {i}: {e} (--live {} runs it live instead)",
                            st.id, st.id
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        journaled.push((st.id.clone(), entries.len()));
        journals.insert(st.id.clone(), Arc::new(entries));
    }
    let mut spec2 = spec.clone();
    for s in &mut spec2.stages {
        if stubs.contains_key(&s.id) {
            s.kind = STUB_KIND.into();
            s.params.clear();
            s.device = None;
            s.inline = false;
        } else if journals.contains_key(&s.id) {
            s.kind = JOURNAL_KIND.into();
        }
    }
    let overrides2: Vec<Override> = overrides
        .into_iter()
        .filter(|o| !stubs.contains_key(&o.stage))
        .collect();
    let clock = Arc::new(Clock {
        origin: OnceLock::new(),
        speed,
    });
    let mut reg = registry.clone();
    reg.register(StubFactory {
        stubs,
        clock: clock.clone(),
    });
    reg.register(JournalFactory { journals, clock });
    let plan2 = edgeflow_graph::validate(&spec2, &reg, base_dir, &overrides2, None, text)?;
    Ok(Replay {
        pipeline: Pipeline::from_plan(plan2),
        stubbed,
        journaled,
    })
}
