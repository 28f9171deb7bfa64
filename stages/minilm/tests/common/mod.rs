//! Shared helpers of the model tests.
#![allow(dead_code)]

use edgeflow_minilm::cards::MINILM_L6;
use std::path::{Path, PathBuf};

/// The fixture folder.
pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The reference outputs of scripts/minilm_reference.py.
pub(crate) fn reference() -> serde_json::Value {
    let p = fixtures().join("reference.json");
    let text = std::fs::read_to_string(&p).expect("reading reference.json");
    serde_json::from_str(&text).expect("parsing reference.json")
}

/// One fixture case: its text and token ids.
pub(crate) fn case(v: &serde_json::Value) -> (String, Vec<u32>) {
    let text = v["text"].as_str().expect("text").to_string();
    let ids = v["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|i| i.as_u64().expect("id") as u32)
        .collect();
    (text, ids)
}

/// The cached minilm-l6 folder, `None` when it is missing and
/// EDGEFLOW_SKIP_MODEL_TESTS=1; otherwise a missing model fails the test
/// with the command that fetches it.
pub(crate) fn model() -> Option<PathBuf> {
    match MINILM_L6.locate() {
        Ok(d) => Some(d),
        Err(e) if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping (EDGEFLOW_SKIP_MODEL_TESTS=1): {e}");
            None
        }
        Err(e) => panic!("{e}\n(set EDGEFLOW_SKIP_MODEL_TESTS=1 to skip model tests)"),
    }
}

/// The CPU device.
pub(crate) fn cpu() -> edgeflow_runtime::Device {
    edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu device")
}

/// Cosine similarity and largest absolute difference.
pub(crate) fn compare(a: &[f32], b: &[f32]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let max_abs = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs())
        .fold(0.0, f64::max);
    (dot / (na * nb).max(1e-30), max_abs)
}
