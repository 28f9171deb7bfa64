//! A BERT encoder (`BertModel` of Hugging Face `transformers`), as
//! all-MiniLM-L6-v2 and other sentence-transformers checkpoints use it,
//! run on an edgeflow [`Device`].
//!
//! Tensor names are those of a `BertModel` safetensors file
//! (`embeddings.word_embeddings`, `encoder.layer.N.attention.self.query`,
//! ...); a checkpoint saved from a task model (`BertForMaskedLM`, ...) has
//! them under `bert.`, which [`BertModel::load`] finds too. The pooler is
//! not used (sentence-transformers pools the hidden states itself).
//!
//! Post-norm blocks: `x = LN(x + Attn(x))`, `x = LN(x + W2 act(W1 x))`.

use crate::{Error, Result};
use edgeflow_nn::{
    merge_heads, stack_rows, Attention, Embedding, LayerNorm, Linear, Projections, VarBuilder,
};
use edgeflow_runtime::{Device, Tensor, UnaryOp};
use serde::Deserialize;
use std::path::Path;

/// The feed-forward activation (`hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum HiddenAct {
    /// Exact GELU, `x * Phi(x)` (`"gelu"`: BERT, MiniLM).
    #[serde(rename = "gelu")]
    Gelu,
    /// GELU, tanh approximation (`"gelu_new"`, `"gelu_pytorch_tanh"`).
    #[serde(rename = "gelu_new", alias = "gelu_pytorch_tanh")]
    GeluTanh,
    /// `max(x, 0)`.
    #[serde(rename = "relu")]
    Relu,
}

fn default_position_type() -> String {
    "absolute".into()
}

/// Hyper-parameters, as in the checkpoint's `config.json`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Config {
    /// Rows of the word embedding (`vocab_size`, 30 522).
    pub vocab_size: usize,
    /// Width of every hidden state (`hidden_size`, 384).
    pub hidden_size: usize,
    /// Encoder blocks (`num_hidden_layers`, 6).
    pub num_hidden_layers: usize,
    /// Attention heads (`num_attention_heads`, 12).
    pub num_attention_heads: usize,
    /// Inner width of the feed-forward (`intermediate_size`, 1 536).
    pub intermediate_size: usize,
    /// Feed-forward activation (`hidden_act`, exact GELU).
    pub hidden_act: HiddenAct,
    /// Learned positions (`max_position_embeddings`, 512): the longest input.
    pub max_position_embeddings: usize,
    /// Token-type rows (`type_vocab_size`, 2; every token uses type 0).
    pub type_vocab_size: usize,
    /// LayerNorm epsilon (`layer_norm_eps`, 1e-12).
    pub layer_norm_eps: f64,
    /// Must be `absolute` (`position_embedding_type`).
    #[serde(default = "default_position_type")]
    pub position_embedding_type: String,
}

impl Config {
    /// all-MiniLM-L6-v2's configuration.
    pub fn minilm_l6() -> Self {
        Config {
            vocab_size: 30522,
            hidden_size: 384,
            num_hidden_layers: 6,
            num_attention_heads: 12,
            intermediate_size: 1536,
            hidden_act: HiddenAct::Gelu,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            position_embedding_type: default_position_type(),
        }
    }

    /// Read a `config.json` and check that it is a BERT this file runs.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let cfg: Config = serde_json::from_str(&text)
            .map_err(|e| Error::bad_model(path, format!("not a BERT config.json: {e}")))?;
        cfg.check().map_err(|m| Error::bad_model(path, m))?;
        Ok(cfg)
    }

    /// The size of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.position_embedding_type != "absolute" {
            return Err(format!(
                "position_embedding_type `{}` is not supported (absolute)",
                self.position_embedding_type
            ));
        }
        if self.num_attention_heads == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.type_vocab_size == 0 || self.max_position_embeddings == 0 || self.vocab_size == 0 {
            return Err(
                "vocab_size, type_vocab_size and max_position_embeddings must be > 0".into(),
            );
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Layer {
    /// Query, key and value stacked by output rows: one GEMM.
    attn: Attention,
    attn_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// The BERT encoder: token ids in, one hidden state per token out.
#[derive(Debug)]
pub struct BertModel {
    cfg: Config,
    dev: Device,
    word: Embedding,
    /// `position_embeddings` `[max_positions, d]`.
    position: Tensor,
    /// Row 0 of `token_type_embeddings`, `[1, d]`: every token is type 0.
    token_type: Tensor,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
}

impl BertModel {
    /// Load every weight under `vb` (the root of a `BertModel` checkpoint,
    /// or of a task model whose encoder is under `bert.`) for the device it
    /// carries.
    pub fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        cfg.check().map_err(|m| Error::bad_model(&vb.path(), m))?;
        let vb = if !vb.contains("embeddings.word_embeddings.weight")
            && vb.contains("bert.embeddings.word_embeddings.weight")
        {
            vb.pp("bert")
        } else {
            vb.clone()
        };
        let dev = vb.device().clone();
        let host = dev.host();
        let d = cfg.hidden_size;
        let eps = cfg.layer_norm_eps;
        let e = vb.pp("embeddings");
        let word = Embedding::new(
            e.pp("word_embeddings")
                .get_f32("weight", &[cfg.vocab_size, d])?,
        );
        let position = e
            .pp("position_embeddings")
            .get_f32("weight", &[cfg.max_position_embeddings, d])?;
        let types = e
            .pp("token_type_embeddings")
            .host_f32("weight", &[cfg.type_vocab_size, d])?;
        let token_type = vb.place(&host.narrow(&types, 0, 0, 1)?)?;
        let embed_norm = LayerNorm::load(&e.pp("LayerNorm"), d, eps)?;
        let (h, hd) = (cfg.num_attention_heads, cfg.head_dim());
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = vb.pp("encoder").pp("layer").pp(i);
            let a = l.pp("attention");
            let s = a.pp("self");
            let mut w = Vec::with_capacity(3);
            let mut b = Vec::with_capacity(3);
            for name in ["query", "key", "value"] {
                w.push(s.pp(name).host_f32("weight", &[d, d])?);
                b.push(s.pp(name).host_f32("bias", &[d])?);
            }
            let qkv = Linear::new(
                vb.place(&stack_rows(&host, &w)?)?,
                Some(vb.place(&stack_rows(&host, &b)?)?),
            );
            let o = Linear::load(&a.pp("output").pp("dense"), d, d, true)?;
            layers.push(Layer {
                attn: Attention::new(Projections::Fused(qkv), o, h, h, hd)?,
                attn_norm: LayerNorm::load(&a.pp("output").pp("LayerNorm"), d, eps)?,
                intermediate: Linear::load(
                    &l.pp("intermediate").pp("dense"),
                    d,
                    cfg.intermediate_size,
                    true,
                )?,
                output: Linear::load(&l.pp("output").pp("dense"), cfg.intermediate_size, d, true)?,
                output_norm: LayerNorm::load(&l.pp("output").pp("LayerNorm"), d, eps)?,
            });
        }
        Ok(BertModel {
            cfg: cfg.clone(),
            dev,
            word,
            position,
            token_type,
            embed_norm,
            layers,
        })
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Hidden states `[b, s, hidden_size]` of token ids `ids[b, s]` (i64).
    /// `mask[b, s]` (f32, 1 for a token, 0 for padding) keeps padded keys
    /// out of attention; `None` attends to every position. Every token has
    /// type 0 and position `0..s`.
    pub fn forward(&self, ids: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let dev = self.dev.clone();
        dev.batch(|| self.forward_ops(ids, mask))
    }

    fn forward_ops(&self, ids: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let &[b, s] = ids.dims() else {
            return Err(Error::BadInput(format!(
                "token ids must be [batch, seq], got {:?}",
                ids.dims()
            )));
        };
        if s == 0 || b == 0 {
            return Err(Error::BadInput(
                "an empty batch: every sequence needs at least [CLS] and [SEP]".into(),
            ));
        }
        if s > self.cfg.max_position_embeddings {
            return Err(Error::BadInput(format!(
                "{s} tokens exceed the model's {} positions: truncate the text",
                self.cfg.max_position_embeddings
            )));
        }
        let dev = &self.dev;
        let c = &self.cfg;
        let d = c.hidden_size;
        let flat = dev.reshape(ids, &[b * s])?;
        let x = self.word.forward(dev, &flat)?;
        let x = dev.reshape(&x, &[b, s, d])?;
        let pos = dev.narrow(&self.position, 0, 0, s)?;
        let x = dev.add(&dev.add(&x, &pos)?, &self.token_type)?;
        let mut x = self.embed_norm.forward(dev, &x)?;
        // Additive key mask [b, 1, 1, s]: 0 for tokens, the most negative
        // f32 for padding (as transformers' extended attention mask).
        let key_mask = match mask {
            Some(m) => {
                if m.dims() != [b, s] {
                    return Err(Error::BadInput(format!(
                        "the attention mask is {:?}, the ids [{b}, {s}]",
                        m.dims()
                    )));
                }
                let m = dev.affine(m, f32::MAX as f64, -(f32::MAX as f64))?;
                Some(dev.reshape(&m, &[b, 1, 1, s])?)
            }
            None => None,
        };
        let scale = 1.0 / (c.head_dim() as f64).sqrt();
        for l in &self.layers {
            let (q, k, v) = l.attn.qkv(dev, &x, None)?;
            let a = dev.attention(&q, &k, &v, key_mask.as_ref(), scale, false)?;
            let a = l.attn.out().forward(dev, &merge_heads(dev, &a)?)?;
            x = l.attn_norm.forward(dev, &dev.add(&x, &a)?)?;
            let h = l.intermediate.forward(dev, &x)?;
            let h = match c.hidden_act {
                HiddenAct::Gelu => dev.unary(UnaryOp::GeluErf, &h)?,
                HiddenAct::GeluTanh => dev.gelu(&h)?,
                HiddenAct::Relu => dev.unary(UnaryOp::Relu, &h)?,
            };
            let h = l.output.forward(dev, &h)?;
            x = l.output_norm.forward(dev, &dev.add(&x, &h)?)?;
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_minilm_and_refuses_what_it_cannot_run() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("config.json");
        std::fs::write(
            &p,
            r#"{"architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": 384,
                "intermediate_size": 1536, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
                "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 6,
                "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522}"#,
        )
        .expect("write");
        assert_eq!(Config::from_file(&p).expect("config"), Config::minilm_l6());
        std::fs::write(&p, r#"{"hidden_act": "swish"}"#).expect("write");
        let e = Config::from_file(&p).expect_err("bad");
        assert!(e.to_string().contains("not a BERT config.json"), "{e}");
        let mut c = Config::minilm_l6();
        c.num_attention_heads = 5;
        assert!(c.check().is_err());
    }
}
