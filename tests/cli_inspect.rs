//! `edgeflow graph`, `edgeflow stages` and `edgeflow schema`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn edgeflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("failed to start the edgeflow binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A timer feeding a passthrough that loops back to itself through a
/// declared back-edge.
const LOOP: &str = "name: loop\nstages:\n  - { id: tick, kind: timer, params: { count: 3 } }\n  - { id: gate, kind: passthrough }\n  - { id: echo, kind: passthrough, device: cpu }\n  - { id: sink, kind: stdout }\nedges:\n  - { from: tick, to: gate }\n  - { from: gate, to: echo, capacity: 2, policy: latest }\n  - { from: echo, to: sink }\n  - { from: echo, to: gate, back_edge: true, policy: drop_oldest, capacity: 1 }\n";

fn loop_file(dir: &tempfile::TempDir) -> PathBuf {
    let p = dir.path().join("loop.yaml");
    std::fs::write(&p, LOOP).expect("write");
    p
}

#[test]
fn graph_as_dot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = loop_file(&dir);
    let out = edgeflow(&["graph", p.to_str().expect("path")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dot = text(&out.stdout);
    assert!(dot.starts_with("digraph \"loop\" {"), "{dot}");
    assert!(
        dot.contains("\"tick\" [label=\"tick\\ntimer · cpu\""),
        "{dot}"
    );
    assert!(
        dot.contains("\"gate\" -> \"echo\" [label=\"out → in\\nlatest, 2\"];"),
        "{dot}"
    );
    let back = dot
        .lines()
        .find(|l| l.contains("\"echo\" -> \"gate\""))
        .expect("back-edge");
    assert!(
        back.contains("style=dashed") && back.contains("drop_oldest, 1"),
        "{back}"
    );
    assert_eq!(dot.matches("style=dashed").count(), 1, "{dot}");
    assert!(dot.trim_end().ends_with('}'));
}

#[test]
fn graph_as_mermaid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = loop_file(&dir);
    let out = edgeflow(&["graph", p.to_str().expect("path"), "--format", "mermaid"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let m = text(&out.stdout);
    assert!(m.starts_with("flowchart LR\n"), "{m}");
    assert!(m.contains("s1[\"gate<br/>passthrough · cpu\"]"), "{m}");
    assert!(m.contains("s1 -->|\"out → in<br/>latest, 2\"| s2"), "{m}");
    assert!(
        m.contains("s2 -.->|\"out → in<br/>drop_oldest, 1, back-edge\"| s1"),
        "{m}"
    );
}

#[test]
fn graph_of_an_invalid_file_fails_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("bad.yaml");
    std::fs::write(&p, LOOP.replace(", back_edge: true", "")).expect("write");
    let out = edgeflow(&["graph", p.to_str().expect("path"), "--format", "dot"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).is_empty());
    assert!(text(&out.stderr).contains("cycle"), "{}", text(&out.stderr));
    let out = edgeflow(&["graph", p.to_str().expect("path"), "--format", "png"]);
    assert!(!out.status.success());
}

#[test]
fn stages_lists_every_kind_with_ports_and_params() {
    let out = edgeflow(&["stages"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    for kind in [
        "timer (source):",
        "stdout:",
        "passthrough:",
        "host_in (source):",
    ] {
        assert!(t.contains(kind), "{kind} in {t}");
    }
    assert!(t.contains("rate_hz") && t.contains("default 10.0"), "{t}");
    let out = edgeflow(&["stages", "timer"]);
    let t = text(&out.stdout);
    assert!(t.starts_with("timer (source):"), "{t}");
    assert!(t.contains("outputs:\n    out "), "{t}");
    assert!(!t.contains("stdout:"), "{t}");
}

#[test]
fn stages_as_json() {
    let out = edgeflow(&["stages", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let kinds = v.as_array().expect("a list");
    let timer = kinds.iter().find(|k| k["kind"] == "timer").expect("timer");
    assert_eq!(timer["source"], true);
    assert_eq!(timer["outputs"][0]["name"], "out");
    assert_eq!(timer["outputs"][0]["type"], "control");
    let rate = timer["params"]
        .as_array()
        .expect("params")
        .iter()
        .find(|p| p["name"] == "rate_hz")
        .expect("rate_hz");
    assert_eq!(rate["type"], "float");
    assert_eq!(rate["default"], 10.0);
    assert_eq!(rate["required"], false);
    assert!(rate["doc"].as_str().is_some_and(|d| !d.is_empty()));
    for k in kinds {
        for key in ["kind", "doc", "inputs", "outputs", "params"] {
            assert!(k.get(key).is_some(), "{key} in {k}");
        }
    }
    let one = edgeflow(&["stages", "stdout", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&one.stdout).expect("json");
    assert_eq!(v.as_array().map(Vec::len), Some(1));
}

#[test]
fn unknown_stage_kind_fails() {
    let out = edgeflow(&["stages", "no_such_kind"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("no stage kind `no_such_kind`") && err.contains("timer"),
        "{err}"
    );
}

#[test]
fn schema_matches_the_committed_file() {
    let out = edgeflow(&["schema"]);
    assert!(out.status.success());
    let committed =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("schema.json"))
            .expect("pipelines/schema.json is committed");
    assert!(
        text(&out.stdout) == committed,
        "pipelines/schema.json is stale: run `cargo run -p edgeflow -- schema > pipelines/schema.json`"
    );
    let v: serde_json::Value = serde_json::from_str(&committed).expect("json");
    assert_eq!(v["title"], "PipelineSpec");
    assert_eq!(v["additionalProperties"], false);
}

/// `edgeflow devices` prints its table and nothing from the graphics stack,
/// even with no desktop session (no `XDG_RUNTIME_DIR`, as on a server).
#[test]
fn devices_prints_no_graphics_stack_warnings() {
    let out = Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .arg("devices")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("WAYLAND_SOCKET")
        .output()
        .expect("failed to start the edgeflow binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "stderr: {stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("device "),
        "the table comes first"
    );
}
