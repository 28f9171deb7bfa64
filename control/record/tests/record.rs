//! Record a small pipeline, read it back, inspect it, break it, replay it.

use edgeflow_graph::{EdgeTap, Event, Message, Payload, Pipeline, Registry, Timestamp};
use edgeflow_record::{
    prepare, Error, RecordOptions, Recorder, Recording, RunInfo, Speed, Summary,
};
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// 40 ticks at 200 Hz through a passthrough into two sinks (fan-out), and
/// a text line.
const YAML: &str = "name: rec\nstages:\n  - { id: tick, kind: timer, params: { rate_hz: 200, count: 40 } }\n  - { id: mid, kind: passthrough }\n  - { id: a, kind: discard }\n  - { id: b, kind: discard }\n  - { id: say, kind: text, params: { text: \"hello\\nworld\", whole: false } }\n  - { id: c, kind: discard }\nedges:\n  - { from: tick.out, to: mid.in }\n  - { from: mid.out, to: a.in }\n  - { from: mid.out, to: b.in, policy: latest, capacity: 1 }\n  - { from: say.out, to: c.in }\n";

fn record(dir: &Path, yaml: &str, opts: RecordOptions) -> (PathBuf, edgeflow_record::RecordStats) {
    let path = dir.join("run.mcap");
    let p = Pipeline::from_yaml(yaml, &Registry::builtin()).expect("valid");
    let info = RunInfo {
        pipeline_text: yaml.into(),
        file: Some("rec.yaml".into()),
        overrides: vec!["tick.count=40".into()],
    };
    let rec = Recorder::create(&path, p.plan(), info, opts).expect("create");
    let (_m, r) = p.start_with_tap(rec.tap()).expect("start").finish(None);
    r.expect("run");
    let stats = rec.finish().expect("finish");
    (path, stats)
}

#[test]
fn every_edge_is_recorded_with_seq_epoch_and_the_pipeline() {
    let dir = tempfile::tempdir().expect("tmp");
    let (path, stats) = record(dir.path(), YAML, RecordOptions::default());
    assert_eq!(stats.messages, 40 * 3 + 2, "{stats:?}");
    assert!(stats.warnings().is_empty());
    let rec = Recording::open(&path).expect("open");
    assert_eq!(rec.pipeline_text, YAML);
    assert_eq!(rec.pipeline_name(), "rec");
    assert_eq!(rec.overrides(), vec!["tick.count=40".to_string()]);
    assert!(rec
        .params
        .get("tick")
        .is_some_and(|p| p.contains("\"count\":40")));
    let topics: Vec<&str> = rec.edges.iter().map(|e| e.topic.as_str()).collect();
    assert_eq!(
        topics,
        [
            "tick.out->mid.in",
            "mid.out->a.in",
            "mid.out->b.in",
            "say.out->c.in"
        ]
    );
    for (i, n) in [(0, 40), (1, 40), (2, 40), (3, 2)] {
        let ms: Vec<_> = rec.messages.iter().filter(|m| m.edge == i).collect();
        assert_eq!(ms.len(), n, "edge {i}");
        for (k, m) in ms.iter().enumerate() {
            let w = rec.decode(m).expect("decode");
            assert_eq!(w.header.seq, k as u64 + 1);
            assert_eq!(w.header.epoch, 0);
            assert!(m.publish_time <= m.log_time, "capture before send");
        }
    }
    let texts: Vec<_> = rec
        .messages
        .iter()
        .filter(|m| m.edge == 3)
        .map(|m| rec.decode(m).expect("decode").body)
        .collect();
    assert_eq!(
        texts,
        [
            edgeflow_control::wire::Body::Text("hello".into()),
            edgeflow_control::wire::Body::Text("world".into())
        ]
    );
    rec.check_matches(YAML).expect("same pipeline");
    let s = Summary::of(&rec);
    assert_eq!(s.messages, 122);
    let tick = &s.edges[0];
    assert_eq!(tick.messages, 40);
    // 200 Hz nominal; a loaded CI machine skips late ticks, never adds.
    let rate = tick.rate_hz.expect("rate");
    assert!(rate > 50.0 && rate < 260.0, "{rate}");
    let text = s.render();
    assert!(
        text.contains("tick.out->mid.in") && text.contains("rec"),
        "{text}"
    );
}

#[test]
fn another_pipeline_version_says_what_differs() {
    let dir = tempfile::tempdir().expect("tmp");
    let (path, _) = record(dir.path(), YAML, RecordOptions::default());
    let rec = Recording::open(&path).expect("open");
    let other = YAML.replace("rate_hz: 200", "rate_hz: 100");
    let e = rec.check_matches(&other).expect_err("differs").to_string();
    assert!(e.contains("pipeline file differs"), "{e}");
    assert!(e.contains("line 3") && e.contains("rate_hz: 100"), "{e}");
}

#[test]
fn truncated_and_corrupt_files_name_the_offset_and_never_panic() {
    let dir = tempfile::tempdir().expect("tmp");
    let (path, _) = record(dir.path(), YAML, RecordOptions::default());
    let good = std::fs::read(&path).expect("read");
    let bad = dir.path().join("bad.mcap");

    // Cut in half: a truncation error with an offset, and a readable prefix.
    std::fs::write(&bad, &good[..good.len() / 2]).expect("write");
    let e = Recording::open(&bad).expect_err("truncated");
    let msg = e.to_string();
    assert!(matches!(e, Error::Truncated { .. }), "{msg}");
    assert!(
        msg.contains("truncated at byte") && msg.contains("expected"),
        "{msg}"
    );
    let part = Recording::open_partial(&bad).expect("prefix");
    assert!(part.truncated.is_some());

    // Not an MCAP file at all.
    std::fs::write(&bad, b"name: rec\nstages: []\n").expect("write");
    let msg = Recording::open(&bad).expect_err("not mcap").to_string();
    assert!(
        msg.contains("corrupt at byte 0") && msg.contains("MCAP magic"),
        "{msg}"
    );

    // A flipped byte inside the data: a CRC or parse error at an offset.
    let mut flipped = good.clone();
    let mid = good.len() / 3;
    flipped[mid] ^= 0xFF;
    std::fs::write(&bad, &flipped).expect("write");
    if let Err(e) = Recording::open(&bad) {
        let msg = e.to_string();
        assert!(msg.contains("at byte"), "{msg}");
    }

    // Every cut and many flips: errors or successes, never a panic.
    for cut in (0..good.len()).step_by(97) {
        std::fs::write(&bad, &good[..cut]).expect("write");
        match Recording::open(&bad) {
            Err(Error::Truncated { offset, .. }) => assert!(offset <= cut as u64),
            Err(Error::Corrupt { .. }) => {}
            other => panic!("cut at {cut}: {other:?}"),
        }
        let _ = Recording::open_partial(&bad);
    }
    for at in (0..good.len()).step_by(53) {
        let mut f = good.clone();
        f[at] = f[at].wrapping_add(0x5A);
        std::fs::write(&bad, &f).expect("write");
        if let Ok(r) = Recording::open(&bad) {
            for m in &r.messages {
                let _ = r.decode(m);
            }
        }
    }
}

#[test]
fn the_size_limit_stops_with_a_warning_or_rotates() {
    let dir = tempfile::tempdir().expect("tmp");
    let small = RecordOptions {
        max_bytes: 4000,
        ..Default::default()
    };
    let (path, stats) = record(dir.path(), YAML, small.clone());
    assert!(stats.stopped_at_limit, "{stats:?}");
    assert!(stats.dropped_after_limit > 0);
    assert!(
        stats.messages + stats.dropped_after_limit == 122,
        "{stats:?}"
    );
    assert!(stats.warnings()[0].contains("size limit"));
    let rec = Recording::open(&path).expect("finalised");
    assert_eq!(rec.messages.len() as u64, stats.messages);
    assert!(Summary::of(&rec).render().contains("size limit"));

    let dir = tempfile::tempdir().expect("tmp");
    let (_, stats) = record(
        dir.path(),
        YAML,
        RecordOptions {
            rotate: 100,
            ..small
        },
    );
    assert!(!stats.stopped_at_limit, "{stats:?}");
    assert!(stats.files.len() >= 2, "{stats:?}");
    let mut total = 0;
    for f in &stats.files {
        let r = Recording::open(f).expect("each part is a whole recording");
        assert_eq!(r.pipeline_text, YAML);
        total += r.messages.len();
    }
    assert_eq!(total, 122);
    assert!(stats.files[1].ends_with("run.1.mcap"), "{:?}", stats.files);
}

/// Collects (edge, epoch, seq, body bytes) of what a run sends.
#[derive(Default)]
struct Collect(Mutex<Vec<(usize, u64, u64, String)>>);

impl EdgeTap for Collect {
    fn on_message(&self, edge: usize, msg: &Message, _at: Timestamp) {
        self.0
            .lock()
            .push((edge, msg.epoch, msg.seq, describe(&msg.payload)));
    }
}

/// A payload as text, a tick by its index only: its `due` time goes
/// through the wire's clock conversion (monotonic ns <-> engine clock),
/// which is exact only to the conversion's own jitter.
fn describe(p: &Payload) -> String {
    match p.as_event() {
        Some(Event::Tick { index, .. }) => format!("tick {index}"),
        _ => format!("{p:?}"),
    }
}

#[test]
fn a_stubbed_stage_replays_its_recorded_outputs_in_order() {
    let dir = tempfile::tempdir().expect("tmp");
    let (path, _) = record(dir.path(), YAML, RecordOptions::default());
    let rec = Recording::open(&path).expect("open");
    let reg = Registry::builtin();
    for speed in [Speed::Max, Speed::Factor(4.0)] {
        let r = prepare(
            &rec,
            &reg,
            &["mid".into(), "say".into()],
            &[],
            speed,
            Path::new("."),
        )
        .expect("prepare");
        assert_eq!(r.stubbed, [("mid".to_string(), 40), ("say".to_string(), 2)]);
        let seen = Arc::new(Collect::default());
        let t = std::time::Instant::now();
        r.pipeline
            .start_with_tap(seen.clone())
            .expect("start")
            .wait(Some(std::time::Duration::from_secs(20)))
            .expect("replay");
        let seen = seen.0.lock();
        // Edge 1 (mid.out->a.in) carries exactly the recorded ticks.
        let got: Vec<_> = seen
            .iter()
            .filter(|m| m.0 == 1)
            .map(|m| m.3.clone())
            .collect();
        let want: Vec<_> = rec
            .messages
            .iter()
            .filter(|m| m.edge == 1)
            .map(|m| {
                let w = rec.decode(m).expect("decode");
                describe(&edgeflow_control::zenoh_io::body_to_payload(w.body).expect("payload"))
            })
            .collect();
        assert_eq!(got, want, "{speed:?}");
        let says: Vec<_> = seen
            .iter()
            .filter(|m| m.0 == 3)
            .map(|m| m.3.clone())
            .collect();
        assert_eq!(says, ["Text(\"hello\")", "Text(\"world\")"]);
        if speed == Speed::Factor(4.0) {
            // 40 ticks at 200 Hz = 195 ms recorded; at 4x about 49 ms.
            assert!(t.elapsed().as_millis() >= 40, "{:?}", t.elapsed());
        }
    }
    let e = prepare(
        &rec,
        &reg,
        &["nope".into()],
        &[],
        Speed::Max,
        Path::new("."),
    )
    .expect_err("unknown stage")
    .to_string();
    assert!(
        e.contains("no stage `nope`") && e.contains("tick, mid"),
        "{e}"
    );
    let e = prepare(
        &rec,
        &reg,
        &[],
        &["nada".into()],
        Speed::Max,
        Path::new("."),
    )
    .expect_err("unknown stage")
    .to_string();
    assert!(e.contains("--live nada") && e.contains("no stage"), "{e}");
}
