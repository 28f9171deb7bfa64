//! VITS's text encoder (`enc_p`): phoneme embedding, a transformer encoder
//! with relative-position multi-head attention (window 4) and convolutional
//! feed-forward layers, and the projection to the prior's mean / log-scale.
//!
//! Activations are kept time-major (`[1, t, c]`) inside the transformer so
//! the 1x1 convolutions are plain linear layers and the layer norms run over
//! the last dim.

use super::layers::LN_EPS;
use super::VitsConfig;
use crate::Result;
use edgeflow_nn::{Conv1d, Conv1dConfig, LayerNorm, Pointwise, VarBuilder};
use edgeflow_runtime::{Device, PadMode, Tensor};

#[derive(Debug)]
struct RelAttention {
    q: Pointwise,
    k: Pointwise,
    v: Pointwise,
    o: Pointwise,
    /// [1, 2w+1, d_head] embeddings of relative distances -w..=w.
    rel_k: Tensor,
    rel_v: Tensor,
    heads: usize,
    window: usize,
}

impl RelAttention {
    fn load(vb: &VarBuilder, c: usize, heads: usize, window: usize) -> Result<Self> {
        let d = c / heads;
        Ok(RelAttention {
            q: Pointwise::load(&vb.pp("conv_q"), c, c)?,
            k: Pointwise::load(&vb.pp("conv_k"), c, c)?,
            v: Pointwise::load(&vb.pp("conv_v"), c, c)?,
            o: Pointwise::load(&vb.pp("conv_o"), c, c)?,
            rel_k: vb.get_f32("emb_rel_k", &[1, 2 * window + 1, d])?,
            rel_v: vb.get_f32("emb_rel_v", &[1, 2 * window + 1, d])?,
            heads,
            window,
        })
    }

    /// The relative embeddings for distances -(t-1)..=(t-1): [1, 2t-1, d],
    /// zero beyond the window (VITS `_get_relative_embeddings`).
    fn rel_embeddings(&self, dev: &Device, emb: &Tensor, t: usize) -> Result<Tensor> {
        let w = self.window;
        let pad = t.saturating_sub(w + 1);
        let start = (w + 1).saturating_sub(t);
        let padded = if pad > 0 {
            dev.pad(emb, 1, pad, pad, PadMode::Zeros)?
        } else {
            emb.clone()
        };
        Ok(dev.narrow(&padded, 1, start, 2 * t - 1)?)
    }

    /// x[1, t, c] -> [1, t, c].
    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let (t, c) = (x.dims()[1], x.dims()[2]);
        let (h, d) = (self.heads, c / self.heads);
        let scale = 1.0 / (d as f64).sqrt();
        let heads = |y: Tensor| -> Result<Tensor> {
            let y = dev.reshape(&y, &[1, t, h, d])?;
            Ok(dev.permute(&y, &[0, 2, 1, 3])?)
        };
        let q = heads(self.q.forward_tc(dev, x)?)?;
        let q = dev.scale(&q, scale)?;
        let k = heads(self.k.forward_tc(dev, x)?)?;
        let v = heads(self.v.forward_tc(dev, x)?)?;

        // Content scores plus relative-key scores.
        let kt = dev.transpose(&k, 2, 3)?;
        let scores = dev.matmul(&q, &kt)?;
        let rel_k = self.rel_embeddings(dev, &self.rel_k, t)?;
        let rel_kt = dev.reshape(&dev.transpose(&rel_k, 1, 2)?, &[1, 1, d, 2 * t - 1])?;
        let rel_logits = dev.matmul(&q, &rel_kt)?; // [1, h, t, 2t-1]
        let scores = dev.add(&scores, &rel_to_abs(dev, &rel_logits, h, t)?)?;
        let p = dev.softmax(&scores, 3)?;

        // Values plus relative-value contributions.
        let out = dev.matmul(&p, &v)?;
        let rel_w = abs_to_rel(dev, &p, h, t)?; // [1, h, t, 2t-1]
        let rel_v = self.rel_embeddings(dev, &self.rel_v, t)?;
        let rel_v = dev.reshape(&rel_v, &[1, 1, 2 * t - 1, d])?;
        let out = dev.add(&out, &dev.matmul(&rel_w, &rel_v)?)?;
        let out = dev.permute(&out, &[0, 2, 1, 3])?;
        let out = dev.reshape(&out, &[1, t, c])?;
        Ok(self.o.forward_tc(dev, &out)?)
    }
}

/// [1, h, t, 2t-1] relative logits -> [1, h, t, t] absolute (VITS's
/// pad-reshape-slice trick).
fn rel_to_abs(dev: &Device, x: &Tensor, h: usize, t: usize) -> Result<Tensor> {
    let x = dev.pad(x, 3, 0, 1, PadMode::Zeros)?;
    let x = dev.reshape(&x, &[1, h, 2 * t * t])?;
    let x = dev.pad(&x, 2, 0, t - 1, PadMode::Zeros)?;
    let x = dev.reshape(&x, &[1, h, t + 1, 2 * t - 1])?;
    let x = dev.narrow(&x, 2, 0, t)?;
    Ok(dev.narrow(&x, 3, t - 1, t)?)
}

/// [1, h, t, t] absolute weights -> [1, h, t, 2t-1] relative.
fn abs_to_rel(dev: &Device, x: &Tensor, h: usize, t: usize) -> Result<Tensor> {
    let x = dev.pad(x, 3, 0, t - 1, PadMode::Zeros)?;
    let x = dev.reshape(&x, &[1, h, t * (2 * t - 1)])?;
    let x = dev.pad(&x, 2, t, 0, PadMode::Zeros)?;
    let x = dev.reshape(&x, &[1, h, t, 2 * t])?;
    Ok(dev.narrow(&x, 3, 1, 2 * t - 1)?)
}

#[derive(Debug)]
struct Ffn {
    conv1: Conv1d,
    conv2: Conv1d,
}

impl Ffn {
    /// x[1, t, c] -> [1, t, c]: conv, relu, conv over time.
    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let xc = dev.transpose(x, 1, 2)?;
        let y = self.conv1.forward(dev, &xc)?;
        let y = dev.unary(edgeflow_runtime::UnaryOp::Relu, &y)?;
        let y = self.conv2.forward(dev, &y)?;
        Ok(dev.transpose(&y, 1, 2)?)
    }
}

#[derive(Debug)]
struct Layer {
    attn: RelAttention,
    norm1: LayerNorm,
    ffn: Ffn,
    norm2: LayerNorm,
}

/// Output of the text encoder, channel-major `[1, c, t_text]`.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// Hidden states (condition the duration predictor).
    pub x: Tensor,
    /// Prior mean.
    pub m_p: Tensor,
    /// Prior log-scale.
    pub logs_p: Tensor,
}

/// The text encoder `enc_p`.
#[derive(Debug)]
pub struct TextEncoder {
    emb: Tensor,
    layers: Vec<Layer>,
    proj: Pointwise,
    hidden: usize,
    inter: usize,
    num_symbols: usize,
}

impl TextEncoder {
    /// Load `enc_p.*` (`vb` at the checkpoint's root).
    pub fn load(vb: &VarBuilder, cfg: &VitsConfig) -> Result<Self> {
        let c = cfg.hidden_channels;
        let vb = vb.pp("enc_p");
        let enc = vb.pp("encoder");
        let conv = |p: VarBuilder, c_in: usize, c_out: usize| {
            Conv1d::load(&p, c_in, c_out, cfg.kernel_size, Conv1dConfig::default())
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let ffn = enc.pp("ffn_layers").pp(i);
            layers.push(Layer {
                attn: RelAttention::load(
                    &enc.pp("attn_layers").pp(i),
                    c,
                    cfg.n_heads,
                    cfg.window_size,
                )?,
                norm1: LayerNorm::load_gamma_beta(&enc.pp("norm_layers_1").pp(i), c, LN_EPS)?,
                ffn: Ffn {
                    conv1: conv(ffn.pp("conv_1"), c, cfg.filter_channels)?,
                    conv2: conv(ffn.pp("conv_2"), cfg.filter_channels, c)?,
                },
                norm2: LayerNorm::load_gamma_beta(&enc.pp("norm_layers_2").pp(i), c, LN_EPS)?,
            });
        }
        Ok(TextEncoder {
            emb: vb.get_f32("emb.weight", &[cfg.num_symbols, c])?,
            layers,
            proj: Pointwise::load(&vb.pp("proj"), c, 2 * cfg.inter_channels)?,
            hidden: c,
            inter: cfg.inter_channels,
            num_symbols: cfg.num_symbols,
        })
    }

    /// Encode phoneme ids.
    pub fn forward(&self, dev: &Device, ids: &[i64]) -> Result<Encoded> {
        if let Some(bad) = ids
            .iter()
            .find(|&&i| i < 0 || i as usize >= self.num_symbols)
        {
            return Err(crate::Error::BadInput(format!(
                "phoneme id {bad} is outside 0..{}",
                self.num_symbols
            )));
        }
        let t = ids.len();
        let idx = Tensor::from_i64(ids.to_vec(), &[t])?;
        let x = dev.index_select(&self.emb, &idx, 0)?;
        let x = dev.scale(&x, (self.hidden as f64).sqrt())?;
        let mut x = dev.reshape(&x, &[1, t, self.hidden])?;
        for l in &self.layers {
            let y = l.attn.forward(dev, &x)?;
            x = l.norm1.forward(dev, &dev.add(&x, &y)?)?;
            let y = l.ffn.forward(dev, &x)?;
            x = l.norm2.forward(dev, &dev.add(&x, &y)?)?;
        }
        let stats = self.proj.forward_tc(dev, &x)?; // [1, t, 2 * inter]
        let stats = dev.transpose(&stats, 1, 2)?;
        Ok(Encoded {
            x: dev.transpose(&x, 1, 2)?,
            m_p: dev.narrow(&stats, 1, 0, self.inter)?,
            logs_p: dev.narrow(&stats, 1, self.inter, self.inter)?,
        })
    }
}
