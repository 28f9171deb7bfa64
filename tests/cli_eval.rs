//! `edgeflow eval thinker` end to end: the 20 factual questions through the
//! Qwen2.5-0.5B card (fetched by the README's test command), greedy, so the
//! count is a property of the model and our kernels, not of the machine.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::Path;
use std::process::Command;

#[test]
fn eval_thinker_counts_correct_answers_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("thinker.json");
    let out = Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(["eval", "thinker", "--models", "qwen2.5-0.5b", "--json"])
        .arg(&json)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("| qwen2.5-0.5b | "), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let m = &v["models"][0];
    assert_eq!(m["questions"], 20);
    let answers = m["answers"].as_array().unwrap();
    assert_eq!(answers.len(), 20);
    let correct = answers.iter().filter(|a| a["correct"] == true).count();
    assert_eq!(m["correct"].as_u64().unwrap() as usize, correct);
    // The bar for this model (measured 15/20).
    assert!(correct >= 15, "{correct}/20:\n{stdout}");
}

#[test]
fn eval_thinker_names_an_unknown_model_and_the_cards() {
    let out = Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(["eval", "thinker", "--models", "gpt-17"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpt-17") && err.contains("smollm2"), "{err}");
}
