//! Where an Omni stage's weights come from: a Qwen2.5-Omni checkpoint
//! folder (`model_dir`), or seeded random weights at a small or the real
//! configuration (`model: random-small | random-real`), because no
//! Qwen2.5-Omni weights can be had offline here.

use crate::{Error, Result, VarBuilder};
use edgeflow_graph::{BuildEnv, Params, StageError};
use edgeflow_runtime::weights::RandomWeights;
use edgeflow_runtime::Device;
use std::path::{Path, PathBuf};

/// The `model` / `model_dir` choice of an Omni stage.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A small configuration with seeded random weights (structure and
    /// speed; the audio is noise).
    RandomSmall,
    /// Qwen2.5-Omni's real configuration with seeded random weights (its
    /// speed and memory; the audio is noise).
    RandomReal,
    /// A Qwen2.5-Omni checkpoint folder: `config.json` and its
    /// `*.safetensors` shards (tensors under `talker.`, `token2wav.`).
    Dir(PathBuf),
}

/// The one line an Omni stage prints at start with random weights.
pub fn random_notice(stage: &str, part: &str, source: &Source) -> Option<String> {
    let which = match source {
        Source::RandomSmall => "a small random-initialised configuration",
        Source::RandomReal => "Qwen2.5-Omni's real configuration with random weights",
        Source::Dir(_) => return None,
    };
    Some(format!(
        "{stage}: the {part} runs {which}: no Qwen2.5-Omni weights are shipped, so its output is noise; set model_dir to a Qwen2.5-Omni checkpoint folder to run the real model"
    ))
}

impl Source {
    /// Read `model_dir` (wins when set) or `model`.
    pub fn from_params(p: &Params, env: &BuildEnv) -> std::result::Result<Self, StageError> {
        if let Some(dir) = p.path("model_dir", env)? {
            if !dir.join("config.json").is_file() {
                return Err(p
                    .error(
                        "model_dir",
                        format!(
                            "{} has no config.json: model_dir must be a Qwen2.5-Omni checkpoint folder (config.json and *.safetensors)",
                            dir.display()
                        ),
                    )
                    .into());
            }
            return Ok(Source::Dir(dir));
        }
        let name: String = p.get_or("model", "random-small".to_string())?;
        match name.as_str() {
            "random-small" => Ok(Source::RandomSmall),
            "random-real" => Ok(Source::RandomReal),
            other => Err(p
                .error(
                    "model",
                    format!(
                        "unknown model `{other}`: choose random-small or random-real, or set model_dir to a Qwen2.5-Omni checkpoint folder (config.json and *.safetensors)"
                    ),
                )
                .into()),
        }
    }

    /// The checkpoint's `config.json` as JSON (None for random sources).
    pub fn config_json(&self) -> Result<Option<serde_json::Value>> {
        let Source::Dir(dir) = self else {
            return Ok(None);
        };
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let v = serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(&path, format!("not JSON: {e}")))?;
        Ok(Some(v))
    }

    /// A [`VarBuilder`] for one part: the checkpoint's shards under
    /// `prefix`, or random weights of `shapes` seeded by `seed`.
    pub fn var_builder(
        &self,
        prefix: &str,
        shapes: Vec<(String, Vec<usize>)>,
        seed: u64,
        dev: &Device,
    ) -> Result<VarBuilder> {
        match self {
            Source::Dir(dir) => {
                let shards = safetensors_in(dir)?;
                Ok(VarBuilder::open(&shards, dev)?.pp(prefix))
            }
            _ => {
                let label = format!("random:{prefix}");
                Ok(VarBuilder::from_reader(
                    RandomWeights::new(label, shapes, seed)?,
                    dev,
                ))
            }
        }
    }
}

/// The sub-object at `path` (dot-separated) of a config, or the error
/// naming what is missing.
pub fn sub_config<'a>(
    v: &'a serde_json::Value,
    path: &str,
    file: &Path,
) -> Result<&'a serde_json::Value> {
    let mut cur = v;
    for key in path.split('.') {
        cur = cur.get(key).ok_or_else(|| {
            Error::bad_file(
                file,
                format!("`{path}` is missing: is this a Qwen2.5-Omni config.json?"),
            )
        })?;
    }
    Ok(cur)
}

/// Every `*.safetensors` in `dir`, sorted.
fn safetensors_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(Error::bad_file(
            dir,
            "no *.safetensors shards in this folder: model_dir must be a Qwen2.5-Omni checkpoint folder",
        ));
    }
    Ok(v)
}
