//! The Llama / Qwen2 decoder layer and a stack of them ([`Decoder`]),
//! shared by the models built on that block (the thinker's Llama and
//! Qwen2.5 from GGUF, Qwen2.5-Omni's talker from Hugging Face
//! safetensors).
//!
//! One layer (pre-norm, residual around each half):
//!
//! ```text
//! x += o(attention(rope(q(n)), rope(k(n)), v(n)))   n = rms_norm(x)
//! x += down(silu(gate(n)) * up(n))                   n = rms_norm(x)
//! ```
//!
//! with grouped-query attention (`n_kv_head` divides `n_head`), a head
//! size that may differ from `d_model / n_head`, optional biases on the
//! Q/K/V projections, causal masking and a per-layer KV cache.
//!
//! Tensor names come from a [`DecoderNames`]: [`DecoderNames::GGUF`]
//! (llama.cpp: `blk.N.attn_q`, `ffn_gate`, ...) or
//! [`DecoderNames::HF`] (Hugging Face: `model.layers.N.self_attn.q_proj`,
//! `mlp.gate_proj`, `input_layernorm`, ...). The caller passes the
//! [`VarBuilder`] of the layer list (`vb.pp("blk")`,
//! `vb.pp("model").pp("layers")`).
//!
//! Projections that read the same input are stacked into one linear (one
//! GEMV per token) when their weights share a storage format: Q/K/V, and
//! gate/up. Quantized weights stay quantized (mixed quantizations such as
//! Q4_K_M keep each matrix in its own format, then the projections stay
//! separate) unless [`WeightFormat`] asks otherwise.

use crate::{stack_rows, Attention, Error, KvCache, Linear, Masking, Projections, Result};
use crate::{RmsNorm, RopeAt, VarBuilder};
use edgeflow_runtime::{DType, Device, Tensor};

/// The names of one layer's tensors (each followed by `.weight`, and
/// `.bias` for the optional Q/K/V biases), relative to the layer's
/// prefix `<list>.N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderNames {
    /// RMSNorm before attention.
    pub attn_norm: &'static str,
    /// Query projection.
    pub q: &'static str,
    /// Key projection.
    pub k: &'static str,
    /// Value projection.
    pub v: &'static str,
    /// Attention output projection.
    pub o: &'static str,
    /// RMSNorm before the MLP.
    pub ffn_norm: &'static str,
    /// MLP gate projection (through SiLU).
    pub gate: &'static str,
    /// MLP up projection.
    pub up: &'static str,
    /// MLP down projection.
    pub down: &'static str,
}

impl DecoderNames {
    /// llama.cpp's GGUF names (`blk.N.attn_q.weight`, ...).
    pub const GGUF: DecoderNames = DecoderNames {
        attn_norm: "attn_norm",
        q: "attn_q",
        k: "attn_k",
        v: "attn_v",
        o: "attn_output",
        ffn_norm: "ffn_norm",
        gate: "ffn_gate",
        up: "ffn_up",
        down: "ffn_down",
    };

    /// Hugging Face `transformers`' names for Llama / Qwen2 layers
    /// (`model.layers.N.self_attn.q_proj.weight`, ...).
    pub const HF: DecoderNames = DecoderNames {
        attn_norm: "input_layernorm",
        q: "self_attn.q_proj",
        k: "self_attn.k_proj",
        v: "self_attn.v_proj",
        o: "self_attn.o_proj",
        ffn_norm: "post_attention_layernorm",
        gate: "mlp.gate_proj",
        up: "mlp.up_proj",
        down: "mlp.down_proj",
    };
}

/// The storage format projection weights are kept in. Norm weights and
/// biases are always f32 (cast at load when stored otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// As stored: f32, f16, bf16 or quantized blocks (the runtime's
    /// `linear` reads each).
    #[default]
    Stored,
    /// Quantized blocks expanded to f32 (the arithmetic of an f32
    /// reference, for parity checks); float weights as stored.
    DequantizeQuantized,
    /// Every weight as f32 (f16 / bf16 widened, quantized blocks expanded).
    F32,
    /// Float weights as bf16 (f32 / f16 rounded to the nearest, ties to
    /// even), quantized blocks as stored. On a CPU with AVX512_BF16 the
    /// linear layers then hold half an f32 checkpoint's memory and run its
    /// bf16 dot product (activations rounded to bf16, sums in f32); other
    /// CPUs widen them to f32 once.
    Bf16,
}

impl WeightFormat {
    /// The dtype a weight stored as `dt` is kept in.
    pub fn kept_as(self, dt: DType) -> DType {
        match self {
            WeightFormat::Stored => dt,
            WeightFormat::DequantizeQuantized if dt.is_quantized() => DType::F32,
            WeightFormat::DequantizeQuantized => dt,
            WeightFormat::F32 => DType::F32,
            WeightFormat::Bf16 if dt.is_quantized() => dt,
            WeightFormat::Bf16 => DType::BF16,
        }
    }
}

/// Whether the Q/K/V projections have biases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QkvBias {
    /// Used when the checkpoint has all three (`<q>.bias`, ...).
    #[default]
    IfPresent,
    /// Required: a missing one is an error naming it (Qwen2).
    Required,
    /// None (any in the checkpoint are ignored).
    Absent,
}

/// Hyper-parameters of a [`Decoder`].
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    /// Layers.
    pub n_layer: usize,
    /// Hidden size (input and output of each layer).
    pub d_model: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key / value heads (they divide `n_head`).
    pub n_kv_head: usize,
    /// Size of one head (even; `n_head * head_dim` need not be `d_model`).
    pub head_dim: usize,
    /// MLP inner size.
    pub ffn: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// Storage format of the projection weights.
    pub format: WeightFormat,
    /// Q/K/V biases.
    pub qkv_bias: QkvBias,
}

impl DecoderConfig {
    /// Reject sizes no decoder can have (zero sizes, heads that do not
    /// group, odd head size).
    pub fn check(&self) -> Result<()> {
        let c = self;
        if c.n_layer == 0 || c.d_model == 0 || c.ffn == 0 || c.head_dim == 0 {
            return Err(Error::BadInput(format!(
                "decoder sizes must be positive: {} layers, hidden {}, MLP {}, head size {}",
                c.n_layer, c.d_model, c.ffn, c.head_dim
            )));
        }
        if c.n_head == 0 || c.n_kv_head == 0 || !c.n_head.is_multiple_of(c.n_kv_head) {
            return Err(Error::BadInput(format!(
                "decoder with {} query heads and {} key/value heads: key/value heads must divide query heads",
                c.n_head, c.n_kv_head
            )));
        }
        if !c.head_dim.is_multiple_of(2) {
            return Err(Error::BadInput(format!(
                "odd head size {} cannot take RoPE",
                c.head_dim
            )));
        }
        Ok(())
    }
}

/// The MLP's gate and up projections: stacked by output rows (one GEMV
/// per token) when their weights share a format, else two linears (mixed
/// quantizations such as Q4_K_M keep each matrix in its own format).
#[derive(Debug)]
enum GateUp {
    Fused(Linear),
    Separate { gate: Linear, up: Linear },
}

impl GateUp {
    fn size_bytes(&self) -> usize {
        match self {
            GateUp::Fused(l) => l.size_bytes(),
            GateUp::Separate { gate, up } => gate.size_bytes() + up.size_bytes(),
        }
    }

    /// `silu(gate(x)) * up(x)`, the activation one fused op (SwiGLU).
    fn forward(&self, dev: &Device, x: &Tensor, ffn: usize) -> Result<Tensor> {
        Ok(match self {
            GateUp::Fused(l) => {
                let gu = l.forward(dev, x)?;
                debug_assert_eq!(gu.dims().last(), Some(&(2 * ffn)));
                dev.swiglu(&gu, None)?
            }
            GateUp::Separate { gate, up } => {
                dev.swiglu(&gate.forward(dev, x)?, Some(&up.forward(dev, x)?))?
            }
        })
    }
}

/// One decoder layer with its KV cache (see the module docs).
#[derive(Debug)]
pub struct DecoderLayer {
    attn_norm: RmsNorm,
    /// Q, K and V projections (stacked when they share a format).
    attn: Attention,
    ffn_norm: RmsNorm,
    gate_up: GateUp,
    down: Linear,
    ffn: usize,
    cache: KvCache,
}

impl DecoderLayer {
    /// Bytes of the weights read per token: norms, attention (with its
    /// biases), MLP.
    pub fn weight_bytes_per_token(&self) -> usize {
        self.attn_norm.weight().size_bytes()
            + self.attn.size_bytes()
            + self.ffn_norm.weight().size_bytes()
            + self.gate_up.size_bytes()
            + self.down.size_bytes()
    }

    /// The attention (projections, heads).
    pub fn attention(&self) -> &Attention {
        &self.attn
    }

    /// Tokens in this layer's KV cache.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Run `x[1, s, d_model]` after what is cached (causal), appending its
    /// keys and values to the cache; `rope` holds the positions of the `s`
    /// rows.
    pub fn forward(&mut self, dev: &Device, x: &Tensor, rope: &RopeAt) -> Result<Tensor> {
        let n = self.attn_norm.forward(dev, x)?;
        // All s rows at once: on the CPU, quantized weights take the
        // backend's int8-activation kernel, whose rows equal the one-row
        // (decode) result bit for bit, and causal attention and the
        // element-wise ops compute each row on its own, so a prefill gives
        // what the same tokens fed one at a time give, bit for bit.
        let a = self
            .attn
            .forward(dev, &n, Some(rope), Some(&mut self.cache), Masking::Causal)?;
        let x = dev.add(x, &a)?;
        let n = self.ffn_norm.forward(dev, &x)?;
        let h = self.gate_up.forward(dev, &n, self.ffn)?;
        Ok(dev.add(&x, &self.down.forward(dev, &h)?)?)
    }
}

/// A stack of [`DecoderLayer`]s (no embedding, final norm or head: those
/// differ between the models that share it).
#[derive(Debug)]
pub struct Decoder {
    cfg: DecoderConfig,
    layers: Vec<DecoderLayer>,
    weight_bytes: usize,
}

/// Reads one layer's tensors under a [`DecoderNames`], stacking and
/// converting as the [`DecoderConfig`] says, and counts the bytes of the
/// weights it places.
struct LayerLoader<'a> {
    vb: &'a VarBuilder,
    cfg: &'a DecoderConfig,
    host: Device,
    weight_bytes: usize,
}

impl LayerLoader<'_> {
    /// `<name>.weight` under `p` on the host, checked against `dims`, in
    /// the configured format.
    fn weight(&self, p: &VarBuilder, name: &str, dims: &[usize]) -> Result<Tensor> {
        let t = p.pp(name).host("weight", dims)?;
        let to = self.cfg.format.kept_as(t.dtype());
        Ok(if to != t.dtype() {
            self.host.cast(&t, to)?
        } else {
            t
        })
    }

    /// The storage format `<name>.weight` would get from [`Self::weight`],
    /// without converting it.
    fn format(&self, p: &VarBuilder, name: &str) -> Result<DType> {
        let dt = p.pp(name).host_unchecked("weight")?.dtype();
        Ok(self.cfg.format.kept_as(dt))
    }

    /// Weights `(name, rows)` under `p` (each `[rows, cols]`) stacked along
    /// their output rows into one, then placed (counted in the weight
    /// bytes).
    fn stacked(&mut self, p: &VarBuilder, parts: &[(&str, usize)], cols: usize) -> Result<Tensor> {
        let mut ts = Vec::with_capacity(parts.len());
        for &(name, rows) in parts {
            ts.push(self.weight(p, name, &[rows, cols])?);
        }
        let t = stack_rows(&self.host, &ts)?;
        self.weight_bytes += t.size_bytes();
        Ok(self.vb.place_or_host(&t))
    }

    /// An RMSNorm's `<name>.weight[dim]` as f32, placed and counted.
    fn norm(&mut self, p: &VarBuilder, name: &str, dim: usize) -> Result<RmsNorm> {
        let t = p.pp(name).host("weight", &[dim])?;
        let t = if t.dtype() == DType::F32 {
            t
        } else {
            self.host.cast(&t, DType::F32)?
        };
        self.weight_bytes += t.size_bytes();
        Ok(RmsNorm::new(self.vb.place_or_host(&t), self.cfg.rms_eps))
    }

    /// The Q/K/V biases `(name, rows)` under `p` as f32 host tensors; None
    /// when the layer has none.
    fn biases(&self, p: &VarBuilder, parts: &[(&str, usize)]) -> Result<Option<Vec<Tensor>>> {
        let present = parts.iter().all(|(n, _)| p.contains(&format!("{n}.bias")));
        match self.cfg.qkv_bias {
            QkvBias::Absent => return Ok(None),
            QkvBias::IfPresent if !present => return Ok(None),
            _ => {}
        }
        let mut v = Vec::with_capacity(parts.len());
        for &(name, rows) in parts {
            let t = p.pp(name).host("bias", &[rows])?;
            v.push(if t.dtype() == DType::F32 {
                t
            } else {
                self.host.cast(&t, DType::F32)?
            });
        }
        Ok(Some(v))
    }

    fn same_format(&self, p: &VarBuilder, names: &[&str]) -> Result<bool> {
        let mut dts = Vec::with_capacity(names.len());
        for name in names {
            dts.push(self.format(p, name)?);
        }
        Ok(dts.windows(2).all(|w| w[0] == w[1]))
    }

    fn layer(&mut self, b: &VarBuilder, names: &DecoderNames) -> Result<DecoderLayer> {
        let c = self.cfg;
        let (d, h, hk, hd) = (c.d_model, c.n_head, c.n_kv_head, c.head_dim);
        let qkv = [(names.q, h * hd), (names.k, hk * hd), (names.v, hk * hd)];
        let qkv_bias = self.biases(b, &qkv)?;
        let proj = if self.same_format(b, &[names.q, names.k, names.v])? {
            let bias = match &qkv_bias {
                Some(v) => Some(self.vb.place_or_host(&stack_rows(&self.host, v)?)),
                None => None,
            };
            Projections::Fused(Linear::new(self.stacked(b, &qkv, d)?, bias))
        } else {
            let mut lin = Vec::with_capacity(3);
            for (i, part) in qkv.iter().enumerate() {
                let bias = qkv_bias.as_ref().map(|v| self.vb.place_or_host(&v[i]));
                lin.push(Linear::new(self.stacked(b, &[*part], d)?, bias));
            }
            let (Some(v), Some(k), Some(q)) = (lin.pop(), lin.pop(), lin.pop()) else {
                return Err(Error::BadInput("three projections expected".into()));
            };
            Projections::Separate { q, k, v }
        };
        let wo = Linear::new(self.stacked(b, &[(names.o, d)], h * hd)?, None);
        let gate_up = if self.same_format(b, &[names.gate, names.up])? {
            GateUp::Fused(Linear::new(
                self.stacked(b, &[(names.gate, c.ffn), (names.up, c.ffn)], d)?,
                None,
            ))
        } else {
            GateUp::Separate {
                gate: Linear::new(self.stacked(b, &[(names.gate, c.ffn)], d)?, None),
                up: Linear::new(self.stacked(b, &[(names.up, c.ffn)], d)?, None),
            }
        };
        Ok(DecoderLayer {
            attn_norm: self.norm(b, names.attn_norm, d)?,
            attn: Attention::new(proj, wo, h, hk, hd)?,
            ffn_norm: self.norm(b, names.ffn_norm, d)?,
            gate_up,
            down: Linear::new(self.stacked(b, &[(names.down, d)], c.ffn)?, None),
            ffn: c.ffn,
            cache: KvCache::new(),
        })
    }
}

impl Decoder {
    /// Load `cfg.n_layer` layers `0..n` under `vb` (the layer list:
    /// `vb.pp("blk")` for GGUF, `vb.pp("model").pp("layers")` for Hugging
    /// Face) with the tensor names `names`, for the device `vb` carries.
    /// Every weight's shape is checked (the error names the tensor).
    /// Weights go to the placed backend when it can hold them; those it
    /// cannot (e.g. quantized blocks on a backend without quantized
    /// kernels) stay on the host and their ops fall back to the CPU per
    /// op, counted in the device's stats.
    pub fn load(vb: &VarBuilder, cfg: &DecoderConfig, names: &DecoderNames) -> Result<Self> {
        cfg.check()?;
        // Two loaders, each over half the layers: a load is mostly copies
        // into freshly faulted memory, which two threads fault in about
        // twice as fast as one.
        let half = cfg.n_layer.div_ceil(2);
        let load_range = |range: std::ops::Range<usize>| -> Result<(Vec<DecoderLayer>, usize)> {
            let mut loader = LayerLoader {
                vb,
                cfg,
                host: vb.device().host(),
                weight_bytes: 0,
            };
            let mut layers = Vec::with_capacity(range.len());
            for i in range {
                layers.push(loader.layer(&vb.pp(i), names)?);
            }
            Ok((layers, loader.weight_bytes))
        };
        let (first, second) = std::thread::scope(|s| {
            let second = s.spawn(|| load_range(half..cfg.n_layer));
            let first = load_range(0..half);
            let second = second.join().unwrap_or_else(|_| {
                Err(Error::Weights {
                    path: vb.path(),
                    name: vb.full(&format!("{half}..{}", cfg.n_layer)),
                    msg: "could not be loaded: the loading thread panicked".into(),
                })
            });
            (first, second)
        });
        let (mut layers, a) = first?;
        let (rest, b) = second?;
        layers.extend(rest);
        Ok(Decoder {
            cfg: cfg.clone(),
            layers,
            weight_bytes: a + b,
        })
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }

    /// The layers.
    pub fn layers(&self) -> &[DecoderLayer] {
        &self.layers
    }

    /// Bytes of the weights as stored: projections and norms (biases not
    /// counted).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Bytes of weights read to run one token through every layer.
    pub fn weight_bytes_per_token(&self) -> usize {
        self.layers
            .iter()
            .map(DecoderLayer::weight_bytes_per_token)
            .sum()
    }

    /// Run `x[1, s, d_model]` through every layer after what is cached,
    /// appending to the KV caches; `rope` holds the positions of the `s`
    /// rows.
    pub fn forward(&mut self, dev: &Device, x: &Tensor, rope: &RopeAt) -> Result<Tensor> {
        if x.rank() != 3 || x.dims()[2] != self.cfg.d_model {
            return Err(Error::BadInput(format!(
                "decoder input {:?}, expected [batch, seq, {}]",
                x.dims(),
                self.cfg.d_model
            )));
        }
        let mut x = x.clone();
        for l in &mut self.layers {
            x = l.forward(dev, &x, rope)?;
        }
        Ok(x)
    }

    /// Keep the first `len` cached tokens in every layer.
    pub fn truncate(&mut self, dev: &Device, len: usize) -> Result<()> {
        for l in &mut self.layers {
            l.cache.truncate(dev, len)?;
        }
        Ok(())
    }

    /// Empty every layer's KV cache.
    pub fn reset(&mut self) {
        for l in &mut self.layers {
            l.cache.reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RopeLayout, RotaryEmbedding};
    use std::collections::BTreeMap;

    fn dev() -> Device {
        edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu")
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((((i * 53 + seed * 17) % 97) as f32) / 48.0 - 1.0) * 0.3)
            .collect()
    }

    fn cfg(qkv_bias: QkvBias) -> DecoderConfig {
        DecoderConfig {
            n_layer: 2,
            d_model: 12,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 4,
            ffn: 20,
            rms_eps: 1e-6,
            format: WeightFormat::Stored,
            qkv_bias,
        }
    }

    /// One random checkpoint under `names` (prefix `layers`), with biases.
    fn write(path: &std::path::Path, names: &DecoderNames, c: &DecoderConfig, skip: Option<&str>) {
        let (d, q, kv, f) = (
            c.d_model,
            c.n_head * c.head_dim,
            c.n_kv_head * c.head_dim,
            c.ffn,
        );
        let mut m = BTreeMap::new();
        let mut seed = 0;
        for i in 0..c.n_layer {
            for (n, dims) in [
                (format!("{}.weight", names.attn_norm), vec![d]),
                (format!("{}.weight", names.q), vec![q, d]),
                (format!("{}.bias", names.q), vec![q]),
                (format!("{}.weight", names.k), vec![kv, d]),
                (format!("{}.bias", names.k), vec![kv]),
                (format!("{}.weight", names.v), vec![kv, d]),
                (format!("{}.bias", names.v), vec![kv]),
                (format!("{}.weight", names.o), vec![d, q]),
                (format!("{}.weight", names.ffn_norm), vec![d]),
                (format!("{}.weight", names.gate), vec![f, d]),
                (format!("{}.weight", names.up), vec![f, d]),
                (format!("{}.weight", names.down), vec![d, f]),
            ] {
                seed += 1;
                let full = format!("layers.{i}.{n}");
                if skip == Some(full.as_str()) {
                    continue;
                }
                let n_el = dims.iter().product();
                let mut v = values(n_el, seed);
                if dims.len() == 1 && !n.ends_with("bias") {
                    v.iter_mut().for_each(|x| *x += 1.0);
                }
                m.insert(full, Tensor::from_vec(v, &dims).expect("t"));
            }
        }
        edgeflow_runtime::weights::write_safetensors(path, &m, None).expect("write");
    }

    fn run(dec: &mut Decoder, dev: &Device, x: &[f32], s: usize) -> Vec<f32> {
        let d = dec.config().d_model;
        let rope = RotaryEmbedding::new(4, 16, 10_000.0, RopeLayout::Halves).expect("rope");
        let start = dec.layers()[0].cached();
        let x = Tensor::from_vec(x.to_vec(), &[1, s, d]).expect("x");
        let y = dec
            .forward(dev, &x, &rope.at(dev, start, s).expect("at"))
            .expect("forward");
        dev.to_host(&y).expect("h").to_vec_f32().expect("v")
    }

    #[test]
    fn both_namings_load_the_same_layers_and_decode_matches_prefill() {
        let dev = dev();
        let dir = tempfile::tempdir().expect("tmp");
        let c = cfg(QkvBias::Required);
        let mut outs = Vec::new();
        for (file, names) in [("hf", DecoderNames::HF), ("gguf", DecoderNames::GGUF)] {
            let p = dir.path().join(format!("{file}.safetensors"));
            write(&p, &names, &c, None);
            let vb = VarBuilder::open(&[&p], &dev).expect("open");
            let mut dec = Decoder::load(&vb.pp("layers"), &c, &names).expect("load");
            let x = values(5 * 12, 9);
            let all = run(&mut dec, &dev, &x, 5);
            // Prefill of 3 rows, then 2 single-row steps on the KV cache.
            dec.reset();
            let mut steps = run(&mut dec, &dev, &x[..36], 3);
            steps.extend(run(&mut dec, &dev, &x[36..48], 1));
            steps.extend(run(&mut dec, &dev, &x[48..], 1));
            for (a, b) in all.iter().zip(&steps) {
                // Same products in another grouping of rows: f32 rounding.
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
            assert_eq!(dec.layers()[1].cached(), 5);
            outs.push(all);
        }
        assert_eq!(outs[0], outs[1]);
    }

    #[test]
    fn missing_or_misshapen_tensors_are_named() {
        let dev = dev();
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("m.safetensors");
        let names = DecoderNames::HF;
        write(
            &p,
            &names,
            &cfg(QkvBias::Required),
            Some("layers.1.self_attn.k_proj.bias"),
        );
        let vb = VarBuilder::open(&[&p], &dev).expect("open").pp("layers");
        let e = Decoder::load(&vb, &cfg(QkvBias::Required), &names).expect_err("bias");
        assert!(
            e.to_string().contains("layers.1.self_attn.k_proj.bias"),
            "{e}"
        );
        // Optional biases: the layer runs without them.
        assert!(Decoder::load(&vb, &cfg(QkvBias::IfPresent), &names).is_ok());
        let wide = DecoderConfig {
            ffn: 24,
            ..cfg(QkvBias::Absent)
        };
        let e = Decoder::load(&vb, &wide, &names).expect_err("dims");
        assert!(
            e.to_string().contains("layers.0.mlp.gate_proj.weight"),
            "{e}"
        );
        let odd = DecoderConfig {
            n_kv_head: 3,
            ..cfg(QkvBias::Absent)
        };
        assert!(Decoder::load(&vb, &odd, &names).is_err());
    }
}
