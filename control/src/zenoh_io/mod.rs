//! The `zenoh_sub` (source) and `zenoh_pub` (sink, in `publish.rs`) stages.
//!
//! Each stage declares a liveliness token (`token`, default
//! `edgeflow/alive/<stage id>`) so the other side can tell it is gone; a
//! stage with `watch` subscribes to the peer's tokens and emits
//! `peer_alive` / `peer_lost` events on its `peer` port (and counts
//! `peers_lost`) as soon as zenoh reports a token's removal.

use crate::session::{SessionConfig, SharedSession};
use crate::wire::{self, Body, Kind, TensorData, WireError};
use edgeflow_graph::{
    BuildEnv, Event, Message, ParamInfo, ParamType, Params, Payload, Policy, Poll, PortSpec,
    PortType, Ports, Stage, StageCtx, StageError, StageFactory, StageHandle, StageInfo,
    StageResult, TryEmit,
};
use edgeflow_runtime::Tensor;
use parking_lot::{Condvar, Mutex};
use serde_json::json;
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use zenoh::sample::SampleKind;
use zenoh::Wait;

mod publish;
pub use publish::{encode_message, parse_qos, Qos, ZenohPub, ZenohPubKind};

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
    if t == "any" {
        return Ok(None);
    }
    Kind::parse(&t).map(Some).ok_or_else(|| {
        p.error(
            "type",
            format!("`{t}` is not a wire kind: use audio, tensor, image, robot_state, actions, text, control or any"),
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
            ParamInfo::required("type", ParamType::String, "wire kind: audio, tensor, image, robot_state, actions, text or control (other kinds are counted and rejected), or any"),
            ParamInfo::optional("dim", ParamType::Int, "reject (and count) messages whose vector length / action dim / channels differ"),
            ParamInfo::new("policy", ParamType::String, "latest", "local queue when the pipeline is slower than the publisher: latest (keep the newest), drop_oldest, drop_newest, or block (FIFO up to `capacity`, then the oldest is dropped: a zenoh callback cannot wait)"),
            ParamInfo::new("capacity", ParamType::Int, 16, "local queue length (1..=65536)"),
            ParamInfo::optional("watch", ParamType::String, "liveliness key expression of the peer (e.g. `edgeflow/alive/sim`): emits peer_lost / peer_alive on `peer`"),
            ParamInfo::optional("token", ParamType::String, "liveliness token to declare (default edgeflow/alive/<stage id>; \"\" = none)"),
            ParamInfo::new("eos", ParamType::Bool, false, "end the stream when the publisher announces its end on `<key>/eos` (edges between parts)"),
            ParamInfo::new("ack", ParamType::Bool, false, "acknowledge each delivered message on `<key>/ack` for a publisher's credit `window` (needs policy block)"),
            ParamInfo::new("ack_every", ParamType::Int, 1, "with `ack`: one acknowledgement per this many delivered messages (cumulative), the rest within 20 ms when the stream pauses; at most half the publisher's `window`"),
            ParamInfo::new("end_on_lost", ParamType::Bool, false, "end the stream when every peer under `watch` is gone (default: wait for it to come back)"),
            ParamInfo::new("keep_epoch", ParamType::Bool, false, "stamp messages with the sender's epoch (and raise this pipeline's epoch to it) instead of the current one: edges between parts of one pipeline"),
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
        // `None`: `type: any`, whatever kind the sender sent.
        let kind = kind_param(p, true)?;
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
        let eos: bool = p.get_or("eos", false)?;
        let ack: bool = p.get_or("ack", false)?;
        let ack_every: u64 = p.get_or("ack_every", 1)?;
        if !(1..=32_768).contains(&ack_every) {
            return Err(p
                .error(
                    "ack_every",
                    format!("must be in 1..=32768, got {ack_every}"),
                )
                .into());
        }
        let end_on_lost: bool = p.get_or("end_on_lost", false)?;
        if ack && policy != Policy::Block {
            return Err(p
                .error(
                    "ack",
                    "acknowledgements need `policy: block` (a credit window is lossless)",
                )
                .into());
        }
        if end_on_lost && watch.is_none() {
            return Err(p
                .error(
                    "end_on_lost",
                    "needs `watch`: the peer whose loss ends the stream",
                )
                .into());
        }
        let token = token_key(p, env)?;
        let scfg = SessionConfig::from_params(p)?;
        let session = SharedSession::open(&scfg)?;
        // Also for `eos` alone: the end of stream is acknowledged.
        let acker = if ack || eos {
            Some(
                crate::link::Acker::open(&session, &key, ack_every)
                    .map_err(|e| StageError::msg(format!("zenoh_sub `{}`: {e}", env.stage_id)))?,
            )
        } else {
            None
        };
        let shared = Arc::new(SubShared {
            keep_epoch: p.get_or("keep_epoch", false)?,
            acker,
            ack_data: ack,
            ..SubShared::default()
        });
        let sh = shared.clone();
        let stage_id = env.stage_id.clone();
        let key2 = key.clone();
        let sub = session
            .session()
            .declare_subscriber(key.clone())
            .callback(move |sample| {
                let bytes = sample.payload().to_bytes();
                let decoded = match kind {
                    Some(k) => wire::decode_kind(&bytes, k),
                    None => wire::decode(&bytes),
                };
                let r = decoded.and_then(|m| match (dim, body_dim(&m.body)) {
                    (Some(want), Some(got)) if want != got => Err(WireError::BadBody {
                        kind: m.body.kind().name(),
                        msg: format!("size {got}, this subscriber takes {want} (param `dim`)"),
                    }),
                    _ => Ok(m),
                });
                let attachment = sample.attachment().map(|a| a.to_bytes());
                match r {
                    Ok(m) if !sh.admit(&stage_id, attachment.as_deref(), &m.header) => {}
                    Ok(m) => match sh.direct.get() {
                        Some(Direct::Drops(h)) => sh.emit_direct(h, m),
                        Some(Direct::Blocks(h)) => sh.emit_or_hold(h, m, capacity),
                        None => sh.push(m, policy, capacity),
                    },
                    Err(e) => {
                        let n = sh.malformed.fetch_add(1, Ordering::Relaxed) + 1;
                        if n <= 10 || n.is_power_of_two() {
                            eprintln!(
                                "zenoh_sub `{stage_id}`: rejected a message on `{}` (expected {} on `{key2}`): {e} [{n} rejected so far]",
                                sample.key_expr(),
                                kind.map_or("a message", Kind::name)
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
        let eos_sub = if eos {
            let sh = shared.clone();
            let eos_id = env.stage_id.clone();
            Some(
                session
                    .session()
                    .declare_subscriber(crate::link::eos_key(&key))
                    .callback(move |sample| {
                        let bytes = sample.payload().to_bytes();
                        if let Some(n) = crate::link::event_number(&bytes, "end_of_stream", "sent")
                        {
                            if sh.eos_acked.load(Ordering::Acquire) {
                                // Sent again: the acknowledgement was lost.
                                sh.ack_eos(&eos_id, n);
                            }
                            sh.state.lock().eos = Some(n);
                            sh.cv.notify_one();
                        }
                    })
                    .wait()
                    .map_err(|e| {
                        StageError::msg(format!(
                            "zenoh_sub `{}`: cannot subscribe to `{key}`'s end of stream: {e}",
                            env.stage_id
                        ))
                    })?,
            )
        } else {
            None
        };
        let token = declare_token(&session, "zenoh_sub", &env.stage_id, token)?;
        Ok(Box::new(ZenohSub {
            shared,
            policy,
            end_on_lost,
            _eos: eos_sub,
            reported_malformed: 0,
            reported_dropped: 0,
            reported_duplicates: 0,
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
    /// [`Direct::Blocks`]: messages the callback could not deliver without
    /// waiting, with their link sequence numbers, for the stage's thread.
    held: VecDeque<(Message, u64)>,
    /// The stage's thread is delivering what it took from `queue` / `held`
    /// (the callback holds new messages meanwhile, to keep the order).
    delivering: bool,
    peer_events: VecDeque<(String, bool)>,
    alive: BTreeSet<String>,
    /// The publisher's end of stream arrived (messages it sent).
    eos: Option<u64>,
}

#[derive(Default)]
struct SubShared {
    state: Mutex<SubState>,
    cv: Condvar,
    malformed: AtomicU64,
    dropped: AtomicU64,
    /// Set at start when messages may go straight from zenoh's callback
    /// into the pipeline (see [`ZenohSub`]).
    direct: OnceLock<Direct>,
    /// Keep the sender's epoch (`keep_epoch`).
    keep_epoch: bool,
    /// Acknowledgements for the publisher's credit window (`ack`).
    acker: Option<crate::link::Acker>,
    /// Data is acknowledged (`ack`); else `acker` serves only the end of
    /// stream.
    ack_data: bool,
    /// With `ack`: the windowed sender's instance and the last link
    /// sequence number taken from it (what is at or below is a duplicate).
    link: Mutex<(Option<u64>, u64)>,
    /// Without `ack`: the last message's header. A `latest` publisher
    /// sends its newest message again when a subscriber appears, which
    /// can reach a subscriber that took it already.
    last: Mutex<Option<wire::Header>>,
    /// Duplicates dropped (messages sent again after a lost link).
    duplicates: AtomicU64,
    /// The end of stream was acknowledged: one sent again is acknowledged
    /// again from the callback.
    eos_acked: AtomicBool,
}

/// How zenoh's callback delivers once the stage has started.
enum Direct {
    /// Every edge from `out` drops when full: emit, never waits.
    Drops(StageHandle),
    /// `policy: block` into queued consumers: emit when every edge has
    /// room, else hold the message for the stage's thread.
    Blocks(StageHandle),
}

impl SubShared {
    /// Deliver a decoded message from zenoh's callback thread: the `out`
    /// edges never wait (checked at start), so this cannot stall zenoh.
    fn emit_direct(&self, h: &StageHandle, m: wire::WireMessage) {
        let epoch = self.epoch_of(h, &m);
        match to_message(m, epoch) {
            Ok((msg, transit_ms)) => {
                h.record("transit_ms", transit_ms);
                // Refused only while the epoch is cancelled or the pipeline
                // stops: the message is dropped, as a queued one would be.
                let _ = h.emit_msg(0, msg);
            }
            Err(e) => {
                let n = self.malformed.fetch_add(1, Ordering::Relaxed) + 1;
                h.record("malformed", n as f64);
                eprintln!(
                    "zenoh_sub `{}`: rejected a message: {e} [{n} rejected so far]",
                    h.id()
                );
            }
        }
    }

    /// The message's epoch as this pipeline takes it.
    fn epoch_of(&self, h: &StageHandle, m: &wire::WireMessage) -> edgeflow_graph::Epoch {
        if self.keep_epoch {
            h.observe_epoch(m.header.epoch);
            m.header.epoch
        } else {
            h.current_epoch()
        }
    }

    /// With `ack`, whether a message from a windowed sender is new: one
    /// it sent again (after a lost link or a missing acknowledgement) that
    /// was already taken is dropped and acknowledged again. A new sender
    /// instance (a restarted process) numbers from 1 afresh.
    /// Without `ack`, a message sent again ([`crate::link::AGAIN`]) whose
    /// header is the last one's is a duplicate.
    fn admit(&self, id: &str, attachment: Option<&[u8]>, header: &wire::Header) -> bool {
        let seq = header.seq;
        let Some(acker) = self.acker.as_ref().filter(|_| self.ack_data) else {
            let mut last = self.last.lock();
            if attachment == Some(&crate::link::AGAIN[..]) && last.as_ref() == Some(header) {
                self.duplicates.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            *last = Some(*header);
            return true;
        };
        let Some(instance) = crate::link::instance_of(attachment) else {
            return true;
        };
        let mut link = self.link.lock();
        if link.0 != Some(instance) {
            if link.0.is_some() {
                acker.restart();
            }
            *link = (Some(instance), 0);
        }
        if seq <= link.1 {
            drop(link);
            self.duplicates.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = acker.reack() {
                eprintln!("zenoh_sub `{id}`: {e}");
            }
            return false;
        }
        link.1 = seq;
        true
    }

    /// Acknowledge link sequence number `seq` (with `ack`), or say why not.
    fn ack(&self, id: &str, seq: u64) {
        if let Some(a) = self.acker.as_ref().filter(|_| self.ack_data) {
            if let Err(e) = a.ack(seq) {
                eprintln!("zenoh_sub `{id}`: {e}");
            }
        }
    }

    /// Acknowledge the end of stream after `sent` messages: the sender's
    /// window gives it the next link sequence number.
    fn ack_eos(&self, id: &str, sent: u64) {
        if let Some(a) = &self.acker {
            if let Err(e) = a.ack_now(sent + 1) {
                eprintln!("zenoh_sub `{id}`: {e}");
            }
            self.eos_acked.store(true, Ordering::Release);
        }
    }

    /// Acknowledge what was delivered and not yet acknowledged (`ack_every`).
    fn flush_acks(&self, id: &str) {
        if let Some(a) = self.acker.as_ref().filter(|_| self.ack_data) {
            if let Err(e) = a.flush() {
                eprintln!("zenoh_sub `{id}`: {e}");
            }
        }
    }

    /// [`Direct::Blocks`], on zenoh's callback thread: deliver at once when
    /// nothing is held before it and every `block` edge has room (then
    /// acknowledge, as the stage's thread would), else hold it in order for
    /// the thread, which may wait. The publisher's credit window keeps what
    /// is held within `cap`; without one the oldest is dropped and counted.
    fn emit_or_hold(&self, h: &StageHandle, m: wire::WireMessage, cap: usize) {
        let seq = m.header.seq;
        let epoch = self.epoch_of(h, &m);
        let msg = match to_message(m, epoch) {
            Ok((msg, transit_ms)) => {
                h.record("transit_ms", transit_ms);
                msg
            }
            Err(e) => {
                let n = self.malformed.fetch_add(1, Ordering::Relaxed) + 1;
                h.record("malformed", n as f64);
                eprintln!(
                    "zenoh_sub `{}`: rejected a message: {e} [{n} rejected so far]",
                    h.id()
                );
                return;
            }
        };
        let mut st = self.state.lock();
        let msg = if st.queue.is_empty() && st.held.is_empty() && !st.delivering {
            match h.try_emit_msg(0, msg) {
                // Refused: its epoch was cancelled (or the pipeline stops):
                // dropped as a queue drops it, and taken off the window.
                Ok(()) | Err(TryEmit::Refused) => {
                    drop(st);
                    self.ack(h.id(), seq);
                    return;
                }
                Err(TryEmit::Full(msg)) => msg,
            }
        } else {
            msg
        };
        if st.held.len() >= cap {
            st.held.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        st.held.push_back((msg, seq));
        self.cv.notify_one();
    }

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

/// A decoded wire message as a graph message in `epoch`, and its transit
/// time (capture to now) in ms.
fn to_message(
    m: wire::WireMessage,
    epoch: edgeflow_graph::Epoch,
) -> Result<(Message, f64), crate::Error> {
    let capture = wire::to_graph_time(m.header.capture_ns);
    let deadline = m.header.deadline_ns.map(wire::to_graph_time);
    let transit_ms = capture.elapsed().as_secs_f64() * 1e3;
    let payload = body_to_payload(m.body)?;
    Ok((
        Message {
            epoch,
            seq: 0,
            timestamp: capture,
            deadline,
            payload,
        },
        transit_ms,
    ))
}

/// The `zenoh_sub` stage.
///
/// Messages reach the pipeline from zenoh's receive callback without a hop
/// through this stage's thread whenever that cannot make the callback wait:
///
/// - the stage's `policy` drops (`latest`, `drop_*`) and every edge from
///   `out` drops too (no `block` edge, no inline consumer): the callback
///   emits each message;
/// - `policy: block` and no consumer runs inline: the callback emits a
///   message when every `block` edge from `out` has room and nothing is
///   held before it (and acknowledges it, with `ack`); otherwise it holds
///   it for the stage's thread, which emits in order and may wait. A full
///   consumer thus stalls this thread and, through the credit window, the
///   publisher, never zenoh.
///
/// Otherwise (inline consumers) the callback fills the local queue under
/// `policy` and the stage's thread emits from it.
pub struct ZenohSub {
    shared: Arc<SubShared>,
    policy: Policy,
    end_on_lost: bool,
    _eos: Option<zenoh::pubsub::Subscriber<()>>,
    reported_malformed: u64,
    reported_dropped: u64,
    reported_duplicates: u64,
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

impl ZenohSub {
    /// Emit what the stage's thread took: messages queued before start (or
    /// without a direct path), then those the callback held, in order, each
    /// acknowledged (with `ack`) once it is in the pipeline.
    fn deliver(
        &self,
        ctx: &mut StageCtx,
        msgs: Vec<wire::WireMessage>,
        held: Vec<(Message, u64)>,
    ) -> StageResult {
        for m in msgs {
            let seq = m.header.seq;
            let epoch = if self.shared.keep_epoch {
                ctx.observe_epoch(m.header.epoch);
                m.header.epoch
            } else {
                ctx.current_epoch()
            };
            match to_message(m, epoch) {
                Ok((msg, transit_ms)) => {
                    ctx.record("transit_ms", transit_ms);
                    self.emit_one(ctx, msg, seq)?;
                }
                Err(e) => {
                    let n = self.shared.malformed.fetch_add(1, Ordering::Relaxed) + 1;
                    eprintln!(
                        "zenoh_sub `{}`: rejected a message: {e} [{n} rejected so far]",
                        ctx.id()
                    );
                }
            }
        }
        for (msg, seq) in held {
            self.emit_one(ctx, msg, seq)?;
        }
        Ok(())
    }

    fn emit_one(&self, ctx: &mut StageCtx, msg: Message, seq: u64) -> StageResult {
        // With a direct path the callback emits on `out` too: one port,
        // one emitter's sequence numbers.
        let r = match self.shared.direct.get() {
            Some(Direct::Blocks(h)) => h.emit_msg(0, msg),
            _ => ctx.emit_msg(0, msg),
        };
        match r {
            Ok(()) => {}
            // Refused: the pipeline stops, or the message's epoch was
            // cancelled (it arrived from another part just before the
            // cancel did): drop it, as a queue drops a cancelled epoch,
            // acknowledge it (the sender's window counts it as taken) and
            // go on.
            Err(StageError::Cancelled) if !ctx.should_stop() => {}
            Err(e) => return Err(e),
        }
        self.shared.ack(ctx.id(), seq);
        Ok(())
    }
}

impl Stage for ZenohSub {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        let h = ctx.handle();
        // Messages that arrived before start stay queued for `poll`.
        if self.policy != Policy::Block && h.never_waits(0) {
            let _ = self.shared.direct.set(Direct::Drops(h));
            ctx.record("direct", 1.0);
        } else if self.policy == Policy::Block && h.queued(0) {
            let _ = self.shared.direct.set(Direct::Blocks(h));
            ctx.record("direct", 1.0);
        }
        Ok(())
    }

    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        if ctx.should_stop() {
            return Ok(Poll::Done);
        }
        let (msgs, held, events, eos, none_alive) = {
            let mut st = self.shared.state.lock();
            if st.queue.is_empty()
                && st.held.is_empty()
                && st.peer_events.is_empty()
                && st.eos.is_none()
            {
                self.shared.cv.wait_for(&mut st, Duration::from_millis(20));
            }
            let msgs = st.queue.drain(..).collect::<Vec<_>>();
            let held = st.held.drain(..).collect::<Vec<_>>();
            // Until these are out, the callback holds what comes next.
            st.delivering = !msgs.is_empty() || !held.is_empty();
            (
                msgs,
                held,
                st.peer_events.drain(..).collect::<Vec<_>>(),
                st.eos,
                st.alive.is_empty(),
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
        let lost_all = self.end_on_lost && none_alive && events.iter().any(|(_, alive)| !alive);
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
        let idle = msgs.is_empty() && held.is_empty();
        let delivered = self.deliver(ctx, msgs, held);
        if !idle {
            self.shared.state.lock().delivering = false;
        } else {
            // The stream paused (or emits from the callback): what it
            // delivered since the last acknowledgement goes back now.
            self.shared.flush_acks(ctx.id());
        }
        delivered?;
        let duplicates = self.shared.duplicates.load(Ordering::Relaxed);
        if duplicates != self.reported_duplicates {
            self.reported_duplicates = duplicates;
            ctx.record("duplicates", duplicates as f64);
        }
        if let Some(sent) = eos {
            // Everything before the end of stream was queued (or emitted
            // directly) before it: the same link delivers in order.
            self.shared.ack_eos(ctx.id(), sent);
            eprintln!("zenoh_sub `{}`: end of stream ({sent} sent)", ctx.id());
            return Ok(Poll::Done);
        }
        if lost_all {
            eprintln!(
                "zenoh_sub `{}`: every peer is gone; ending the stream (end_on_lost)",
                ctx.id()
            );
            return Ok(Poll::Done);
        }
        Ok(if idle { Poll::Idle } else { Poll::Continue })
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
