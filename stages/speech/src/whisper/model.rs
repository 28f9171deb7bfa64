//! Whisper encoder and decoder on the edgeflow runtime, loaded from a
//! CTranslate2 `model.bin` (faster-whisper's format).
//!
//! CTranslate2 stores attention projections fused (`self_attention/linear_0`
//! is `[q; k; v]`, cross-attention `linear_1` is `[k; v]`); they are split at
//! load into Whisper's separate query / key / value projections (the key
//! has no bias in Whisper; its fused bias slice is zero). fp16 weights are
//! cast to f32 once.

use crate::{Error, Result};
use edgeflow_runtime::weights::WeightStore;
use edgeflow_runtime::{ConvCfg, DType, Device, DeviceKind, KvCache, Tensor, UnaryOp};
use std::path::Path;

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

struct Linear {
    w: Tensor,
    /// The checkpoint's fp16 weights as f16 (decoder, CPU): decoder steps
    /// (a few rows) stream half the bytes with the same f32 products.
    w16: Option<Tensor>,
    b: Option<Tensor>,
}

/// Activation rows up to which a linear with f16 weights reads them (the
/// CPU backend's f16 GEMV); longer prompts take the f32 GEMM.
const F16_ROWS: usize = 8;

impl Linear {
    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let rows = x.dims().iter().rev().skip(1).product::<usize>();
        let w = match &self.w16 {
            Some(w16) if rows <= F16_ROWS => w16,
            _ => &self.w,
        };
        Ok(dev.linear(x, w, self.b.as_ref())?)
    }
}

struct Norm {
    g: Tensor,
    b: Tensor,
}

impl Norm {
    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        Ok(dev.layer_norm(x, &self.g, Some(&self.b), 1e-5)?)
    }
}

struct Attention {
    ln: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
}

struct Mlp {
    ln: Norm,
    fc1: Linear,
    fc2: Linear,
}

struct EncoderLayer {
    attn: Attention,
    mlp: Mlp,
}

struct DecoderLayer {
    self_attn: Attention,
    cross: Attention,
    mlp: Mlp,
}

/// Whisper (encoder + decoder) weights on a device.
pub struct Whisper {
    dev: Device,
    cfg: WhisperConfig,
    conv1: (Tensor, Tensor),
    conv2: (Tensor, Tensor),
    enc_pos: Tensor,
    enc_layers: Vec<EncoderLayer>,
    enc_ln: Norm,
    embed: Tensor,
    /// The output projection (tied to `embed`): the checkpoint's fp16
    /// values kept as f16 on the CPU, where the linear converts them in
    /// registers (the same f32 products as `embed`, half the bytes per
    /// decoder step); `embed` itself elsewhere.
    logits_w: Tensor,
    dec_pos: Tensor,
    dec_layers: Vec<DecoderLayer>,
    dec_ln: Norm,
    attn_chunk: usize,
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
    ws: &'a WeightStore,
    path: &'a Path,
    /// Also keep fp16-stored linear weights as f16 (see [`Linear::w16`]).
    f16: bool,
}

impl Loader<'_> {
    fn t(&self, name: &str) -> Result<Tensor> {
        Ok(self.ws.get_as(name, DType::F32)?)
    }

    fn norm(&self, p: &str) -> Result<Norm> {
        Ok(Norm {
            g: self.t(&format!("{p}/gamma"))?,
            b: self.t(&format!("{p}/beta"))?,
        })
    }

    fn linear(&self, p: &str) -> Result<Linear> {
        let name = format!("{p}/weight");
        let w16 = if self.f16 {
            let stored = self.ws.get(&name)?;
            (stored.dtype() == DType::F16).then_some(stored)
        } else {
            None
        };
        Ok(Linear {
            w: self.t(&name)?,
            w16,
            b: Some(self.t(&format!("{p}/bias"))?),
        })
    }

    /// Rows `[i*d, (i+1)*d)` of a fused projection.
    fn split(&self, l: &Linear, parts: usize, i: usize, d: usize, bias: bool) -> Result<Linear> {
        let dev = self.ws.device();
        if l.w.dims().first() != Some(&(parts * d)) {
            return Err(Error::bad_model(
                self.path,
                format!(
                    "fused attention projection has dims {:?}, expected [{}, {d}]",
                    l.w.dims(),
                    parts * d
                ),
            ));
        }
        let w = dev.narrow(&l.w, 0, i * d, d)?;
        let w16 = match &l.w16 {
            Some(w16) => Some(dev.narrow(w16, 0, i * d, d)?),
            None => None,
        };
        let b = match (&l.b, bias) {
            (Some(b), true) => Some(dev.narrow(b, 0, i * d, d)?),
            _ => None,
        };
        Ok(Linear { w, w16, b })
    }

    fn self_attention(&self, p: &str, d: usize) -> Result<Attention> {
        let qkv = self.linear(&format!("{p}/linear_0"))?;
        Ok(Attention {
            ln: self.norm(&format!("{p}/layer_norm"))?,
            q: self.split(&qkv, 3, 0, d, true)?,
            k: self.split(&qkv, 3, 1, d, false)?,
            v: self.split(&qkv, 3, 2, d, true)?,
            out: self.linear(&format!("{p}/linear_1"))?,
        })
    }

    fn cross_attention(&self, p: &str, d: usize) -> Result<Attention> {
        let kv = self.linear(&format!("{p}/linear_1"))?;
        Ok(Attention {
            ln: self.norm(&format!("{p}/layer_norm"))?,
            q: self.linear(&format!("{p}/linear_0"))?,
            k: self.split(&kv, 2, 0, d, false)?,
            v: self.split(&kv, 2, 1, d, true)?,
            out: self.linear(&format!("{p}/linear_2"))?,
        })
    }

    fn mlp(&self, p: &str) -> Result<Mlp> {
        Ok(Mlp {
            ln: self.norm(&format!("{p}/layer_norm"))?,
            fc1: self.linear(&format!("{p}/linear_0"))?,
            fc2: self.linear(&format!("{p}/linear_1"))?,
        })
    }
}

fn count_layers(ws: &WeightStore, prefix: &str) -> usize {
    (0..)
        .take_while(|i| ws.contains(&format!("{prefix}/layer_{i}/ffn/linear_0/weight")))
        .count()
}

impl Whisper {
    /// Load a CTranslate2 Whisper `model.bin` onto `dev`.
    pub fn load(model_bin: &Path, dev: &Device) -> Result<Self> {
        let ws = WeightStore::open(&[model_bin], dev.clone())?;
        let mut l = Loader {
            ws: &ws,
            path: model_bin,
            f16: false,
        };
        let conv1w = l.t("encoder/conv1/weight")?;
        let embed = l.t("decoder/embeddings/weight")?;
        let enc_pos = l.t("encoder/position_encodings/encodings")?;
        let dec_pos = l.t("decoder/position_encodings/encodings")?;
        let (&[d_model, n_mels, 3], &[vocab, d2], &[n_audio_ctx, _], &[n_text_ctx, _]) =
            (conv1w.dims(), embed.dims(), enc_pos.dims(), dec_pos.dims())
        else {
            return Err(Error::bad_model(
                model_bin,
                "not a Whisper CTranslate2 model (conv1, embeddings or position encodings have unexpected ranks)",
            ));
        };
        if d2 != d_model || d_model % 64 != 0 {
            return Err(Error::bad_model(
                model_bin,
                format!("embedding width {d2} does not match the encoder width {d_model}"),
            ));
        }
        let cfg = WhisperConfig {
            n_mels,
            d_model,
            n_heads: d_model / 64,
            encoder_layers: count_layers(&ws, "encoder"),
            decoder_layers: count_layers(&ws, "decoder"),
            vocab,
            n_audio_ctx,
            n_text_ctx,
        };
        let d = d_model;
        let mut enc_layers = Vec::new();
        for i in 0..cfg.encoder_layers {
            let p = format!("encoder/layer_{i}");
            enc_layers.push(EncoderLayer {
                attn: l.self_attention(&format!("{p}/self_attention"), d)?,
                mlp: l.mlp(&format!("{p}/ffn"))?,
            });
        }
        // Decoder steps are GEMVs over the weights: f16 halves their bytes.
        l.f16 = dev.kind() == DeviceKind::Cpu;
        let mut dec_layers = Vec::new();
        for i in 0..cfg.decoder_layers {
            let p = format!("decoder/layer_{i}");
            dec_layers.push(DecoderLayer {
                self_attn: l.self_attention(&format!("{p}/self_attention"), d)?,
                cross: l.cross_attention(&format!("{p}/attention"), d)?,
                mlp: l.mlp(&format!("{p}/ffn"))?,
            });
        }
        // Stored fp16 -> exact as f16. Anything else keeps the f32 copy.
        let stored = ws.get("decoder/embeddings/weight")?;
        let logits_w = if stored.dtype() == DType::F16 && dev.kind() == DeviceKind::Cpu {
            stored
        } else {
            embed.clone()
        };
        Ok(Whisper {
            conv1: (conv1w, l.t("encoder/conv1/bias")?),
            conv2: (l.t("encoder/conv2/weight")?, l.t("encoder/conv2/bias")?),
            enc_pos,
            enc_layers,
            enc_ln: l.norm("encoder/layer_norm")?,
            embed,
            logits_w,
            dec_pos,
            dec_layers,
            dec_ln: l.norm("decoder/layer_norm")?,
            dev: dev.clone(),
            cfg,
            attn_chunk: 250,
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

    /// `[1, s, d]` -> `[1, h, s, 64]`.
    fn heads(&self, x: &Tensor) -> Result<Tensor> {
        let s = x.dims()[1];
        let x = self.dev.reshape(x, &[1, s, self.cfg.n_heads, 64])?;
        Ok(self.dev.permute(&x, &[0, 2, 1, 3])?)
    }

    /// `[1, h, s, 64]` -> `[1, s, d]`.
    fn merge(&self, x: &Tensor) -> Result<Tensor> {
        let s = x.dims()[2];
        let x = self.dev.permute(x, &[0, 2, 1, 3])?;
        Ok(self.dev.reshape(&x, &[1, s, self.cfg.d_model])?)
    }

    fn mlp(&self, m: &Mlp, x: &Tensor) -> Result<Tensor> {
        let dev = &self.dev;
        let h = m.ln.forward(dev, x)?;
        let h = m.fc1.forward(dev, &h)?;
        let h = dev.unary(UnaryOp::GeluErf, &h)?;
        let h = m.fc2.forward(dev, &h)?;
        Ok(dev.add(x, &h)?)
    }

    /// Non-causal attention computed for blocks of query rows, so that each
    /// block's score matrix stays cache-sized (the full 1500 x 1500 x heads
    /// matrix is 54 MB); identical results.
    fn chunked_attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
        let dev = &self.dev;
        let n = q.dims()[2];
        let chunk = self.attn_chunk.max(1);
        if n <= chunk {
            return Ok(dev.attention(q, k, v, None, scale, false)?);
        }
        let mut outs = Vec::new();
        let mut s = 0;
        while s < n {
            let len = chunk.min(n - s);
            let qc = dev.narrow(q, 2, s, len)?;
            outs.push(dev.attention(&qc, k, v, None, scale, false)?);
            s += len;
        }
        let refs: Vec<&Tensor> = outs.iter().collect();
        Ok(dev.concat(&refs, 2)?)
    }

    /// Set the query block size of the encoder's attention (rows per block).
    pub fn set_attention_chunk(&mut self, rows: usize) {
        self.attn_chunk = rows;
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
        let pad1 = ConvCfg {
            padding: 1,
            ..Default::default()
        };
        let x = dev.conv1d(&x, &self.conv1.0, Some(&self.conv1.1), pad1)?;
        let x = dev.unary(UnaryOp::GeluErf, &x)?;
        let x = dev.conv1d(
            &x,
            &self.conv2.0,
            Some(&self.conv2.1),
            ConvCfg { stride: 2, ..pad1 },
        )?;
        let x = dev.unary(UnaryOp::GeluErf, &x)?;
        let x = dev.transpose(&x, 1, 2)?;
        let mut x = dev.add(&x, &self.enc_pos)?;
        let scale = 1.0 / (64f64).sqrt();
        for layer in &self.enc_layers {
            let a = &layer.attn;
            let h = a.ln.forward(dev, &x)?;
            let q = self.heads(&a.q.forward(dev, &h)?)?;
            let k = self.heads(&a.k.forward(dev, &h)?)?;
            let v = self.heads(&a.v.forward(dev, &h)?)?;
            let o = self.chunked_attention(&q, &k, &v, scale)?;
            let o = a.out.forward(dev, &self.merge(&o)?)?;
            x = dev.add(&x, &o)?;
            x = self.mlp(&layer.mlp, &x)?;
        }
        self.enc_ln.forward(dev, &x)
    }

    /// A fresh decoder state for encoded audio `enc` (`[1, n_audio_ctx, d]`):
    /// the cross-attention keys and values are computed once here.
    pub fn start(&self, enc: &Tensor) -> Result<DecoderState> {
        let mut cross_kv = Vec::with_capacity(self.dec_layers.len());
        for layer in &self.dec_layers {
            let k = self.heads(&layer.cross.k.forward(&self.dev, enc)?)?;
            let v = self.heads(&layer.cross.v.forward(&self.dev, enc)?)?;
            cross_kv.push((k, v));
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
        let x = dev.index_select(&self.embed, &ids, 0)?;
        let pos = dev.narrow(&self.dec_pos, 0, st.offset, s)?;
        let x = dev.add(&x, &pos)?;
        let mut x = dev.reshape(&x, &[1, s, self.cfg.d_model])?;
        let scale = 1.0 / (64f64).sqrt();
        for (i, layer) in self.dec_layers.iter().enumerate() {
            let a = &layer.self_attn;
            let h = a.ln.forward(dev, &x)?;
            let q = self.heads(&a.q.forward(dev, &h)?)?;
            let k = self.heads(&a.k.forward(dev, &h)?)?;
            let v = self.heads(&a.v.forward(dev, &h)?)?;
            let (k, v) = st.self_kv[i].append(dev, &k, &v)?;
            let o = dev.attention(&q, &k, &v, None, scale, true)?;
            x = dev.add(&x, &a.out.forward(dev, &self.merge(&o)?)?)?;

            let c = &layer.cross;
            let h = c.ln.forward(dev, &x)?;
            let q = self.heads(&c.q.forward(dev, &h)?)?;
            let (ck, cv) = &st.cross_kv[i];
            let o = dev.attention(&q, ck, cv, None, scale, false)?;
            x = dev.add(&x, &c.out.forward(dev, &self.merge(&o)?)?)?;

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
            let logits = dev.linear(&row, &self.logits_w, None)?;
            out.push(dev.to_host(&logits)?.to_vec_f32()?);
        }
        Ok(out)
    }
}
