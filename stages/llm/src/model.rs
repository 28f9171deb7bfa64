//! Llama- and Qwen2-architecture decoders (SmolLM2, Llama, Qwen2.5, ...)
//! read from GGUF and run on an edgeflow [`Device`].
//!
//! Tensor names follow llama.cpp's GGUF convention (`token_embd`,
//! `blk.N.attn_q`, ..., `output_norm`, optional `output`; without `output`
//! the embedding is tied). Quantized weights (Q4_0 / Q4_1 / Q5_0 / Q8_0 and
//! the K-quants Q4_K / Q5_K / Q6_K) stay quantized and go through the
//! runtime's quantized `linear`.
//!
//! The two architectures differ in three places:
//! - RoPE: llama.cpp's converter permutes Llama's Q/K rows so that rotary
//!   pairs are adjacent, hence the interleaved RoPE for `llama`
//!   (transformers undoes that permutation and uses the half-split form:
//!   the same function); Qwen2's rows are not permuted, it rotates halves
//!   (NEOX);
//! - Qwen2 has biases on the Q, K and V projections (`attn_q.bias`, ...);
//! - the metadata keys are prefixed by the architecture (`qwen2.block_count`).
//!
//! The blocks are [`edgeflow_nn::Decoder`] under [`DecoderNames::GGUF`]
//! (the same layer stack runs Qwen2.5-Omni's talker from Hugging Face
//! names); this file adds the embedding, the final norm, the output head
//! and the GGUF metadata.

use crate::{Error, Result};
use edgeflow_nn::{
    Decoder, DecoderConfig, DecoderNames, Embedding, Linear, QkvBias, RmsNorm, RopeLayout,
    RotaryEmbedding, VarBuilder, WeightFormat,
};
use edgeflow_runtime::weights::{GgufFile, WeightReader};
use edgeflow_runtime::{DType, Device, Tensor};

/// The decoder families this module runs (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `llama` (SmolLM2, Llama): interleaved RoPE, no projection biases.
    Llama,
    /// `qwen2` (Qwen2, Qwen2.5): rotate-halves RoPE, biases on Q/K/V.
    Qwen2,
}

impl Arch {
    /// The GGUF name (`general.architecture`, also the metadata prefix).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }

    fn rope_layout(self) -> RopeLayout {
        match self {
            Arch::Llama => RopeLayout::Interleaved,
            Arch::Qwen2 => RopeLayout::Halves,
        }
    }
}

/// Hyper-parameters read from the GGUF metadata (`<arch>.*`, e.g.
/// `llama.block_count`, `qwen2.block_count`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Architecture (`general.architecture`).
    pub arch: Arch,
    /// Decoder blocks (`<arch>.block_count`).
    pub n_layer: usize,
    /// Hidden size (`<arch>.embedding_length`).
    pub d_model: usize,
    /// Query heads (`<arch>.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`<arch>.attention.head_count_kv`; GQA when fewer).
    pub n_kv_head: usize,
    /// Size of one head (`d_model / n_head`).
    pub head_dim: usize,
    /// MLP inner size (`<arch>.feed_forward_length`).
    pub ffn: usize,
    /// Vocabulary size (rows of `token_embd`).
    pub vocab: usize,
    /// RoPE base (`<arch>.rope.freq_base`, 10 000 when absent).
    pub rope_theta: f64,
    /// RMSNorm epsilon (`<arch>.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f64,
    /// Trained context length (`<arch>.context_length`).
    pub context_length: usize,
    /// A load option, not read from the file: expand quantized weights to
    /// f32 at load (what PyTorch `transformers` does with a GGUF): four to
    /// eight times the memory and the bandwidth, but the arithmetic of the
    /// f32 reference, for parity checks. False from [`Config::from_gguf`].
    pub dequantize: bool,
}

impl Config {
    /// The shape of the block stack (shared with other decoders in
    /// [`edgeflow_nn::Decoder`]): quantized weights kept quantized unless
    /// `dequantize`, Q/K/V biases used when the file has them.
    pub fn decoder_config(&self) -> DecoderConfig {
        DecoderConfig {
            n_layer: self.n_layer,
            d_model: self.d_model,
            n_head: self.n_head,
            n_kv_head: self.n_kv_head,
            head_dim: self.head_dim,
            ffn: self.ffn,
            rms_eps: self.rms_eps,
            format: if self.dequantize {
                WeightFormat::DequantizeQuantized
            } else {
                WeightFormat::Stored
            },
            qkv_bias: QkvBias::IfPresent,
        }
    }

    /// Read the hyper-parameters of a llama GGUF.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let path = g.path();
        let bad = |msg: String| Error::Model {
            path: path.to_path_buf(),
            msg,
        };
        let arch_name = g.meta_str("general.architecture").unwrap_or("");
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => {
                return Err(bad(format!(
                    "general.architecture is `{other}`; supported: `llama`, `qwen2`"
                )))
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let int = |k: &str| {
            let k = key(k);
            g.meta_u64(&k)
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("metadata `{k}` is missing")))
        };
        let n_layer = int("block_count")?;
        let d_model = int("embedding_length")?;
        let n_head = int("attention.head_count")?;
        let n_kv_head = g
            .meta_u64(&key("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or(n_head);
        let ffn = int("feed_forward_length")?;
        let context_length = int("context_length")?;
        if n_head == 0 || n_kv_head == 0 || d_model % n_head != 0 || n_head % n_kv_head != 0 {
            return Err(bad(format!(
                "inconsistent heads: d_model {d_model}, {n_head} heads, {n_kv_head} KV heads"
            )));
        }
        let head_dim = d_model / n_head;
        if head_dim % 2 != 0 {
            return Err(bad(format!("odd head size {head_dim} cannot take RoPE")));
        }
        if let Some(rd) = g.meta_u64(&key("rope.dimension_count")) {
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
            arch,
            n_layer,
            d_model,
            n_head,
            n_kv_head,
            head_dim,
            ffn,
            vocab,
            rope_theta: g.meta_f64(&key("rope.freq_base")).unwrap_or(10_000.0),
            rms_eps: g
                .meta_f64(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            context_length,
            dequantize: false,
        })
    }
}

/// The decoder (Llama or Qwen2, see [`Arch`]) with its KV cache.
#[derive(Debug)]
pub struct Llama {
    cfg: Config,
    dev: Device,
    embed: Embedding,
    /// The blocks (`blk.N.*`), with their KV caches.
    decoder: Decoder,
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
        let host = dev.host();
        // The tensor `name` under `vb`, placed, and its bytes.
        let load = |name: &str| -> Result<(Tensor, usize)> {
            let t = vb.pp(name).host_unchecked("weight")?;
            let t = if cfg.dequantize && t.dtype().is_quantized() {
                host.cast(&t, DType::F32)?
            } else {
                t
            };
            let bytes = t.size_bytes();
            Ok((vb.place_or_host(&t), bytes))
        };
        let hd = cfg.head_dim;
        // The embedding table and an untied output head (the two largest
        // tensors) on a thread of their own beside the blocks: Q/K/V and
        // gate/up stacked when their formats match, Q/K/V biases when the
        // file has them (qwen2).
        let tables = || -> Result<_> {
            let embed = load("token_embd")?;
            let head = if vb.contains("output.weight") {
                Some(load("output")?)
            } else {
                None
            };
            Ok((embed, head))
        };
        let (tables, decoder) = std::thread::scope(|s| {
            let tables = s.spawn(tables);
            let decoder = Decoder::load(&vb.pp("blk"), &cfg.decoder_config(), &DecoderNames::GGUF);
            let tables = tables.join().unwrap_or_else(|_| {
                Err(Error::Model {
                    path: vb.path(),
                    msg: "the thread loading `token_embd` and `output` panicked".into(),
                })
            });
            (tables, decoder)
        });
        let (((embed, embed_bytes), head), decoder) = (tables?, decoder?);
        let (norm, norm_bytes) = load("output_norm")?;
        let norm = RmsNorm::new(norm, cfg.rms_eps);
        let (lm_head, head_bytes) = head.unwrap_or_else(|| (embed.clone(), 0));
        let weight_bytes = embed_bytes + norm_bytes + head_bytes + decoder.weight_bytes();
        // See the module docs: interleaved pairs for llama, halves for qwen2.
        let rope = RotaryEmbedding::new(
            hd,
            cfg.context_length,
            cfg.rope_theta,
            cfg.arch.rope_layout(),
        )?;
        Ok(Llama {
            cfg: cfg.clone(),
            dev,
            embed: Embedding::new(embed),
            decoder,
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
        self.decoder.weight_bytes_per_token()
            + self.norm.weight().size_bytes()
            + self.lm_head.size_bytes()
    }

    /// Keep the first `len` cached tokens (a conversation rolled back to a
    /// shared prefix); no-op when `len` is not shorter than what is cached.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len >= self.pos {
            return Ok(());
        }
        self.decoder.truncate(&self.dev, len)?;
        self.pos = len;
        Ok(())
    }

    /// Forget the KV cache (new conversation or cancelled turn).
    pub fn reset(&mut self) {
        self.decoder.reset();
        self.pos = 0;
    }

    /// Run `tokens` after what is cached, append them to the KV cache and
    /// return the logits (length `vocab`) that follow the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        // One batch: on the CPU the whole pass runs on a worker of the
        // kernels' thread pool (Device::batch), not waking this thread for
        // each of its ~400 ops.
        let dev = self.dev.clone();
        let (logits, _) = dev.batch(|| self.forward_ops(tokens, false))?;
        Ok(logits)
    }

    /// [`Llama::forward`] (the same logits bit for bit, the same KV cache
    /// update) that also returns, for each of the `s` tokens, the row
    /// `norm(h) + embed(token)`: the last decoder layer's output after the
    /// final RMSNorm (Hugging Face's `hidden_states[-1]`) plus the token's
    /// input embedding. Host f32, `[1, s, d_model]`: what Qwen2.5-Omni's
    /// talker takes from its thinker (`edgeflow_omni`'s `TalkerInput`).
    ///
    /// A row depends on the tokens before it only through the KV cache, so
    /// a prefill's rows match those of feeding the same tokens one at a
    /// time: bit for bit on the CPU with the weights kept quantized (every
    /// op computes a row the same way whatever the number of rows), within
    /// f32 rounding with the weights expanded to f32 (the `states` and
    /// `prefill_decode` tests).
    pub fn forward_states(&mut self, tokens: &[u32]) -> Result<(Vec<f32>, Tensor)> {
        let dev = self.dev.clone();
        let (logits, states) = dev.batch(|| self.forward_ops(tokens, true))?;
        let states =
            states.ok_or_else(|| Error::BadInput("forward_states computed no states".into()))?;
        Ok((logits, states))
    }

    /// The input embeddings of `ids` (rows of `token_embd`), host f32
    /// `[1, n, d_model]`; the KV cache is untouched.
    pub fn embed_tokens(&self, ids: &[u32]) -> Result<Tensor> {
        let n = ids.len();
        if n == 0 {
            return Err(Error::BadInput("embed_tokens of zero tokens".into()));
        }
        self.check_ids(ids)?;
        let dev = &self.dev;
        let ids = Tensor::from_i64(ids.iter().map(|&t| i64::from(t)).collect(), &[n])?;
        let x = self.embed.forward(dev, &ids)?;
        host_rows(dev, &x, n, self.cfg.d_model)
    }

    fn check_ids(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            Some(&t) => Err(Error::BadInput(format!(
                "token id {t} is outside the vocabulary of {}",
                self.cfg.vocab
            ))),
            None => Ok(()),
        }
    }

    fn forward_ops(&mut self, tokens: &[u32], states: bool) -> Result<(Vec<f32>, Option<Tensor>)> {
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
        self.check_ids(tokens)?;
        let dev = &self.dev;
        let c = &self.cfg;
        let ids = Tensor::from_i64(tokens.iter().map(|&t| i64::from(t)).collect(), &[s])?;
        let emb = self.embed.forward(dev, &ids)?;
        let emb = dev.reshape(&emb, &[1, s, c.d_model])?;
        let rope = self.rope.at(dev, self.pos, s)?;
        let x = self.decoder.forward(dev, &emb, &rope)?;
        // The logits take exactly the path they take without states (the
        // last row normed on its own), so they are the same bit for bit.
        let last = dev.narrow(&x, 1, s - 1, 1)?;
        let last = self.norm.forward(dev, &last)?;
        let logits = self.lm_head.forward(dev, &last)?;
        let logits = dev.to_host(&logits)?.to_vec_f32()?;
        let states = if states {
            let h = self.norm.forward(dev, &x)?;
            let rows = dev.add(&h, &emb)?;
            Some(host_rows(dev, &rows, s, c.d_model)?)
        } else {
            None
        };
        self.pos += s;
        Ok((logits, states))
    }
}

/// `t` (n x d values) as a plain host f32 tensor `[1, n, d]`.
fn host_rows(dev: &Device, t: &Tensor, n: usize, d: usize) -> Result<Tensor> {
    let v = dev.to_host(t)?.to_vec_f32()?;
    Ok(Tensor::from_vec(v, &[1, n, d])?)
}
