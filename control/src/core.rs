//! The controller's per-period logic, free of threads and clocks so it can
//! be tested period by period: the action queue, chunk requests with their
//! measured inference delay, and the watchdog's safe action.

use crate::queue::{ActionQueue, InsertReport, MergeMode, QueueError};
use std::time::Duration;

/// What the safe action is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SafeMode {
    /// Repeat the last commanded action (a position target: hold still).
    Hold,
    /// All zeros (a velocity command: stop).
    Zero,
}

/// Controller settings (the stage's params).
#[derive(Debug, Clone, PartialEq)]
pub struct CoreConfig {
    /// Control period.
    pub period: Duration,
    /// Request a chunk when fewer than `threshold * horizon` actions remain;
    /// 0 = synchronous: request only when the queue is empty.
    pub threshold: f32,
    /// Expected chunk length H (updated from arriving chunks).
    pub horizon: usize,
    /// Overlap merge.
    pub merge: MergeMode,
    /// Safe action kind.
    pub safe: SafeMode,
    /// An observation older than this triggers the safe action.
    pub max_obs_age: Duration,
    /// An empty queue for longer than this triggers the safe action.
    pub grace: Duration,
    /// Action dim, if known before the first chunk (needed for `zero`).
    pub dim: Option<usize>,
    /// Re-send a request that got no chunk for this long.
    pub request_timeout: Duration,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            period: Duration::from_millis(20),
            threshold: 0.5,
            horizon: 16,
            merge: MergeMode::WeightedAverage { old_weight: 0.3 },
            safe: SafeMode::Hold,
            max_obs_age: Duration::from_millis(500),
            grace: Duration::from_millis(200),
            dim: None,
            request_timeout: Duration::from_secs(1),
        }
    }
}

/// A chunk request for the policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The step the controller executes next.
    pub step: u64,
    /// The last chunk's measured inference delay in periods (request to
    /// arrival), for real-time chunking; `None` before the first chunk.
    pub last_delay: Option<u64>,
    /// The actions already queued for `step`, `step + 1`, ... (flattened,
    /// `dim` values each): what executes while the policy computes. A
    /// real-time-chunking policy freezes them and plans what follows.
    pub prefix: Vec<f32>,
    /// Values per action in `prefix` (0 while unknown).
    pub dim: usize,
}

/// Where a period's command came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Popped from the queue.
    Queue,
    /// Queue empty within `grace` (or waiting synchronously): the last
    /// command repeated.
    Hold,
    /// The watchdog's safe action.
    Safe,
    /// Nothing to send yet (no chunk ever arrived, hold mode).
    None,
}

/// Why the watchdog fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SafeReason {
    /// The newest observation is older than `max_obs_age`.
    StaleObservation,
    /// The queue has been empty for longer than `grace`.
    EmptyQueue,
    /// The peer (robot side) is gone.
    PeerLost,
}

/// One period's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    /// Step index of this period.
    pub step: u64,
    /// The command (empty when `source` is `None`).
    pub command: Vec<f32>,
    /// Where it came from.
    pub source: Source,
    /// A request to emit this period.
    pub request: Option<Request>,
    /// Set in the period a safe-hold episode starts.
    pub safe_started: Option<SafeReason>,
    /// With `safe_started`: how long after the condition arose (stale
    /// observation, grace expired, peer lost) the safe action went out, ns.
    pub safe_reaction_ns: Option<u64>,
    /// Set in the period a safe-hold episode ends: its length in periods.
    pub safe_ended: Option<u64>,
    /// The queue was empty this period (an underrun), outside sync waits.
    pub underrun: bool,
}

/// Counters since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CoreStats {
    /// Periods run.
    pub periods: u64,
    /// Periods with an empty queue (excluding synchronous waits).
    pub underruns: u64,
    /// Periods that published the safe action.
    pub safe_periods: u64,
    /// Safe-hold episodes started.
    pub safe_episodes: u64,
    /// Chunks accepted.
    pub chunks: u64,
    /// Requests sent.
    pub requests: u64,
}

/// The controller state machine.
#[derive(Debug, Clone)]
pub struct ControllerCore {
    cfg: CoreConfig,
    queue: ActionQueue,
    step: u64,
    /// Outstanding request: (step it carried, time sent in ns).
    outstanding: Option<(u64, u64)>,
    last_delay: Option<u64>,
    last_cmd: Option<Vec<f32>>,
    last_obs_ns: Option<u64>,
    empty_since_ns: Option<u64>,
    safe_since_step: Option<u64>,
    /// Since when the peer is gone (ns).
    peer_lost: Option<u64>,
    stats: CoreStats,
}

impl ControllerCore {
    /// A controller at step 0.
    pub fn new(cfg: CoreConfig) -> Self {
        ControllerCore {
            queue: ActionQueue::new(cfg.merge, cfg.dim),
            cfg,
            step: 0,
            outstanding: None,
            last_delay: None,
            last_cmd: None,
            last_obs_ns: None,
            empty_since_ns: None,
            safe_since_step: None,
            peer_lost: None,
            stats: CoreStats::default(),
        }
    }

    /// Settings.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// The step the next period executes.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Counters.
    pub fn stats(&self) -> CoreStats {
        self.stats
    }

    /// Actions dropped because their time had passed.
    pub fn dropped(&self) -> u64 {
        self.queue.dropped()
    }

    /// Queued actions from the next step on.
    pub fn queued(&self) -> usize {
        self.queue.len_from(self.step)
    }

    /// Whether a safe-hold episode is in progress.
    pub fn in_safe_hold(&self) -> bool {
        self.safe_since_step.is_some()
    }

    /// An observation captured at `capture_ns` arrived.
    pub fn on_observation(&mut self, capture_ns: u64) {
        self.last_obs_ns = Some(self.last_obs_ns.map_or(capture_ns, |t| t.max(capture_ns)));
    }

    /// The robot side's liveliness changed at `now_ns`.
    pub fn set_peer_lost(&mut self, lost: bool, now_ns: u64) {
        self.peer_lost = if lost {
            Some(self.peer_lost.unwrap_or(now_ns))
        } else {
            None
        };
    }

    /// A chunk arrived at `now_ns`. Returns the merge report and, when it
    /// answered an outstanding request, its inference delay in periods.
    pub fn on_chunk(
        &mut self,
        start_step: u64,
        dim: usize,
        values: &[f32],
        now_ns: u64,
    ) -> Result<(InsertReport, Option<u64>), QueueError> {
        let rep = self.queue.insert(start_step, dim, values, self.step)?;
        self.stats.chunks += 1;
        let h = values.len() / dim;
        if h > 0 {
            self.cfg.horizon = h;
        }
        let delay = self.outstanding.take().map(|(_, sent)| {
            let p = self.cfg.period.as_nanos().max(1) as u64;
            now_ns.saturating_sub(sent).div_ceil(p)
        });
        if delay.is_some() {
            self.last_delay = delay;
        }
        Ok((rep, delay))
    }

    /// Why the safe action is due now, and since when it was due (ns).
    fn safe_reason(&self, now_ns: u64, empty: bool) -> Option<(SafeReason, u64)> {
        if let Some(t) = self.peer_lost {
            return Some((SafeReason::PeerLost, t));
        }
        let max_age = self.cfg.max_obs_age.as_nanos() as u64;
        match self.last_obs_ns {
            Some(t) if now_ns.saturating_sub(t) > max_age => {
                return Some((SafeReason::StaleObservation, t + max_age))
            }
            _ => {}
        }
        // Armed once a first chunk has arrived: start-up is not an underrun.
        if empty && self.stats.chunks > 0 {
            if let Some(since) = self.empty_since_ns {
                let grace = self.cfg.grace.as_nanos() as u64;
                if now_ns.saturating_sub(since) >= grace {
                    return Some((SafeReason::EmptyQueue, since + grace));
                }
            }
        }
        None
    }

    fn safe_command(&self) -> Vec<f32> {
        match self.cfg.safe {
            SafeMode::Hold => self.last_cmd.clone().unwrap_or_default(),
            SafeMode::Zero => vec![0.0; self.queue.dim().unwrap_or(0)],
        }
    }

    /// Run the period for the current step at `now_ns`; advances the step.
    pub fn tick(&mut self, now_ns: u64) -> Tick {
        let step = self.step;
        self.stats.periods += 1;
        let popped = self.queue.pop(step);
        let empty = popped.is_none();
        if empty {
            self.empty_since_ns.get_or_insert(now_ns);
        } else {
            self.empty_since_ns = None;
        }
        let sync_wait = self.cfg.threshold <= 0.0 && self.outstanding.is_some();
        let underrun = empty && !sync_wait && self.stats.chunks > 0;
        if underrun {
            self.stats.underruns += 1;
        }
        let reason = self.safe_reason(now_ns, empty);
        let mut safe_started = None;
        let mut safe_reaction_ns = None;
        let mut safe_ended = None;
        let (command, source) = match reason {
            Some((r, due)) => {
                if self.safe_since_step.is_none() {
                    self.safe_since_step = Some(step);
                    self.stats.safe_episodes += 1;
                    safe_started = Some(r);
                    safe_reaction_ns = Some(now_ns.saturating_sub(due));
                }
                self.stats.safe_periods += 1;
                (self.safe_command(), Source::Safe)
            }
            None => {
                if let Some(s) = self.safe_since_step.take() {
                    safe_ended = Some(step - s);
                }
                match popped {
                    Some(a) => (a, Source::Queue),
                    None => match &self.last_cmd {
                        Some(c) => (c.clone(), Source::Hold),
                        None => (Vec::new(), Source::None),
                    },
                }
            }
        };
        if source == Source::Queue {
            self.last_cmd = Some(command.clone());
        }
        // Chunk request after this period's pop.
        let left = self.queue.len_from(step + 1);
        let want = if self.cfg.threshold <= 0.0 {
            left == 0
        } else {
            (left as f32) < self.cfg.threshold * self.cfg.horizon as f32
        };
        let timed_out = self.outstanding.is_some_and(|(_, sent)| {
            now_ns.saturating_sub(sent) >= self.cfg.request_timeout.as_nanos() as u64
        });
        let request = if want && (self.outstanding.is_none() || timed_out) {
            self.outstanding = Some((step + 1, now_ns));
            self.stats.requests += 1;
            Some(Request {
                step: step + 1,
                last_delay: self.last_delay,
                prefix: self.queue.values_from(step + 1),
                dim: self.queue.dim().unwrap_or(0),
            })
        } else {
            None
        };
        self.step += 1;
        Tick {
            step,
            command: if source == Source::None {
                Vec::new()
            } else {
                command
            },
            source,
            request,
            safe_started,
            safe_reaction_ns,
            safe_ended,
            underrun,
        }
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
