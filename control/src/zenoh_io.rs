//! The `zenoh_sub` (source) and `zenoh_pub` (sink) stages.
//!
//! Each stage declares a liveliness token (`token`, default
//! `edgeflow/alive/<stage id>`) so the other side can tell it is gone; a
//! stage with `watch` subscribes to the peer's tokens and emits
//! `peer_alive` / `peer_lost` events on its `peer` port (and counts
//! `peers_lost`) as soon as zenoh reports a token's removal.

use crate::session::{SessionConfig, SharedSession};
use crate::wire::{self, Body, Header, Kind, TensorData, WireError};
use edgeflow_graph::{
    BuildEnv, Event, Input, Message, ParamInfo, ParamType, Params, Payload, Policy, Poll, PortSpec,
    PortType, Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use edgeflow_runtime::Tensor;
use parking_lot::{Condvar, Mutex};
use serde_json::json;
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zenoh::qos::{CongestionControl, Priority, Reliability};
use zenoh::sample::SampleKind;
use zenoh::Wait;

/// Port type a wire kind maps to inside the graph.
pub fn port_type(kind: Kind) -> PortType {
    match kind {
        Kind::Audio => PortType::AUDIO_ANY,
        Kind::Tensor | Kind::RobotState => PortType::Tensor,
        Kind::Image => PortType::Image,
        Kind::Actions => PortType::Actions,
        Kind::Text => PortType::Text,
        Kind::Event => PortType::Control,
    }
}

fn kind_param(p: &Params, required: bool) -> StageResult<Option<Kind>> {
    let Some(t) = p.opt::<String>("type")? else {
        if required {
            return Err(p
                .error(
                    "type",
                    "is required: audio, tensor, image, robot_state, actions, text or control",
                )
                .into());
        }
        return Ok(None);
    };
    Kind::parse(&t).map(Some).ok_or_else(|| {
        p.error(
            "type",
            format!("`{t}` is not a wire kind: use audio, tensor, image, robot_state, actions, text or control"),
        )
        .into()
    })
}

fn key_param(p: &Params) -> StageResult<String> {
    let key: String = p.get("key")?;
    zenoh::key_expr::KeyExpr::try_from(key.clone())
        .map_err(|e| p.error("key", format!("`{key}` is not a zenoh key expression: {e}")))?;
    Ok(key)
}

fn token_key(p: &Params, env: &BuildEnv) -> StageResult<Option<String>> {
    let t: String = p.get_or("token", format!("edgeflow/alive/{}", env.stage_id))?;
    if t.is_empty() {
        return Ok(None);
    }
    zenoh::key_expr::KeyExpr::try_from(t.clone())
        .map_err(|e| p.error("token", format!("`{t}` is not a key expression: {e}")))?;
    Ok(Some(t))
}

/// A graph payload as a wire body. `as_kind` picks the wire kind for
/// tensors (`robot_state` sends a 1-D tensor as a state vector, `step` = the
/// message's sequence number).
pub fn payload_to_body(p: &Payload, as_kind: Option<Kind>, seq: u64) -> Result<Body, crate::Error> {
    Ok(match p {
        Payload::Audio(a) => Body::Audio((**a).clone()),
        Payload::Text(t) => Body::Text(t.to_string()),
        Payload::Tokens(t) => Body::Tensor {
            dims: vec![t.len()],
            data: TensorData::I64(t.iter().map(|&x| x as i64).collect()),
        },
        Payload::Tensor(t) => {
            let values = t
                .to_vec_f32()
                .map_err(|e| crate::Error::Payload(format!("tensor cannot be read as f32: {e}")))?;
            if as_kind == Some(Kind::RobotState) {
                Body::RobotState { step: seq, values }
            } else {
                Body::Tensor {
                    dims: t.dims().to_vec(),
                    data: TensorData::F32(values),
                }
            }
        }
        Payload::Image(i) => Body::Image((**i).clone()),
        Payload::Actions(a) => Body::Actions((**a).clone()),
        Payload::Event(e) => Body::Event((**e).clone()),
    })
}

/// A wire body as a graph payload (robot states become 1-D f32 tensors).
pub fn body_to_payload(b: Body) -> Result<Payload, crate::Error> {
    let tensor_err = |e: edgeflow_runtime::Error| crate::Error::Payload(format!("tensor: {e}"));
    Ok(match b {
        Body::Audio(a) => Payload::Audio(Arc::new(a)),
        Body::Tensor { dims, data } => Payload::Tensor(match data {
            TensorData::F32(v) => Tensor::from_vec(v, &dims).map_err(tensor_err)?,
            TensorData::I64(v) => Tensor::from_i64(v, &dims).map_err(tensor_err)?,
        }),
        Body::RobotState { values, .. } => {
            let n = values.len();
            Payload::Tensor(Tensor::from_vec(values, &[n]).map_err(tensor_err)?)
        }
        Body::Image(i) => Payload::Image(Arc::new(i)),
        Body::Actions(a) => Payload::Actions(Arc::new(a)),
        Body::Text(t) => Payload::text(t),
        Body::Event(e) => Payload::event(e),
    })
}

/// Element count a body carries, for the `dim` check.
fn body_dim(b: &Body) -> Option<usize> {
    match b {
        Body::RobotState { values, .. } => Some(values.len()),
        Body::Tensor {
            data: TensorData::F32(v),
            ..
        } => Some(v.len()),
        Body::Tensor {
            data: TensorData::I64(v),
            ..
        } => Some(v.len()),
        Body::Actions(a) => Some(a.dim),
        Body::Audio(a) => Some(a.channels as usize),
        _ => None,
    }
}

// ------------------------------------------------------------- zenoh_sub

/// The `zenoh_sub` kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZenohSubKind;

fn sub_ports(kind: Option<Kind>) -> Ports {
    Ports {
        inputs: vec![],
        outputs: vec![
            PortSpec::new(
                "out",
                kind.map_or(PortType::Any, port_type),
                "decoded messages (type from the `type` param)",
            ),
            PortSpec::optional(
                "peer",
                PortType::Control,
                "`peer_alive` / `peer_lost` {key} events for the tokens under `watch`",
            ),
        ],
    }
}

impl StageFactory for ZenohSubKind {
    fn info(&self) -> StageInfo {
        let mut params = vec![
            ParamInfo::required("key", ParamType::String, "zenoh key expression to subscribe to"),
            ParamInfo::required("type", ParamType::String, "wire kind: audio, tensor, image, robot_state, actions, text or control; other kinds are counted and rejected"),
            ParamInfo::optional("dim", ParamType::Int, "reject (and count) messages whose vector length / action dim / channels differ"),
            ParamInfo::new("policy", ParamType::String, "latest", "local queue when the pipeline is slower than the publisher: latest (keep the newest), drop_oldest, drop_newest, or block (FIFO up to `capacity`, then the oldest is dropped: a zenoh callback cannot wait)"),
            ParamInfo::new("capacity", ParamType::Int, 16, "local queue length (1..=65536)"),
            ParamInfo::optional("watch", ParamType::String, "liveliness key expression of the peer (e.g. `edgeflow/alive/sim`): emits peer_lost / peer_alive on `peer`"),
            ParamInfo::optional("token", ParamType::String, "liveliness token to declare (default edgeflow/alive/<stage id>; \"\" = none)"),
        ];
        params.extend(SessionConfig::param_infos());
        StageInfo {
            kind: "zenoh_sub",
            doc: "Source: subscribes to a zenoh key expression and emits each edgeflow wire message (control/WIRE.md) as a typed payload stamped with the sender's capture time; malformed, newer-version or wrong-kind messages are counted (`malformed`) and rejected with a log line.",
            params,
            ports: sub_ports(None),
            source: true,
        }
    }

    fn ports(&self, p: &Params, _env: &BuildEnv) -> StageResult<Ports> {
        Ok(sub_ports(kind_param(p, true)?))
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let kind = kind_param(p, true)?.ok_or_else(|| StageError::msg("type is required"))?;
        let key = key_param(p)?;
        let policy_name: String = p.get_or("policy", "latest".to_string())?;
        let policy = match policy_name.as_str() {
            "latest" => Policy::Latest,
            "drop_oldest" => Policy::DropOldest,
            "drop_newest" => Policy::DropNewest,
            "block" => Policy::Block,
            o => {
                return Err(p
                    .error(
                        "policy",
                        format!("`{o}` is not latest, drop_oldest, drop_newest or block"),
                    )
                    .into())
            }
        };
        let capacity: usize = p.get_or("capacity", 16)?;
        if !(1..=65_536).contains(&capacity) {
            return Err(p
                .error("capacity", format!("must be in 1..=65536, got {capacity}"))
                .into());
        }
        let dim: Option<usize> = p.opt("dim")?;
        let watch: Option<String> = p.opt("watch")?;
        let token = token_key(p, env)?;
        let scfg = SessionConfig::from_params(p)?;
        let session = SharedSession::open(&scfg)?;
        let shared = Arc::new(SubShared::default());
        let sh = shared.clone();
        let stage_id = env.stage_id.clone();
        let key2 = key.clone();
        let sub = session
            .session()
            .declare_subscriber(key.clone())
            .callback(move |sample| {
                let bytes = sample.payload().to_bytes();
                let r = wire::decode_kind(&bytes, kind).and_then(|m| match (dim, body_dim(&m.body)) {
                    (Some(want), Some(got)) if want != got => Err(WireError::BadBody {
                        kind: kind.name(),
                        msg: format!("size {got}, this subscriber takes {want} (param `dim`)"),
                    }),
                    _ => Ok(m),
                });
                match r {
                    Ok(m) => sh.push(m, policy, capacity),
                    Err(e) => {
                        let n = sh.malformed.fetch_add(1, Ordering::Relaxed) + 1;
                        if n <= 10 || n.is_power_of_two() {
                            eprintln!(
                                "zenoh_sub `{stage_id}`: rejected a message on `{}` (expected {} on `{key2}`): {e} [{n} rejected so far]",
                                sample.key_expr(),
                                kind.name()
                            );
                        }
                    }
                }
            })
            .wait()
            .map_err(|e| StageError::msg(format!("zenoh_sub `{}`: cannot subscribe to `{key}`: {e}", env.stage_id)))?;
        let liveliness = match &watch {
            None => None,
            Some(w) => {
                let sh = shared.clone();
                Some(
                    session
                        .session()
                        .liveliness()
                        .declare_subscriber(w.clone())
                        .history(true)
                        .callback(move |s| {
                            let key = s.key_expr().as_str().to_string();
                            let alive = s.kind() == SampleKind::Put;
                            sh.liveliness(key, alive);
                        })
                        .wait()
                        .map_err(|e| {
                            StageError::msg(format!(
                                "zenoh_sub `{}`: cannot watch `{w}`: {e}",
                                env.stage_id
                            ))
                        })?,
                )
            }
        };
        let token = declare_token(&session, "zenoh_sub", &env.stage_id, token)?;
        Ok(Box::new(ZenohSub {
            shared,
            reported_malformed: 0,
            reported_dropped: 0,
            peers_lost: 0,
            _sub: sub,
            _liveliness: liveliness,
            _token: token,
            _session: session,
        }))
    }
}

#[derive(Default)]
struct SubState {
    queue: VecDeque<wire::WireMessage>,
    peer_events: VecDeque<(String, bool)>,
    alive: BTreeSet<String>,
}

#[derive(Default)]
struct SubShared {
    state: Mutex<SubState>,
    cv: Condvar,
    malformed: AtomicU64,
    dropped: AtomicU64,
}

impl SubShared {
    fn push(&self, m: wire::WireMessage, policy: Policy, cap: usize) {
        let mut st = self.state.lock();
        match policy {
            Policy::Latest => {
                if !st.queue.is_empty() {
                    self.dropped
                        .fetch_add(st.queue.len() as u64, Ordering::Relaxed);
                    st.queue.clear();
                }
                st.queue.push_back(m);
            }
            Policy::DropNewest if st.queue.len() >= cap => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                if st.queue.len() >= cap {
                    st.queue.pop_front();
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
                st.queue.push_back(m);
            }
        }
        self.cv.notify_one();
    }

    fn liveliness(&self, key: String, alive: bool) {
        let mut st = self.state.lock();
        let changed = if alive {
            st.alive.insert(key.clone())
        } else {
            st.alive.remove(&key)
        };
        if changed {
            st.peer_events.push_back((key, alive));
            self.cv.notify_one();
        }
    }
}

/// The `zenoh_sub` stage.
pub struct ZenohSub {
    shared: Arc<SubShared>,
    reported_malformed: u64,
    reported_dropped: u64,
    peers_lost: u64,
    _sub: zenoh::pubsub::Subscriber<()>,
    _liveliness: Option<zenoh::pubsub::Subscriber<()>>,
    _token: Option<zenoh::liveliness::LivelinessToken>,
    _session: SharedSession,
}

impl std::fmt::Debug for ZenohSub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZenohSub").finish_non_exhaustive()
    }
}

impl Stage for ZenohSub {
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        if ctx.should_stop() {
            return Ok(Poll::Done);
        }
        let (msgs, events) = {
            let mut st = self.shared.state.lock();
            if st.queue.is_empty() && st.peer_events.is_empty() {
                self.shared.cv.wait_for(&mut st, Duration::from_millis(20));
            }
            (
                st.queue.drain(..).collect::<Vec<_>>(),
                st.peer_events.drain(..).collect::<Vec<_>>(),
            )
        };
        let malformed = self.shared.malformed.load(Ordering::Relaxed);
        if malformed != self.reported_malformed {
            self.reported_malformed = malformed;
            ctx.record("malformed", malformed as f64);
        }
        let dropped = self.shared.dropped.load(Ordering::Relaxed);
        if dropped != self.reported_dropped {
            self.reported_dropped = dropped;
            ctx.record("dropped", dropped as f64);
        }
        for (key, alive) in events {
            if !alive {
                self.peers_lost += 1;
                ctx.record("peers_lost", self.peers_lost as f64);
                eprintln!(
                    "zenoh_sub `{}`: peer `{key}` is gone (liveliness token removed)",
                    ctx.id()
                );
            }
            let name = if alive { "peer_alive" } else { "peer_lost" };
            ctx.emit(
                1,
                Payload::event(Event::Named(name.into(), json!({ "key": key }))),
            )?;
        }
        let idle = msgs.is_empty();
        for m in msgs {
            let capture = wire::to_graph_time(m.header.capture_ns);
            let deadline = m.header.deadline_ns.map(wire::to_graph_time);
            ctx.record("transit_ms", capture.elapsed().as_secs_f64() * 1e3);
            let payload = match body_to_payload(m.body) {
                Ok(p) => p,
                Err(e) => {
                    let n = self.shared.malformed.fetch_add(1, Ordering::Relaxed) + 1;
                    eprintln!(
                        "zenoh_sub `{}`: rejected a message: {e} [{n} rejected so far]",
                        ctx.id()
                    );
                    continue;
                }
            };
            ctx.emit_msg(
                0,
                Message {
                    epoch: ctx.current_epoch(),
                    seq: 0,
                    timestamp: capture,
                    deadline,
                    payload,
                },
            )?;
        }
        Ok(if idle { Poll::Idle } else { Poll::Continue })
    }
}

// ------------------------------------------------------------- zenoh_pub

/// The `zenoh_pub` kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZenohPubKind;

/// QoS of a publisher, from params.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qos {
    /// Reliable or best effort.
    pub reliable: bool,
    /// Block (wait for room) or drop on congestion.
    pub block: bool,
    /// zenoh priority.
    pub priority: Priority,
    /// Send at once, without batching.
    pub express: bool,
}

fn parse_priority(s: &str) -> Option<Priority> {
    Some(match s {
        "real_time" => Priority::RealTime,
        "interactive_high" => Priority::InteractiveHigh,
        "interactive_low" => Priority::InteractiveLow,
        "data_high" => Priority::DataHigh,
        "data" => Priority::Data,
        "data_low" => Priority::DataLow,
        "background" => Priority::Background,
        _ => return None,
    })
}

/// Read QoS params. The edge policy vocabulary maps onto congestion
/// control when `congestion_control` is not given: `block` -> Block,
/// `latest` / `drop_oldest` / `drop_newest` -> Drop.
pub fn parse_qos(p: &Params) -> StageResult<Qos> {
    let rel: String = p.get_or("reliability", "reliable".to_string())?;
    let reliable = match rel.as_str() {
        "reliable" => true,
        "best_effort" => false,
        o => {
            return Err(p
                .error(
                    "reliability",
                    format!("`{o}` is not reliable or best_effort"),
                )
                .into())
        }
    };
    let policy: String = p.get_or("policy", "block".to_string())?;
    let from_policy = match policy.as_str() {
        "block" => true,
        "latest" | "drop_oldest" | "drop_newest" => false,
        o => {
            return Err(p
                .error(
                    "policy",
                    format!("`{o}` is not block, latest, drop_oldest or drop_newest"),
                )
                .into())
        }
    };
    let block = match p.opt::<String>("congestion_control")?.as_deref() {
        None => from_policy,
        Some("block") => true,
        Some("drop") => false,
        Some(o) => {
            return Err(p
                .error("congestion_control", format!("`{o}` is not block or drop"))
                .into())
        }
    };
    let pr: String = p.get_or("priority", "data".to_string())?;
    let priority = parse_priority(&pr).ok_or_else(|| {
        p.error("priority", format!("`{pr}` is not real_time, interactive_high, interactive_low, data_high, data, data_low or background"))
    })?;
    Ok(Qos {
        reliable,
        block,
        priority,
        express: p.get_or("express", false)?,
    })
}

impl StageFactory for ZenohPubKind {
    fn info(&self) -> StageInfo {
        let mut params = vec![
            ParamInfo::required("key", ParamType::String, "zenoh key expression to publish on"),
            ParamInfo::optional("type", ParamType::String, "wire kind; only needed to send tensors as robot_state (default: from the payload)"),
            ParamInfo::new("reliability", ParamType::String, "reliable", "reliable or best_effort"),
            ParamInfo::new("policy", ParamType::String, "block", "edge-policy vocabulary mapped to congestion control: block -> block, latest / drop_oldest / drop_newest -> drop"),
            ParamInfo::optional("congestion_control", ParamType::String, "block or drop (overrides `policy`)"),
            ParamInfo::new("priority", ParamType::String, "data", "real_time, interactive_high, interactive_low, data_high, data, data_low, background"),
            ParamInfo::new("express", ParamType::Bool, false, "send each message at once instead of batching"),
            ParamInfo::optional("token", ParamType::String, "liveliness token to declare (default edgeflow/alive/<stage id>; \"\" = none)"),
        ];
        params.extend(SessionConfig::param_infos());
        StageInfo {
            kind: "zenoh_pub",
            doc: "Sink: publishes each message it receives on a zenoh key expression in the edgeflow wire format (control/WIRE.md), with its epoch, sequence number, capture time and deadline; QoS (reliability, congestion control, priority, express) from params.",
            params,
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Any, "messages to publish")],
                outputs: vec![],
            },
            source: false,
        }
    }

    fn ports(&self, p: &Params, _env: &BuildEnv) -> StageResult<Ports> {
        let kind = kind_param(p, false)?;
        Ok(Ports {
            inputs: vec![PortSpec::new(
                "in",
                kind.map_or(PortType::Any, port_type),
                "messages to publish",
            )],
            outputs: vec![],
        })
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let kind = kind_param(p, false)?;
        let key = key_param(p)?;
        let qos = parse_qos(p)?;
        let token = token_key(p, env)?;
        let session = SharedSession::open(&SessionConfig::from_params(p)?)?;
        let publisher = session
            .session()
            .declare_publisher(key.clone())
            .congestion_control(if qos.block {
                CongestionControl::Block
            } else {
                CongestionControl::Drop
            })
            .priority(qos.priority)
            .express(qos.express)
            .reliability(if qos.reliable {
                Reliability::Reliable
            } else {
                Reliability::BestEffort
            })
            .wait()
            .map_err(|e| {
                StageError::msg(format!(
                    "zenoh_pub `{}`: cannot publish on `{key}`: {e}",
                    env.stage_id
                ))
            })?;
        let token = declare_token(&session, "zenoh_pub", &env.stage_id, token)?;
        Ok(Box::new(ZenohPub {
            kind,
            key,
            publisher,
            _token: token,
            _session: session,
        }))
    }
}

/// The `zenoh_pub` stage.
pub struct ZenohPub {
    kind: Option<Kind>,
    key: String,
    publisher: zenoh::pubsub::Publisher<'static>,
    _token: Option<zenoh::liveliness::LivelinessToken>,
    _session: SharedSession,
}

impl std::fmt::Debug for ZenohPub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZenohPub")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Encode a graph message for the wire.
pub fn encode_message(msg: &Message, as_kind: Option<Kind>) -> Result<Vec<u8>, crate::Error> {
    let body = payload_to_body(&msg.payload, as_kind, msg.seq)?;
    if let Some(k) = as_kind {
        if k != body.kind() {
            return Err(crate::Error::Payload(format!(
                "a {} message cannot be sent as {}",
                msg.payload.type_name(),
                k.name()
            )));
        }
    }
    let header = Header {
        epoch: msg.epoch,
        seq: msg.seq,
        capture_ns: wire::from_graph_time(msg.timestamp),
        deadline_ns: msg.deadline.map(wire::from_graph_time),
    };
    Ok(wire::encode(&header, &body)?)
}

impl Stage for ZenohPub {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let bytes = encode_message(&input.msg, self.kind).map_err(|e| {
            StageError::msg(format!("zenoh_pub `{}` on `{}`: {e}", ctx.id(), self.key))
        })?;
        self.publisher.put(bytes).wait().map_err(|e| {
            StageError::msg(format!(
                "zenoh_pub `{}`: put on `{}` failed: {e}",
                ctx.id(),
                self.key
            ))
        })?;
        Ok(())
    }
}

/// This stage's liveliness token (`token:` param), if it has one.
fn declare_token(
    session: &SharedSession,
    kind: &str,
    stage_id: &str,
    token: Option<String>,
) -> Result<Option<zenoh::liveliness::LivelinessToken>, StageError> {
    let Some(t) = token else {
        return Ok(None);
    };
    session
        .session()
        .liveliness()
        .declare_token(t.clone())
        .wait()
        .map(Some)
        .map_err(|e| {
            StageError::msg(format!(
                "{kind} `{stage_id}`: cannot declare token `{t}`: {e}"
            ))
        })
}
