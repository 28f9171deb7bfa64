//! Whisper encoder and decoder on the edgeflow runtime, loaded from a
//! CTranslate2 `model.bin` (faster-whisper's format).
//!
//! CTranslate2 stores attention projections fused (`self_attention/linear_0`
//! is `[q; k; v]`, cross-attention `linear_1` is `[k; v]`); they are split at
//! load into Whisper's separate query / key / value projections (the key
//! has no bias in Whisper; its fused bias slice is zero). fp16 weights are
//! cast to f32 once. Names are read through a [`VarBuilder`] with `/` as
//! the separator, mirroring the file.

use crate::{Error, Result};
use edgeflow_nn::{
    Attention, Conv1d, Conv1dConfig, Embedding, KvCache, LayerNorm, Linear, Masking, Projections,
    VarBuilder,
};
use edgeflow_runtime::{DType, Device, DeviceKind, Tensor, UnaryOp};

/// Shape of a Whisper checkpoint, read from the tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WhisperConfig {
    /// Mel bins (80).
    pub n_mels: usize,
    /// Model width (384 for tiny).
    pub d_model: usize,
    /// Attention heads (width / 64).
    pub n_heads: usize,
    /// Encoder layers.
    pub encoder_layers: usize,
    /// Decoder layers.
    pub decoder_layers: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Encoder positions (1500).
    pub n_audio_ctx: usize,
    /// Decoder positions (448).
    pub n_text_ctx: usize,
}

/// Activation rows up to which a linear with f16 weights reads them (the
/// CPU backend's f16 GEMV); longer prompts take the f32 GEMM.
const F16_ROWS: usize = 8;

/// Query rows per block of the encoder's attention (see
/// [`Whisper::set_attention_chunk`]).
const ATTENTION_CHUNK: usize = 250;

/// Width of one attention head in every Whisper size.
const HEAD_DIM: usize = 64;

/// Layer-norm epsilon.
const LN_EPS: f64 = 1e-5;

impl WhisperConfig {
    /// Read the shape from a checkpoint's tensors (conv1, embeddings,
    /// position encodings, layer count).
    pub fn from_weights(vb: &VarBuilder) -> Result<Self> {
        let dims = |name: &str| -> Result<Vec<usize>> {
            vb.info(name).map(|i| i.dims).ok_or_else(|| {
                Error::bad_model(
                    &vb.path(),
                    format!("not a Whisper CTranslate2 model: tensor `{name}` is missing"),
                )
            })
        };
        let (conv1w, embed, enc_pos, dec_pos) = (
            dims("encoder/conv1/weight")?,
            dims("decoder/embeddings/weight")?,
            dims("encoder/position_encodings/encodings")?,
            dims("decoder/position_encodings/encodings")?,
        );
        let (&[d_model, n_mels, 3], &[vocab, d2], &[n_audio_ctx, _], &[n_text_ctx, _]) = (
            conv1w.as_slice(),
            embed.as_slice(),
            enc_pos.as_slice(),
            dec_pos.as_slice(),
        ) else {
            return Err(Error::bad_model(
                &vb.path(),
                "not a Whisper CTranslate2 model (conv1, embeddings or position encodings have unexpected ranks)",
            ));
        };
        if d2 != d_model || d_model % HEAD_DIM != 0 {
            return Err(Error::bad_model(
                &vb.path(),
                format!("embedding width {d2} does not match the encoder width {d_model}"),
            ));
        }
        let count_layers = |side: &str| {
            (0..)
                .take_while(|i| vb.contains(&format!("{side}/layer_{i}/ffn/linear_0/weight")))
                .count()
        };
        Ok(WhisperConfig {
            n_mels,
            d_model,
            n_heads: d_model / HEAD_DIM,
            encoder_layers: count_layers("encoder"),
            decoder_layers: count_layers("decoder"),
            vocab,
            n_audio_ctx,
            n_text_ctx,
        })
    }
}

struct Mlp {
    ln: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

struct EncoderLayer {
    ln: LayerNorm,
    attn: Attention,
    mlp: Mlp,
}

struct DecoderLayer {
    ln: LayerNorm,
    self_attn: Attention,
    cross_ln: LayerNorm,
    cross: Attention,
    mlp: Mlp,
}

/// Whisper (encoder + decoder) weights on a device.
pub struct Whisper {
    dev: Device,
    cfg: WhisperConfig,
    conv1: Conv1d,
    conv2: Conv1d,
    enc_pos: Tensor,
    enc_layers: Vec<EncoderLayer>,
    enc_ln: LayerNorm,
    embed: Embedding,
    /// The output projection (tied to `embed`): the checkpoint's fp16
    /// values kept as f16 on the CPU, where the linear converts them in
    /// registers (the same f32 products as `embed`, half the bytes per
    /// decoder step); `embed` itself elsewhere.
    logits: Linear,
    dec_pos: Tensor,
    dec_layers: Vec<DecoderLayer>,
    dec_ln: LayerNorm,
}

impl std::fmt::Debug for Whisper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Whisper").field("cfg", &self.cfg).finish()
    }
}

/// Per-utterance decoder state: self-attention KV caches, cross-attention
/// keys/values of the encoded audio, and the position.
pub struct DecoderState {
    self_kv: Vec<KvCache>,
    cross_kv: Vec<(Tensor, Tensor)>,
    offset: usize,
}

impl std::fmt::Debug for DecoderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecoderState")
            .field("offset", &self.offset)
            .finish()
    }
}

impl DecoderState {
    /// Tokens decoded so far (the next position).
    pub fn offset(&self) -> usize {
        self.offset
    }
}

struct Loader<'a> {
    vb: &'a VarBuilder,
    cfg: &'a WhisperConfig,
    /// Also keep fp16-stored linear weights as f16 for few-row calls.
    f16: bool,
}

impl Loader<'_> {
    fn norm(&self, p: &str) -> Result<LayerNorm> {
        Ok(LayerNorm::load_gamma_beta(
            &self.vb.pp(p),
            self.cfg.d_model,
            LN_EPS,
        )?)
    }

    fn linear(&self, p: &str) -> Result<Linear> {
        let vb = self.vb.pp(p);
        let w16 = if self.f16 {
            let stored = vb.get_unchecked("weight")?;
            (stored.dtype() == DType::F16).then_some(stored)
        } else {
            None
        };
        let l = Linear::load_f32(&vb, true)?;
        Ok(match w16 {
            Some(w16) => l.with_small_batch_weight(w16, F16_ROWS)?,
            None => l,
        })
    }

    /// Rows `[i*d, (i+1)*d)` of a fused projection.
    fn split(&self, l: &Linear, parts: usize, i: usize, bias: bool) -> Result<Linear> {
        let d = self.cfg.d_model;
        if l.weight().dims().first() != Some(&(parts * d)) {
            return Err(Error::bad_model(
                &self.vb.path(),
                format!(
                    "fused attention projection has dims {:?}, expected [{}, {d}]",
                    l.weight().dims(),
                    parts * d
                ),
            ));
        }
        Ok(l.rows(self.vb.device(), i * d, d, bias)?)
    }

    fn attention(&self, proj: Projections, out: Linear) -> Result<Attention> {
        let h = self.cfg.n_heads;
        Ok(Attention::new(proj, out, h, h, HEAD_DIM)?)
    }

    fn self_attention(&self, p: &str) -> Result<Attention> {
        let qkv = self.linear(&format!("{p}/linear_0"))?;
        let proj = Projections::Separate {
            q: self.split(&qkv, 3, 0, true)?,
            k: self.split(&qkv, 3, 1, false)?,
            v: self.split(&qkv, 3, 2, true)?,
        };
        self.attention(proj, self.linear(&format!("{p}/linear_1"))?)
    }

    fn cross_attention(&self, p: &str) -> Result<Attention> {
        let kv = self.linear(&format!("{p}/linear_1"))?;
        let proj = Projections::Separate {
            q: self.linear(&format!("{p}/linear_0"))?,
            k: self.split(&kv, 2, 0, false)?,
            v: self.split(&kv, 2, 1, true)?,
        };
        self.attention(proj, self.linear(&format!("{p}/linear_2"))?)
    }

    fn mlp(&self, p: &str) -> Result<Mlp> {
        Ok(Mlp {
            ln: self.norm(&format!("{p}/layer_norm"))?,
            fc1: self.linear(&format!("{p}/linear_0"))?,
            fc2: self.linear(&format!("{p}/linear_1"))?,
        })
    }
}

impl Whisper {
    /// Load a CTranslate2 Whisper checkpoint (`model.bin`, opened with `/`
    /// as the separator: `VarBuilder::open(&[path], dev)?.with_separator("/")`)
    /// onto the device `vb` carries; `cfg` from [`WhisperConfig::from_weights`].
    pub fn load(vb: &VarBuilder, cfg: &WhisperConfig) -> Result<Self> {
        let dev = vb.device().clone();
        let mut l = Loader {
            vb,
            cfg,
            f16: false,
        };
        let d = cfg.d_model;
        let conv = |name: &str, c_in: usize, stride: usize| -> Result<Conv1d> {
            let c = Conv1dConfig {
                stride,
                padding: Some(1),
                ..Conv1dConfig::default()
            };
            Ok(Conv1d::load(&vb.pp("encoder").pp(name), c_in, d, 3, c)?)
        };
        let conv1 = conv("conv1", cfg.n_mels, 1)?;
        let conv2 = conv("conv2", d, 2)?;
        let embed = vb.get_f32("decoder/embeddings/weight", &[cfg.vocab, d])?;
        let enc_pos = vb.get_f32(
            "encoder/position_encodings/encodings",
            &[cfg.n_audio_ctx, d],
        )?;
        let dec_pos = vb.get_f32("decoder/position_encodings/encodings", &[cfg.n_text_ctx, d])?;
        let mut enc_layers = Vec::new();
        for i in 0..cfg.encoder_layers {
            let p = format!("encoder/layer_{i}");
            let a = format!("{p}/self_attention");
            enc_layers.push(EncoderLayer {
                ln: l.norm(&format!("{a}/layer_norm"))?,
                attn: l.self_attention(&a)?.with_query_chunk(ATTENTION_CHUNK),
                mlp: l.mlp(&format!("{p}/ffn"))?,
            });
        }
        // Decoder steps are GEMVs over the weights: f16 halves their bytes.
        l.f16 = dev.kind() == DeviceKind::Cpu;
        let mut dec_layers = Vec::new();
        for i in 0..cfg.decoder_layers {
            let p = format!("decoder/layer_{i}");
            let (a, c) = (format!("{p}/self_attention"), format!("{p}/attention"));
            dec_layers.push(DecoderLayer {
                ln: l.norm(&format!("{a}/layer_norm"))?,
                self_attn: l.self_attention(&a)?,
                cross_ln: l.norm(&format!("{c}/layer_norm"))?,
                cross: l.cross_attention(&c)?,
                mlp: l.mlp(&format!("{p}/ffn"))?,
            });
        }
        // Stored fp16 -> exact as f16. Anything else keeps the f32 copy.
        let stored = vb.get_unchecked("decoder/embeddings/weight")?;
        let logits_w = if stored.dtype() == DType::F16 && dev.kind() == DeviceKind::Cpu {
            stored
        } else {
            embed.clone()
        };
        Ok(Whisper {
            conv1,
            conv2,
            enc_pos,
            enc_layers,
            enc_ln: l.norm("encoder/layer_norm")?,
            embed: Embedding::new(embed),
            logits: Linear::new(logits_w, None),
            dec_pos,
            dec_layers,
            dec_ln: l.norm("decoder/layer_norm")?,
            dev,
            cfg: *cfg,
        })
    }

    /// The checkpoint's shape.
    pub fn config(&self) -> &WhisperConfig {
        &self.cfg
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    fn mlp(&self, m: &Mlp, x: &Tensor) -> Result<Tensor> {
        let dev = &self.dev;
        let h = m.ln.forward(dev, x)?;
        let h = m.fc1.forward(dev, &h)?;
        let h = dev.unary(UnaryOp::GeluErf, &h)?;
        let h = m.fc2.forward(dev, &h)?;
        Ok(dev.add(x, &h)?)
    }

    /// Set the query block size of the encoder's attention (rows per
    /// block): each block's score matrix stays cache-sized (the full 1500 x
    /// 1500 x heads matrix is 54 MB); identical results.
    pub fn set_attention_chunk(&mut self, rows: usize) {
        for l in &mut self.enc_layers {
            l.attn.set_query_chunk(rows);
        }
    }

    /// Encode log-mel features `[n_mels, 2 * n_audio_ctx]` (row-major) to
    /// `[1, n_audio_ctx, d]`.
    pub fn encode(&self, mel: &[f32]) -> Result<Tensor> {
        // One batch of ops (on the CPU: run on the kernels' worker pool).
        self.dev.batch(|| self.encode_ops(mel))
    }

    fn encode_ops(&self, mel: &[f32]) -> Result<Tensor> {
        let dev = &self.dev;
        let frames = 2 * self.cfg.n_audio_ctx;
        if mel.len() != self.cfg.n_mels * frames {
            return Err(Error::BadInput(format!(
                "Whisper's encoder takes {} x {frames} mel features, got {} values",
                self.cfg.n_mels,
                mel.len()
            )));
        }
        let x = dev.place(&Tensor::from_slice(mel, &[1, self.cfg.n_mels, frames])?)?;
        let x = self.conv1.forward(dev, &x)?;
        let x = dev.unary(UnaryOp::GeluErf, &x)?;
        let x = self.conv2.forward(dev, &x)?;
        let x = dev.unary(UnaryOp::GeluErf, &x)?;
        let x = dev.transpose(&x, 1, 2)?;
        let mut x = dev.add(&x, &self.enc_pos)?;
        for layer in &self.enc_layers {
            let h = layer.ln.forward(dev, &x)?;
            let o = layer.attn.forward(dev, &h, None, None, Masking::Full)?;
            x = dev.add(&x, &o)?;
            x = self.mlp(&layer.mlp, &x)?;
        }
        Ok(self.enc_ln.forward(dev, &x)?)
    }

    /// A fresh decoder state for encoded audio `enc` (`[1, n_audio_ctx, d]`):
    /// the cross-attention keys and values are computed once here.
    pub fn start(&self, enc: &Tensor) -> Result<DecoderState> {
        let mut cross_kv = Vec::with_capacity(self.dec_layers.len());
        for layer in &self.dec_layers {
            cross_kv.push(layer.cross.key_values(&self.dev, enc)?);
        }
        Ok(DecoderState {
            self_kv: vec![KvCache::new(); self.dec_layers.len()],
            cross_kv,
            offset: 0,
        })
    }

    /// Run the decoder on `tokens` (appended after what `st` holds) and
    /// return the logits (host, `vocab` each) at the positions `want`
    /// (indices into `tokens`).
    pub fn decode(
        &self,
        st: &mut DecoderState,
        tokens: &[u32],
        want: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        // One batch of ops (on the CPU: run on the kernels' worker pool).
        self.dev.batch(|| self.decode_ops(st, tokens, want))
    }

    fn decode_ops(
        &self,
        st: &mut DecoderState,
        tokens: &[u32],
        want: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let dev = &self.dev;
        let s = tokens.len();
        if s == 0 || st.offset + s > self.cfg.n_text_ctx {
            return Err(Error::BadInput(format!(
                "Whisper's decoder holds {} tokens; {} + {s} do not fit",
                self.cfg.n_text_ctx, st.offset
            )));
        }
        let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        let ids = dev.place(&Tensor::from_i64(ids, &[s])?)?;
        let x = self.embed.forward(dev, &ids)?;
        let pos = dev.narrow(&self.dec_pos, 0, st.offset, s)?;
        let x = dev.add(&x, &pos)?;
        let mut x = dev.reshape(&x, &[1, s, self.cfg.d_model])?;
        for (i, layer) in self.dec_layers.iter().enumerate() {
            let h = layer.ln.forward(dev, &x)?;
            let o = layer.self_attn.forward(
                dev,
                &h,
                None,
                Some(&mut st.self_kv[i]),
                Masking::Causal,
            )?;
            x = dev.add(&x, &o)?;

            let h = layer.cross_ln.forward(dev, &x)?;
            let (ck, cv) = &st.cross_kv[i];
            x = dev.add(&x, &layer.cross.forward_cross(dev, &h, ck, cv)?)?;

            x = self.mlp(&layer.mlp, &x)?;
        }
        st.offset += s;
        let x = self.dec_ln.forward(dev, &x)?;
        let mut out = Vec::with_capacity(want.len());
        for &p in want {
            if p >= s {
                return Err(Error::BadInput(format!(
                    "logits wanted at position {p} of {s} tokens"
                )));
            }
            let row = dev.narrow(&x, 1, p, 1)?;
            let row = dev.reshape(&row, &[1, self.cfg.d_model])?;
            let logits = self.logits.forward(dev, &row)?;
            out.push(dev.to_host(&logits)?.to_vec_f32()?);
        }
        Ok(out)
    }
}
