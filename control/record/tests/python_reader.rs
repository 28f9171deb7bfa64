//! A recording opens in PyPI `mcap` (the Foxglove ecosystem's reader), run
//! from the venv scripts/python_mcap_env.sh creates. Runs when
//! EDGEFLOW_MCAP_VENV names that venv (scripts/test.sh sets it); otherwise
//! it says so and passes.

use edgeflow_graph::{Pipeline, Registry};
use edgeflow_record::{RecordOptions, Recorder, RunInfo};
use std::path::Path;
use std::process::Command;

const YAML: &str = "name: py\nstages:\n  - { id: tick, kind: timer, params: { rate_hz: 500, count: 25 } }\n  - { id: mid, kind: passthrough }\n  - { id: sink, kind: discard }\nedges:\n  - { from: tick.out, to: mid.in }\n  - { from: mid.out, to: sink.in, policy: latest, capacity: 1 }\n";

#[test]
fn the_python_mcap_reader_opens_a_recording() {
    let Ok(venv) = std::env::var("EDGEFLOW_MCAP_VENV") else {
        eprintln!(
            "EDGEFLOW_MCAP_VENV is not set: skipped (scripts/python_mcap_env.sh makes the venv)"
        );
        return;
    };
    let python = Path::new(&venv).join("bin/python");
    assert!(
        python.exists(),
        "EDGEFLOW_MCAP_VENV={venv} has no bin/python: run scripts/python_mcap_env.sh"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("py.mcap");
    let p = Pipeline::from_yaml(YAML, &Registry::builtin()).expect("valid");
    let info = RunInfo {
        pipeline_text: YAML.into(),
        file: Some("py.yaml".into()),
        overrides: vec![],
    };
    let rec = Recorder::create(&path, p.plan(), info, RecordOptions::default()).expect("create");
    p.start_with_tap(rec.tap())
        .expect("start")
        .wait(None)
        .expect("run");
    let stats = rec.finish().expect("finish");
    // 25 ticks, each sent on both edges, unless the timer skipped ticks it
    // was too late for (it counts them towards its 25, and a loaded
    // machine makes it late): the reader must see what was recorded.
    let ticks = stats.messages / 2;
    assert!(
        stats.messages.is_multiple_of(2) && (1..=25).contains(&ticks),
        "{} messages recorded",
        stats.messages
    );

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/read_mcap.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&path)
        .output()
        .expect("run the Python reader");
    assert!(
        out.status.success(),
        "the Python reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["profile"], "edgeflow");
    assert_eq!(v["has_summary"], true);
    assert_eq!(v["statistics_messages"], stats.messages);
    assert_eq!(v["bad_seq"], 0, "{v}");
    for topic in ["tick.out->mid.in", "mid.out->sink.in"] {
        let t = &v["topics"][topic];
        assert_eq!(t["count"], ticks, "{topic}: {v}");
        assert_eq!(t["encoding"], "edgeflow-wire-v1");
        assert_eq!(t["schema"], "edgeflow.wire.v1");
        assert_eq!(t["epochs"], serde_json::json!([0]));
    }
    assert_eq!(v["attachments"]["pipeline.yaml"]["text"], YAML);
    assert_eq!(v["metadata"]["edgeflow.run"]["pipeline"], "py");
    assert_eq!(
        v["metadata"]["edgeflow.end"]["messages"],
        stats.messages.to_string()
    );
    assert!(v["metadata"]["edgeflow.params"]["tick"]
        .as_str()
        .is_some_and(|s| s.contains("\"count\":25")));
}
