//! Parts of one pipeline in several processes or hosts, joined by zenoh.
//!
//! The engine decides which edges cross parts
//! ([`edgeflow_graph::parts::select_part`]); [`ZenohBridge`] says how: the
//! producer's part publishes the edge with a `zenoh_pub`, the consumer's
//! part subscribes with a `zenoh_sub`, both in the part's session from the
//! pipeline's `parts:` section, and the edge keeps its meaning:
//!
//! | edge policy | publisher | subscriber |
//! |---|---|---|
//! | `block` | reliable, congestion control block, express, credit window = the edge's capacity, waits while the consuming part is absent | FIFO, delivers from zenoh's callback while the edge has room (else its thread does, in order), acknowledges every `capacity / 2` delivered messages and the rest when the stream pauses |
//! | `latest` | reliable, congestion control drop, express; its newest message, if published while the consuming part was absent, is sent again when it comes (and before the end of stream) | the same policy on its queue (drops counted); a message sent again that it has already is dropped |
//! | `drop_oldest`, `drop_newest` | reliable, congestion control drop, express | the same policy on its queue (drops counted) |
//!
//! The publisher runs inline on the producing stage's thread (no hand-off
//! to a thread of its own; a full window stalls the producer itself).
//!
//! Both ends carry end of stream (`<key>/eos`), so a finite split pipeline
//! ends in every part; the subscriber watches the producing part's
//! liveliness and emits `peer_lost` / `peer_alive`.
//!
//! [`PartPresence`] is what a running part declares and watches: its
//! liveliness token `edgeflow/parts/<pipeline>/<part>/<file hash>`, a check
//! at start that every other part present runs the same pipeline file
//! (refused otherwise, both hashes named), and a report, within the link
//! lease (about a second), of each part that goes or comes back.

use crate::error::{Error, Result};
use crate::session::{SessionConfig, SharedSession};
use edgeflow_graph::parts::{key_chunk, part_names, Crossing, PartBridge};
use edgeflow_graph::spec::{PipelineSpec, Policy, StageSpec};
use edgeflow_graph::PortType;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use zenoh::sample::SampleKind;
use zenoh::Wait;

/// Where the first part (in name order) listens when the file's `parts:`
/// says nothing; the others connect there.
pub const DEFAULT_PORT: u16 = 7450;

/// What a part does when a part it receives from is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Keep running and wait for the part to come back (default).
    Wait,
    /// End the streams that came from it, so the part stops cleanly.
    Stop,
}

/// The liveliness prefix of a pipeline's parts.
pub fn parts_prefix(pipeline: &str) -> String {
    format!("edgeflow/parts/{}", key_chunk(pipeline))
}

/// The session each part uses: its `parts:` entry, else loopback defaults
/// (the first part listens on [`DEFAULT_PORT`], the others connect to it).
pub fn part_sessions(spec: &PipelineSpec) -> BTreeMap<String, SessionConfig> {
    let names = part_names(spec);
    let first = names.first().cloned().unwrap_or_default();
    let first_listen: Vec<String> = match spec.parts.get(&first) {
        Some(p) if !p.listen.is_empty() => p.listen.clone(),
        _ => vec![format!("tcp/127.0.0.1:{DEFAULT_PORT}")],
    };
    names
        .into_iter()
        .map(|n| {
            let cfg = match spec.parts.get(&n) {
                Some(p) => SessionConfig {
                    mode: "peer".into(),
                    connect: p.connect.clone(),
                    listen: if p.listen.is_empty() {
                        vec!["tcp/127.0.0.1:0".into()]
                    } else {
                        p.listen.clone()
                    },
                },
                None if n == first => SessionConfig {
                    mode: "peer".into(),
                    connect: vec![],
                    listen: first_listen.clone(),
                },
                None => SessionConfig {
                    mode: "peer".into(),
                    connect: first_listen.clone(),
                    listen: vec!["tcp/127.0.0.1:0".into()],
                },
            };
            (n, cfg)
        })
        .collect()
}

/// The wire `type` for a port type, or why it cannot cross.
fn wire_type(t: &PortType) -> std::result::Result<&'static str, String> {
    Ok(match t {
        PortType::Audio { .. } => "audio",
        PortType::Text => "text",
        PortType::Tensor => "tensor",
        PortType::Image => "image",
        PortType::Actions => "actions",
        PortType::Control => "control",
        // Whatever the producer sends; the wire header names its kind.
        PortType::Any => "any",
        other => {
            return Err(format!(
                "a `{}` port has no wire format; keep the edge inside one part (token ids have no wire format yet)",
                other
            ))
        }
    })
}

/// [`PartBridge`] over zenoh.
#[derive(Debug, Clone)]
pub struct ZenohBridge {
    sessions: BTreeMap<String, SessionConfig>,
    prefix: String,
    on_lost: OnLost,
}

impl ZenohBridge {
    /// The bridge for `spec`'s parts.
    pub fn new(spec: &PipelineSpec, pipeline: &str, on_lost: OnLost) -> Self {
        ZenohBridge {
            sessions: part_sessions(spec),
            prefix: parts_prefix(pipeline),
            on_lost,
        }
    }

    /// The session of `part`.
    pub fn session(&self, part: &str) -> SessionConfig {
        self.sessions.get(part).cloned().unwrap_or_default()
    }

    fn session_params(&self, part: &str) -> [(String, Value); 3] {
        let s = self.session(part);
        [
            ("mode".into(), json!(s.mode)),
            ("listen".into(), json!(s.listen)),
            ("connect".into(), json!(s.connect)),
        ]
    }
}

fn stage(kind: &str, params: Vec<(String, Value)>) -> StageSpec {
    StageSpec {
        id: String::new(),
        kind: kind.into(),
        device: None,
        threads: None,
        inline: false,
        part: None,
        params: params.into_iter().collect(),
    }
}

impl PartBridge for ZenohBridge {
    fn sender(&self, c: &Crossing) -> std::result::Result<StageSpec, String> {
        let ty = wire_type(&c.port_type)?;
        let block = c.policy == Policy::Block;
        let mut p: Vec<(String, Value)> = vec![
            ("key".into(), json!(c.key)),
            ("type".into(), json!(ty)),
            ("reliability".into(), json!("reliable")),
            ("policy".into(), json!(c.policy.name())),
            // Every message leaves at once: batched, a lone message waits
            // for zenoh's transmit task to give up on more (up to a timer
            // tick, ~1 ms); a `block` edge's credit window bounds what is
            // in flight anyway.
            ("express".into(), json!(true)),
            ("token".into(), json!("")),
            ("eos".into(), json!(true)),
        ];
        if block {
            p.push(("window".into(), json!(c.capacity)));
        }
        // The receiving part: a block edge waits for it; the end of stream
        // of every edge waits for its acknowledgement.
        p.push((
            "watch".into(),
            json!(format!("{}/{}/*", self.prefix, c.to_part)),
        ));
        p.extend(self.session_params(&c.from_part));
        // On the producer's thread: one wake-up less per message, and a
        // full credit window stalls the producer itself (backpressure).
        let mut st = stage("zenoh_pub", p);
        st.inline = true;
        Ok(st)
    }

    fn receiver(&self, c: &Crossing) -> std::result::Result<StageSpec, String> {
        let ty = wire_type(&c.port_type)?;
        let block = c.policy == Policy::Block;
        let mut p: Vec<(String, Value)> = vec![
            ("key".into(), json!(c.key)),
            ("type".into(), json!(ty)),
            ("policy".into(), json!(c.policy.name())),
            // The credit window keeps a block edge's queue within capacity.
            ("capacity".into(), json!(c.capacity.max(1))),
            ("token".into(), json!("")),
            ("eos".into(), json!(true)),
            ("ack".into(), json!(block)),
            // Half the window: the publisher never waits on an
            // acknowledgement held back, and there are fewer of them.
            ("ack_every".into(), json!((c.capacity / 2).max(1))),
            (
                "watch".into(),
                json!(format!("{}/{}/*", self.prefix, c.from_part)),
            ),
            ("end_on_lost".into(), json!(self.on_lost == OnLost::Stop)),
            ("keep_epoch".into(), json!(true)),
        ];
        p.extend(self.session_params(&c.to_part));
        Ok(stage("zenoh_sub", p))
    }
}

/// Another part's acknowledgement of a cancel this part started.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RemoteAck {
    /// The part.
    pub part: String,
    /// The cancelled epoch.
    pub epoch: u64,
    /// Its stages that acknowledged, of `stages` asked.
    pub acked: usize,
    /// Its stages asked.
    pub stages: usize,
    /// From its receiving the cancel to its last stage's acknowledgement, ms
    /// (`None`: not all acknowledged within 2 s).
    pub ack_ms: Option<f64>,
}

/// A running part's presence: its token, the other parts it has seen, and
/// the reports of parts that go or come back.
pub struct PartPresence {
    part: String,
    prefix: String,
    seen: Arc<Mutex<BTreeSet<String>>>,
    acks: Arc<Mutex<Vec<RemoteAck>>>,
    cancel_subs: Vec<zenoh::pubsub::Subscriber<()>>,
    /// Every other part's final metrics, as they arrive.
    metrics: Arc<Mutex<BTreeMap<String, Value>>>,
    _metrics_sub: zenoh::pubsub::Subscriber<()>,
    _watch: zenoh::pubsub::Subscriber<()>,
    _token: zenoh::liveliness::LivelinessToken,
    session: SharedSession,
}

impl std::fmt::Debug for PartPresence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartPresence")
            .field("part", &self.part)
            .finish_non_exhaustive()
    }
}

/// `<prefix>/<part>/<hash>` split into (part, hash).
fn part_and_hash<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, &'k str)> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('/')?;
    rest.split_once('/')
}

impl PartPresence {
    /// Join as `part` of `pipeline` (file hash `hash`) in `session`: refuse
    /// if a part already present runs another file, then declare this part
    /// and report every other part that goes or comes back on stderr.
    /// Declare it once the part's stages are built, so a peer that sees the
    /// token finds its subscribers in place. A part that shows up later
    /// with another file is reported to `on_mismatch` (stop the pipeline
    /// there: its edges would not match).
    pub fn join(
        session: &SessionConfig,
        pipeline: &str,
        part: &str,
        hash: &str,
        on_mismatch: impl Fn(String) + Send + Sync + 'static,
    ) -> Result<Self> {
        let s = SharedSession::open(session)?;
        let prefix = parts_prefix(pipeline);
        let all = format!("{prefix}/*/*");
        // Who is there already (the link may take a moment to come up: the
        // watcher below reports late arrivals too).
        let replies = s
            .session()
            .liveliness()
            .get(all.clone())
            .timeout(Duration::from_millis(500))
            .wait()
            .map_err(|e| Error::Zenoh(format!("asking for the other parts: {e}")))?;
        while let Ok(r) = replies.recv() {
            if let Ok(sample) = r.result() {
                check_same_file(&prefix, sample.key_expr().as_str(), part, hash)?;
            }
        }
        let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let seen2 = seen.clone();
        let (me, my_hash, prefix2) = (part.to_string(), hash.to_string(), prefix.clone());
        let watch = s
            .session()
            .liveliness()
            .declare_subscriber(all)
            .history(true)
            .callback(move |sample| {
                let key = sample.key_expr().as_str();
                let Some((p, h)) = part_and_hash(&prefix2, key) else {
                    return;
                };
                if p == me {
                    return;
                }
                if sample.kind() == SampleKind::Put {
                    if h != my_hash {
                        on_mismatch(format!(
                            "part `{p}` runs a pipeline file with hash {h}, this part (`{me}`) one with hash {my_hash}: start every part from the same file"
                        ));
                        return;
                    }
                    if seen2.lock().insert(p.to_string()) {
                        eprintln!("edgeflow: part `{p}` is here");
                    }
                } else if seen2.lock().remove(p) {
                    eprintln!("edgeflow: part `{p}` is gone (its liveliness token was withdrawn or its link timed out)");
                }
            })
            .wait()
            .map_err(|e| Error::Zenoh(format!("watching the other parts: {e}")))?;
        // Other parts' final metrics (see `exchange_metrics`): subscribed
        // from the start, so a part that ends first is not missed.
        let metrics: Arc<Mutex<BTreeMap<String, Value>>> = Arc::default();
        let (m2, prefix3, me3) = (metrics.clone(), prefix.clone(), part.to_string());
        let metrics_sub = s
            .session()
            .declare_subscriber(format!("{prefix}/metrics/*"))
            .callback(move |sample| {
                let key = sample.key_expr().as_str();
                let Some(p) = key.strip_prefix(&format!("{prefix3}/metrics/")) else {
                    return;
                };
                if p == key_chunk(&me3) {
                    return;
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&sample.payload().to_bytes()) {
                    let name = v["part"].as_str().unwrap_or(p).to_string();
                    m2.lock().insert(name, v);
                }
            })
            .wait()
            .map_err(|e| Error::Zenoh(format!("watching the other parts' metrics: {e}")))?;
        let token = s
            .session()
            .liveliness()
            .declare_token(format!("{prefix}/{}/{hash}", key_chunk(part)))
            .wait()
            .map_err(|e| Error::Zenoh(format!("declaring part `{part}`: {e}")))?;
        Ok(PartPresence {
            part: part.to_string(),
            prefix,
            seen,
            acks: Arc::default(),
            cancel_subs: Vec::new(),
            metrics,
            _metrics_sub: metrics_sub,
            _watch: watch,
            _token: token,
            session: s,
        })
    }

    /// The other parts present now.
    pub fn others(&self) -> Vec<String> {
        self.seen.lock().iter().cloned().collect()
    }

    /// Gather the run's metrics across parts: publish this part's final
    /// `mine` (a serialised `MetricsSnapshot`) and wait up to `wait` for the
    /// final metrics of every other part still present (a part that ended
    /// earlier published its own before it left; a part that was lost sends
    /// none). Returns each other part's metrics by part name, with a
    /// `part` field added.
    pub fn exchange_metrics(&self, mine: &Value, wait: Duration) -> BTreeMap<String, Value> {
        let mut v = mine.clone();
        if let Some(o) = v.as_object_mut() {
            o.insert("part".into(), json!(self.part));
        }
        let key = format!("{}/metrics/{}", self.prefix, key_chunk(&self.part));
        if let Ok(bytes) = serde_json::to_vec(&v) {
            if let Err(e) = self
                .session
                .session()
                .put(key, bytes)
                .congestion_control(zenoh::qos::CongestionControl::Block)
                .wait()
            {
                eprintln!("edgeflow: could not publish this part's metrics: {e}");
            }
        }
        let end = std::time::Instant::now() + wait;
        loop {
            let got = self.metrics.lock().clone();
            let missing = self.seen.lock().iter().any(|p| !got.contains_key(p));
            if !missing || std::time::Instant::now() >= end {
                return got;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The other parts' acknowledgements of cancels started here.
    pub fn remote_acks(&self) -> Vec<RemoteAck> {
        self.acks.lock().clone()
    }

    /// Carry epoch cancellation between this part's `running` pipeline and
    /// the other parts: an epoch cancelled here (by a stage, e.g. on
    /// barge-in, or by the host) is published on
    /// `edgeflow/parts/<pipeline>/cancel`; a cancel from another part is
    /// applied here, every stage acknowledges, and the acknowledgement goes
    /// back on `.../cancel_ack` to be reported (stderr, [`Self::remote_acks`]).
    /// Messages that cross parts keep their epoch, so a cancel means the
    /// same turn everywhere.
    pub fn carry_cancels(&mut self, running: &edgeflow_graph::Running) -> Result<()> {
        let cancel_key = format!("{}/cancel", self.prefix);
        let ack_key = format!("{}/cancel_ack", self.prefix);
        let from_remote: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
        // Out: cancels that start here.
        {
            let (sess, key, me, remote) = (
                self.session.session().clone(),
                cancel_key.clone(),
                self.part.clone(),
                from_remote.clone(),
            );
            running.on_cancel(move |epoch| {
                if remote.lock().contains(&epoch) {
                    return;
                }
                let sent = crate::link::event_json("cancel", json!({ "epoch": epoch, "part": me }))
                    .and_then(|b| {
                        sess.put(key.clone(), b)
                            .congestion_control(zenoh::qos::CongestionControl::Block)
                            .wait()
                            .map_err(|e| Error::Zenoh(e.to_string()))
                    });
                if let Err(e) = sent {
                    eprintln!("edgeflow: part `{me}`: the cancel of epoch {epoch} could not be sent to the other parts: {e}");
                }
            });
        }
        // In: cancels from the other parts, acknowledged back.
        let (sess, me, handle, ack_out) = (
            self.session.session().clone(),
            self.part.clone(),
            running.cancel_handle(),
            ack_key.clone(),
        );
        let incoming = self
            .session
            .session()
            .declare_subscriber(cancel_key)
            .callback(move |sample| {
                let Some(v) = crate::link::decode_event(&sample.payload().to_bytes(), "cancel") else {
                    return;
                };
                let (Some(epoch), Some(from)) = (v["epoch"].as_u64(), v["part"].as_str()) else {
                    return;
                };
                if from == me {
                    return;
                }
                from_remote.lock().insert(epoch);
                let (h, sess, me, key) = (handle.clone(), sess.clone(), me.clone(), ack_out.clone());
                // Waiting for the acknowledgements must not hold zenoh's thread.
                std::thread::spawn(move || {
                    let (acked, stages, ms) = match h.cancel(epoch, Duration::from_secs(2)) {
                        Ok(r) => (r.acked, r.stages, r.ack_ms),
                        Err(_) => (0, 0, None),
                    };
                    let v = json!({ "epoch": epoch, "part": me, "acked": acked, "stages": stages, "ack_ms": ms });
                    if let Ok(b) = crate::link::event_json("cancel_ack", v) {
                        let _ = sess
                            .put(key, b)
                            .congestion_control(zenoh::qos::CongestionControl::Block)
                            .wait();
                    }
                });
            })
            .wait()
            .map_err(|e| Error::Zenoh(format!("cancels from the other parts: {e}")))?;
        // Acknowledgements of cancels started here.
        let (me, acks) = (self.part.clone(), self.acks.clone());
        let ack_sub = self
            .session
            .session()
            .declare_subscriber(ack_key)
            .callback(move |sample| {
                let Some(v) = crate::link::decode_event(&sample.payload().to_bytes(), "cancel_ack") else {
                    return;
                };
                let a = RemoteAck {
                    part: v["part"].as_str().unwrap_or("?").to_string(),
                    epoch: v["epoch"].as_u64().unwrap_or(0),
                    acked: v["acked"].as_u64().unwrap_or(0) as usize,
                    stages: v["stages"].as_u64().unwrap_or(0) as usize,
                    ack_ms: v["ack_ms"].as_f64(),
                };
                if a.part == me {
                    return;
                }
                match a.ack_ms {
                    Some(ms) => eprintln!(
                        "edgeflow: part `{}` acknowledged the cancel of epoch {}: {}/{} stages in {ms:.2} ms",
                        a.part, a.epoch, a.acked, a.stages
                    ),
                    None => eprintln!(
                        "edgeflow: part `{}` did not acknowledge the cancel of epoch {} within 2 s",
                        a.part, a.epoch
                    ),
                }
                acks.lock().push(a);
            })
            .wait()
            .map_err(|e| Error::Zenoh(format!("cancel acknowledgements: {e}")))?;
        self.cancel_subs.push(incoming);
        self.cancel_subs.push(ack_sub);
        Ok(())
    }
}

fn check_same_file(prefix: &str, key: &str, part: &str, hash: &str) -> Result<()> {
    let Some((p, h)) = part_and_hash(prefix, key) else {
        return Ok(());
    };
    if p == part {
        return Err(Error::Zenoh(format!(
            "part `{part}` is already running (token `{key}`): run each part once"
        )));
    }
    if h != hash {
        return Err(Error::Zenoh(format!(
            "part `{p}` runs a pipeline file with hash {h}, this part (`{part}`) one with hash {hash}: start every part from the same file"
        )));
    }
    Ok(())
}

/// A short, stable hash of a pipeline file's bytes (hex, 16 digits of its
/// SHA-256), as the parts compare it.
pub fn file_hash(bytes: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(bytes);
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeflow_graph::{parse_spec, parts::select_part, Pipeline, Registry};

    const YAML: &str = r#"
name: split
parts:
  robot: { listen: ["tcp/127.0.0.1:17450"] }
stages:
  - { id: tick, kind: timer, part: robot, params: { rate_hz: 100, count: 3 } }
  - { id: show, kind: stdout, part: brain }
  - { id: fast, kind: timer, part: robot, params: { rate_hz: 100, count: 3 } }
  - { id: drop, kind: discard, part: brain }
edges:
  - { from: tick.out, to: show.in, capacity: 4 }
  - { from: fast.out, to: drop.in, policy: latest, capacity: 1 }
"#;

    fn registry() -> Registry {
        let mut r = Registry::builtin();
        crate::register(&mut r);
        r
    }

    #[test]
    fn sessions_default_to_loopback_with_the_first_part_listening() {
        let spec = parse_spec(YAML, None).expect("parse");
        let s = part_sessions(&spec);
        // `brain` sorts first but has no entry: it listens on the default
        // port... and `robot` has its own entry.
        assert_eq!(s["brain"].listen, ["tcp/127.0.0.1:7450"]);
        assert_eq!(s["robot"].listen, ["tcp/127.0.0.1:17450"]);
        assert!(s["robot"].connect.is_empty());
    }

    #[test]
    fn block_edges_get_a_window_and_acks_latest_edges_drop() {
        let spec = parse_spec(YAML, None).expect("parse");
        let plan = Pipeline::from_yaml(YAML, &registry()).expect("valid");
        let bridge = ZenohBridge::new(&spec, "split", OnLost::Wait);
        let robot = select_part(&spec, plan.plan(), "robot", &bridge).expect("robot");
        let out0 = &robot.stages[2];
        assert_eq!(out0.kind, "zenoh_pub");
        assert_eq!(out0.params["window"], 4);
        assert_eq!(out0.params["policy"], "block");
        assert_eq!(out0.params["watch"], "edgeflow/parts/split/brain/*");
        let out1 = &robot.stages[3];
        assert_eq!(out1.params["policy"], "latest");
        assert!(!out1.params.contains_key("window"));
        let brain = select_part(&spec, plan.plan(), "brain", &bridge).expect("brain");
        let in0 = &brain.stages[2];
        assert_eq!(in0.kind, "zenoh_sub");
        assert_eq!(in0.params["ack"], true);
        assert_eq!(in0.params["type"], "control");
        assert_eq!(in0.params["key"], "edgeflow/split/tick.out/show.in");
        // Both halves validate as pipelines of their own.
        Pipeline::from_spec(&robot, &registry()).expect("robot part validates");
        Pipeline::from_spec(&brain, &registry()).expect("brain part validates");
    }

    #[test]
    fn a_different_file_or_a_second_copy_is_refused() {
        let prefix = parts_prefix("split");
        let e = check_same_file(&prefix, &format!("{prefix}/brain/bbbb"), "robot", "aaaa")
            .expect_err("other hash");
        let m = e.to_string();
        assert!(m.contains("bbbb") && m.contains("aaaa"), "{m}");
        assert!(
            check_same_file(&prefix, &format!("{prefix}/robot/aaaa"), "robot", "aaaa").is_err()
        );
        assert!(check_same_file(&prefix, &format!("{prefix}/brain/aaaa"), "robot", "aaaa").is_ok());
        assert_eq!(file_hash(b"x").len(), 16);
    }
}
