//! The `controller` stage: a fixed-rate loop on its own thread that pops
//! one action per period from the action queue, asks the policy for chunks,
//! and publishes the safe action when the policy or the robot side goes
//! quiet. See [`crate::core`] for the per-period logic.
//!
//! While the run is recorded, every call on the core is journaled
//! ([`crate::journal`]); [`Controller::replaying`] builds the stage that
//! `edgeflow replay` runs instead, which makes the journaled calls again
//! and publishes the same commands bit for bit.

use crate::core::{ControllerCore, CoreConfig, CoreStats, SafeMode, SafeReason, Source, Tick};
use crate::journal::{Applied, Entry};
use crate::queue::MergeMode;
use crate::rt::{try_realtime, Metronome};
use edgeflow_graph::{
    ActionChunk, BuildEnv, Event, Input, Message, ParamInfo, ParamType, Params, Payload, PortSpec,
    PortType, Ports, Stage, StageCtx, StageError, StageFactory, StageHandle, StageInfo,
    StageResult, Timestamp,
};
use parking_lot::Mutex;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Output ports.
const OUT_COMMAND: usize = 0;
const OUT_REQUEST: usize = 1;
const OUT_EVENTS: usize = 2;
/// Input ports.
const IN_ACTIONS: usize = 0;
const IN_OBS: usize = 1;
const IN_PEER: usize = 2;

/// Settings beyond the core's.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Per-period logic settings.
    pub core: CoreConfig,
    /// SCHED_FIFO priority to try (0 = do not).
    pub rt_priority: i32,
    /// Try `mlockall`.
    pub lock_memory: bool,
}

/// The `controller` kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct ControllerKind;

fn ports() -> Ports {
    Ports {
        inputs: vec![
            PortSpec::new("actions", PortType::Actions, "action chunks from the policy (first timestep, H actions)"),
            PortSpec::optional("obs", PortType::Any, "observations; only their capture time is used (watchdog `max_obs_age`)"),
            PortSpec::optional("peer", PortType::Control, "liveliness events (`peer_lost` / `peer_alive`) from a zenoh stage"),
        ],
        outputs: vec![
            PortSpec::new("command", PortType::Actions, "one action per period (a 1-step chunk at the period's timestep)"),
            PortSpec::optional("request", PortType::Control, "`chunk_request` {step, last_delay, prefix}: the policy should send a chunk starting at `step`; `prefix` holds the actions already queued from `step` on (they execute while it computes)"),
            PortSpec::optional("events", PortType::Control, "`safe_hold` {reason, step} / `safe_hold_end` {periods} / `controller_rt` {status}"),
        ],
    }
}

impl StageFactory for ControllerKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "controller",
            doc: "Fixed-rate control loop on its own thread (absolute-deadline clock_nanosleep, SCHED_FIFO and mlockall when permitted): pops one action per period from a timestep-indexed queue, requests chunks below `threshold` x H with the measured inference delay, merges overlaps, and publishes the safe action when observations go stale or the queue stays empty.",
            params: vec![
                ParamInfo::new("rate_hz", ParamType::Float, 50.0, "control rate (1..=2000)"),
                ParamInfo::new("threshold", ParamType::Float, 0.5, "request a chunk when fewer than threshold x H actions remain; 0 = synchronous (wait for each chunk)"),
                ParamInfo::new("horizon", ParamType::Int, 16, "expected chunk length H before the first chunk arrives"),
                ParamInfo::new("merge", ParamType::String, "weighted_average", "overlap merge: latest_only, weighted_average, average, conservative, ensemble"),
                ParamInfo::new("old_weight", ParamType::Float, 0.3, "weighted_average: weight of the queued action (new gets 1 - old_weight)"),
                ParamInfo::new("ensemble_m", ParamType::Float, 0.01, "ensemble: weights exp(-m i), i = 0 the oldest prediction"),
                ParamInfo::new("safe_action", ParamType::String, "hold", "hold (repeat the last position target) or zero (zero velocity)"),
                ParamInfo::new("max_obs_age", ParamType::Duration, "500ms", "an observation older than this triggers the safe action"),
                ParamInfo::new("grace", ParamType::Duration, "200ms", "an empty queue for longer than this triggers the safe action"),
                ParamInfo::new("request_timeout", ParamType::Duration, "1s", "re-send a request that got no chunk for this long"),
                ParamInfo::optional("dim", ParamType::Int, "action dimension, if known before the first chunk (needed by `zero`)"),
                ParamInfo::new("rt_priority", ParamType::Int, 50, "SCHED_FIFO priority to try for the loop thread (0 = do not)"),
                ParamInfo::new("lock_memory", ParamType::Bool, true, "try mlockall(MCL_CURRENT | MCL_FUTURE)"),
            ],
            ports: ports(),
            source: false,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        Ok(Box::new(Controller::new(parse_config(p)?)))
    }
}

/// Read the stage params.
pub fn parse_config(p: &Params) -> StageResult<ControllerConfig> {
    let rate: f64 = p.get_or("rate_hz", 50.0)?;
    if !(1.0..=2000.0).contains(&rate) {
        return Err(p
            .error("rate_hz", format!("must be in 1..=2000, got {rate}"))
            .into());
    }
    let threshold: f32 = p.get_or("threshold", 0.5)?;
    if !(0.0..=1.0).contains(&threshold) {
        return Err(p
            .error("threshold", format!("must be in 0..=1, got {threshold}"))
            .into());
    }
    let horizon: usize = p.get_or("horizon", 16)?;
    if horizon == 0 {
        return Err(p.error("horizon", "must be at least 1").into());
    }
    let old_weight: f32 = p.get_or("old_weight", 0.3)?;
    if !(0.0..=1.0).contains(&old_weight) {
        return Err(p
            .error("old_weight", format!("must be in 0..=1, got {old_weight}"))
            .into());
    }
    let m: f32 = p.get_or("ensemble_m", 0.01)?;
    let merge_name: String = p.get_or("merge", "weighted_average".to_string())?;
    let Some(merge) = MergeMode::parse(&merge_name, old_weight, m) else {
        return Err(p
            .error("merge", format!("`{merge_name}` is not a merge mode: use latest_only, weighted_average, average, conservative or ensemble"))
            .into());
    };
    let safe_name: String = p.get_or("safe_action", "hold".to_string())?;
    let safe = match safe_name.as_str() {
        "hold" => SafeMode::Hold,
        "zero" => SafeMode::Zero,
        other => {
            return Err(p
                .error("safe_action", format!("`{other}` is not hold or zero"))
                .into())
        }
    };
    let dim: Option<usize> = p.opt("dim")?;
    if safe == SafeMode::Zero && dim.is_none() {
        return Err(p
            .error(
                "dim",
                "is required with safe_action: zero (the zero command needs its size)",
            )
            .into());
    }
    Ok(ControllerConfig {
        core: CoreConfig {
            period: Duration::from_secs_f64(1.0 / rate),
            threshold,
            horizon,
            merge,
            safe,
            max_obs_age: p
                .duration("max_obs_age")?
                .unwrap_or(Duration::from_millis(500)),
            grace: p.duration("grace")?.unwrap_or(Duration::from_millis(200)),
            dim,
            request_timeout: p
                .duration("request_timeout")?
                .unwrap_or(Duration::from_secs(1)),
        },
        rt_priority: p.get_or("rt_priority", 50)?,
        lock_memory: p.get_or("lock_memory", true)?,
    })
}

struct Shared {
    core: Mutex<ControllerCore>,
    stop: AtomicBool,
    /// Capture time (graph ns) of the observation the newest chunk came from.
    chunk_capture: AtomicU64,
    /// Set at start when the run keeps journals.
    journal: OnceLock<StageHandle>,
}

impl Shared {
    /// Make one call on the core, journaling it under the core's lock (so
    /// the journal holds the order the two threads really made them in).
    fn apply(&self, e: Entry) -> (Applied, CoreStats, u64) {
        let mut c = self.core.lock();
        if let Some(h) = self.journal.get() {
            h.journal(&e.encode());
        }
        let out = e.apply(&mut c);
        (out, c.stats(), c.dropped())
    }
}

/// A recorded journal to replay instead of running live
/// ([`Controller::replaying`]).
pub struct JournalReplay {
    /// The entries, each with its offset (ns) on the replay's clock.
    pub entries: Vec<(u64, Entry)>,
    /// When the tick at this offset is due; `None` runs it at once.
    pub due: Box<dyn Fn(u64) -> Option<Instant> + Send>,
}

impl std::fmt::Debug for JournalReplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalReplay")
            .field("entries", &self.entries.len())
            .finish()
    }
}

/// The `controller` stage.
pub struct Controller {
    cfg: ControllerConfig,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Replaying a journal: its entries until started.
    replay: Option<JournalReplay>,
    replaying: bool,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl Controller {
    /// A controller with these settings (its loop starts with the pipeline).
    pub fn new(cfg: ControllerConfig) -> Self {
        Controller {
            shared: Arc::new(Shared {
                core: Mutex::new(ControllerCore::new(cfg.core.clone())),
                stop: AtomicBool::new(false),
                chunk_capture: AtomicU64::new(0),
                journal: OnceLock::new(),
            }),
            cfg,
            threads: Vec::new(),
            replay: None,
            replaying: false,
        }
    }

    /// A controller that replays a recorded journal instead of running
    /// live: its loop makes the journaled core calls again in their
    /// order, each tick when `journal.due` says, and publishes what they
    /// return on the same ports. Its inputs are read and dropped (the
    /// journal holds what the recorded controller applied); it ends when
    /// the journal does.
    pub fn replaying(cfg: ControllerConfig, journal: JournalReplay) -> Self {
        let mut c = Controller::new(cfg);
        c.replay = Some(journal);
        c.replaying = true;
        c
    }

    fn stop_threads(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

fn named(name: &str, v: serde_json::Value) -> Payload {
    Payload::event(Event::Named(name.into(), v))
}

/// Side outputs (requests, events) go through a bounded channel to their
/// own thread, so a slow or blocked policy edge never delays a period.
type SideTx = crossbeam_channel::Sender<(usize, Payload)>;

fn side_thread(h: StageHandle, rx: crossbeam_channel::Receiver<(usize, Payload)>) {
    while let Ok((port, p)) = rx.recv() {
        if h.emit(port, p).is_err() {
            break;
        }
    }
}

/// Publishes what a tick returned: the command, the side outputs, the
/// metrics (shared by the live loop and the journal replay).
struct Publisher {
    h: StageHandle,
    side: SideTx,
    period: Duration,
    side_dropped: u64,
    last: CoreStats,
    last_dropped: u64,
}

impl Publisher {
    /// False when the command edge is gone (the loop ends).
    fn publish(
        &mut self,
        tick: Tick,
        stats: CoreStats,
        dropped: u64,
        now: Timestamp,
        sh: &Shared,
    ) -> bool {
        let h = &self.h;
        if !tick.command.is_empty() {
            let dim = tick.command.len();
            let msg = Message {
                epoch: h.current_epoch(),
                seq: 0,
                timestamp: now,
                deadline: Some(now.plus(self.period)),
                payload: Payload::Actions(Arc::new(ActionChunk {
                    start_step: tick.step,
                    dt: self.period,
                    dim,
                    actions: tick.command,
                })),
            };
            if h.emit_msg(OUT_COMMAND, msg).is_err() {
                return false;
            }
            if tick.source == Source::Queue {
                let cap = sh.chunk_capture.load(Ordering::Acquire);
                if cap > 0 {
                    h.record("obs_to_command_ms", now.0.saturating_sub(cap) as f64 / 1e6);
                }
            }
        }
        let side = &self.side;
        let side_dropped = &mut self.side_dropped;
        let mut side_send = |port: usize, p: Payload| {
            if side.try_send((port, p)).is_err() {
                *side_dropped += 1;
                h.record("side_outputs_dropped", *side_dropped as f64);
            }
        };
        if let Some(r) = tick.request {
            side_send(
                OUT_REQUEST,
                named(
                    "chunk_request",
                    json!({
                        "step": r.step,
                        "last_delay": r.last_delay,
                        "prefix": prefix_rows(&r.prefix, r.dim),
                    }),
                ),
            );
        }
        if let Some(reason) = tick.safe_started {
            let why = match reason {
                SafeReason::StaleObservation => "stale_observation",
                SafeReason::EmptyQueue => "empty_queue",
                SafeReason::PeerLost => "peer_lost",
            };
            let reaction_ms = tick.safe_reaction_ns.unwrap_or(0) as f64 / 1e6;
            h.record("safe_hold_reaction_ms", reaction_ms);
            eprintln!(
                "controller `{}`: safe hold at step {} ({why}; {reaction_ms:.2} ms after it was due)",
                h.id(),
                tick.step
            );
            side_send(
                OUT_EVENTS,
                named("safe_hold", json!({ "reason": why, "step": tick.step })),
            );
        }
        if let Some(n) = tick.safe_ended {
            h.record("safe_hold_len_periods", n as f64);
            side_send(
                OUT_EVENTS,
                named("safe_hold_end", json!({ "periods": n, "step": tick.step })),
            );
        }
        let last = self.last;
        if stats.underruns != last.underruns {
            h.record("underruns", stats.underruns as f64);
        }
        if stats.safe_periods != last.safe_periods {
            h.record("safe_hold_periods", stats.safe_periods as f64);
        }
        if stats.safe_episodes != last.safe_episodes {
            h.record("safe_hold_episodes", stats.safe_episodes as f64);
        }
        if stats.requests != last.requests {
            h.record("requests", stats.requests as f64);
        }
        if dropped != self.last_dropped {
            h.record("dropped_actions", dropped as f64);
            self.last_dropped = dropped;
        }
        self.last = stats;
        true
    }
}

fn control_loop(h: StageHandle, sh: Arc<Shared>, cfg: ControllerConfig, side: SideTx) {
    let rt = try_realtime(cfg.rt_priority, cfg.lock_memory);
    let line = rt.describe();
    if rt.fifo.is_err() || rt.mlock.is_err() {
        eprintln!("controller `{}`: {line}", h.id());
    }
    h.record("rt_fifo", if rt.fifo.is_ok() { 1.0 } else { 0.0 });
    h.record("mem_locked", if rt.mlock.is_ok() { 1.0 } else { 0.0 });
    let _ = side.try_send((
        OUT_EVENTS,
        named("controller_rt", json!({ "status": line })),
    ));
    let period = cfg.core.period;
    let mut clock = Metronome::new(period.as_nanos() as u64);
    let mut missed_total = 0u64;
    let mut out = Publisher {
        h: h.clone(),
        side,
        period,
        side_dropped: 0,
        last: CoreStats::default(),
        last_dropped: 0,
    };
    while !sh.stop.load(Ordering::Acquire) && !h.should_stop() {
        let wake = clock.wait();
        let now = Timestamp::now();
        h.record("jitter_us", wake.jitter_ns as f64 / 1e3);
        if wake.missed > 0 {
            missed_total += wake.missed;
            h.record("missed_periods", missed_total as f64);
        }
        let (Applied::Tick(tick), stats, dropped) = sh.apply(Entry::Tick { now_ns: now.0 }) else {
            continue;
        };
        if !out.publish(tick, stats, dropped, now, &sh) {
            break;
        }
    }
}

/// The replay loop: the journal's calls in order, each tick when due.
fn replay_loop(
    h: StageHandle,
    sh: Arc<Shared>,
    cfg: ControllerConfig,
    side: SideTx,
    journal: JournalReplay,
) {
    let mut out = Publisher {
        h: h.clone(),
        side,
        period: cfg.core.period,
        side_dropped: 0,
        last: CoreStats::default(),
        last_dropped: 0,
    };
    let stopping = || sh.stop.load(Ordering::Acquire) || h.should_stop();
    let mut ticks = 0u64;
    for (offset, e) in journal.entries {
        if stopping() {
            return;
        }
        if matches!(e, Entry::Tick { .. }) {
            if let Some(due) = (journal.due)(offset) {
                loop {
                    let left = due.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    if stopping() {
                        return;
                    }
                    std::thread::sleep(left.min(Duration::from_millis(20)));
                }
            }
        }
        match sh.apply(e) {
            (Applied::Tick(tick), stats, dropped) => {
                ticks += 1;
                h.record("replayed_ticks", ticks as f64);
                if !out.publish(tick, stats, dropped, Timestamp::now(), &sh) {
                    return;
                }
            }
            (Applied::Chunk(Err(e)), ..) => {
                eprintln!(
                    "controller `{}`: journaled chunk rejected again: {e}",
                    h.id()
                );
            }
            _ => {}
        }
    }
}

impl Stage for Controller {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        let h = ctx.handle();
        let (tx, rx) = crossbeam_channel::bounded(256);
        let h2 = h.clone();
        let side = std::thread::Builder::new()
            .name("ef-ctl-side".into())
            .spawn(move || side_thread(h2, rx))
            .map_err(|e| {
                StageError::msg(format!("controller `{}`: cannot spawn: {e}", ctx.id()))
            })?;
        let sh = self.shared.clone();
        let cfg = self.cfg.clone();
        let replay = self.replay.take();
        if replay.is_none() && h.journaling() {
            let _ = self.shared.journal.set(h.clone());
        }
        let lp = std::thread::Builder::new()
            .name("ef-ctl-loop".into())
            .spawn(move || match replay {
                Some(j) => replay_loop(h, sh, cfg, tx, j),
                None => control_loop(h, sh, cfg, tx),
            })
            .map_err(|e| {
                StageError::msg(format!("controller `{}`: cannot spawn: {e}", ctx.id()))
            })?;
        // Join the loop first: it owns the channel's sender, so the side
        // thread ends when it does.
        self.threads.push(lp);
        self.threads.push(side);
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        if self.replaying {
            // The journal holds what the recorded controller applied.
            return Ok(());
        }
        let ts = input.msg.timestamp;
        match input.port {
            IN_ACTIONS => {
                let Payload::Actions(a) = &input.msg.payload else {
                    return Err(StageError::msg(format!(
                        "controller `{}`: `actions` got a {} message",
                        ctx.id(),
                        input.msg.payload.type_name()
                    )));
                };
                let e = Entry::Chunk {
                    start_step: a.start_step,
                    dim: a.dim,
                    actions: a.actions.clone(),
                    now_ns: Timestamp::now().0,
                };
                match self.shared.apply(e).0 {
                    Applied::Chunk(Ok((rep, delay))) => {
                        self.shared.chunk_capture.store(ts.0, Ordering::Release);
                        if let Some(d) = delay {
                            ctx.record("inference_delay_periods", d as f64);
                        }
                        if rep.stale > 0 {
                            ctx.record("stale_on_arrival", rep.stale as f64);
                        }
                    }
                    Applied::Chunk(Err(e)) => {
                        // A bad chunk is the policy's bug: report, keep control.
                        ctx.record("rejected_chunks", 1.0);
                        eprintln!("controller `{}`: chunk rejected: {e}", ctx.id());
                    }
                    _ => {}
                }
            }
            IN_OBS => {
                self.shared.apply(Entry::Observation { capture_ns: ts.0 });
            }
            IN_PEER => {
                if let Some(Event::Named(name, _)) = input.msg.payload.as_event() {
                    let lost = match name.as_str() {
                        "peer_lost" => Some(true),
                        "peer_alive" => Some(false),
                        _ => None,
                    };
                    if let Some(lost) = lost {
                        self.shared.apply(Entry::Peer {
                            lost,
                            now_ns: Timestamp::now().0,
                        });
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(&mut self, _ctx: &mut StageCtx) -> StageResult {
        if self.replaying {
            // Inputs ended: the journal still plays to its end (a stop or
            // cancel of the pipeline ends it early).
            let mut threads = std::mem::take(&mut self.threads).into_iter();
            if let Some(lp) = threads.next() {
                let _ = lp.join();
            }
            self.threads = threads.collect();
        }
        self.stop_threads();
        Ok(())
    }
}

/// A request's flattened prefix as rows of `dim` values (JSON `[[x, y], ...]`).
fn prefix_rows(prefix: &[f32], dim: usize) -> Vec<&[f32]> {
    if dim == 0 {
        return Vec::new();
    }
    prefix.chunks_exact(dim).collect()
}
