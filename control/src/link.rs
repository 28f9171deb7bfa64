//! What an edge between two parts needs beyond a plain publication:
//!
//! - **end of stream**: when its input ends, the sender publishes an
//!   `end_of_stream` event (with the number of messages it sent) on
//!   `<key>/eos`; a receiver with `eos: true` ends its stream once it has
//!   delivered what came before it, so a finite split pipeline ends in every
//!   part;
//! - **a credit window** for `block` edges: the receiver acknowledges each
//!   message it has delivered into its pipeline on `<key>/ack` (the link
//!   sequence number), and the sender keeps at most `window` messages
//!   unacknowledged. A slow consumer thus stalls the producer across hosts
//!   (backpressure) and the receiver's queue never overflows. The sender
//!   also waits while the receiving part is absent (its liveliness token
//!   gone), so nothing is sent into the void at start-up or while a part
//!   restarts;
//! - **retransmission**, so a `block` edge is lossless across a lost link:
//!   the sender keeps what is unacknowledged and sends it again when the
//!   receiving part comes back or no acknowledgement came for a while
//!   (1 s, doubling to 8 s); every message carries the sender's instance
//!   (a zenoh attachment, [`instance_attachment`]) and the receiver drops
//!   a sequence number it already took from that instance, acknowledging
//!   again. The windowed end of stream takes the next sequence number and
//!   is acknowledged and resent the same way, so it cannot be lost either.
//!
//! Both sides speak the wire format's `control` kind (control/WIRE.md), so
//! another zenoh program can join an edge.

use crate::error::{Error, Result};
use crate::session::SharedSession;
use crate::wire::{self, Body, Header, Kind};
use edgeflow_graph::Event;
use parking_lot::{Condvar, Mutex, MutexGuard};
use serde_json::json;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zenoh::bytes::ZBytes;
use zenoh::sample::SampleKind;
use zenoh::Wait;

/// The key of an edge's end-of-stream events.
pub fn eos_key(key: &str) -> String {
    format!("{key}/eos")
}

/// The key of an edge's acknowledgements.
pub fn ack_key(key: &str) -> String {
    format!("{key}/ack")
}

/// A `control` wire message carrying the named event `name` with `value`.
pub(crate) fn event_json(name: &str, value: serde_json::Value) -> Result<Vec<u8>> {
    Ok(wire::encode(
        &Header {
            epoch: 0,
            seq: 0,
            capture_ns: wire::mono_ns(),
            deadline_ns: None,
        },
        &Body::Event(Event::Named(name.into(), value)),
    )?)
}

/// The value of a `control` wire message carrying the named event `name`.
pub(crate) fn decode_event(bytes: &[u8], name: &str) -> Option<serde_json::Value> {
    let m = wire::decode_kind(bytes, Kind::Event).ok()?;
    match m.body {
        Body::Event(Event::Named(n, v)) if n == name => Some(v),
        _ => None,
    }
}

/// A `control` wire message carrying `name` {`field`: n}.
fn event_bytes(name: &str, field: &str, n: u64) -> Result<Vec<u8>> {
    event_json(name, json!({ field: n }))
}

/// The number in a `control` wire message `name` {`field`: n}.
pub(crate) fn event_number(bytes: &[u8], name: &str, field: &str) -> Option<u64> {
    decode_event(bytes, name)?[field].as_u64()
}

/// The end-of-stream event after `sent` messages.
pub(crate) fn eos_bytes(sent: u64) -> Result<Vec<u8>> {
    event_bytes("end_of_stream", "sent", sent)
}

/// Publish the end of stream of `key` after `sent` messages.
pub(crate) fn send_eos(session: &SharedSession, key: &str, sent: u64) -> Result<()> {
    put_eos(session, key, eos_bytes(sent)?)
}

/// Publish end-of-stream event `bytes` ([`eos_bytes`]) for `key`.
pub(crate) fn put_eos(session: &SharedSession, key: &str, bytes: impl Into<ZBytes>) -> Result<()> {
    session
        .session()
        .put(eos_key(key), bytes)
        .congestion_control(zenoh::qos::CongestionControl::Block)
        .wait()
        .map_err(|e| Error::Zenoh(format!("end of stream on `{key}`: {e}")))
}

/// The receiver's acknowledgements, one for every `every` messages
/// delivered (acknowledgements are cumulative), the rest when the stream
/// pauses ([`Acker::flush`]).
pub(crate) struct Acker {
    publisher: zenoh::pubsub::Publisher<'static>,
    every: u64,
    /// (last delivered, last acknowledged) link sequence numbers.
    st: Mutex<(u64, u64)>,
}

impl Acker {
    /// Acknowledge on `<key>/ack`, at least every `every` messages.
    pub(crate) fn open(session: &SharedSession, key: &str, every: u64) -> Result<Acker> {
        // Acknowledgements may be sent from zenoh's receive callback (see
        // `zenoh_sub`): above the data priority, they have a transmit
        // queue of their own and never wait behind a full one of data.
        let publisher = session
            .session()
            .declare_publisher(ack_key(key))
            .congestion_control(zenoh::qos::CongestionControl::Block)
            .priority(zenoh::qos::Priority::InteractiveHigh)
            .express(true)
            .wait()
            .map_err(|e| Error::Zenoh(format!("acknowledgements for `{key}`: {e}")))?;
        Ok(Acker {
            publisher,
            every: every.max(1),
            st: Mutex::new((0, 0)),
        })
    }

    /// Everything up to link sequence number `seq` has been delivered:
    /// acknowledged now when `every` messages are unacknowledged (or the
    /// sender restarted its numbering), else at the next [`Self::flush`].
    pub(crate) fn ack(&self, seq: u64) -> Result<()> {
        let mut st = self.st.lock();
        st.0 = seq;
        if seq < st.1 || seq - st.1 >= self.every {
            st.1 = seq;
            // Sent under the lock: acknowledgements leave in order.
            self.send(seq)?;
        }
        Ok(())
    }

    /// Acknowledge whatever was delivered and not acknowledged yet.
    pub(crate) fn flush(&self) -> Result<()> {
        let mut st = self.st.lock();
        if st.0 != st.1 {
            st.1 = st.0;
            self.send(st.0)?;
        }
        Ok(())
    }

    /// Acknowledge `seq` at once (an end of stream, which ends delivery).
    pub(crate) fn ack_now(&self, seq: u64) -> Result<()> {
        let mut st = self.st.lock();
        st.0 = seq;
        st.1 = seq;
        self.send(seq)
    }

    /// A duplicate arrived: the sender missed an acknowledgement (a lost
    /// link); send the last one again.
    pub(crate) fn reack(&self) -> Result<()> {
        let st = self.st.lock();
        if st.0 == 0 {
            return Ok(());
        }
        self.send(st.0)
    }

    /// A new sender instance: its numbering starts afresh.
    pub(crate) fn restart(&self) {
        *self.st.lock() = (0, 0);
    }

    fn send(&self, seq: u64) -> Result<()> {
        let bytes = event_bytes("ack", "seq", seq)?;
        self.publisher
            .put(bytes)
            .wait()
            .map_err(|e| Error::Zenoh(format!("acknowledgement: {e}")))
    }
}

/// Where a kept message goes when it is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The edge's data key.
    Data,
    /// Its end-of-stream key.
    Eos,
}

/// First wait for an acknowledgement before the unacknowledged messages
/// are sent again; it doubles up to [`RETRANSMIT_MAX`] while none comes.
const RETRANSMIT: Duration = Duration::from_secs(1);
const RETRANSMIT_MAX: Duration = Duration::from_secs(8);

#[derive(Debug)]
struct WinState {
    /// Link sequence number of the last message sent (1-based).
    sent: u64,
    /// Highest sequence number the receiver has delivered.
    acked: u64,
    /// Receiving parts present (liveliness tokens seen).
    present: usize,
    /// The messages sent and not acknowledged yet, oldest first, kept to
    /// be sent again.
    /// (The bytes are shared, not copied.)
    kept: VecDeque<(u64, Route, ZBytes)>,
    /// A receiver (re)appeared: send what is kept again.
    rejoined: bool,
    /// When the window last moved (an acknowledgement, or a first message
    /// into an empty window), and the wait before sending again.
    progress: Instant,
    retransmit: Duration,
    /// Messages sent again so far.
    resent: u64,
}

impl Default for WinState {
    fn default() -> Self {
        WinState {
            sent: 0,
            acked: 0,
            present: 0,
            kept: VecDeque::new(),
            rejoined: false,
            progress: Instant::now(),
            retransmit: RETRANSMIT,
            resent: 0,
        }
    }
}

impl WinState {
    /// The receiver has everything up to `seq`: drop what it acknowledged.
    fn acknowledge(&mut self, seq: u64) {
        // A receiver that restarted acknowledges from 1 again: take the
        // newest acknowledgement as it is, not the maximum.
        let seq = seq.min(self.sent);
        if seq != self.acked {
            self.progress = Instant::now();
            self.retransmit = RETRANSMIT;
        }
        self.acked = seq;
        while self.kept.front().is_some_and(|(s, _, _)| *s <= seq) {
            self.kept.pop_front();
        }
    }

    /// What to send again now: everything kept when a receiver came back,
    /// or when no acknowledgement came for the retransmit wait.
    fn due(&mut self, watched: bool) -> Vec<(Route, ZBytes)> {
        if self.kept.is_empty() {
            self.rejoined = false;
            return Vec::new();
        }
        if watched && self.present == 0 {
            return Vec::new();
        }
        let overdue = self.progress.elapsed() >= self.retransmit;
        if !self.rejoined && !overdue {
            return Vec::new();
        }
        if overdue {
            self.retransmit = (self.retransmit * 2).min(RETRANSMIT_MAX);
        }
        self.rejoined = false;
        self.progress = Instant::now();
        self.resent += self.kept.len() as u64;
        self.kept.iter().map(|(_, r, b)| (*r, b.clone())).collect()
    }
}

/// The sender's side of a credit window. It keeps each message until the
/// receiver acknowledges it and sends the kept ones again when the
/// receiving part comes back (a dropped link, a restart) or no
/// acknowledgement came for a while; the receiver drops the duplicates by
/// link sequence number within this sender's instance (see
/// [`instance_of`]), so the edge is lossless across a lost link.
pub(crate) struct Window {
    size: u64,
    /// This sender's instance, attached to every message it publishes.
    /// (Built once: every put shares it.)
    attachment: ZBytes,
    st: Arc<(Mutex<WinState>, Condvar)>,
    watched: bool,
    _acks: zenoh::pubsub::Subscriber<()>,
    _watch: Option<zenoh::pubsub::Subscriber<()>>,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window").field("size", &self.size).finish()
    }
}

/// The attachment that names a windowed sender's instance: `efl1` and the
/// instance as 8 little-endian bytes.
const INSTANCE_TAG: &[u8; 4] = b"efl1";

/// A sender instance number no other sender (this process's others, a
/// restarted process) is likely to share: std's randomly keyed hasher
/// over the process, the time and a counter.
fn new_instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(wire::mono_ns());
    h.write_u64(COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish()
}

/// The attachment of a `latest` edge's newest message sent again when a
/// subscriber appears: a receiver that took it already drops it.
pub(crate) const AGAIN: &[u8; 4] = b"efla";

/// The attachment bytes for sender instance `instance`.
pub(crate) fn instance_attachment(instance: u64) -> Vec<u8> {
    let mut a = INSTANCE_TAG.to_vec();
    a.extend_from_slice(&instance.to_le_bytes());
    a
}

/// The sender instance a message's attachment names, if it names one.
pub(crate) fn instance_of(attachment: Option<&[u8]>) -> Option<u64> {
    let a = attachment?;
    if a.len() != 12 || &a[..4] != INSTANCE_TAG {
        return None;
    }
    Some(u64::from_le_bytes(a[4..].try_into().ok()?))
}

impl Window {
    /// A window of `size` messages on `key`; with `watch`, the receiving
    /// part's liveliness key expression (the sender waits while it is gone).
    pub(crate) fn open(
        session: &SharedSession,
        key: &str,
        size: u64,
        watch: Option<&str>,
    ) -> Result<Window> {
        let st: Arc<(Mutex<WinState>, Condvar)> = Arc::default();
        let s2 = st.clone();
        let acks = session
            .session()
            .declare_subscriber(ack_key(key))
            .callback(move |sample| {
                if let Some(seq) = event_number(&sample.payload().to_bytes(), "ack", "seq") {
                    let (m, cv) = &*s2;
                    m.lock().acknowledge(seq);
                    cv.notify_all();
                }
            })
            .wait()
            .map_err(|e| Error::Zenoh(format!("acknowledgements for `{key}`: {e}")))?;
        let watch_sub = match watch {
            None => None,
            Some(w) => {
                let s3 = st.clone();
                Some(
                    session
                        .session()
                        .liveliness()
                        .declare_subscriber(w.to_string())
                        .history(true)
                        .callback(move |s| {
                            let (m, cv) = &*s3;
                            let mut st = m.lock();
                            if s.kind() == SampleKind::Put {
                                st.present += 1;
                                st.rejoined = true;
                            } else {
                                st.present = st.present.saturating_sub(1);
                            }
                            cv.notify_all();
                        })
                        .wait()
                        .map_err(|e| Error::Zenoh(format!("watching `{w}`: {e}")))?,
                )
            }
        };
        Ok(Window {
            size: size.max(1),
            attachment: ZBytes::from(instance_attachment(new_instance())),
            st,
            watched: watch.is_some(),
            _acks: acks,
            _watch: watch_sub,
        })
    }

    /// The attachment every message of this sender carries.
    pub(crate) fn attachment(&self) -> ZBytes {
        self.attachment.clone()
    }

    /// Wait for room (and, when watched, for the receiver to be present),
    /// then take the next link sequence number; meanwhile `resend` is
    /// handed each kept message that is due again. `None` when `stop()`
    /// said to give up.
    pub(crate) fn acquire(
        &self,
        stop: impl Fn() -> bool,
        mut resend: impl FnMut(Route, &ZBytes),
    ) -> Option<u64> {
        let (m, cv) = &*self.st;
        let mut w = m.lock();
        loop {
            if self.resend_due(&mut w, &mut resend) {
                continue;
            }
            let room = w.sent - w.acked.min(w.sent) < self.size;
            if room && (!self.watched || w.present > 0) {
                w.sent += 1;
                return Some(w.sent);
            }
            if stop() {
                return None;
            }
            cv.wait_for(&mut w, Duration::from_millis(50));
        }
    }

    /// Hand each kept message that is due again to `resend`, with the
    /// lock released; true when there was any.
    fn resend_due(
        &self,
        w: &mut MutexGuard<'_, WinState>,
        resend: &mut impl FnMut(Route, &ZBytes),
    ) -> bool {
        let due = w.due(self.watched);
        if due.is_empty() {
            return false;
        }
        MutexGuard::unlocked(w, || {
            for (r, b) in &due {
                resend(*r, b);
            }
        });
        true
    }

    /// Keep message `seq` (taken with [`Self::acquire`]) until the
    /// receiver acknowledges it.
    pub(crate) fn keep(&self, seq: u64, route: Route, bytes: ZBytes) {
        let mut w = self.st.0.lock();
        if seq <= w.acked {
            return;
        }
        if w.kept.is_empty() {
            w.progress = Instant::now();
        }
        w.kept.push_back((seq, route, bytes));
    }

    /// Wait until every message sent is acknowledged, sending kept ones
    /// again as [`Self::acquire`] does. Gives up (false) when `stop()`
    /// says so or after `timeout` without the receiver: when watched, of
    /// its part's continuous absence (a present receiver that is slow is
    /// waited for, as backpressure); else `timeout` in all.
    pub(crate) fn drain(
        &self,
        timeout: Duration,
        stop: impl Fn() -> bool,
        mut resend: impl FnMut(Route, &ZBytes),
    ) -> bool {
        let mut since = Instant::now();
        let (m, cv) = &*self.st;
        let mut w = m.lock();
        while w.acked < w.sent {
            if self.resend_due(&mut w, &mut resend) {
                continue;
            }
            if self.watched && w.present > 0 {
                since = Instant::now();
            }
            if stop() || since.elapsed() >= timeout {
                return false;
            }
            cv.wait_for(&mut w, Duration::from_millis(20));
        }
        true
    }

    /// Messages sent so far.
    pub(crate) fn sent(&self) -> u64 {
        self.st.0.lock().sent
    }

    /// Messages sent but not acknowledged yet.
    pub(crate) fn unacked(&self) -> u64 {
        let w = self.st.0.lock();
        w.sent - w.acked.min(w.sent)
    }

    /// Messages sent again so far (after a lost link, a restarted
    /// receiver or a missing acknowledgement).
    pub(crate) fn resent(&self) -> u64 {
        self.st.0.lock().resent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_attachment_round_trips_and_anything_else_names_none() {
        let a = instance_attachment(0x0123_4567_89ab_cdef);
        assert_eq!(instance_of(Some(&a)), Some(0x0123_4567_89ab_cdef));
        assert_eq!(instance_of(None), None);
        assert_eq!(instance_of(Some(b"efl1")), None);
        assert_eq!(instance_of(Some(b"xxxx12345678")), None);
        assert_ne!(new_instance(), new_instance());
    }

    fn window_with(kept: &[u64]) -> WinState {
        let mut w = WinState {
            present: 1,
            ..WinState::default()
        };
        for &s in kept {
            w.sent = s;
            w.kept
                .push_back((s, Route::Data, ZBytes::from(vec![s as u8])));
        }
        w
    }

    #[test]
    fn acknowledgements_release_what_is_kept_and_a_returning_receiver_gets_the_rest_again() {
        let mut w = window_with(&[1, 2, 3, 4]);
        w.acknowledge(2);
        assert_eq!(w.acked, 2);
        assert_eq!(w.kept.iter().map(|k| k.0).collect::<Vec<_>>(), [3, 4]);
        // Nothing is due while acknowledgements keep coming.
        assert!(w.due(true).is_empty());
        // The receiver went and came back: 3 and 4 again, once.
        w.present = 0;
        w.rejoined = true;
        assert!(w.due(true).is_empty(), "nothing is sent while it is away");
        w.present = 1;
        let again: Vec<u8> = w
            .due(true)
            .into_iter()
            .map(|(_, b)| b.to_bytes()[0])
            .collect();
        assert_eq!(again, [3, 4]);
        assert!(w.due(true).is_empty());
        assert_eq!(w.resent, 2);
        // An acknowledgement past what was sent is clamped.
        w.acknowledge(99);
        assert_eq!((w.acked, w.kept.len()), (4, 0));
    }

    #[test]
    fn without_acknowledgements_what_is_kept_is_sent_again_with_a_growing_wait() {
        let mut w = window_with(&[1]);
        w.progress = Instant::now() - RETRANSMIT;
        assert_eq!(w.due(true).len(), 1);
        assert_eq!(w.retransmit, RETRANSMIT * 2);
        assert!(w.due(true).is_empty(), "the wait starts again");
        for _ in 0..5 {
            w.progress = Instant::now() - RETRANSMIT_MAX;
            assert_eq!(w.due(true).len(), 1);
        }
        assert_eq!(w.retransmit, RETRANSMIT_MAX);
        // Progress resets the wait.
        w.sent = 2;
        w.acknowledge(1);
        assert_eq!(w.retransmit, RETRANSMIT);
    }

    #[test]
    fn events_round_trip_and_other_names_are_ignored() {
        let b = event_bytes("ack", "seq", 42).expect("encode");
        assert_eq!(event_number(&b, "ack", "seq"), Some(42));
        assert_eq!(event_number(&b, "end_of_stream", "sent"), None);
        assert_eq!(event_number(b"garbage", "ack", "seq"), None);
    }
}
