//! A stage's inbox: one bounded queue per incoming edge plus a control lane
//! that jumps them, under one lock so a stage can wait on all its inputs.

use crate::exec::{CancelAck, Shared};
use crate::message::{Epoch, Message};
use crate::metrics::EdgeStats;
use crate::spec::Policy;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Control-lane items; served before any queued data.
#[derive(Debug)]
pub(crate) enum Control {
    /// Reset for this epoch and acknowledge.
    Cancel(Epoch, Arc<CancelAck>),
}

pub(crate) struct EdgeQueue {
    pub(crate) queue: VecDeque<Message>,
    pub(crate) capacity: usize,
    pub(crate) policy: Policy,
    pub(crate) max_age: Option<Duration>,
    pub(crate) port: usize,
    pub(crate) producers: usize,
    /// A declared feedback edge: it does not keep its consumer alive, so a
    /// loop (e.g. the agent's audio fed back to a turn manager) still ends
    /// when the forward inputs end.
    pub(crate) back_edge: bool,
    pub(crate) stats: Arc<EdgeStats>,
}

#[derive(Default)]
pub(crate) struct InboxState {
    pub(crate) edges: Vec<EdgeQueue>,
    pub(crate) control: VecDeque<Control>,
    rr: usize,
    /// The consumer has exited; pushes are discarded (counted).
    pub(crate) dead: bool,
    /// The consumer is parked on `not_empty`.
    waiting: bool,
}

/// What the consumer gets next.
pub(crate) enum Item {
    Control(Control),
    Msg(usize, Message),
    EndOfStream,
    Stop,
}

/// Why a push did not enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushError {
    Cancelled,
    Stopped,
}

/// One stage's inputs.
#[derive(Default)]
pub(crate) struct Inbox {
    pub(crate) state: Mutex<InboxState>,
    not_empty: Condvar,
    not_full: Condvar,
}

impl Inbox {
    pub(crate) fn add_edge(&self, e: EdgeQueue) -> usize {
        let mut st = self.state.lock();
        st.edges.push(e);
        st.edges.len() - 1
    }

    /// Producer side. Applies the edge's policy when full.
    pub(crate) fn push(&self, edge: usize, msg: Message, shared: &Shared) -> Result<(), PushError> {
        let mut st = self.state.lock();
        loop {
            if shared.is_stopping() {
                return Err(PushError::Stopped);
            }
            if shared.is_cancelled(msg.epoch) {
                st.edges[edge]
                    .stats
                    .dropped_cancel
                    .fetch_add(1, Ordering::Relaxed);
                return Err(PushError::Cancelled);
            }
            let dead = st.dead;
            let e = &mut st.edges[edge];
            e.stats.sent.fetch_add(1, Ordering::Relaxed);
            if dead {
                e.stats.dropped_closed.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            match e.policy {
                Policy::Latest => {
                    let n = e.queue.len() as u64;
                    e.queue.clear();
                    e.stats.dropped_latest.fetch_add(n, Ordering::Relaxed);
                }
                _ if e.queue.len() < e.capacity => {}
                Policy::Block => {
                    e.stats.sent.fetch_sub(1, Ordering::Relaxed);
                    e.stats.blocked.fetch_add(1, Ordering::Relaxed);
                    self.not_full.wait(&mut st);
                    continue;
                }
                Policy::DropOldest => {
                    e.queue.pop_front();
                    e.stats.dropped_oldest.fetch_add(1, Ordering::Relaxed);
                }
                Policy::DropNewest => {
                    e.stats.dropped_newest.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
            }
            e.queue.push_back(msg);
            let depth = e.queue.len() as u64;
            e.stats.max_depth.fetch_max(depth, Ordering::Relaxed);
            let wake = st.waiting;
            drop(st);
            if wake {
                self.not_empty.notify_one();
            }
            return Ok(());
        }
    }

    /// Whether a push on `edge` would return without waiting: its policy
    /// drops when full, it has room, or nobody consumes it any more.
    pub(crate) fn has_room(&self, edge: usize) -> bool {
        let st = self.state.lock();
        let e = &st.edges[edge];
        st.dead || e.policy != Policy::Block || e.queue.len() < e.capacity
    }

    /// A producer of `edge` has finished.
    pub(crate) fn close_edge(&self, edge: usize) {
        let mut st = self.state.lock();
        let e = &mut st.edges[edge];
        e.producers = e.producers.saturating_sub(1);
        drop(st);
        self.not_empty.notify_all();
    }

    /// Consumer side: the next control item, else the next message (round
    /// robin over edges, skipping ones older than `max_age`), else
    /// end-of-stream once every edge is closed and drained.
    pub(crate) fn pop(&self, shared: &Shared, block: bool) -> Option<Item> {
        let mut st = self.state.lock();
        let mut spins = 0u32;
        loop {
            if let Some(c) = st.control.pop_front() {
                return Some(Item::Control(c));
            }
            if shared.is_stopping() {
                return Some(Item::Stop);
            }
            let n = st.edges.len();
            let mut popped = None;
            for k in 0..n {
                let i = (st.rr + k) % n;
                let e = &mut st.edges[i];
                while let Some(m) = e.queue.pop_front() {
                    if let Some(age) = e.max_age {
                        if m.timestamp.elapsed() > age {
                            e.stats.dropped_age.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    }
                    e.stats.delivered.fetch_add(1, Ordering::Relaxed);
                    popped = Some((i, e.port, m));
                    break;
                }
                if popped.is_some() {
                    break;
                }
            }
            if let Some((i, port, m)) = popped {
                st.rr = i + 1;
                drop(st);
                self.not_full.notify_all();
                return Some(Item::Msg(port, m));
            }
            let forward = st.edges.iter().any(|e| !e.back_edge);
            if st
                .edges
                .iter()
                .filter(|e| !(forward && e.back_edge))
                .all(|e| e.producers == 0)
            {
                return Some(Item::EndOfStream);
            }
            if !block {
                return None;
            }
            // A short spin before parking: a hop that arrives within a few
            // microseconds then costs no futex wake-up.
            if spins < 2 {
                spins += 1;
                drop(st);
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                std::thread::yield_now();
                st = self.state.lock();
                continue;
            }
            st.waiting = true;
            self.not_empty.wait(&mut st);
            st.waiting = false;
        }
    }

    /// Drop queued messages of `epoch` and queue a cancel on the control lane.
    pub(crate) fn cancel(&self, epoch: Epoch, ack: &Arc<CancelAck>) -> bool {
        let mut st = self.state.lock();
        for e in st.edges.iter_mut() {
            let before = e.queue.len();
            e.queue.retain(|m| m.epoch != epoch);
            let n = (before - e.queue.len()) as u64;
            e.stats.dropped_cancel.fetch_add(n, Ordering::Relaxed);
        }
        let live = !st.dead;
        if live {
            st.control.push_back(Control::Cancel(epoch, ack.clone()));
        }
        drop(st);
        self.wake_all();
        live
    }

    /// Mark the consumer gone: acknowledge pending cancels, drop the queues
    /// (counted) and release blocked producers.
    pub(crate) fn kill(&self) {
        let mut st = self.state.lock();
        st.dead = true;
        for c in st.control.drain(..) {
            match c {
                Control::Cancel(_, ack) => ack.ack(),
            }
        }
        for e in st.edges.iter_mut() {
            let n = e.queue.len() as u64;
            e.queue.clear();
            e.stats.dropped_closed.fetch_add(n, Ordering::Relaxed);
        }
        drop(st);
        self.wake_all();
    }

    pub(crate) fn wake_all(&self) {
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    /// Sleep until `t`; false when woken by stop or a control item.
    pub(crate) fn sleep_until(&self, t: Instant, shared: &Shared) -> bool {
        let mut st = self.state.lock();
        loop {
            if shared.is_stopping() || !st.control.is_empty() {
                return false;
            }
            if Instant::now() >= t {
                return true;
            }
            st.waiting = true;
            self.not_empty.wait_until(&mut st, t);
            st.waiting = false;
        }
    }

    /// Current queue depth of each edge.
    pub(crate) fn depths(&self) -> Vec<(Arc<EdgeStats>, usize)> {
        let st = self.state.lock();
        st.edges
            .iter()
            .map(|e| (e.stats.clone(), e.queue.len()))
            .collect()
    }
}
