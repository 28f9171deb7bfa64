//! The actor contract every stage implements, and the context it runs in.

use crate::message::{Epoch, Message, Payload, Timestamp};
use crate::metrics::StageMetrics;
use edgeflow_runtime::DeviceStats;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a stage call did not complete.
#[derive(Debug)]
pub enum StageError {
    /// The epoch in hand was cancelled (or the pipeline is stopping); not a
    /// failure. Long loops return this from [`StageCtx::check`].
    Cancelled,
    /// A real failure: the pipeline stops and reports it with the stage id.
    Failed(Box<dyn std::error::Error + Send + Sync>),
}

impl StageError {
    /// A failure from a message.
    pub fn msg(m: impl Into<String>) -> Self {
        StageError::Failed(m.into().into())
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for StageError {
    fn from(e: E) -> Self {
        StageError::Failed(Box::new(e))
    }
}

impl fmt::Display for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StageError::Cancelled => f.write_str("cancelled"),
            StageError::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// Result of stage calls.
pub type StageResult<T = ()> = Result<T, StageError>;

/// A message delivered to a stage, with the input port it arrived on.
#[derive(Debug, Clone)]
pub struct Input {
    /// Index into the stage's `Ports::inputs`.
    pub port: usize,
    /// The message.
    pub msg: Message,
}

/// What a source's `poll` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    /// Call again.
    Continue,
    /// Nothing now; the engine checks the control lane and calls again.
    Idle,
    /// The source is exhausted: end-of-stream goes downstream.
    Done,
}

/// A stage: one actor of the pipeline, run on its own thread (or inline on
/// its producer's thread). Lifecycle: `start`, then `process` per message
/// (or `poll` for sources), `reset` after each cancelled epoch, `finish` at
/// end of stream.
pub trait Stage: Send + 'static {
    /// Called once on the stage's thread before any message.
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        let _ = ctx;
        Ok(())
    }

    /// Handle one input message. Emit results with [`StageCtx::emit`]; they
    /// inherit the input's epoch and timestamp.
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let _ = (input, ctx);
        Ok(())
    }

    /// Sources only (stages with no inputs): produce some output, or say
    /// you are done. Should not block for more than ~50 ms at a time so
    /// the control lane stays responsive; check [`StageCtx::should_stop`].
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        let _ = ctx;
        Ok(Poll::Done)
    }

    /// Epoch `epoch` was cancelled: drop any state that belongs to it
    /// (buffers, KV caches, partial sentences). Called on the stage's
    /// thread; returning acknowledges the cancel.
    fn reset(&mut self, epoch: Epoch, ctx: &mut StageCtx) -> StageResult {
        let _ = (epoch, ctx);
        Ok(())
    }

    /// Every input has ended: flush what is buffered.
    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        let _ = ctx;
        Ok(())
    }
}

/// What a [`StageCtx`] needs from the engine that runs its stage: the
/// pipeline's stop flag and epochs, and a sleep that wakes on control
/// messages. The executor implements it; the public contract sees only this.
pub(crate) trait EngineLink: Send + Sync {
    /// The pipeline is shutting down.
    fn is_stopping(&self) -> bool;
    /// `epoch` has been cancelled.
    fn is_cancelled(&self, epoch: Epoch) -> bool;
    /// The pipeline's current epoch.
    fn current_epoch(&self) -> Epoch;
    /// Start a new epoch and return it.
    fn new_epoch(&self) -> Epoch;
    /// Cancel `epoch` across the pipeline (acknowledged asynchronously).
    fn cancel(&self, epoch: Epoch);
    /// Raise the current epoch to at least `epoch`.
    fn observe_epoch(&self, epoch: Epoch);
    /// Sleep until `t`; false when woken early by stop or a control message.
    fn sleep_until(&self, t: Instant) -> bool;
    /// Whether an installed tap keeps journals.
    fn journaling(&self) -> bool;
    /// Hand a journal entry of stage `stage` to the tap.
    fn journal(&self, stage: &str, entry: &[u8]);
}

/// A message was not delivered because its epoch was cancelled or the
/// pipeline is stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused;

/// One output port of a stage: numbers each message and delivers it to
/// every consumer (blocking on full `block` edges). The executor implements it.
pub(crate) trait Outlet: Send {
    /// Deliver `msg` (its `seq` is assigned here, per port).
    fn send(&mut self, msg: Message) -> Result<(), Refused>;
    /// The same port for a helper thread: shareable, with its own sequence
    /// numbers (see [`StageHandle`]).
    fn share(&self) -> Arc<dyn SharedOutlet>;
}

/// An output port a helper thread emits on through a [`StageHandle`].
pub(crate) trait SharedOutlet: Send + Sync {
    /// Deliver `msg` (its `seq` is assigned here, per port).
    fn send(&self, msg: Message) -> Result<(), Refused>;
    /// True when a send can never wait: no consumer edge is `block` and no
    /// consumer runs inline (which would run its work on the caller).
    fn never_waits(&self) -> bool;
    /// Deliver `msg` only if that cannot wait (see [`StageHandle::try_emit_msg`]).
    fn try_send(&self, msg: Message) -> Result<(), TryEmit>;
    /// True when every consumer takes messages through a queue (none runs
    /// inline on the sender's thread).
    fn queued(&self) -> bool;
}

/// Why [`StageHandle::try_emit_msg`] did not deliver.
#[derive(Debug)]
pub enum TryEmit {
    /// Delivering would wait (a `block` edge is full, or a consumer runs
    /// inline on the emitting thread): the message, untouched.
    Full(Message),
    /// The message's epoch was cancelled or the pipeline stops: dropped.
    Refused,
}

/// What a stage uses to talk to the engine: emit, check cancellation, start
/// or cancel epochs, record metrics.
pub struct StageCtx {
    pub(crate) id: Arc<str>,
    pub(crate) outputs: Vec<Box<dyn Outlet>>,
    pub(crate) engine: Arc<dyn EngineLink>,
    pub(crate) metrics: Arc<StageMetrics>,
    /// Epoch and timestamp of the message in hand (sources: current epoch, now).
    pub(crate) epoch: Epoch,
    pub(crate) timestamp: Option<Timestamp>,
    pub(crate) deadline: Option<Timestamp>,
}

impl fmt::Debug for StageCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StageCtx")
            .field("id", &self.id)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl StageCtx {
    /// This stage's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Epoch of the message in hand (for sources: the pipeline's current epoch).
    pub fn epoch(&self) -> Epoch {
        if self.timestamp.is_none() {
            self.engine.current_epoch()
        } else {
            self.epoch
        }
    }

    /// Emit `payload` on output `port` (an index into `Ports::outputs`),
    /// stamped with the epoch and capture time of the message in hand.
    /// Blocks on a full `block` edge (backpressure). Returns
    /// `Err(Cancelled)` when that epoch was cancelled or the pipeline stops.
    pub fn emit(&mut self, port: usize, payload: Payload) -> StageResult {
        let msg = Message {
            epoch: self.epoch(),
            seq: 0,
            timestamp: self.timestamp.unwrap_or_else(Timestamp::now),
            deadline: self.deadline,
            payload,
        };
        self.emit_msg(port, msg)
    }

    /// Emit a fully formed message (sources setting their own capture time).
    /// The sequence number is assigned per port.
    pub fn emit_msg(&mut self, port: usize, msg: Message) -> StageResult {
        let Some(out) = self.outputs.get_mut(port) else {
            return Err(StageError::msg(format!(
                "stage `{}` emitted on output #{port}, but it has {} output(s)",
                self.id,
                self.outputs.len()
            )));
        };
        out.send(msg).map_err(|Refused| StageError::Cancelled)
    }

    /// Number of output ports.
    pub fn output_count(&self) -> usize {
        self.outputs.len()
    }

    /// True when the epoch in hand has been cancelled or the pipeline is
    /// stopping. Long loops (decode, denoising steps) call this each step.
    pub fn is_cancelled(&self) -> bool {
        self.engine.is_stopping() || self.engine.is_cancelled(self.epoch())
    }

    /// `Err(Cancelled)` when [`Self::is_cancelled`]; use with `?` in loops.
    pub fn check(&self) -> StageResult {
        if self.is_cancelled() {
            Err(StageError::Cancelled)
        } else {
            Ok(())
        }
    }

    /// True once the pipeline is shutting down (sources should return `Done`).
    pub fn should_stop(&self) -> bool {
        self.engine.is_stopping()
    }

    /// Whether `epoch` has been cancelled.
    pub fn epoch_cancelled(&self, epoch: Epoch) -> bool {
        self.engine.is_cancelled(epoch)
    }

    /// Cancel `epoch` across the whole pipeline (barge-in, new goal). Returns
    /// at once; every stage resets and acknowledges asynchronously, and the
    /// time until the last acknowledgement is recorded in the metrics.
    pub fn cancel_epoch(&self, epoch: Epoch) {
        self.engine.cancel(epoch);
    }

    /// Start a new epoch (turn); sources stamp new data with it. Returns it.
    pub fn new_epoch(&self) -> Epoch {
        self.engine.new_epoch()
    }

    /// The pipeline's current epoch.
    pub fn current_epoch(&self) -> Epoch {
        self.engine.current_epoch()
    }

    /// Raise the pipeline's current epoch to at least `epoch` (see
    /// [`StageHandle::observe_epoch`]).
    pub fn observe_epoch(&self, epoch: Epoch) {
        self.engine.observe_epoch(epoch);
    }

    /// Use this epoch for what this source emits next (sources only).
    pub fn set_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
    }

    /// Record a domain metric value (e.g. `time_to_first_audio_ms`); the
    /// summary (count, mean, p50, p99, last) appears in the metrics.
    pub fn record(&self, name: &str, value: f64) {
        self.metrics.record(name, value);
    }

    /// Count one missed deadline.
    pub fn deadline_missed(&self) {
        self.metrics.deadline_missed();
    }

    /// Attach a runtime device's counters (fallbacks, transfers, resident
    /// bytes) so they appear in this stage's metrics.
    pub fn attach_device(&self, stats: Arc<DeviceStats>) {
        self.metrics.attach_device(stats);
    }

    /// Sleep until `t`, waking early (returning false) if the pipeline
    /// stops or a control message (cancel) arrives for this stage.
    pub fn sleep_until(&self, t: Instant) -> bool {
        self.engine.sleep_until(t)
    }

    /// Sleep for `d` (see [`Self::sleep_until`]).
    pub fn sleep(&self, d: Duration) -> bool {
        self.sleep_until(Instant::now() + d)
    }
}

/// A `Send + Clone` handle to a stage's outputs and metrics, for a helper
/// thread the stage owns (a fixed-rate control loop, a transport callback)
/// that must emit without waiting for an input to arrive. Get it from
/// [`StageCtx::handle`] in `start`; the stage must stop the thread (join it)
/// in `finish` and on drop. Its sequence numbers are its own: a port should
/// be emitted on either by the handle or by the context, not both.
#[derive(Clone)]
pub struct StageHandle {
    id: Arc<str>,
    ports: Arc<[Arc<dyn SharedOutlet>]>,
    engine: Arc<dyn EngineLink>,
    metrics: Arc<StageMetrics>,
}

impl fmt::Debug for StageHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StageHandle").field("id", &self.id).finish()
    }
}

impl StageCtx {
    /// A handle for a helper thread (see [`StageHandle`]).
    pub fn handle(&self) -> StageHandle {
        StageHandle {
            id: self.id.clone(),
            ports: self.outputs.iter().map(|o| o.share()).collect(),
            engine: self.engine.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl StageHandle {
    /// The stage's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Emit a fully formed message on output `port` from this thread. The
    /// sequence number is assigned per port. Blocks on a full `block` edge;
    /// `Err(Cancelled)` when the epoch was cancelled or the pipeline stops.
    pub fn emit_msg(&self, port: usize, msg: Message) -> StageResult {
        let Some(out) = self.ports.get(port) else {
            return Err(StageError::msg(format!(
                "stage `{}` emitted on output #{port}, but it has {} output(s)",
                self.id,
                self.ports.len()
            )));
        };
        out.send(msg).map_err(|Refused| StageError::Cancelled)
    }

    /// True when emitting on output `port` can never wait: every edge from
    /// it drops (`latest`, `drop_oldest`, `drop_newest`) rather than blocks
    /// when full, and no consumer runs inline on the emitting thread. A
    /// thread that must not wait (a transport's receive callback) may emit
    /// on such a port directly and save a hop through a thread of its own.
    pub fn never_waits(&self, port: usize) -> bool {
        self.ports.get(port).is_some_and(|o| o.never_waits())
    }

    /// Emit `msg` on `port` only if that cannot wait: delivered to every
    /// consumer when each `block` edge from the port has room and none
    /// runs inline, else handed back as [`TryEmit::Full`] (for a thread
    /// that may wait to emit later, in order). For a thread that must not
    /// wait (a transport's receive callback) in front of `block` edges.
    /// Sends on one port must not run concurrently with this: each edge has
    /// this port as its only producer, so the room seen stays there.
    pub fn try_emit_msg(&self, port: usize, msg: Message) -> Result<(), TryEmit> {
        match self.ports.get(port) {
            Some(out) => out.try_send(msg),
            None => Err(TryEmit::Full(msg)),
        }
    }

    /// True when every consumer of output `port` takes messages through a
    /// queue: none runs inline on the emitting thread, so
    /// [`Self::try_emit_msg`] delivers whenever the `block` edges have room.
    pub fn queued(&self, port: usize) -> bool {
        self.ports.get(port).is_some_and(|o| o.queued())
    }

    /// Emit `payload` stamped now in the pipeline's current epoch.
    pub fn emit(&self, port: usize, payload: Payload) -> StageResult {
        self.emit_msg(port, Message::new(self.engine.current_epoch(), payload))
    }

    /// True once the pipeline is shutting down.
    pub fn should_stop(&self) -> bool {
        self.engine.is_stopping()
    }

    /// The pipeline's current epoch.
    pub fn current_epoch(&self) -> Epoch {
        self.engine.current_epoch()
    }

    /// Raise the pipeline's current epoch to at least `epoch`: a message
    /// that arrived from another part carries an epoch started there.
    pub fn observe_epoch(&self, epoch: Epoch) {
        self.engine.observe_epoch(epoch);
    }

    /// Record a domain metric value (see [`StageCtx::record`]).
    pub fn record(&self, name: &str, value: f64) {
        self.metrics.record(name, value);
    }

    /// Whether the run keeps journals (a recorder is installed): encode
    /// entries only then.
    pub fn journaling(&self) -> bool {
        self.engine.journaling()
    }

    /// Append an entry to this stage's journal in the run's recording
    /// ([`crate::EdgeTap::on_journal`]); nothing when none is kept. A
    /// stage whose outputs depend on more than its inputs' contents (a
    /// clock, the order two threads applied things in) journals those, in
    /// the order it applied them, so a replay can reproduce its outputs.
    pub fn journal(&self, entry: &[u8]) {
        self.engine.journal(&self.id, entry);
    }

    /// Count one missed deadline.
    pub fn deadline_missed(&self) {
        self.metrics.deadline_missed();
    }
}
