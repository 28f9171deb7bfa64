//! The `zenoh_pub` stage: graph messages published on a zenoh key in wire
//! format v1, with the QoS its params and edge policy choose.

use super::{declare_token, key_param, kind_param, payload_to_body, port_type, token_key};
use crate::link::Route;
use crate::session::{SessionConfig, SharedSession};
use crate::wire::{self, Header, Kind};
use edgeflow_graph::{
    BuildEnv, Input, Message, ParamInfo, ParamType, Params, PortSpec, PortType, Ports, Stage,
    StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zenoh::bytes::ZBytes;
use zenoh::qos::{CongestionControl, Priority, Reliability};
use zenoh::Wait;

/// How long the end of a windowed stream waits for a receiving part that
/// is gone to come back and acknowledge what is left (while it is there,
/// the end waits as long as it takes: that is backpressure).
const DRAIN: Duration = Duration::from_secs(10);
/// The same for the end of stream of an edge without a data window (a
/// `latest` or drop edge): long enough for a link to come back after its
/// lease expired, short for a part whose peer was killed.
const EOS_GRACE: Duration = Duration::from_secs(3);

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
            ParamInfo::new("policy", ParamType::String, "block", "edge-policy vocabulary mapped to congestion control: block -> block, latest / drop_oldest / drop_newest -> drop; with latest, the newest message published while no subscriber matched is sent again when one appears"),
            ParamInfo::optional("congestion_control", ParamType::String, "block or drop (overrides `policy`)"),
            ParamInfo::new("priority", ParamType::String, "data", "real_time, interactive_high, interactive_low, data_high, data, data_low, background"),
            ParamInfo::new("express", ParamType::Bool, false, "send each message at once instead of batching"),
            ParamInfo::optional("token", ParamType::String, "liveliness token to declare (default edgeflow/alive/<stage id>; \"\" = none)"),
            ParamInfo::new("eos", ParamType::Bool, false, "announce the end of the stream on `<key>/eos` when the input ends (edges between parts)"),
            ParamInfo::new("window", ParamType::Int, 0, "credit window: at most this many messages unacknowledged by a subscriber with `ack: true` (0: none); lossless backpressure across hosts"),
            ParamInfo::optional("watch", ParamType::String, "the receiver's liveliness key expression: with `window`, publishing waits while it is gone; with `eos`, the end of stream waits for its acknowledgement (up to 10 s of the receiver's absence with `window`, 3 s without) and is sent again until then"),
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
        let window: u64 = p.get_or("window", 0)?;
        if window > 65_536 {
            return Err(p
                .error("window", format!("must be in 0..=65536, got {window}"))
                .into());
        }
        let watch: Option<String> = p.opt("watch")?;
        let eos: bool = p.get_or("eos", false)?;
        let data_window = window > 0;
        // Without a window of its own, a watched end of stream still takes
        // a window of one, to be acknowledged (and sent again) like data.
        let window = if data_window || (eos && watch.is_some()) {
            Some(
                crate::link::Window::open(&session, &key, window.max(1), watch.as_deref())
                    .map_err(|e| StageError::msg(format!("zenoh_pub `{}`: {e}", env.stage_id)))?,
            )
        } else {
            None
        };
        let publisher = Arc::new(publisher);
        let (newest, matching) = if p.get_or::<String>("policy", "block".to_string())? == "latest" {
            let (newest, listener) = Newest::watch(&publisher).map_err(|e| {
                StageError::msg(format!(
                    "zenoh_pub `{}`: cannot watch the subscribers of `{key}`: {e}",
                    env.stage_id
                ))
            })?;
            (Some(newest), Some(listener))
        } else {
            (None, None)
        };
        let token = declare_token(&session, "zenoh_pub", &env.stage_id, token)?;
        Ok(Box::new(ZenohPub {
            kind,
            key,
            eos,
            window,
            data_window,
            sent: 0,
            publisher,
            newest,
            _matching: matching,
            _token: token,
            _session: session,
        }))
    }
}

/// The `zenoh_pub` stage.
pub struct ZenohPub {
    kind: Option<Kind>,
    key: String,
    eos: bool,
    window: Option<crate::link::Window>,
    /// Data goes through `window` (`window` > 0); else it serves only the
    /// end of stream.
    data_window: bool,
    sent: u64,
    publisher: Arc<zenoh::pubsub::Publisher<'static>>,
    /// `policy: latest`: the newest message, for a subscriber that comes
    /// after it was published.
    newest: Option<Arc<Mutex<Newest>>>,
    _matching: Option<zenoh::matching::MatchingListener<()>>,
    _token: Option<zenoh::liveliness::LivelinessToken>,
    _session: SharedSession,
}

/// A `latest` edge's newest message. zenoh sends a publication only where
/// a subscriber is declared, so a message published before the consumer's
/// subscription reached this part (a part that starts or reconnects late,
/// a slow link) would be lost, and with it the edge's promise that the
/// consumer sees the newest value. The newest message published while no
/// subscriber matched is sent again when one appears.
struct Newest {
    bytes: Option<ZBytes>,
    /// `bytes` was published while no subscriber matched.
    unrouted: bool,
    /// A subscriber matches, as the matching listener last said.
    matched: bool,
}

impl Newest {
    /// Track `publisher`'s subscribers: the listener sends the newest
    /// message again when the first one appears.
    fn watch(
        publisher: &Arc<zenoh::pubsub::Publisher<'static>>,
    ) -> Result<(Arc<Mutex<Newest>>, zenoh::matching::MatchingListener<()>), zenoh::Error> {
        let newest = Arc::new(Mutex::new(Newest {
            bytes: None,
            unrouted: false,
            matched: false,
        }));
        let (n, p) = (newest.clone(), publisher.clone());
        let listener = publisher
            .matching_listener()
            .callback(move |status| {
                let mut n = n.lock();
                n.matched = status.matching();
                if n.matched && n.unrouted {
                    if let Some(b) = &n.bytes {
                        let again = p.put(b.clone()).attachment(&crate::link::AGAIN[..]);
                        if let Err(e) = again.wait() {
                            eprintln!(
                                "zenoh_pub: sending the newest message on `{}` again: {e}",
                                p.key_expr()
                            );
                        }
                    }
                    n.unrouted = false;
                }
            })
            .wait()?;
        Ok((newest, listener))
    }

    /// Publish `bytes` with `put` and keep them as the newest message.
    fn put(
        newest: &Mutex<Newest>,
        bytes: ZBytes,
        put: impl FnOnce(ZBytes) -> Result<(), zenoh::Error>,
    ) -> Result<(), zenoh::Error> {
        let mut n = newest.lock();
        put(bytes.clone())?;
        n.unrouted = !n.matched;
        n.bytes = Some(bytes);
        Ok(())
    }

    /// Wait up to `grace` (or until `give_up`) for the newest message to
    /// be sent to a subscriber; whether it was.
    fn settle(newest: &Mutex<Newest>, grace: Duration, give_up: impl Fn() -> bool) -> bool {
        let t0 = Instant::now();
        loop {
            if !newest.lock().unrouted {
                return true;
            }
            if give_up() || t0.elapsed() >= grace {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
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
    encode_with_seq(msg, as_kind, msg.seq)
}

/// [`encode_message`] with the header's sequence number set to `seq` (a
/// link's own numbering).
fn encode_with_seq(
    msg: &Message,
    as_kind: Option<Kind>,
    seq: u64,
) -> Result<Vec<u8>, crate::Error> {
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
        seq,
        capture_ns: wire::from_graph_time(msg.timestamp),
        deadline_ns: msg.deadline.map(wire::from_graph_time),
    };
    Ok(wire::encode(&header, &body)?)
}

impl ZenohPub {
    /// Publish `bytes` on the data key, with the window's instance
    /// attached when there is a window.
    fn put(&self, bytes: ZBytes) -> Result<(), zenoh::Error> {
        let put = self.publisher.put(bytes);
        match &self.window {
            Some(w) if self.data_window => put.attachment(w.attachment()).wait(),
            _ => put.wait(),
        }
    }

    /// Send a kept message again (see [`crate::link::Window`]); a failure
    /// is reported and left to the next retransmission.
    fn resend(&self, id: &str, route: Route, bytes: &ZBytes) {
        let r = match route {
            Route::Data => self.put(bytes.clone()).map_err(|e| e.to_string()),
            Route::Eos => crate::link::put_eos(&self._session, &self.key, bytes.clone())
                .map_err(|e| e.to_string()),
        };
        if let Err(e) = r {
            eprintln!("zenoh_pub `{id}`: sending again on `{}`: {e}", self.key);
        }
    }
}

impl Stage for ZenohPub {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let ctx = &*ctx;
        let seq = match self.window.as_ref().filter(|_| self.data_window) {
            Some(w) => match w.acquire(|| ctx.should_stop(), |r, b| self.resend(ctx.id(), r, b)) {
                Some(seq) => seq,
                None => return Err(StageError::Cancelled),
            },
            None => input.msg.seq,
        };
        // Shared, not copied, with what the window keeps.
        let bytes = ZBytes::from(encode_with_seq(&input.msg, self.kind, seq).map_err(|e| {
            StageError::msg(format!("zenoh_pub `{}` on `{}`: {e}", ctx.id(), self.key))
        })?);
        self.sent += 1;
        if let Some(w) = self.window.as_ref().filter(|_| self.data_window) {
            w.keep(seq, Route::Data, bytes.clone());
        }
        let sent = match &self.newest {
            Some(n) => Newest::put(n, bytes, |b| self.put(b)),
            None => self.put(bytes),
        };
        sent.map_err(|e| {
            StageError::msg(format!(
                "zenoh_pub `{}`: put on `{}` failed: {e}",
                ctx.id(),
                self.key
            ))
        })?;
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        let id = ctx.id().to_string();
        // A receiving part on its way gets the newest message before the
        // end of stream (within the end's grace, which this wait spends).
        let t_end = Instant::now();
        if let (Some(n), true) = (&self.newest, self.eos && self.window.is_some()) {
            if !Newest::settle(n, EOS_GRACE, || ctx.should_stop()) && !ctx.should_stop() {
                eprintln!(
                    "zenoh_pub `{id}`: no subscriber on `{}` came for the newest message within {} s",
                    self.key,
                    EOS_GRACE.as_secs()
                );
                ctx.record("newest_unsent", 1.0);
            }
        }
        let Some(w) = &self.window else {
            if self.eos {
                crate::link::send_eos(&self._session, &self.key, self.sent)
                    .map_err(|e| StageError::msg(format!("zenoh_pub `{id}`: {e}")))?;
            }
            return Ok(());
        };
        // Everything delivered, then the end of stream (itself windowed:
        // acknowledged, and sent again until it is), so the producing
        // process may exit as soon as this returns.
        let grace = if self.data_window { DRAIN } else { EOS_GRACE };
        let mut done = w.drain(grace, || ctx.should_stop(), |r, b| self.resend(&id, r, b));
        // A block edge's grace starts after its drain.
        let t0 = if self.data_window {
            Instant::now()
        } else {
            t_end
        };
        let give_up = || ctx.should_stop() || t0.elapsed() >= grace;
        if self.eos {
            let bytes = ZBytes::from(
                crate::link::eos_bytes(self.sent)
                    .map_err(|e| StageError::msg(format!("zenoh_pub `{id}`: {e}")))?,
            );
            let eos_err = |e| StageError::msg(format!("zenoh_pub `{id}`: {e}"));
            let seq = if done {
                w.acquire(give_up, |r, b| self.resend(&id, r, b))
            } else {
                None
            };
            if let Some(seq) = seq {
                w.keep(seq, Route::Eos, bytes.clone());
                crate::link::put_eos(&self._session, &self.key, bytes).map_err(eos_err)?;
                done = w.drain(grace, || ctx.should_stop(), |r, b| self.resend(&id, r, b));
            } else {
                // The receiver stayed away: announce the end anyway, for a
                // receiver that comes back to whatever it has.
                crate::link::put_eos(&self._session, &self.key, bytes).map_err(eos_err)?;
                done = false;
            }
        }
        // A run that is being stopped gives up on purpose: no warning.
        if !done && !ctx.should_stop() {
            eprintln!(
                "zenoh_pub `{id}`: {} of {} messages on `{}` unacknowledged at the end{}",
                w.unacked(),
                w.sent(),
                self.key,
                if self.eos {
                    " (the end of stream among them)"
                } else {
                    ""
                }
            );
        }
        if !done {
            ctx.record("unacked_at_end", w.unacked() as f64);
        }
        if w.resent() > 0 {
            ctx.record("resent", w.resent() as f64);
        }
        Ok(())
    }
}
