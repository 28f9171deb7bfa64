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
//!   (backpressure) and the receiver's queue never overflows (lossless). The
//!   sender also waits while the receiving part is absent (its liveliness
//!   token gone), so nothing is sent into the void at start-up or while a
//!   part restarts; messages in flight when it vanished are counted as lost.
//!
//! Both sides speak the wire format's `control` kind (control/WIRE.md), so
//! another zenoh program can join an edge.

use crate::error::{Error, Result};
use crate::session::SharedSession;
use crate::wire::{self, Body, Header, Kind};
use edgeflow_graph::Event;
use parking_lot::{Condvar, Mutex};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
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

/// Publish the end of stream of `key` after `sent` messages.
pub(crate) fn send_eos(session: &SharedSession, key: &str, sent: u64) -> Result<()> {
    let bytes = event_bytes("end_of_stream", "sent", sent)?;
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

    fn send(&self, seq: u64) -> Result<()> {
        let bytes = event_bytes("ack", "seq", seq)?;
        self.publisher
            .put(bytes)
            .wait()
            .map_err(|e| Error::Zenoh(format!("acknowledgement: {e}")))
    }
}

#[derive(Debug, Default)]
struct WinState {
    /// Link sequence number of the last message sent (1-based).
    sent: u64,
    /// Highest sequence number the receiver has delivered.
    acked: u64,
    /// Receiving parts present (liveliness tokens seen).
    present: usize,
    /// Messages given up when the receiver vanished with them in flight.
    lost: u64,
}

/// The sender's side of a credit window.
pub(crate) struct Window {
    size: u64,
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
                    let mut w = m.lock();
                    // A restarted sender counts from 1 again: take the
                    // newest acknowledgement as it is, not the maximum.
                    w.acked = seq.min(w.sent);
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
                                // A (re)joined receiver starts afresh.
                                st.acked = st.sent;
                            } else {
                                st.present = st.present.saturating_sub(1);
                                let in_flight = st.sent - st.acked.min(st.sent);
                                st.lost += in_flight;
                                st.acked = st.sent;
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
            st,
            watched: watch.is_some(),
            _acks: acks,
            _watch: watch_sub,
        })
    }

    /// Wait for room (and, when watched, for the receiver to be present),
    /// then take the next link sequence number. `None` when `stop()` said
    /// to give up.
    pub(crate) fn acquire(&self, stop: impl Fn() -> bool) -> Option<u64> {
        let (m, cv) = &*self.st;
        let mut w = m.lock();
        loop {
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

    /// Wait until every message sent is acknowledged, or `timeout`.
    pub(crate) fn drain(&self, timeout: Duration, stop: impl Fn() -> bool) -> bool {
        let end = Instant::now() + timeout;
        let (m, cv) = &*self.st;
        let mut w = m.lock();
        while w.acked < w.sent {
            if stop() || Instant::now() >= end {
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

    /// Messages lost in flight when a receiver vanished.
    pub(crate) fn lost(&self) -> u64 {
        self.st.0.lock().lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_other_names_are_ignored() {
        let b = event_bytes("ack", "seq", 42).expect("encode");
        assert_eq!(event_number(&b, "ack", "seq"), Some(42));
        assert_eq!(event_number(&b, "end_of_stream", "sent"), None);
        assert_eq!(event_number(b"garbage", "ack", "seq"), None);
    }
}
