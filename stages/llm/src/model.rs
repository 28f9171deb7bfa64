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
use edgeflow_runtime::weights::{GgufFile, WeightReader};
use edgeflow_runtime::{DType, Device, KvCache, Tensor};
use std::path::Path;

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
        })
    }
}

#[derive(Debug)]
struct Block {
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    ffn_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
    cache: KvCache,
}

/// The decoder with its KV cache.
#[derive(Debug)]
pub struct Llama {
    cfg: Config,
    dev: Device,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Tensor,
    cos: Tensor,
    sin: Tensor,
    pos: usize,
    weight_bytes: usize,
}

impl Llama {
    /// Load every weight of `g` for `dev`. Weights go to the placed backend
    /// when it can hold them; those it cannot (e.g. quantized blocks on a
    /// backend without quantized kernels) stay on the host and their ops
    /// fall back to the CPU per op, counted in the device's stats.
    pub fn load(dev: &Device, g: &GgufFile) -> Result<Self> {
        Self::load_with(dev, g, false)
    }

    /// Like [`Llama::load`]; with `dequantize`, quantized weights are
    /// expanded to f32 at load (what PyTorch `transformers` does with a
    /// GGUF): four to eight times the memory and the bandwidth, but the
    /// arithmetic of the f32 reference, for parity checks.
    pub fn load_with(dev: &Device, g: &GgufFile, dequantize: bool) -> Result<Self> {
        let cfg = Config::from_gguf(g)?;
        let mut weight_bytes = 0usize;
        let host = dev.host();
        let mut load = |name: &str| -> Result<Tensor> {
            let mut t = g.load(name)?;
            if dequantize && t.dtype().is_quantized() {
                t = host.cast(&t, DType::F32)?;
            }
            weight_bytes += t.size_bytes();
            let t = dev.place(&t).unwrap_or(t);
            dev.stats().add_resident(t.size_bytes() as i64);
            Ok(t)
        };
        let embed = load("token_embd.weight")?;
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            blocks.push(Block {
                attn_norm: load(&p("attn_norm"))?,
                wq: load(&p("attn_q"))?,
                wk: load(&p("attn_k"))?,
                wv: load(&p("attn_v"))?,
                wo: load(&p("attn_output"))?,
                ffn_norm: load(&p("ffn_norm"))?,
                gate: load(&p("ffn_gate"))?,
                up: load(&p("ffn_up"))?,
                down: load(&p("ffn_down"))?,
                cache: KvCache::new(),
            });
        }
        let norm = load("output_norm.weight")?;
        let lm_head = if g.contains("output.weight") {
            load("output.weight")?
        } else {
            embed.clone()
        };
        let (cos, sin) = rope_tables(&cfg)?;
        Ok(Llama {
            cfg,
            dev: dev.clone(),
            embed,
            blocks,
            norm,
            lm_head,
            cos,
            sin,
            pos: 0,
            weight_bytes,
        })
    }

    /// Open a GGUF file and load it (see [`Llama::load`]).
    pub fn open(dev: &Device, path: &Path) -> Result<(Self, GgufFile)> {
        let g = GgufFile::open(path)?;
        let m = Self::load(dev, &g)?;
        Ok((m, g))
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
                [
                    &b.attn_norm,
                    &b.wq,
                    &b.wk,
                    &b.wv,
                    &b.wo,
                    &b.ffn_norm,
                    &b.gate,
                    &b.up,
                    &b.down,
                ]
                .iter()
                .map(|t| t.size_bytes())
                .sum::<usize>()
            })
            .sum();
        blocks + self.norm.size_bytes() + self.lm_head.size_bytes()
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
        let (d, h, hk, hd) = (c.d_model, c.n_head, c.n_kv_head, c.head_dim);
        let ids = Tensor::from_i64(tokens.iter().map(|&t| i64::from(t)).collect(), &[s])?;
        let mut x = dev.index_select(&self.embed, &ids, 0)?;
        x = dev.reshape(&x, &[1, s, d])?;
        let cos = dev.narrow(&self.cos, 0, self.pos, s)?;
        let sin = dev.narrow(&self.sin, 0, self.pos, s)?;
        let scale = 1.0 / (hd as f64).sqrt();
        for b in &mut self.blocks {
            let n = dev.rms_norm(&x, &b.attn_norm, c.rms_eps)?;
            let heads = |w: &Tensor, nh: usize| -> Result<Tensor> {
                let y = linear(dev, &n, w)?;
                let y = dev.reshape(&y, &[1, s, nh, hd])?;
                Ok(dev.permute(&y, &[0, 2, 1, 3])?)
            };
            let q = dev.rope(&heads(&b.wq, h)?, &cos, &sin, true)?;
            let k = dev.rope(&heads(&b.wk, hk)?, &cos, &sin, true)?;
            let v = heads(&b.wv, hk)?;
            let (k, v) = b.cache.append(dev, &k, &v)?;
            let a = dev.attention(&q, &k, &v, None, scale, true)?;
            let a = dev.permute(&a, &[0, 2, 1, 3])?;
            let a = dev.reshape(&a, &[1, s, d])?;
            x = dev.add(&x, &linear(dev, &a, &b.wo)?)?;
            let n = dev.rms_norm(&x, &b.ffn_norm, c.rms_eps)?;
            let g = dev.silu(&linear(dev, &n, &b.gate)?)?;
            let u = linear(dev, &n, &b.up)?;
            x = dev.add(&x, &linear(dev, &dev.mul(&g, &u)?, &b.down)?)?;
        }
        let last = dev.narrow(&x, 1, s - 1, 1)?;
        let last = dev.rms_norm(&last, &self.norm, c.rms_eps)?;
        let logits = dev.linear(&last, &self.lm_head, None)?;
        let logits = dev.to_host(&logits)?.to_vec_f32()?;
        self.pos += s;
        Ok(logits)
    }
}

/// `x[1, s, k] @ w^T`. With quantized weights and several rows (prefill),
/// one `linear` per row, so every row takes the CPU backend's one-row
/// quantized GEMV (int8 activations per block of 32, as in decode) instead
/// of candle 0.11's multi-row quantized matmul, which is several times
/// slower here (64 prompt tokens of SmolLM2: 11.6-14.7 s batched vs
/// 1.1-1.8 s row by row). Prefill and decode then share one arithmetic.
fn linear(dev: &Device, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let s = x.dims()[1];
    if !w.dtype().is_quantized() || s == 1 {
        return Ok(dev.linear(x, w, None)?);
    }
    let rows = (0..s)
        .map(|i| dev.linear(&dev.narrow(x, 1, i, 1)?, w, None))
        .collect::<edgeflow_runtime::Result<Vec<_>>>()?;
    let refs: Vec<&Tensor> = rows.iter().collect();
    Ok(dev.concat(&refs, 1)?)
}

/// cos / sin of `pos * theta^(-2i/d)` for every position of the context,
/// `[context, head_dim / 2]`.
fn rope_tables(c: &Config) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    let inv: Vec<f64> = (0..half)
        .map(|i| 1.0 / c.rope_theta.powf(2.0 * i as f64 / c.head_dim as f64))
        .collect();
    let n = c.context_length;
    let mut cos = Vec::with_capacity(n * half);
    let mut sin = Vec::with_capacity(n * half);
    for p in 0..n {
        for f in &inv {
            let a = p as f64 * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    Ok((
        Tensor::from_vec(cos, &[n, half])?,
        Tensor::from_vec(sin, &[n, half])?,
    ))
}
