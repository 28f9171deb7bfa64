//! The simulated robot on the wire: the true-state vector layout, the
//! `expert_policy` stage (true state in, action chunks out, with an
//! artificial latency), and the `edgeflow sim push` process loop.
//!
//! Keys under the sim's prefix (default `robot`): `image` (rgb8 at 30 Hz),
//! `state` (robot_state: pusher x, y, vx, vy), `true_state` (robot_state,
//! [`TRUE_STATE_DIM`] values, [`flatten`]), `instruction` (text, at each
//! episode start), `events` (`episode_start` / `episode_end`), and `cmd`
//! (actions it takes: the first action of each is the pusher target).
//! Liveliness token: `edgeflow/alive/sim`.

use crate::error::{Error, Result};
use crate::rt::Metronome;
use crate::session::{SessionConfig, SharedSession};
use crate::wire::{self, Body, Header, Kind};
use edgeflow_graph::{
    ActionChunk, BuildEnv, Event, ImageFrame, Input, Message, ParamInfo, ParamType, Params,
    Payload, PixelFormat, PortSpec, PortType, Ports, Stage, StageCtx, StageError, StageFactory,
    StageInfo, StageResult, Timestamp,
};
use edgeflow_sim::record::EpisodeWriter;
use edgeflow_sim::{
    BlockColour, BlockState, Expert, PushConfig, PushSim, TrueState, Variant, ZoneColour, ZoneState,
};
use parking_lot::Mutex;
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zenoh::Wait;

/// Values in the true-state vector.
pub const TRUE_STATE_DIM: usize = 27;

/// The true state as a flat f32 vector: pusher pos (2), vel (2), target
/// (2); per block (red, blue): pos (2), angle, vel (2), angular vel; per
/// zone (green, yellow): pos (2); variant index (0..4), time (s), step,
/// in-zone steps, success (0/1).
pub fn flatten(s: &TrueState) -> Vec<f32> {
    let mut v = Vec::with_capacity(TRUE_STATE_DIM);
    v.extend(s.pusher_pos);
    v.extend(s.pusher_vel);
    v.extend(s.pusher_target);
    for b in &s.blocks {
        v.extend(b.pos);
        v.push(b.angle);
        v.extend(b.vel);
        v.push(b.ang_vel);
    }
    for z in &s.zones {
        v.extend(z.pos);
    }
    v.push(s.variant.index() as f32);
    v.push(s.time as f32);
    v.push(s.step as f32);
    v.push(s.in_zone_steps as f32);
    v.push(if s.success { 1.0 } else { 0.0 });
    v
}

/// The inverse of [`flatten`]; checks the length and the variant index.
pub fn unflatten(v: &[f32]) -> std::result::Result<TrueState, String> {
    if v.len() != TRUE_STATE_DIM {
        return Err(format!(
            "a true state has {TRUE_STATE_DIM} values, got {}",
            v.len()
        ));
    }
    if v.iter().any(|x| !x.is_finite()) {
        return Err("the true state has a non-finite value".into());
    }
    let p2 = |i: usize| [v[i], v[i + 1]];
    let blocks = BlockColour::ALL
        .iter()
        .enumerate()
        .map(|(k, &colour)| {
            let o = 6 + 6 * k;
            BlockState {
                colour,
                pos: p2(o),
                angle: v[o + 2],
                vel: p2(o + 3),
                ang_vel: v[o + 5],
            }
        })
        .collect();
    let zones = ZoneColour::ALL
        .iter()
        .enumerate()
        .map(|(k, &colour)| ZoneState {
            colour,
            pos: p2(18 + 2 * k),
        })
        .collect();
    let vi = v[22];
    if !(0.0..4.0).contains(&vi) || vi.fract() != 0.0 {
        return Err(format!("variant index {vi} is not 0..=3"));
    }
    Ok(TrueState {
        pusher_pos: p2(0),
        pusher_vel: p2(2),
        pusher_target: p2(4),
        blocks,
        zones,
        variant: Variant::ALL[vi as usize],
        time: v[23] as f64,
        step: v[24] as u64,
        in_zone_steps: v[25] as u32,
        success: v[26] > 0.5,
    })
}

// --------------------------------------------------------- expert_policy

/// The `expert_policy` kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExpertPolicyKind;

impl StageFactory for ExpertPolicyKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "expert_policy",
            doc: "The push simulator's scripted expert as a policy: on each `chunk_request` it plans H pusher targets from the newest true state (after an artificial `latency`) and emits them as an action chunk stamped with that state's capture time. Real-time chunking: when the request carries a `prefix` (actions already queued), it plans from the prefix's last target and starts the chunk right after it, leaving the prefix as it is.",
            params: vec![
                ParamInfo::new("horizon", ParamType::Int, 16, "actions per chunk H (1..=1000)"),
                ParamInfo::new("latency", ParamType::Duration, 0.0, "artificial inference time before each chunk"),
                ParamInfo::new("control_hz", ParamType::Float, 50.0, "the simulator's control rate (the expert plans per period)"),
                ParamInfo::optional("stall_after", ParamType::Int, "fault injection: after this many chunks, stall once for `stall`"),
                ParamInfo::new("stall", ParamType::Duration, 0.0, "fault injection: length of that stall"),
            ],
            ports: Ports {
                inputs: vec![
                    PortSpec::new("state", PortType::Tensor, "the simulator's true state (27 values)"),
                    PortSpec::new("request", PortType::Control, "chunk_request events from the controller"),
                ],
                outputs: vec![PortSpec::new("actions", PortType::Actions, "chunks of H pusher targets [x, y]")],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let horizon: usize = p.get_or("horizon", 16)?;
        if !(1..=1000).contains(&horizon) {
            return Err(p
                .error("horizon", format!("must be in 1..=1000, got {horizon}"))
                .into());
        }
        let control_hz: f64 = p.get_or("control_hz", 50.0)?;
        let cfg = PushConfig {
            control_hz,
            ..PushConfig::default()
        };
        cfg.validate()
            .map_err(|e| p.error("control_hz", e.to_string()))?;
        Ok(Box::new(ExpertPolicy {
            expert: Expert::new(&cfg),
            dt: Duration::from_secs_f64(1.0 / control_hz),
            horizon,
            latency: p.duration("latency")?.unwrap_or_default(),
            stall_after: p.opt("stall_after")?,
            stall: p.duration("stall")?.unwrap_or_default(),
            state: None,
            last_step: 0,
            chunks: 0,
        }))
    }
}

/// The `expert_policy` stage.
#[derive(Debug)]
pub struct ExpertPolicy {
    expert: Expert,
    dt: Duration,
    horizon: usize,
    latency: Duration,
    stall_after: Option<u64>,
    stall: Duration,
    state: Option<(TrueState, Timestamp)>,
    last_step: u64,
    chunks: u64,
}

impl Stage for ExpertPolicy {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        match input.port {
            0 => {
                let Payload::Tensor(t) = &input.msg.payload else {
                    return Ok(());
                };
                let v = t.to_vec_f32()?;
                match unflatten(&v) {
                    Ok(s) => {
                        if s.step < self.last_step {
                            // A new episode: forget the last plan.
                            self.expert.reset();
                        }
                        self.last_step = s.step;
                        self.state = Some((s, input.msg.timestamp));
                    }
                    Err(e) => {
                        ctx.record("bad_states", 1.0);
                        eprintln!("expert_policy `{}`: ignoring a state: {e}", ctx.id());
                    }
                }
            }
            _ => {
                let Some(Event::Named(name, v)) = input.msg.payload.as_event() else {
                    return Ok(());
                };
                if name != "chunk_request" {
                    return Ok(());
                }
                let step = v["step"].as_u64().unwrap_or(0);
                let Some((state, captured)) = self.state.clone() else {
                    ctx.record("requests_without_state", 1.0);
                    return Ok(());
                };
                let mut wait = self.latency;
                if self.stall_after == Some(self.chunks) {
                    wait += self.stall;
                    eprintln!(
                        "expert_policy `{}`: stalling {:?} (fault injection)",
                        ctx.id(),
                        self.stall
                    );
                }
                if !wait.is_zero() && !ctx.sleep(wait) {
                    return Err(StageError::Cancelled);
                }
                // Real-time chunking: the queued prefix executes while we
                // plan, so plan from where it leaves the pusher and start
                // the chunk right after it (the prefix stays as it is).
                let prefix = prefix_targets(&v["prefix"]);
                let mut state = state;
                if let Some(last) = prefix.last() {
                    state.pusher_pos = *last;
                }
                let start = step + prefix.len() as u64;
                let plan = self.expert.chunk(&state, self.horizon);
                let actions: Vec<f32> = plan.iter().flat_map(|a| *a).collect();
                self.chunks += 1;
                ctx.emit_msg(
                    0,
                    Message {
                        epoch: ctx.epoch(),
                        seq: 0,
                        timestamp: captured,
                        deadline: None,
                        payload: Payload::Actions(Arc::new(ActionChunk {
                            start_step: start,
                            dt: self.dt,
                            dim: 2,
                            actions,
                        })),
                    },
                )?;
            }
        }
        Ok(())
    }
}

/// The `prefix` of a `chunk_request` as pusher targets: rows of two finite
/// numbers; anything else ends the prefix there.
fn prefix_targets(v: &serde_json::Value) -> Vec<[f32; 2]> {
    let Some(rows) = v.as_array() else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let xy = r.as_array().and_then(|a| match a.as_slice() {
            [x, y] => Some([x.as_f64()? as f32, y.as_f64()? as f32]),
            _ => None,
        });
        match xy {
            Some(p) if p.iter().all(|c| c.is_finite()) => out.push(p),
            _ => break,
        }
    }
    out
}

// ------------------------------------------------------------ sim process

/// `edgeflow sim push` settings.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// zenoh session.
    pub session: SessionConfig,
    /// Key prefix.
    pub prefix: String,
    /// Episodes to run.
    pub episodes: u64,
    /// Seed of episode 0; episode i uses `seed + i`.
    pub seed: u64,
    /// Simulator settings.
    pub config: PushConfig,
    /// Camera rate.
    pub image_hz: f64,
    /// Record each episode under this folder.
    pub record: Option<PathBuf>,
    /// Wait until a liveliness token matching this appears before starting.
    pub wait_for: Option<String>,
    /// How long to wait for it.
    pub wait_timeout: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            session: SessionConfig::peer(&["tcp/127.0.0.1:7447"], &[]),
            prefix: "robot".into(),
            episodes: 20,
            seed: 0,
            config: PushConfig::default(),
            image_hz: 30.0,
            record: None,
            wait_for: None,
            wait_timeout: Duration::from_secs(30),
        }
    }
}

/// One episode's outcome.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EpisodeResult {
    /// Episode index.
    pub episode: u64,
    /// Its seed.
    pub seed: u64,
    /// Goal variant name.
    pub variant: String,
    /// Solved.
    pub success: bool,
    /// Control steps.
    pub steps: u64,
    /// Simulated seconds to success or timeout.
    pub seconds: f64,
    /// Commands received during the episode.
    pub commands: u64,
    /// Steps without a fresh command (the last target held).
    pub stale_steps: u64,
    /// Where it was recorded.
    pub recorded: Option<PathBuf>,
}

fn zerr(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Zenoh(format!("sim: {what}: {e}"))
}

struct Pub<'a> {
    p: zenoh::pubsub::Publisher<'a>,
    seq: u64,
}

impl Pub<'_> {
    fn put(&mut self, epoch: u64, capture_ns: u64, body: &Body) -> Result<()> {
        self.seq += 1;
        let h = Header {
            epoch,
            seq: self.seq,
            capture_ns,
            deadline_ns: None,
        };
        let b = wire::encode(&h, body)?;
        self.p.put(b).wait().map_err(|e| zerr("put", e))
    }
}

/// Run the simulator process: episodes from seeds, published over zenoh,
/// driven by the commands it receives. Calls `on_result` after each episode.
pub fn run_push_sim(
    o: &SimOptions,
    mut on_result: impl FnMut(&EpisodeResult),
) -> Result<Vec<EpisodeResult>> {
    let mut sim =
        PushSim::new(o.config.clone()).map_err(|e| Error::Payload(format!("sim config: {e}")))?;
    let session = SharedSession::open(&o.session)?;
    let s = session.session();
    let key = |k: &str| format!("{}/{k}", o.prefix);
    let fast = |k: String| {
        s.declare_publisher(k)
            .congestion_control(zenoh::qos::CongestionControl::Drop)
            .priority(zenoh::qos::Priority::RealTime)
            .express(true)
            .wait()
            .map_err(|e| zerr("publisher", e))
    };
    let mut state_pub = Pub {
        p: fast(key("state"))?,
        seq: 0,
    };
    let mut true_pub = Pub {
        p: fast(key("true_state"))?,
        seq: 0,
    };
    let mut image_pub = Pub {
        p: s.declare_publisher(key("image"))
            .congestion_control(zenoh::qos::CongestionControl::Drop)
            .wait()
            .map_err(|e| zerr("publisher", e))?,
        seq: 0,
    };
    let reliable = |k: String| {
        s.declare_publisher(k)
            .wait()
            .map_err(|e| zerr("publisher", e))
    };
    let mut text_pub = Pub {
        p: reliable(key("instruction"))?,
        seq: 0,
    };
    let mut event_pub = Pub {
        p: reliable(key("events"))?,
        seq: 0,
    };
    let latest: Arc<Mutex<Option<[f32; 2]>>> = Arc::new(Mutex::new(None));
    let commands = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let (l2, c2, b2) = (latest.clone(), commands.clone(), bad.clone());
    let _cmd_sub = s
        .declare_subscriber(key("cmd"))
        .callback(move |sample| {
            match wire::decode_kind(&sample.payload().to_bytes(), Kind::Actions) {
                Ok(wire::WireMessage {
                    body: Body::Actions(a),
                    ..
                }) if a.dim >= 2 && !a.actions.is_empty() => {
                    *l2.lock() = Some([a.actions[0], a.actions[1]]);
                    c2.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => {
                    b2.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    let n = b2.fetch_add(1, Ordering::Relaxed) + 1;
                    if n <= 10 {
                        eprintln!("sim: rejected a command: {e}");
                    }
                }
            }
        })
        .wait()
        .map_err(|e| zerr("subscriber", e))?;
    let _token = s
        .liveliness()
        .declare_token("edgeflow/alive/sim")
        .wait()
        .map_err(|e| zerr("token", e))?;
    if let Some(w) = &o.wait_for {
        let end = Instant::now() + o.wait_timeout;
        loop {
            let replies = s
                .liveliness()
                .get(w.clone())
                .wait()
                .map_err(|e| zerr("liveliness", e))?;
            if replies
                .recv_timeout(Duration::from_millis(500))
                .ok()
                .flatten()
                .is_some()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            if Instant::now() > end {
                return Err(Error::Zenoh(format!(
                    "sim: nothing declared a liveliness token matching `{w}` within {:?}: is the pipeline running and connected?",
                    o.wait_timeout
                )));
            }
        }
    }
    let period_ns = (1e9 / o.config.control_hz) as u64;
    let steps_per_image = (o.config.control_hz / o.image_hz.max(0.1)).max(1.0);
    let mut results = Vec::new();
    let mut clock = Metronome::new(period_ns);
    for ep in 0..o.episodes {
        let seed = o.seed + ep;
        let info = sim.reset(seed);
        let epoch = ep + 1;
        *latest.lock() = None;
        let c0 = commands.load(Ordering::Relaxed);
        text_pub.put(
            epoch,
            wire::mono_ns(),
            &Body::Text(info.instruction.clone()),
        )?;
        event_pub.put(
            epoch,
            wire::mono_ns(),
            &Body::Event(Event::Named(
                "episode_start".into(),
                json!({ "episode": ep, "seed": seed, "variant": info.variant.name(), "instruction": info.instruction }),
            )),
        )?;
        let mut writer = match &o.record {
            Some(dir) => Some(
                EpisodeWriter::create(dir.join(format!("episode_{ep:04}")), &info, &o.config)
                    .map_err(|e| Error::Payload(format!("recording: {e}")))?,
            ),
            None => None,
        };
        let mut stale_steps = 0;
        let mut last_cmd_count = c0;
        let mut next_image = 0.0f64;
        let mut step = 0u64;
        while !sim.done() {
            clock.wait();
            let n = commands.load(Ordering::Relaxed);
            if n == last_cmd_count {
                stale_steps += 1;
            }
            last_cmd_count = n;
            let target = latest.lock().unwrap_or_else(|| sim.hold_action());
            sim.step(target);
            step += 1;
            let now = wire::mono_ns();
            let rs = sim.robot_state();
            state_pub.put(
                epoch,
                now,
                &Body::RobotState {
                    step,
                    values: rs.to_vec(),
                },
            )?;
            let ts = sim.true_state();
            true_pub.put(
                epoch,
                now,
                &Body::RobotState {
                    step,
                    values: flatten(&ts),
                },
            )?;
            let want_image = step as f64 >= next_image;
            if want_image || writer.is_some() {
                let img = sim.render();
                if want_image {
                    next_image += steps_per_image;
                    image_pub.put(
                        epoch,
                        now,
                        &Body::Image(ImageFrame {
                            width: img.width,
                            height: img.height,
                            format: PixelFormat::Rgb8,
                            data: img.rgb.clone(),
                        }),
                    )?;
                }
                if let Some(w) = writer.as_mut() {
                    w.push(ts.time, &img, rs, target)
                        .map_err(|e| Error::Payload(format!("recording: {e}")))?;
                }
            }
        }
        let ts = sim.true_state();
        let recorded = match writer {
            Some(w) => Some(
                w.finish(sim.success())
                    .map_err(|e| Error::Payload(format!("recording: {e}")))?,
            ),
            None => None,
        };
        let r = EpisodeResult {
            episode: ep,
            seed,
            variant: info.variant.name(),
            success: sim.success(),
            steps: ts.step,
            seconds: ts.time,
            commands: commands.load(Ordering::Relaxed) - c0,
            stale_steps,
            recorded,
        };
        event_pub.put(
            epoch,
            wire::mono_ns(),
            &Body::Event(Event::Named(
                "episode_end".into(),
                json!({ "episode": ep, "success": r.success, "steps": r.steps, "seconds": r.seconds }),
            )),
        )?;
        on_result(&r);
        results.push(r);
    }
    let b = bad.load(Ordering::Relaxed);
    if b > 0 {
        eprintln!("sim: {b} malformed commands rejected");
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn true_state_round_trips_through_the_flat_vector() {
        let mut sim = PushSim::new(PushConfig::default()).expect("sim");
        sim.reset(5);
        for _ in 0..20 {
            sim.step([0.05, -0.02]);
        }
        let s = sim.true_state();
        let v = flatten(&s);
        assert_eq!(v.len(), TRUE_STATE_DIM);
        let back = unflatten(&v).expect("unflatten");
        assert_eq!(back.variant, s.variant);
        assert_eq!(back.blocks, s.blocks);
        assert_eq!(back.zones, s.zones);
        assert_eq!(back.pusher_pos, s.pusher_pos);
        assert_eq!(back.step, s.step);
        assert!(unflatten(&v[..26]).is_err());
        let mut bad = v.clone();
        bad[22] = 7.0;
        assert!(unflatten(&bad).is_err());
        bad[22] = f32::NAN;
        assert!(unflatten(&bad).is_err());
    }
}
