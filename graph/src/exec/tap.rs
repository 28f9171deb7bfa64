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

    /// A stage's journal entry: what the stage applied and when, beyond
    /// the messages on its edges (a controller journals its ticks and the
    /// order it applied its inputs in, so a replay reproduces its outputs
    /// bit for bit). `entry` is encoded by the stage; called on the
    /// journaling thread, in the stage's order. Ignored by default.
    fn on_journal(&self, stage: &str, entry: &[u8], at: Timestamp) {
        let _ = (stage, entry, at);
    }

    /// Whether this tap keeps journals ([`Self::on_journal`]); stages skip
    /// encoding entries when no installed tap does.
    fn wants_journal(&self) -> bool {
        false
    }
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

    /// A stage that journals the length of every text it passes on.
    struct Journaling;

    impl crate::Stage for Journaling {
        fn process(
            &mut self,
            input: crate::Input,
            ctx: &mut crate::StageCtx,
        ) -> crate::StageResult {
            let h = ctx.handle();
            if h.journaling() {
                let n = input.msg.payload.as_text().map_or(0, str::len) as u8;
                h.journal(&[n]);
            }
            Ok(())
        }
    }

    struct JournalingKind;

    impl crate::StageFactory for JournalingKind {
        fn info(&self) -> crate::StageInfo {
            crate::StageInfo {
                kind: "journaling",
                doc: "test",
                params: vec![],
                ports: crate::Ports {
                    inputs: vec![crate::PortSpec::new("in", crate::PortType::Text, "text")],
                    outputs: vec![],
                },
                source: false,
            }
        }

        fn build(
            &self,
            _p: &crate::Params,
            _env: &crate::BuildEnv,
        ) -> crate::StageResult<Box<dyn crate::Stage>> {
            Ok(Box::new(Journaling))
        }
    }

    #[derive(Default)]
    struct Journals {
        wants: bool,
        seen: Mutex<Vec<(String, Vec<u8>)>>,
    }

    impl EdgeTap for Journals {
        fn on_message(&self, _edge: usize, _msg: &Message, _at: Timestamp) {}
        fn on_journal(&self, stage: &str, entry: &[u8], _at: Timestamp) {
            self.seen.lock().push((stage.to_string(), entry.to_vec()));
        }
        fn wants_journal(&self) -> bool {
            self.wants
        }
    }

    #[test]
    fn journal_entries_reach_a_tap_that_wants_them_in_order() {
        let mut r = Registry::builtin();
        r.register(JournalingKind);
        let build = || {
            PipelineBuilder::new("journal")
                .stage(
                    "t",
                    "text",
                    serde_json::json!({ "text": "a\nbb\nccc", "whole": false }),
                )
                .stage("j", "journaling", serde_json::json!({}))
                .edge("t.out", "j.in")
                .build(&r)
                .expect("valid")
        };
        for wants in [true, false] {
            let tap = Arc::new(Journals {
                wants,
                ..Default::default()
            });
            build()
                .start_with_tap(tap.clone())
                .expect("start")
                .wait(None)
                .expect("run");
            let seen = tap.seen.lock().clone();
            if wants {
                let want: Vec<(String, Vec<u8>)> =
                    (1..=3).map(|n| ("j".to_string(), vec![n])).collect();
                assert_eq!(seen, want);
            } else {
                assert!(seen.is_empty(), "{seen:?}");
            }
        }
        // No tap at all: nothing journals, nothing fails.
        build().start().expect("start").wait(None).expect("run");
    }
}
