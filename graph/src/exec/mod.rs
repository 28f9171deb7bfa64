//! The executor: one thread per stage (or inline on the producer), bounded
//! inboxes, a control lane for cancellation, clean shutdown on error/panic.

mod actor;
mod inbox;
mod tap;

pub(crate) use inbox::{Control, EdgeQueue, Inbox, Item, PushError};
pub use tap::EdgeTap;

use actor::run_actor;

use crate::error::{Error, Result};
use crate::message::{Epoch, Message, Payload, Timestamp};
use crate::metrics::{CancelReport, EdgeStats, MetricsSnapshot, StageMetrics};
use crate::plan::Plan;
use crate::spec::Policy;
use crate::stage::{
    EngineLink, Input, Outlet, Refused, SharedOutlet, Stage, StageCtx, StageError, TryEmit,
};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Acknowledgement tracker for one cancel.
#[derive(Debug)]
pub(crate) struct CancelAck {
    epoch: Epoch,
    asked: AtomicUsize,
    acked: AtomicUsize,
    started: Instant,
    done: Mutex<Option<Duration>>,
    cv: Condvar,
}

impl CancelAck {
    pub(crate) fn ack(&self) {
        let n = self.acked.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= self.asked.load(Ordering::Acquire) {
            let mut d = self.done.lock();
            if d.is_none() {
                *d = Some(self.started.elapsed());
            }
            self.cv.notify_all();
        }
    }

    fn report(&self) -> CancelReport {
        CancelReport {
            epoch: self.epoch,
            acked: self.acked.load(Ordering::Acquire),
            stages: self.asked.load(Ordering::Acquire),
            ack_ms: self.done.lock().map(|d| d.as_secs_f64() * 1e3),
        }
    }
}

/// State shared by all stage threads of one running pipeline.
pub(crate) struct Shared {
    stopping: AtomicBool,
    cancelled: RwLock<HashSet<Epoch>>,
    n_cancelled: AtomicUsize,
    epoch: AtomicU64,
    inboxes: Mutex<Vec<Arc<Inbox>>>,
    cancels: Mutex<Vec<Arc<CancelAck>>>,
    failure: Mutex<Option<Error>>,
    /// Sees every message sent on an edge, when installed.
    tap: Option<Arc<dyn EdgeTap>>,
    /// Told of each epoch the first time it is cancelled (parts: the
    /// bridge that carries cancels to the other parts).
    cancel_hooks: Mutex<Vec<CancelHook>>,
}

/// A function told of each newly cancelled epoch.
type CancelHook = Arc<dyn Fn(Epoch) + Send + Sync>;

impl Shared {
    fn new(tap: Option<Arc<dyn EdgeTap>>) -> Self {
        Shared {
            stopping: AtomicBool::new(false),
            cancelled: RwLock::new(HashSet::new()),
            n_cancelled: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            inboxes: Mutex::new(Vec::new()),
            cancels: Mutex::new(Vec::new()),
            failure: Mutex::new(None),
            tap,
            cancel_hooks: Mutex::new(Vec::new()),
        }
    }

    /// Raise the current epoch to at least `epoch` (one started elsewhere,
    /// e.g. in another part of a split pipeline).
    pub(crate) fn observe_epoch(&self, epoch: Epoch) {
        self.epoch.fetch_max(epoch, Ordering::AcqRel);
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    pub(crate) fn is_cancelled(&self, epoch: Epoch) -> bool {
        self.n_cancelled.load(Ordering::Acquire) > 0 && self.cancelled.read().contains(&epoch)
    }

    pub(crate) fn current_epoch(&self) -> Epoch {
        self.epoch.load(Ordering::Acquire)
    }

    pub(crate) fn new_epoch(&self) -> Epoch {
        self.epoch.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub(crate) fn cancel(&self, epoch: Epoch) -> Arc<CancelAck> {
        let first = self.cancelled.write().insert(epoch);
        if first {
            self.n_cancelled.fetch_add(1, Ordering::AcqRel);
        }
        let inboxes = self.inboxes.lock().clone();
        let ack = Arc::new(CancelAck {
            epoch,
            asked: AtomicUsize::new(usize::MAX),
            acked: AtomicUsize::new(0),
            started: Instant::now(),
            done: Mutex::new(None),
            cv: Condvar::new(),
        });
        let mut asked = 0;
        for ib in &inboxes {
            if ib.cancel(epoch, &ack) {
                asked += 1;
            }
        }
        ack.asked.store(asked, Ordering::Release);
        // Acks that arrived before `asked` was known: re-check completion.
        if ack.acked.load(Ordering::Acquire) >= asked {
            let mut d = ack.done.lock();
            if d.is_none() {
                *d = Some(ack.started.elapsed());
            }
            ack.cv.notify_all();
        }
        self.cancels.lock().push(ack.clone());
        if first {
            let hooks = self.cancel_hooks.lock().clone();
            for h in hooks {
                h(epoch);
            }
        }
        ack
    }

    fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        for ib in self.inboxes.lock().iter() {
            ib.wake_all();
        }
    }

    fn fail(&self, e: Error) {
        {
            let mut f = self.failure.lock();
            if f.is_none() {
                *f = Some(e);
            }
        }
        self.stop();
    }
}

/// One consumer edge reached from an output port.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) inbox: Arc<Inbox>,
    pub(crate) edge: usize,
    /// Inline consumer: run it right here instead of queueing.
    pub(crate) inline: Option<Arc<InlineStage>>,
    /// The edge's index in the plan (what an [`EdgeTap`] is told).
    pub(crate) plan_edge: usize,
}

impl Target {
    pub(crate) fn push(&self, msg: Message, shared: &Shared) -> std::result::Result<(), PushError> {
        if let Some(inl) = &self.inline {
            return inl.deliver(msg, shared);
        }
        self.inbox.push(self.edge, msg, shared)
    }
}

/// Push `msg` to every target (the last one gets the original, the others
/// clones), blocking on full `block` edges.
fn deliver(
    targets: &[Target],
    shared: &Shared,
    mut msg: Message,
) -> std::result::Result<(), Refused> {
    if let Some(tap) = &shared.tap {
        let now = Timestamp::now();
        for t in targets {
            tap.on_message(t.plan_edge, &msg, now);
        }
    }
    let n = targets.len();
    for (i, t) in targets.iter().enumerate() {
        let m = if i + 1 == n {
            std::mem::replace(&mut msg, Message::placeholder())
        } else {
            msg.clone()
        };
        match t.push(m, shared) {
            Ok(()) => {}
            Err(PushError::Cancelled) | Err(PushError::Stopped) => return Err(Refused),
        }
    }
    Ok(())
}

/// An output port and where it leads: a stage's [`Outlet`].
pub(crate) struct OutPort {
    pub(crate) targets: Vec<Target>,
    pub(crate) seq: u64,
    pub(crate) shared: Arc<Shared>,
}

impl Outlet for OutPort {
    fn send(&mut self, mut msg: Message) -> std::result::Result<(), Refused> {
        self.seq += 1;
        msg.seq = self.seq;
        deliver(&self.targets, &self.shared, msg)
    }

    fn share(&self) -> Arc<dyn SharedOutlet> {
        Arc::new(SharedPort {
            targets: self.targets.clone(),
            seq: AtomicU64::new(0),
            shared: self.shared.clone(),
        })
    }
}

/// An output port shared with a stage's helper thread ([`Outlet::share`]).
struct SharedPort {
    targets: Vec<Target>,
    seq: AtomicU64,
    shared: Arc<Shared>,
}

impl SharedOutlet for SharedPort {
    fn send(&self, mut msg: Message) -> std::result::Result<(), Refused> {
        msg.seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        deliver(&self.targets, &self.shared, msg)
    }

    fn never_waits(&self) -> bool {
        self.targets.iter().all(|t| {
            t.inline.is_none() && t.inbox.state.lock().edges[t.edge].policy != Policy::Block
        })
    }

    fn try_send(&self, mut msg: Message) -> std::result::Result<(), TryEmit> {
        // Each edge's only producer is this port: room seen here stays
        // until the push below (the consumer only makes more).
        if !self
            .targets
            .iter()
            .all(|t| t.inline.is_none() && t.inbox.has_room(t.edge))
        {
            return Err(TryEmit::Full(msg));
        }
        msg.seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        deliver(&self.targets, &self.shared, msg).map_err(|Refused| TryEmit::Refused)
    }

    fn queued(&self) -> bool {
        self.targets.iter().all(|t| t.inline.is_none())
    }
}

/// A stage's view of the engine: the pipeline's shared state and its own
/// inbox (for sleeps that wake on control messages).
struct StageLink {
    shared: Arc<Shared>,
    inbox: Arc<Inbox>,
}

impl EngineLink for StageLink {
    fn is_stopping(&self) -> bool {
        self.shared.is_stopping()
    }

    fn is_cancelled(&self, epoch: Epoch) -> bool {
        self.shared.is_cancelled(epoch)
    }

    fn current_epoch(&self) -> Epoch {
        self.shared.current_epoch()
    }

    fn new_epoch(&self) -> Epoch {
        self.shared.new_epoch()
    }

    fn cancel(&self, epoch: Epoch) {
        self.shared.cancel(epoch);
    }

    fn observe_epoch(&self, epoch: Epoch) {
        self.shared.observe_epoch(epoch);
    }

    fn sleep_until(&self, t: Instant) -> bool {
        self.inbox.sleep_until(t, &self.shared)
    }

    fn journaling(&self) -> bool {
        self.shared.tap.as_ref().is_some_and(|t| t.wants_journal())
    }

    fn journal(&self, stage: &str, entry: &[u8]) {
        if let Some(tap) = &self.shared.tap {
            tap.on_journal(stage, entry, Timestamp::now());
        }
    }
}

/// A stage with its context and where its outputs lead (every target, in
/// port order: the executor finishes and resets inline consumers through it).
struct Actor {
    stage: Box<dyn Stage>,
    ctx: StageCtx,
    downstream: Vec<Target>,
}

/// A stage run on its producer's thread.
pub(crate) struct InlineStage {
    actor: Mutex<Actor>,
    port: usize,
    edge_stats: Arc<EdgeStats>,
}

impl InlineStage {
    fn deliver(&self, msg: Message, shared: &Shared) -> std::result::Result<(), PushError> {
        if shared.is_stopping() {
            return Err(PushError::Stopped);
        }
        if shared.is_cancelled(msg.epoch) {
            self.edge_stats
                .dropped_cancel
                .fetch_add(1, Ordering::Relaxed);
            return Err(PushError::Cancelled);
        }
        self.edge_stats.sent.fetch_add(1, Ordering::Relaxed);
        self.edge_stats.delivered.fetch_add(1, Ordering::Relaxed);
        let mut g = self.actor.lock();
        let Actor { stage, ctx, .. } = &mut *g;
        ctx.epoch = msg.epoch;
        ctx.timestamp = Some(msg.timestamp);
        ctx.deadline = msg.deadline;
        let t0 = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| {
            stage.process(
                Input {
                    port: self.port,
                    msg,
                },
                ctx,
            )
        }));
        ctx.metrics.processed(t0.elapsed());
        match r {
            Ok(Ok(())) | Ok(Err(StageError::Cancelled)) => Ok(()),
            Ok(Err(StageError::Failed(e))) => {
                shared.fail(Error::StageFailed {
                    stage: ctx.id.to_string(),
                    msg: e.to_string(),
                });
                Err(PushError::Stopped)
            }
            Err(p) => {
                shared.fail(Error::StagePanicked {
                    stage: ctx.id.to_string(),
                    msg: panic_message(&p),
                });
                Err(PushError::Stopped)
            }
        }
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}

/// Channels behind `host_in` / `host_out` stages, by stage id.
#[derive(Default)]
pub(crate) struct HostPorts {
    pub(crate) inputs: HashMap<String, crossbeam_channel::Sender<Message>>,
    pub(crate) outputs: HashMap<String, crossbeam_channel::Receiver<Message>>,
}

struct StageSlot {
    id: String,
    kind: String,
    device: String,
    metrics: Arc<StageMetrics>,
}

struct EdgeSlot {
    label: String,
    policy: &'static str,
    capacity: usize,
    stats: Arc<EdgeStats>,
    inbox: Option<Arc<Inbox>>,
}

/// Stops a running pipeline from anywhere (see [`Running::stop_handle`]).
#[derive(Clone)]
pub struct StopHandle(Arc<Shared>);

impl std::fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StopHandle")
    }
}

impl StopHandle {
    /// Ask every stage to stop.
    pub fn stop(&self) {
        self.0.stop();
    }
}

/// Cancels epochs of a running pipeline from another thread (see
/// [`Running::cancel_handle`]).
#[derive(Clone)]
pub struct CancelHandle(Arc<Shared>);

impl std::fmt::Debug for CancelHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CancelHandle")
    }
}

impl CancelHandle {
    /// Cancel `epoch` and wait up to `timeout` for every stage's
    /// acknowledgement, as [`Running::cancel`] does.
    pub fn cancel(&self, epoch: Epoch, timeout: Duration) -> Result<CancelReport> {
        wait_cancel(&self.0, epoch, timeout)
    }

    /// Raise the pipeline's current epoch to at least `epoch`.
    pub fn observe_epoch(&self, epoch: Epoch) {
        self.0.observe_epoch(epoch);
    }
}

fn wait_cancel(shared: &Shared, epoch: Epoch, timeout: Duration) -> Result<CancelReport> {
    let ack = shared.cancel(epoch);
    let deadline = Instant::now() + timeout;
    let mut d = ack.done.lock();
    while d.is_none() {
        if ack.cv.wait_until(&mut d, deadline).timed_out() {
            break;
        }
    }
    drop(d);
    let r = ack.report();
    if r.ack_ms.is_none() {
        return Err(Error::Timeout(timeout));
    }
    Ok(r)
}

/// A running pipeline. Drop stops it and joins every thread.
pub struct Running {
    name: String,
    shared: Arc<Shared>,
    threads: Vec<(String, JoinHandle<()>)>,
    stages: Vec<StageSlot>,
    edges: Vec<EdgeSlot>,
    host: HostPorts,
    started: Instant,
    finished: Arc<(Mutex<usize>, Condvar)>,
    n_threads: usize,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("name", &self.name).finish()
    }
}

impl Running {
    /// Build every stage and start the threads.
    pub(crate) fn start(plan: Plan, tap: Option<Arc<dyn EdgeTap>>) -> Result<Running> {
        let shared = Arc::new(Shared::new(tap));
        let n = plan.stages.len();
        // Build stages first so a failing build starts nothing.
        let mut host = HostPorts::default();
        let mut built: Vec<Option<Box<dyn Stage>>> = Vec::with_capacity(n);
        for st in &plan.stages {
            let stage = if st.kind == crate::builtin::HOST_IN {
                let (tx, rx) = crossbeam_channel::bounded(64);
                host.inputs.insert(st.id.clone(), tx);
                Box::new(crate::builtin::HostIn::new(rx)) as Box<dyn Stage>
            } else if st.kind == crate::builtin::HOST_OUT {
                let cap = st
                    .params
                    .get_or::<usize>("capacity", 1024)
                    .unwrap_or(1024)
                    .max(1);
                let (tx, rx) = crossbeam_channel::bounded(cap);
                host.outputs.insert(st.id.clone(), rx);
                Box::new(crate::builtin::HostOut::new(tx)) as Box<dyn Stage>
            } else {
                st.factory
                    .build(&st.params, &st.env)
                    .map_err(|e| Error::Build {
                        stage: st.id.clone(),
                        msg: e.to_string(),
                    })?
            };
            built.push(Some(stage));
        }
        let inboxes: Vec<Arc<Inbox>> = (0..n).map(|_| Arc::new(Inbox::default())).collect();
        *shared.inboxes.lock() = inboxes.clone();
        let metrics: Vec<Arc<StageMetrics>> = (0..n).map(|_| Arc::default()).collect();

        // Edges: register each on its consumer's inbox.
        let mut edge_slots = Vec::new();
        let mut edge_index = Vec::new(); // plan edge -> inbox edge idx
        for e in &plan.edges {
            let stats = Arc::new(EdgeStats::default());
            let idx = inboxes[e.to.0].add_edge(EdgeQueue {
                queue: Default::default(),
                capacity: e.capacity,
                policy: e.policy,
                max_age: e.max_age,
                port: e.to.1,
                producers: 1,
                back_edge: e.back_edge,
                stats: stats.clone(),
            });
            edge_index.push(idx);
            edge_slots.push(EdgeSlot {
                label: e.label.clone(),
                policy: e.policy.name(),
                capacity: e.capacity,
                stats,
                inbox: Some(inboxes[e.to.0].clone()),
            });
        }

        // Inline stages: exactly one incoming edge, not a source.
        let mut inline: Vec<Option<Arc<InlineStage>>> = vec![None; n];
        let incoming = |i: usize| plan.edges.iter().filter(|e| e.to.0 == i).count();
        // Build contexts (outputs need inline targets, so every inline
        // consumer is resolved before its producer).
        let order = inline_order(&plan, |i| {
            let st = &plan.stages[i];
            st.inline && !st.source && incoming(i) == 1
        });
        let mut ctxs: Vec<Option<(StageCtx, Vec<Target>)>> = (0..n).map(|_| None).collect();
        for &i in &order {
            let mut outputs: Vec<Box<dyn Outlet>> = Vec::new();
            let mut downstream = Vec::new();
            for p in 0..plan.stages[i].ports.outputs.len() {
                let mut targets = Vec::new();
                for (k, e) in plan.edges.iter().enumerate() {
                    if e.from == (i, p) {
                        targets.push(Target {
                            inbox: inboxes[e.to.0].clone(),
                            edge: edge_index[k],
                            inline: inline[e.to.0].clone(),
                            plan_edge: k,
                        });
                    }
                }
                downstream.extend(targets.iter().cloned());
                outputs.push(Box::new(OutPort {
                    targets,
                    seq: 0,
                    shared: shared.clone(),
                }));
            }
            let ctx = StageCtx {
                id: Arc::from(plan.stages[i].id.as_str()),
                outputs,
                engine: Arc::new(StageLink {
                    shared: shared.clone(),
                    inbox: inboxes[i].clone(),
                }),
                metrics: metrics[i].clone(),
                epoch: 0,
                timestamp: None,
                deadline: None,
            };
            let st = &plan.stages[i];
            if st.inline && !st.source && incoming(i) == 1 {
                let k = plan.edges.iter().position(|e| e.to.0 == i).unwrap_or(0);
                if let Some(stage) = built[i].take() {
                    inline[i] = Some(Arc::new(InlineStage {
                        actor: Mutex::new(Actor {
                            stage,
                            ctx,
                            downstream,
                        }),
                        port: plan.edges[k].to.1,
                        edge_stats: edge_slots[k].stats.clone(),
                    }));
                    edge_slots[k].inbox = None;
                    // No thread serves this inbox: its producer resets it
                    // on cancel, so it must not be asked for an ack itself.
                    inboxes[i].kill();
                    continue;
                }
            }
            ctxs[i] = Some((ctx, downstream));
        }

        let finished = Arc::new((Mutex::new(0usize), Condvar::new()));
        let mut threads = Vec::new();
        for i in 0..n {
            let (Some(stage), Some((ctx, downstream))) = (built[i].take(), ctxs[i].take()) else {
                continue;
            };
            let actor = Actor {
                stage,
                ctx,
                downstream,
            };
            let st = &plan.stages[i];
            let source = st.source;
            let shared2 = shared.clone();
            let inbox = inboxes[i].clone();
            let fin = finished.clone();
            let name = format!("ef-{}", st.id);
            let h = std::thread::Builder::new()
                .name(name.chars().take(15).collect())
                .spawn(move || {
                    run_actor(actor, inbox, shared2, source);
                    let (m, cv) = &*fin;
                    *m.lock() += 1;
                    cv.notify_all();
                })
                .map_err(|e| Error::Build {
                    stage: st.id.clone(),
                    msg: format!("could not spawn its thread: {e}"),
                })?;
            threads.push((st.id.clone(), h));
        }
        // Inline stages: they finish when their producer finishes.
        let n_threads = threads.len();
        let stages = plan
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| StageSlot {
                id: s.id.clone(),
                kind: s.kind.clone(),
                device: s.env.device.to_string(),
                metrics: metrics[i].clone(),
            })
            .collect();
        let running = Running {
            name: plan.name.clone(),
            shared,
            threads,
            stages,
            edges: edge_slots,
            host,
            started: Instant::now(),
            finished,
            n_threads,
        };
        Ok(running)
    }

    /// The pipeline's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Push a payload into a `host_in` stage (blocks while its queue is full).
    /// Stamped with the current epoch and now.
    pub fn push(&self, stage: &str, payload: Payload) -> Result<()> {
        let tx = self
            .host
            .inputs
            .get(stage)
            .ok_or_else(|| Error::NoHostPort(stage.to_string()))?;
        let msg = Message::new(self.shared.current_epoch(), payload);
        tx.send(msg).map_err(|_| Error::Stopped)
    }

    /// Push a fully formed message (its own epoch and capture time) into a
    /// `host_in` stage, e.g. replaying recorded messages (blocks while its
    /// queue is full).
    pub fn push_msg(&self, stage: &str, msg: Message) -> Result<()> {
        let tx = self
            .host
            .inputs
            .get(stage)
            .ok_or_else(|| Error::NoHostPort(stage.to_string()))?;
        tx.send(msg).map_err(|_| Error::Stopped)
    }

    /// End the stream of a `host_in` stage: downstream sees end-of-stream.
    pub fn close_input(&mut self, stage: &str) -> Result<()> {
        self.host
            .inputs
            .remove(stage)
            .map(|_| ())
            .ok_or_else(|| Error::NoHostPort(stage.to_string()))
    }

    /// Pull the next message from a `host_out` stage, waiting up to `timeout`.
    /// `Ok(None)` means the stream ended.
    pub fn pull(&self, stage: &str, timeout: Duration) -> Result<Option<Message>> {
        let rx = self
            .host
            .outputs
            .get(stage)
            .ok_or_else(|| Error::NoHostPort(stage.to_string()))?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                // Already handed to the host side but not yet pulled: a
                // cancelled epoch's messages are dropped here too.
                Ok(m) if self.shared.is_cancelled(m.epoch) => continue,
                Ok(m) => return Ok(Some(m)),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    return Err(Error::Timeout(timeout))
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Ok(None),
            }
        }
    }

    /// The current epoch (turn).
    pub fn current_epoch(&self) -> Epoch {
        self.shared.current_epoch()
    }

    /// Start a new epoch; host pushes and sources use it from now on.
    pub fn new_epoch(&self) -> Epoch {
        self.shared.new_epoch()
    }

    /// Cancel `epoch`: its queued messages are dropped everywhere, stages
    /// interrupt loops working on it, reset and acknowledge. Waits up to
    /// `timeout` for every acknowledgement and reports how long it took.
    pub fn cancel(&self, epoch: Epoch, timeout: Duration) -> Result<CancelReport> {
        wait_cancel(&self.shared, epoch, timeout)
    }

    /// A handle that cancels epochs from another thread (e.g. a cancel
    /// that arrived from another part of a split pipeline).
    pub fn cancel_handle(&self) -> CancelHandle {
        CancelHandle(self.shared.clone())
    }

    /// Call `f` with each epoch the first time it is cancelled here, by a
    /// stage, the host or a [`CancelHandle`] (the parts bridge forwards
    /// them to the other parts). `f` runs on the cancelling thread: keep it
    /// short and never cancel from it.
    pub fn on_cancel(&self, f: impl Fn(Epoch) + Send + Sync + 'static) {
        self.shared.cancel_hooks.lock().push(Arc::new(f));
    }

    /// A handle that can stop this pipeline from another thread (e.g. a
    /// Ctrl-C handler) while the owner waits on it.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.shared.clone())
    }

    /// Ask every stage to stop; sources end, queues are abandoned.
    pub fn stop(&self) {
        self.shared.stop();
    }

    /// Whether every stage thread has finished.
    pub fn is_finished(&self) -> bool {
        *self.finished.0.lock() >= self.n_threads
    }

    /// Wait for the pipeline to finish (end of stream everywhere), up to
    /// `timeout` (None: forever). On timeout the pipeline is stopped.
    /// Returns the metrics, or the first stage failure.
    pub fn wait(self, timeout: Option<Duration>) -> Result<MetricsSnapshot> {
        let (metrics, result) = self.finish(timeout);
        result.map(|()| metrics)
    }

    /// Like [`Running::wait`], but always returns the metrics, with the
    /// outcome beside them (failure, timeout or success).
    pub fn finish(mut self, timeout: Option<Duration>) -> (MetricsSnapshot, Result<()>) {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut timed_out = false;
        {
            let (m, cv) = &*self.finished;
            let mut done = m.lock();
            while *done < self.n_threads {
                match deadline {
                    Some(d) => {
                        if cv.wait_until(&mut done, d).timed_out() {
                            timed_out = true;
                            break;
                        }
                    }
                    None => cv.wait(&mut done),
                }
            }
        }
        if timed_out {
            self.shared.stop();
        }
        self.join_all();
        let snap = self.metrics();
        if let Some(e) = self.shared.failure.lock().take() {
            return (snap, Err(e));
        }
        if timed_out {
            return (snap, Err(Error::Timeout(timeout.unwrap_or_default())));
        }
        (snap, Ok(()))
    }

    fn join_all(&mut self) {
        // Host inputs closed so host_in sources end.
        self.host.inputs.clear();
        for (id, h) in self.threads.drain(..) {
            if h.join().is_err() {
                self.shared.fail(Error::StagePanicked {
                    stage: id,
                    msg: "thread panicked outside the stage".into(),
                });
            }
        }
    }

    /// A metrics snapshot (callable while running).
    pub fn metrics(&self) -> MetricsSnapshot {
        let mut depth: HashMap<*const EdgeStats, usize> = HashMap::new();
        for e in &self.edges {
            if let Some(ib) = &e.inbox {
                for (s, d) in ib.depths() {
                    depth.insert(Arc::as_ptr(&s), d);
                }
            }
        }
        MetricsSnapshot {
            pipeline: self.name.clone(),
            wall_s: self.started.elapsed().as_secs_f64(),
            stages: self
                .stages
                .iter()
                .map(|s| s.metrics.snapshot(&s.id, &s.kind, &s.device))
                .collect(),
            edges: self
                .edges
                .iter()
                .map(|e| {
                    let d = depth.get(&Arc::as_ptr(&e.stats)).copied().unwrap_or(0);
                    e.stats.snapshot(&e.label, e.policy, e.capacity, d)
                })
                .collect(),
            cancels: self
                .shared
                .cancels
                .lock()
                .iter()
                .map(|c| c.report())
                .collect(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.shared.stop();
            self.join_all();
        }
    }
}

/// The order to resolve stages in: each stage after every consumer of its
/// outputs that runs inline (`inline(i)`), since a producer's targets must
/// point at its inline consumers. Back edges count like any other: an
/// inline stage fed only by a back edge (e.g. a part's sender for a
/// feedback edge) still comes before its producer. A cycle made only of
/// inline stages (unreachable: each has its one input inside the cycle)
/// is broken anywhere.
fn inline_order(plan: &Plan, inline: impl Fn(usize) -> bool) -> Vec<usize> {
    let n = plan.stages.len();
    // 0: not visited, 1: on the stack, 2: placed.
    let mut mark = vec![0u8; n];
    let mut order = Vec::with_capacity(n);
    for root in 0..n {
        if mark[root] != 0 {
            continue;
        }
        // Iterative post-order over "inline consumer of" links.
        mark[root] = 1;
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        while let Some(top) = stack.last_mut() {
            let (i, from) = *top;
            let next = plan.edges[from..]
                .iter()
                .position(|e| e.from.0 == i && inline(e.to.0) && mark[e.to.0] == 0)
                .map(|p| from + p);
            match next {
                Some(p) => {
                    top.1 = p + 1;
                    let j = plan.edges[p].to.0;
                    mark[j] = 1;
                    stack.push((j, 0));
                }
                None => {
                    mark[i] = 2;
                    order.push(i);
                    stack.pop();
                }
            }
        }
    }
    order
}
