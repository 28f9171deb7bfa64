//! Edge taps: an observer the executor shows every message sent on an edge
//! (a recorder writes them to a file). Nothing is called when no tap is
//! installed; the check is one branch per send.

use crate::message::{Message, Timestamp};

/// Sees every message sent on every edge of a running pipeline, on the
/// producer's thread, before the edge's policy applies (a message later
/// dropped by a full `latest` queue was still sent; the edge metrics count
/// the drops). Install one with [`crate::Pipeline::start_with_tap`].
///
/// A tap runs inside the producer's send: keep it short (clone the message,
/// which shares its payload, and hand it to another thread) and never block
/// for long, or the pipeline slows down with it.
pub trait EdgeTap: Send + Sync {
    /// `edge` is the index in [`crate::Plan::edges`]; `msg.seq` is already
    /// assigned; `at` is when it was sent.
    fn on_message(&self, edge: usize, msg: &Message, at: Timestamp);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PipelineBuilder, Registry};
    use parking_lot::Mutex;
    use std::sync::Arc;

    #[derive(Default)]
    struct Log(Mutex<Vec<(usize, u64)>>);

    impl EdgeTap for Log {
        fn on_message(&self, edge: usize, msg: &Message, _at: Timestamp) {
            self.0.lock().push((edge, msg.seq));
        }
    }

    #[test]
    fn a_tap_sees_every_message_on_every_edge_including_fan_out() {
        let p = PipelineBuilder::new("tap")
            // A lossless source: a timer skips ticks on a busy machine.
            .stage(
                "tick",
                "text",
                serde_json::json!({ "text": "a\nb\nc\nd\ne", "whole": false }),
            )
            .stage("a", "discard", serde_json::json!({}))
            .stage("b", "passthrough", serde_json::json!({}))
            .inline()
            .stage("c", "discard", serde_json::json!({}))
            .edge("tick.out", "a.in")
            .edge("tick.out", "b.in")
            .edge("b.out", "c.in")
            .build(&Registry::builtin())
            .expect("valid");
        let log = Arc::new(Log::default());
        let m = p
            .start_with_tap(log.clone())
            .expect("start")
            .wait(None)
            .expect("run");
        let log = log.0.lock();
        for edge in 0..3 {
            let seqs: Vec<u64> = log.iter().filter(|e| e.0 == edge).map(|e| e.1).collect();
            assert_eq!(seqs, vec![1, 2, 3, 4, 5], "edge {edge}");
        }
        assert_eq!(m.edges.len(), 3);
    }
}
