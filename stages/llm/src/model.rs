//! A llama-architecture decoder (SmolLM2, Llama, ...) read from GGUF and run
//! on an edgeflow [`Device`].
//!
//! Tensor names follow llama.cpp's GGUF convention (`token_embd`,
//! `blk.N.attn_q`, ..., `output_norm`, optional `output`; without `output`
//! the embedding is tied). Quantized weights (Q4_0 / Q4_1 / Q8_0) stay
//! quantized and go through the runtime's quantized `linear`. llama.cpp's
//! converter permutes the Q/K rows so that rotary pairs are adjacent, hence
//! the interleaved RoPE here (transformers undoes that permutation and uses
//! the half-split form: the same function).

use crate::{Error, Result};
use edgeflow_nn::{
    stack_rows, Attention, Embedding, KvCache, Linear, Masking, Projections, RmsNorm, RopeLayout,
    RotaryEmbedding, VarBuilder,
};
use edgeflow_runtime::weights::{GgufFile, WeightReader};
use edgeflow_runtime::{DType, Device, Tensor};

/// Hyper-parameters read from the GGUF metadata (`llama.*`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Decoder blocks (`llama.block_count`).
    pub n_layer: usize,
    /// Hidden size (`llama.embedding_length`).
    pub d_model: usize,
    /// Query heads (`llama.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`llama.attention.head_count_kv`; GQA when fewer).
    pub n_kv_head: usize,
    /// Size of one head (`d_model / n_head`).
    pub head_dim: usize,
    /// MLP inner size (`llama.feed_forward_length`).
    pub ffn: usize,
    /// Vocabulary size (rows of `token_embd`).
    pub vocab: usize,
    /// RoPE base (`llama.rope.freq_base`, 10 000 when absent).
    pub rope_theta: f64,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f64,
    /// Trained context length (`llama.context_length`).
    pub context_length: usize,
    /// A load option, not read from the file: expand quantized weights to
    /// f32 at load (what PyTorch `transformers` does with a GGUF): four to
    /// eight times the memory and the bandwidth, but the arithmetic of the
    /// f32 reference, for parity checks. False from [`Config::from_gguf`].
    pub dequantize: bool,
}

impl Config {
    /// Read the hyper-parameters of a llama GGUF.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let path = g.path();
        let bad = |msg: String| Error::Model {
            path: path.to_path_buf(),
            msg,
        };
        let arch = g.meta_str("general.architecture").unwrap_or("");
        if arch != "llama" {
            return Err(bad(format!(
                "general.architecture is `{arch}`; only `llama` models are supported"
            )));
        }
        let int = |k: &str| {
            g.meta_u64(k)
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("metadata `{k}` is missing")))
        };
        let n_layer = int("llama.block_count")?;
        let d_model = int("llama.embedding_length")?;
        let n_head = int("llama.attention.head_count")?;
        let n_kv_head = g
            .meta_u64("llama.attention.head_count_kv")
            .map(|v| v as usize)
            .unwrap_or(n_head);
        let ffn = int("llama.feed_forward_length")?;
        let context_length = int("llama.context_length")?;
        if n_head == 0 || n_kv_head == 0 || d_model % n_head != 0 || n_head % n_kv_head != 0 {
            return Err(bad(format!(
                "inconsistent heads: d_model {d_model}, {n_head} heads, {n_kv_head} KV heads"
            )));
        }
        let head_dim = d_model / n_head;
        if head_dim % 2 != 0 {
            return Err(bad(format!("odd head size {head_dim} cannot take RoPE")));
        }
        if let Some(rd) = g.meta_u64("llama.rope.dimension_count") {
            if rd as usize != head_dim {
                return Err(bad(format!(
                    "partial RoPE (rope.dimension_count {rd} of head size {head_dim}) is not supported"
                )));
            }
        }
        let vocab = g
            .info("token_embd.weight")
            .map(|i| i.dims[0])
            .ok_or_else(|| bad("tensor `token_embd.weight` is missing".into()))?;
        Ok(Config {
            n_layer,
            d_model,
            n_head,
            n_kv_head,
            head_dim,
            ffn,
            vocab,
            rope_theta: g.meta_f64("llama.rope.freq_base").unwrap_or(10_000.0),
            rms_eps: g
                .meta_f64("llama.attention.layer_norm_rms_epsilon")
                .unwrap_or(1e-5),
            context_length,
            dequantize: false,
        })
    }
}

#[derive(Debug)]
struct Block {
    attn_norm: RmsNorm,
    /// Q, K and V projections stacked by output rows: one GEMV per token.
    attn: Attention,
    ffn_norm: RmsNorm,
    /// Gate and up projections stacked by output rows.
    gate_up: Linear,
    down: Linear,
    cache: KvCache,
}

/// The decoder with its KV cache.
#[derive(Debug)]
pub struct Llama {
    cfg: Config,
    dev: Device,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: RotaryEmbedding,
    pos: usize,
    weight_bytes: usize,
}

impl Llama {
    /// Load every weight under llama.cpp's names (`token_embd`,
    /// `blk.N.attn_q`, ...) from `vb` (a GGUF, see
    /// [`VarBuilder::from_reader`]) for the device it carries. Weights go
    /// to the placed backend when it can hold them; those it cannot (e.g.
    /// quantized blocks on a backend without quantized kernels) stay on the
    /// host and their ops fall back to the CPU per op, counted in the
    /// device's stats. With `cfg.dequantize`, quantized weights are
    /// expanded to f32 first.
    pub fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        let dev = vb.device().clone();
        let mut weight_bytes = 0usize;
        let host = dev.host();
        // Tensors named `names` under `p`, stacked along their output rows
        // (dim 0) into one, then placed.
        let mut load_stacked = |p: &VarBuilder, names: &[&str]| -> Result<Tensor> {
            let mut parts = Vec::with_capacity(names.len());
            for name in names {
                let t = p.pp(name).host_unchecked("weight")?;
                parts.push(if cfg.dequantize && t.dtype().is_quantized() {
                    host.cast(&t, DType::F32)?
                } else {
                    t
                });
            }
            let t = stack_rows(&host, &parts)?;
            weight_bytes += t.size_bytes();
            Ok(vb.place_or_host(&t))
        };
        let (h, hk, hd) = (cfg.n_head, cfg.n_kv_head, cfg.head_dim);
        let embed = load_stacked(vb, &["token_embd"])?;
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let b = vb.pp("blk").pp(i);
            let qkv = Linear::new(load_stacked(&b, &["attn_q", "attn_k", "attn_v"])?, None);
            let wo = Linear::new(load_stacked(&b, &["attn_output"])?, None);
            blocks.push(Block {
                attn_norm: RmsNorm::new(load_stacked(&b, &["attn_norm"])?, cfg.rms_eps),
                attn: Attention::new(Projections::Fused(qkv), wo, h, hk, hd)?,
                ffn_norm: RmsNorm::new(load_stacked(&b, &["ffn_norm"])?, cfg.rms_eps),
                gate_up: Linear::new(load_stacked(&b, &["ffn_gate", "ffn_up"])?, None),
                down: Linear::new(load_stacked(&b, &["ffn_down"])?, None),
                cache: KvCache::new(),
            });
        }
        let norm = RmsNorm::new(load_stacked(vb, &["output_norm"])?, cfg.rms_eps);
        let lm_head = if vb.contains("output.weight") {
            load_stacked(vb, &["output"])?
        } else {
            embed.clone()
        };
        // llama.cpp's converter permutes the Q/K rows so that rotary pairs
        // are adjacent: the interleaved layout.
        let rope = RotaryEmbedding::new(
            hd,
            cfg.context_length,
            cfg.rope_theta,
            RopeLayout::Interleaved,
        )?;
        Ok(Llama {
            cfg: cfg.clone(),
            dev,
            embed: Embedding::new(embed),
            blocks,
            norm,
            lm_head: Linear::new(lm_head, None),
            rope,
            pos: 0,
            weight_bytes,
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

    /// Tokens already in the KV cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes of weights as stored (quantized blocks count as stored).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Bytes of weights read to decode one token: every block and the
    /// output projection (the embedding lookup reads one row).
    pub fn weight_bytes_per_token(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                b.attn_norm.weight().size_bytes()
                    + b.attn.size_bytes()
                    + b.ffn_norm.weight().size_bytes()
                    + b.gate_up.size_bytes()
                    + b.down.size_bytes()
            })
            .sum();
        blocks + self.norm.weight().size_bytes() + self.lm_head.size_bytes()
    }

    /// Keep the first `len` cached tokens (a conversation rolled back to a
    /// shared prefix); no-op when `len` is not shorter than what is cached.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len >= self.pos {
            return Ok(());
        }
        for b in &mut self.blocks {
            b.cache.truncate(&self.dev, len)?;
        }
        self.pos = len;
        Ok(())
    }

    /// Forget the KV cache (new conversation or cancelled turn).
    pub fn reset(&mut self) {
        for b in &mut self.blocks {
            b.cache.reset();
        }
        self.pos = 0;
    }

    /// Run `tokens` after what is cached, append them to the KV cache and
    /// return the logits (length `vocab`) that follow the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        // One batch: on the CPU the whole pass runs on a worker of the
        // kernels' thread pool (Device::batch), not waking this thread for
        // each of its ~400 ops.
        let dev = self.dev.clone();
        dev.batch(|| self.forward_ops(tokens))
    }

    fn forward_ops(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let s = tokens.len();
        if s == 0 {
            return Err(Error::BadInput("forward of zero tokens".into()));
        }
        if self.pos + s > self.cfg.context_length {
            return Err(Error::BadInput(format!(
                "context full: {} cached + {s} new tokens exceed the model's {} positions",
                self.pos, self.cfg.context_length
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(Error::BadInput(format!(
                "token id {t} is outside the vocabulary of {}",
                self.cfg.vocab
            )));
        }
        let dev = &self.dev;
        let c = &self.cfg;
        let ids = Tensor::from_i64(tokens.iter().map(|&t| i64::from(t)).collect(), &[s])?;
        let mut x = self.embed.forward(dev, &ids)?;
        x = dev.reshape(&x, &[1, s, c.d_model])?;
        let rope = self.rope.at(dev, self.pos, s)?;
        for b in &mut self.blocks {
            let n = b.attn_norm.forward(dev, &x)?;
            // All s rows at once: on the CPU, quantized weights take the
            // backend's int8-activation kernel, whose rows equal the one-row
            // (decode) result bit for bit.
            let a = b
                .attn
                .forward(dev, &n, Some(&rope), Some(&mut b.cache), Masking::Causal)?;
            x = dev.add(&x, &a)?;
            let n = b.ffn_norm.forward(dev, &x)?;
            let gu = b.gate_up.forward(dev, &n)?;
            let g = dev.silu(&dev.narrow(&gu, 2, 0, c.ffn)?)?;
            let u = dev.narrow(&gu, 2, c.ffn, c.ffn)?;
            x = dev.add(&x, &b.down.forward(dev, &dev.mul(&g, &u)?)?)?;
        }
        let last = dev.narrow(&x, 1, s - 1, 1)?;
        let last = self.norm.forward(dev, &last)?;
        let logits = self.lm_head.forward(dev, &last)?;
        let logits = dev.to_host(&logits)?.to_vec_f32()?;
        self.pos += s;
        Ok(logits)
    }
}
