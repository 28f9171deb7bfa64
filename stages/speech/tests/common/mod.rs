//! Shared helpers of the model tests.
#![allow(dead_code)]

use edgeflow_models::ModelCard;
use std::path::{Path, PathBuf};

/// The fixture folder.
pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The reference outputs of scripts/speech_reference.py.
pub(crate) fn reference() -> serde_json::Value {
    let p = fixtures().join("reference.json");
    let text = std::fs::read_to_string(&p).expect("reading reference.json");
    serde_json::from_str(&text).expect("parsing reference.json")
}

/// The fixture clip, 16 kHz mono.
pub(crate) fn clip() -> Vec<f32> {
    let (info, samples) =
        edgeflow_audio::wav::read_wav(&fixtures().join("speech_mix.wav")).expect("fixture wav");
    assert_eq!(info.sample_rate, 16_000);
    assert_eq!(info.channels, 1);
    samples
}

/// The cached model folder, `None` when it is missing and
/// EDGEFLOW_SKIP_MODEL_TESTS=1; otherwise a missing model fails the test
/// with the command that fetches it.
pub(crate) fn model(m: &ModelCard) -> Option<PathBuf> {
    match m.locate() {
        Ok(d) => Some(d),
        Err(e) if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping (EDGEFLOW_SKIP_MODEL_TESTS=1): {e}");
            None
        }
        Err(e) => panic!("{e}\n(set EDGEFLOW_SKIP_MODEL_TESTS=1 to skip model tests)"),
    }
}
