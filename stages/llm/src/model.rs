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
    /// Q, K and V projections stacked by output rows: one GEMV per token.
    wqkv: Tensor,
    wo: Tensor,
    ffn_norm: Tensor,
    /// Gate and up projections stacked by output rows.
    gate_up: Tensor,
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
        // Tensors named `names`, stacked along their output rows (dim 0)
        // into one, then placed.
        let mut load_stacked = |names: &[&str]| -> Result<Tensor> {
            let mut parts = Vec::with_capacity(names.len());
            for name in names {
                let t = g.load(name)?;
                parts.push(if dequantize && t.dtype().is_quantized() {
                    host.cast(&t, DType::F32)?
                } else {
                    t
                });
            }
            let t = stack_rows(&host, &parts)?;
            weight_bytes += t.size_bytes();
            let t = dev.place(&t).unwrap_or(t);
            dev.stats().add_resident(t.size_bytes() as i64);
            Ok(t)
        };
        let embed = load_stacked(&["token_embd.weight"])?;
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            blocks.push(Block {
                attn_norm: load_stacked(&[&p("attn_norm")])?,
                wqkv: load_stacked(&[&p("attn_q"), &p("attn_k"), &p("attn_v")])?,
                wo: load_stacked(&[&p("attn_output")])?,
                ffn_norm: load_stacked(&[&p("ffn_norm")])?,
                gate_up: load_stacked(&[&p("ffn_gate"), &p("ffn_up")])?,
                down: load_stacked(&[&p("ffn_down")])?,
                cache: KvCache::new(),
            });
        }
        let norm = load_stacked(&["output_norm.weight"])?;
        let lm_head = if g.contains("output.weight") {
            load_stacked(&["output.weight"])?
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
                    &b.wqkv,
                    &b.wo,
                    &b.ffn_norm,
                    &b.gate_up,
                    &b.down,
                ]
                .iter()
                .map(|t| t.size_bytes())
                .sum::<usize>()
            })
            .sum();
        blocks + self.norm.size_bytes() + self.lm_head.size_bytes()
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
        let (d, h, hk, hd) = (c.d_model, c.n_head, c.n_kv_head, c.head_dim);
        let ids = Tensor::from_i64(tokens.iter().map(|&t| i64::from(t)).collect(), &[s])?;
        let mut x = dev.index_select(&self.embed, &ids, 0)?;
        x = dev.reshape(&x, &[1, s, d])?;
        let cos = dev.narrow(&self.cos, 0, self.pos, s)?;
        let sin = dev.narrow(&self.sin, 0, self.pos, s)?;
        let scale = 1.0 / (hd as f64).sqrt();
        for b in &mut self.blocks {
            let n = dev.rms_norm(&x, &b.attn_norm, c.rms_eps)?;
            // All s rows at once: on the CPU, quantized weights take the
            // backend's int8-activation kernel, whose rows equal the one-row
            // (decode) result bit for bit.
            let qkv = dev.linear(&n, &b.wqkv, None)?;
            let heads = |start: usize, nh: usize| -> Result<Tensor> {
                let y = dev.narrow(&qkv, 2, start, nh * hd)?;
                let y = dev.reshape(&y, &[1, s, nh, hd])?;
                Ok(dev.permute(&y, &[0, 2, 1, 3])?)
            };
            let q = dev.rope(&heads(0, h)?, &cos, &sin, true)?;
            let k = dev.rope(&heads(h * hd, hk)?, &cos, &sin, true)?;
            let v = heads((h + hk) * hd, hk)?;
            let (k, v) = b.cache.append(dev, &k, &v)?;
            let a = dev.attention(&q, &k, &v, None, scale, true)?;
            let a = dev.permute(&a, &[0, 2, 1, 3])?;
            let a = dev.reshape(&a, &[1, s, d])?;
            x = dev.add(&x, &dev.linear(&a, &b.wo, None)?)?;
            let n = dev.rms_norm(&x, &b.ffn_norm, c.rms_eps)?;
            let gu = dev.linear(&n, &b.gate_up, None)?;
            let g = dev.silu(&dev.narrow(&gu, 2, 0, c.ffn)?)?;
            let u = dev.narrow(&gu, 2, c.ffn, c.ffn)?;
            x = dev.add(&x, &dev.linear(&dev.mul(&g, &u)?, &b.down, None)?)?;
        }
        let last = dev.narrow(&x, 1, s - 1, 1)?;
        let last = dev.rms_norm(&last, &self.norm, c.rms_eps)?;
        let logits = dev.linear(&last, &self.lm_head, None)?;
        let logits = dev.to_host(&logits)?.to_vec_f32()?;
        self.pos += s;
        Ok(logits)
    }
}

/// `parts` (each `[n_i, k]`) stacked into `[sum n_i, k]`. Quantized parts
/// of one block format are stacked as raw blocks (rows are whole blocks in
/// GGML's row-major layout), so they stay quantized.
fn stack_rows(host: &Device, parts: &[Tensor]) -> Result<Tensor> {
    if parts.len() == 1 {
        return Ok(parts[0].clone());
    }
    let quantized: Option<Vec<_>> = parts
        .iter()
        .map(|t| match t.storage() {
            edgeflow_runtime::Storage::Quantized(q) => Some(q.clone()),
            _ => None,
        })
        .collect();
    if let Some(qs) = quantized {
        let dt = qs[0].dtype();
        let k = qs[0].shape().dims()[1];
        if qs
            .iter()
            .all(|q| q.dtype() == dt && q.shape().dims()[1] == k)
        {
            let mut raw = Vec::new();
            let mut rows = 0;
            for q in &qs {
                raw.extend_from_slice(&q.data().map_err(edgeflow_runtime::Error::from)?);
                rows += q.shape().dims()[0];
            }
            let q = edgeflow_runtime::candle_core::quantized::ggml_file::qtensor_from_ggml(
                dt,
                &raw,
                vec![rows, k],
                &edgeflow_runtime::candle_core::Device::Cpu,
            )
            .map_err(edgeflow_runtime::Error::from)?;
            return Ok(Tensor::from_quantized(std::sync::Arc::new(q))?);
        }
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    Ok(host.concat(&refs, 0)?)
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
