//! Qwen2.5-Omni's token2wav DiT (`Qwen2_5OmniToken2WavDiTModel` in
//! transformers): a diffusion transformer trained by flow matching that
//! turns the talker's codec tokens into a mel spectrogram, conditioned on a
//! speaker (a conditioning vector and a reference mel that the
//! [`ecapa`](mod@crate::ecapa) speaker encoder summarises).
//!
//! One velocity evaluation ([`Dit::model_output`]) is:
//!
//! - the input: `proj(concat(x, ecapa(ref_mel), codec_embed(codes),
//!   cond))` per frame, codes repeated `repeats` times along time
//!   (`input_embed.proj`, `text_embed.codec_embed`);
//! - the time: a sinusoidal embedding of `t` through an MLP
//!   (`time_embed.time_mlp.0` / `.2`), which modulates every layer;
//! - `num_hidden_layers` DiT blocks (`transformer_blocks.N`): adaptive
//!   layer norm (shift / scale / gate from the time, `attn_norm.linear`),
//!   attention (`attn.to_q` / `to_k` / `to_v` / `to_out.0`) with rotary
//!   positions on the FIRST head only (interleaved pairs, base 10000) and
//!   a block-wise mask: frames are grouped in blocks of `block_size` and a
//!   frame sees its own block, plus the previous block in the
//!   `look_backward_layers` and the next one in the `look_ahead_layers`;
//!   a tanh-GELU MLP (`ff.ff.0` / `ff.ff.3`) after a modulated layer norm;
//! - a modulated final norm (`norm_out.linear`) and `proj_out` to
//!   `mel_dim`.
//!
//! With classifier-free guidance (upstream's `apply_cfg`) the model runs on
//! a batch of two: conditioned, and with the codes (id 0), the reference
//! mel and the conditioning vector all dropped (zeros); the velocity is
//! `c + (c - u) * guidance_scale`.
//!
//! [`Dit::sample`] integrates that velocity from noise at `t = 0` to a mel
//! at `t = 1` on the shared [`OdeSampler`] with upstream's schedule
//! (`num_steps` times from a linspace bent by the sway coefficient,
//! [`schedule`]) and its solver, RK4's 3/8 rule
//! ([`OdeMethod::Rk4ThreeEighths`]). Upstream draws the initial noise with
//! `torch.randn([1, 30000, mel_dim])` and takes the first frames; that
//! stream cannot be reproduced here, so the noise is an argument
//! ([`Dit::noise`] draws one from the runtime's seeded generator).
//! [`Dit::sample_window`] samples the frames of a range of codes from a
//! window with context on both sides, for streaming.
//!
//! Tensor names are upstream's relative to the DiT; in the full
//! Qwen2.5-Omni checkpoint they sit under `token2wav.code2wav_dit_model.`
//! (pass `vb.pp("token2wav.code2wav_dit_model")`). No weights are shipped:
//! users bring the Qwen2.5-Omni checkpoint. Parity with transformers is
//! tested on a small random configuration (`tests/dit.rs`, fixture from
//! `scripts/omni_dit_reference.py`).

use crate::ecapa::{self, Ecapa};
use crate::{Error, Result};
use edgeflow_nn::{
    merge_heads, split_heads, Embedding, Linear, OdeMethod, OdeSampler, RopeAt, RopeLayout,
    RotaryEmbedding, Schedule, VarBuilder, WeightFormat,
};
use edgeflow_runtime::{Device, PadMode, Tensor};
use serde::Deserialize;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The DiT's settings: upstream `Qwen2_5OmniDiTConfig` keys (the
/// `token2wav_config.dit_config` object of Qwen2.5-Omni's `config.json`);
/// defaults are Qwen2.5-Omni's. Keys it does not use are ignored.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Model width.
    pub hidden_size: usize,
    /// DiT blocks.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// MLP width as a multiple of `hidden_size`.
    pub ff_mult: f64,
    /// Codec embedding size.
    pub emb_dim: usize,
    /// Size of one attention head (`heads * head_dim` need not equal
    /// `hidden_size`).
    pub head_dim: usize,
    /// Read but unused, as upstream: the rotary base is always 10000.
    pub rope_theta: f64,
    /// Read but unused, as upstream (rotary tables are built per call).
    pub max_position_embeddings: usize,
    /// Frames per attention block.
    pub block_size: usize,
    /// Layers whose frames also see the next block.
    pub look_ahead_layers: Vec<usize>,
    /// Layers whose frames also see the previous block.
    pub look_backward_layers: Vec<usize>,
    /// Mel frames per codec token.
    pub repeats: usize,
    /// Codec vocabulary; the embedding table has `num_embeds + 1` rows
    /// (ids `0..=num_embeds`; id 0 is the dropped code of guidance).
    pub num_embeds: usize,
    /// Mel bins.
    pub mel_dim: usize,
    /// Training only (read, unused).
    pub dropout: f64,
    /// Size of the speaker conditioning vector.
    pub enc_emb_dim: usize,
    /// Speaker encoder output size.
    pub enc_dim: usize,
    /// Speaker encoder channels ([`ecapa::Config::enc_channels`]).
    pub enc_channels: Vec<usize>,
    /// Speaker encoder kernel sizes.
    pub enc_kernel_sizes: Vec<usize>,
    /// Speaker encoder dilations.
    pub enc_dilations: Vec<usize>,
    /// Speaker encoder attentive pooling channels.
    pub enc_attention_channels: usize,
    /// Speaker encoder Res2Net groups.
    pub enc_res2net_scale: usize,
    /// Speaker encoder squeeze-excitation channels.
    pub enc_se_channels: usize,
}

impl Default for Config {
    /// Qwen2.5-Omni's.
    fn default() -> Self {
        let e = ecapa::Config::default();
        Config {
            hidden_size: 1024,
            num_hidden_layers: 22,
            num_attention_heads: 16,
            ff_mult: 2.0,
            emb_dim: 512,
            head_dim: 64,
            rope_theta: 10_000.0,
            max_position_embeddings: 32_768,
            block_size: 24,
            look_ahead_layers: vec![10],
            look_backward_layers: vec![0, 20],
            repeats: 2,
            num_embeds: 8193,
            mel_dim: e.mel_dim,
            dropout: 0.1,
            enc_emb_dim: 192,
            enc_dim: e.enc_dim,
            enc_channels: e.enc_channels,
            enc_kernel_sizes: e.enc_kernel_sizes,
            enc_dilations: e.enc_dilations,
            enc_attention_channels: e.enc_attention_channels,
            enc_res2net_scale: e.enc_res2net_scale,
            enc_se_channels: e.enc_se_channels,
        }
    }
}

impl Config {
    /// Read a DiT config from JSON: a bare `dit_config` object, a
    /// token2wav config holding one under `dit_config`, or Qwen2.5-Omni's
    /// whole `config.json` (`token2wav_config.dit_config`).
    pub fn from_json(text: &str) -> std::result::Result<Config, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let v = match (v.get("token2wav_config"), v.get("dit_config")) {
            (Some(t), _) => t
                .get("dit_config")
                .cloned()
                .ok_or_else(|| "token2wav_config has no dit_config".to_string())?,
            (None, Some(d)) => d.clone(),
            (None, None) => v,
        };
        let cfg: Config = serde_json::from_value(v).map_err(|e| e.to_string())?;
        cfg.check()?;
        Ok(cfg)
    }

    /// [`Self::from_json`] of a file.
    pub fn read(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Config::from_json(&text)
            .map_err(|m| Error::bad_file(path, format!("not a Qwen2.5-Omni DiT config: {m}")))
    }

    /// The speaker encoder's part.
    pub fn ecapa(&self) -> ecapa::Config {
        ecapa::Config {
            mel_dim: self.mel_dim,
            enc_dim: self.enc_dim,
            enc_channels: self.enc_channels.clone(),
            enc_kernel_sizes: self.enc_kernel_sizes.clone(),
            enc_dilations: self.enc_dilations.clone(),
            enc_attention_channels: self.enc_attention_channels,
            enc_res2net_scale: self.enc_res2net_scale,
            enc_se_channels: self.enc_se_channels,
        }
    }

    /// Width of each block's MLP (`int(hidden_size * ff_mult)`).
    pub fn ff_dim(&self) -> usize {
        (self.hidden_size as f64 * self.ff_mult) as usize
    }

    /// Reject inconsistent settings (the message names the key).
    pub fn check(&self) -> std::result::Result<(), String> {
        for (key, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("emb_dim", self.emb_dim),
            ("head_dim", self.head_dim),
            ("block_size", self.block_size),
            ("repeats", self.repeats),
            ("num_embeds", self.num_embeds),
            ("mel_dim", self.mel_dim),
            ("enc_emb_dim", self.enc_emb_dim),
        ] {
            if v == 0 {
                return Err(format!("{key} must be positive"));
            }
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim must be even (rotary pairs), got {}",
                self.head_dim
            ));
        }
        if !(self.ff_mult.is_finite() && self.ff_dim() > 0) {
            return Err(format!(
                "ff_mult {} gives no MLP width for hidden_size {}",
                self.ff_mult, self.hidden_size
            ));
        }
        for (key, layers) in [
            ("look_ahead_layers", &self.look_ahead_layers),
            ("look_backward_layers", &self.look_backward_layers),
        ] {
            if let Some(l) = layers.iter().find(|&&l| l >= self.num_hidden_layers) {
                return Err(format!(
                    "{key} names layer {l}, but there are {} (num_hidden_layers)",
                    self.num_hidden_layers
                ));
            }
        }
        self.ecapa().check()
    }
}

/// Upstream's sampling settings (`Qwen2_5OmniToken2WavModel.forward`'s
/// defaults are [`SampleOptions::default`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleOptions {
    /// Times on the schedule, both ends included (upstream's `num_steps`:
    /// `num_steps - 1` solver steps; at least 2).
    pub num_steps: usize,
    /// The solver (upstream: [`OdeMethod::Rk4ThreeEighths`]).
    pub method: OdeMethod,
    /// Classifier-free guidance weight; below 1e-5 the model runs once per
    /// evaluation, conditioned only.
    pub guidance_scale: f32,
    /// Bends the schedule toward `t = 0` for negative values:
    /// `t + s (cos(pi t / 2) - 1 + t)`; `None` keeps the linspace.
    pub sway_coefficient: Option<f32>,
}

impl Default for SampleOptions {
    fn default() -> Self {
        SampleOptions {
            num_steps: 10,
            method: OdeMethod::Rk4ThreeEighths,
            guidance_scale: 0.5,
            sway_coefficient: Some(-1.0),
        }
    }
}

/// Upstream's time schedule: `num_steps` points of `linspace(0, 1)`, each
/// moved by `sway * (cos(pi/2 t) - 1 + t)` (computed in f32 as upstream).
pub fn schedule(num_steps: usize, sway_coefficient: Option<f32>) -> Result<Schedule> {
    if num_steps < 2 {
        return Err(Error::BadInput(format!(
            "DiT sampling needs num_steps >= 2 schedule times (num_steps - 1 solver steps), got {num_steps}"
        )));
    }
    let times = (0..num_steps)
        .map(|i| {
            let t = (i as f64 / (num_steps - 1) as f64) as f32;
            match sway_coefficient {
                Some(s) => t + s * ((std::f32::consts::FRAC_PI_2 * t).cos() - 1.0 + t),
                None => t,
            }
        })
        .collect();
    Schedule::times(times).map_err(|e| {
        Error::BadInput(format!(
            "sway coefficient {sway_coefficient:?} with {num_steps} steps: {e}"
        ))
    })
}

/// A speaker, encoded once per utterance ([`Dit::speaker`]).
#[derive(Debug, Clone)]
pub struct Speaker {
    /// The speaker encoder's output for the reference mel, `[1, enc_dim]`.
    pub encoded: Tensor,
    /// Its output for an all-zero reference (guidance's dropped branch).
    pub encoded_null: Tensor,
    /// The conditioning vector, `[1, enc_emb_dim]`.
    pub cond: Tensor,
}

/// Everything of one velocity evaluation that does not change between ODE
/// steps: the conditioning part of the input, the attention masks, the
/// rotary tables ([`Dit::prepare`]).
#[derive(Debug, Clone)]
pub struct Conditioning {
    /// `[b, frames, enc_dim + emb_dim + enc_emb_dim]`: speaker encoding,
    /// codec embeddings, conditioning vector, per frame; `b = 2` with
    /// guidance (second row dropped).
    rest: Tensor,
    frames: usize,
    guided: bool,
    /// Additive masks `[1, 1, frames, frames]` by (look back, look ahead).
    masks: Vec<((bool, bool), Tensor)>,
    rope: RopeAt,
}

impl Conditioning {
    /// Mel frames (`codes * repeats`).
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Whether the model runs the guided batch of two.
    pub fn guided(&self) -> bool {
        self.guided
    }
}

/// Shift / scale / gate vectors `[1, 1, hidden]` of one modulation.
type Mods = Vec<Tensor>;

#[derive(Debug, Clone)]
struct Block {
    ada: Linear,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ff0: Linear,
    ff3: Linear,
    back: bool,
    ahead: bool,
}

/// A modulated layer norm's affine: `1 + scale` and `shift`, `[hidden]`.
#[derive(Debug)]
struct NormAffine {
    scale1: Tensor,
    shift: Tensor,
}

/// One block's modulations at one time: the attention's and the MLP's
/// norm affines and gates (`[1, 1, hidden]`).
#[derive(Debug)]
struct BlockMods {
    attn: NormAffine,
    attn_gate: Tensor,
    ff: NormAffine,
    ff_gate: Tensor,
}

/// Everything of one evaluation that depends on its time alone: every
/// block's modulations and the output norm's.
#[derive(Debug)]
struct TimeMods {
    blocks: Vec<BlockMods>,
    out: NormAffine,
}

/// Times whose modulations are kept (an ODE schedule evaluates the same
/// times in every chunk and utterance: 36 at most for the stage's default
/// of 10 points with RK4; about 0.55 MB each at the real configuration).
const TIME_CACHE: usize = 48;

/// Kept modulations by time (`t`'s bits), oldest first, shared by clones.
type TimeCache = Arc<Mutex<Vec<(u32, Arc<TimeMods>)>>>;

/// The token2wav DiT.
#[derive(Debug, Clone)]
pub struct Dit {
    cfg: Config,
    dev: Device,
    time0: Linear,
    time2: Linear,
    codec: Embedding,
    proj_in: Linear,
    spk: Ecapa,
    blocks: Vec<Block>,
    norm_out: Linear,
    proj_out: Linear,
    /// Modulations by time (`t`'s bits), oldest first.
    times: TimeCache,
}

/// Width of the sinusoidal time features.
const FREQ_DIM: usize = 256;

/// Every tensor [`Dit::load`] reads, with its shape (upstream names,
/// relative to the DiT).
pub fn weight_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let h = cfg.hidden_size;
    let inner = cfg.num_attention_heads * cfg.head_dim;
    let ff = cfg.ff_dim();
    let mut out = Vec::new();
    let mut lin = |name: String, o: usize, i: usize| {
        out.push((format!("{name}.weight"), vec![o, i]));
        out.push((format!("{name}.bias"), vec![o]));
    };
    lin("time_embed.time_mlp.0".into(), h, FREQ_DIM);
    lin("time_embed.time_mlp.2".into(), h, h);
    let in_dim = cfg.mel_dim + cfg.enc_dim + cfg.enc_emb_dim + cfg.emb_dim;
    lin("input_embed.proj".into(), h, in_dim);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("transformer_blocks.{i}");
        lin(format!("{p}.attn_norm.linear"), 6 * h, h);
        lin(format!("{p}.attn.to_q"), inner, h);
        lin(format!("{p}.attn.to_k"), inner, h);
        lin(format!("{p}.attn.to_v"), inner, h);
        lin(format!("{p}.attn.to_out.0"), h, inner);
        lin(format!("{p}.ff.ff.0"), ff, h);
        lin(format!("{p}.ff.ff.3"), h, ff);
    }
    lin("norm_out.linear".into(), 2 * h, h);
    lin("proj_out".into(), cfg.mel_dim, h);
    out.push((
        "text_embed.codec_embed.weight".into(),
        vec![cfg.num_embeds + 1, cfg.emb_dim],
    ));
    out.extend(
        cfg.ecapa()
            .weight_shapes()
            .into_iter()
            .map(|(n, s)| (format!("input_embed.spk_encoder.{n}"), s)),
    );
    out
}

impl Dit {
    /// Read the DiT's weights under `vb` (upstream names; the full
    /// checkpoint's prefix is `token2wav.code2wav_dit_model`).
    pub fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        Self::load_with_format(vb, cfg, WeightFormat::Stored)
    }

    /// [`Dit::load`] keeping the linear layers' weights in `format`: on a
    /// CPU with AVX512_BF16, [`WeightFormat::Bf16`] halves an f32
    /// checkpoint's memory and runs them on its bf16 dot product (the
    /// released checkpoint is bf16 already: `Stored` does the same there).
    /// Norms, biases, embeddings and convolutions stay as `load` reads them.
    pub fn load_with_format(vb: &VarBuilder, cfg: &Config, format: WeightFormat) -> Result<Self> {
        cfg.check()
            .map_err(|m| Error::bad_file(vb.path(), format!("DiT config: {m}")))?;
        let h = cfg.hidden_size;
        let inner = cfg.num_attention_heads * cfg.head_dim;
        let ff = cfg.ff_dim();
        let in_dim = cfg.mel_dim + cfg.enc_dim + cfg.enc_emb_dim + cfg.emb_dim;
        let lin =
            |name: &str, i: usize, o: usize| Linear::load_as(&vb.pp(name), i, o, true, format);
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| {
                let b = vb.pp("transformer_blocks").pp(i);
                let l = |name: &str, i: usize, o: usize| {
                    Linear::load_as(&b.pp(name), i, o, true, format)
                };
                Ok(Block {
                    ada: l("attn_norm.linear", h, 6 * h)?,
                    q: l("attn.to_q", h, inner)?,
                    k: l("attn.to_k", h, inner)?,
                    v: l("attn.to_v", h, inner)?,
                    o: l("attn.to_out.0", inner, h)?,
                    ff0: l("ff.ff.0", h, ff)?,
                    ff3: l("ff.ff.3", ff, h)?,
                    back: cfg.look_backward_layers.contains(&i),
                    ahead: cfg.look_ahead_layers.contains(&i),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let codec = vb.get_f32(
            "text_embed.codec_embed.weight",
            &[cfg.num_embeds + 1, cfg.emb_dim],
        )?;
        Ok(Dit {
            cfg: cfg.clone(),
            dev: vb.device().clone(),
            time0: lin("time_embed.time_mlp.0", FREQ_DIM, h)?,
            time2: lin("time_embed.time_mlp.2", h, h)?,
            codec: Embedding::new(codec),
            proj_in: lin("input_embed.proj", in_dim, h)?,
            spk: Ecapa::load(&vb.pp("input_embed.spk_encoder"), &cfg.ecapa())?,
            blocks,
            norm_out: lin("norm_out.linear", h, 2 * h)?,
            proj_out: lin("proj_out", h, cfg.mel_dim)?,
            times: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The device the weights are on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The speaker encoder.
    pub fn speaker_encoder(&self) -> &Ecapa {
        &self.spk
    }

    /// Encode a speaker: the conditioning vector `cond` `[1, enc_emb_dim]`
    /// and the reference mel `ref_mel` `[1, frames, mel_dim]` (upstream's
    /// `conditioning` and `reference_mel`).
    pub fn speaker(&self, cond: &Tensor, ref_mel: &Tensor) -> Result<Speaker> {
        if cond.dims() != [1, self.cfg.enc_emb_dim] {
            return Err(Error::BadInput(format!(
                "DiT: the speaker conditioning vector must be [1, {}] (enc_emb_dim), got {:?}",
                self.cfg.enc_emb_dim,
                cond.dims()
            )));
        }
        match ref_mel.dims() {
            [1, _, _] => {}
            other => {
                return Err(Error::BadInput(format!(
                    "DiT: the reference mel must be [1, frames, {}] (one utterance), got {other:?}",
                    self.cfg.mel_dim
                )))
            }
        }
        self.spk.check_input(ref_mel)?;
        let dev = &self.dev;
        dev.batch(|| {
            let zeros = dev.place(&Tensor::zeros(ref_mel.dims())?)?;
            Ok(Speaker {
                encoded: self.spk.forward(dev, ref_mel)?,
                encoded_null: self.spk.forward(dev, &zeros)?,
                cond: cond.clone(),
            })
        })
    }

    /// Codes per aligned window start: windows whose first code is a
    /// multiple of this start on an attention block boundary.
    pub fn window_alignment(&self) -> usize {
        let (b, r) = (self.cfg.block_size, self.cfg.repeats);
        b / gcd(b, r)
    }

    /// How far one velocity evaluation reaches, in attention blocks: (back,
    /// ahead) = the number of look-back and look-ahead layers. The ODE
    /// compounds it over every evaluation of a sample.
    pub fn receptive_blocks(&self) -> (usize, usize) {
        (
            self.blocks.iter().filter(|b| b.back).count(),
            self.blocks.iter().filter(|b| b.ahead).count(),
        )
    }

    fn check_codes(&self, codes: &[u32]) -> Result<()> {
        if codes.is_empty() {
            return Err(Error::BadInput("DiT: no codec tokens to synthesize".into()));
        }
        if let Some((i, c)) = codes
            .iter()
            .enumerate()
            .find(|(_, &c)| c as usize > self.cfg.num_embeds)
        {
            return Err(Error::BadInput(format!(
                "DiT: codec token {c} at position {i} is out of range: the codec embedding has ids 0..={} (num_embeds); talker special tokens must be removed first",
                self.cfg.num_embeds
            )));
        }
        Ok(())
    }

    /// `[1, 1, d]` repeated to `[1, frames, d]`.
    fn repeat_frames(&self, v: &Tensor, frames: usize) -> Result<Tensor> {
        let d = v.elem_count();
        let v = self.dev.reshape(v, &[1, 1, d])?;
        Ok(if frames > 1 {
            self.dev.pad(&v, 1, 0, frames - 1, PadMode::Replicate)?
        } else {
            v
        })
    }

    /// Codec embeddings of `ids`, each repeated `repeats` times: `[1,
    /// frames, emb_dim]`.
    fn code_embed(&self, ids: &[u32]) -> Result<Tensor> {
        let r = self.cfg.repeats;
        let rep: Vec<i64> = ids
            .iter()
            .flat_map(|&c| std::iter::repeat_n(c as i64, r))
            .collect();
        let n = rep.len();
        let idx = self.dev.place(&Tensor::from_i64(rep, &[n])?)?;
        let e = self.codec.forward(&self.dev, &idx)?;
        Ok(self.dev.reshape(&e, &[1, n, self.cfg.emb_dim])?)
    }

    /// The step-invariant part of the model's input for `codes` (ids
    /// `0..=num_embeds`), with the guided batch of two when `guided`.
    pub fn prepare(&self, spk: &Speaker, codes: &[u32], guided: bool) -> Result<Conditioning> {
        self.check_codes(codes)?;
        let dev = &self.dev;
        let frames = codes.len() * self.cfg.repeats;
        let rest = dev.batch(|| -> Result<Tensor> {
            let cond = dev.concat(
                &[
                    &self.repeat_frames(&spk.encoded, frames)?,
                    &self.code_embed(codes)?,
                    &self.repeat_frames(&spk.cond, frames)?,
                ],
                2,
            )?;
            if !guided {
                return Ok(cond);
            }
            let zero_cond = dev.place(&Tensor::zeros(&[1, frames, self.cfg.enc_emb_dim])?)?;
            let null = dev.concat(
                &[
                    &self.repeat_frames(&spk.encoded_null, frames)?,
                    &self.code_embed(&vec![0; codes.len()])?,
                    &zero_cond,
                ],
                2,
            )?;
            Ok(dev.concat(&[&cond, &null], 0)?)
        })?;
        let mut masks = Vec::new();
        for b in &self.blocks {
            let key = (b.back, b.ahead);
            if !masks.iter().any(|(k, _)| *k == key) {
                let m = block_mask(frames, self.cfg.block_size, b.back, b.ahead)?;
                masks.push((key, dev.place(&m)?));
            }
        }
        let rope =
            RotaryEmbedding::new(self.cfg.head_dim, frames, 10_000.0, RopeLayout::Interleaved)?
                .at(dev, 0, frames)?;
        Ok(Conditioning {
            rest,
            frames,
            guided,
            masks,
            rope,
        })
    }

    fn check_state(&self, c: &Conditioning, x: &Tensor) -> Result<()> {
        if x.dims() != [1, c.frames, self.cfg.mel_dim] {
            return Err(Error::BadInput(format!(
                "DiT: the state must be [1, {}, {}] ([1, codes * repeats, mel_dim]), got {:?}",
                c.frames,
                self.cfg.mel_dim,
                x.dims()
            )));
        }
        Ok(())
    }

    /// The model's raw output for state `x` `[1, frames, mel_dim]` at time
    /// `t`: `[b, frames, mel_dim]`, `b = 2` (conditioned, dropped) when
    /// `c` is guided (upstream's `forward`).
    pub fn model_output(&self, c: &Conditioning, x: &Tensor, t: f32) -> Result<Tensor> {
        self.check_state(c, x)?;
        self.dev.batch(|| self.model_ops(c, x, t))
    }

    /// The velocity the sampler integrates: the conditioned output, or with
    /// guidance `c + (c - u) * guidance_scale`; `[1, frames, mel_dim]`.
    pub fn velocity(
        &self,
        c: &Conditioning,
        x: &Tensor,
        t: f32,
        guidance_scale: f32,
    ) -> Result<Tensor> {
        let out = self.model_output(c, x, t)?;
        if !c.guided {
            return Ok(out);
        }
        let dev = &self.dev;
        let cond = dev.narrow(&out, 0, 0, 1)?;
        let null = dev.narrow(&out, 0, 1, 1)?;
        let diff = dev.sub(&cond, &null)?;
        Ok(dev.add(&cond, &dev.scale(&diff, guidance_scale as f64)?)?)
    }

    /// One velocity from scratch: state `x` `[1, codes * repeats,
    /// mel_dim]`, reference mel `[1, frames, mel_dim]`, conditioning vector
    /// `[1, enc_emb_dim]`, codes, time `t`; guided when `guidance_scale >=
    /// 1e-5`, as upstream's sampler. (A sampler prepares once:
    /// [`Self::speaker`], [`Self::prepare`], [`Self::velocity`].)
    pub fn forward(
        &self,
        x: &Tensor,
        ref_mel: &Tensor,
        cond: &Tensor,
        codes: &[u32],
        t: f32,
        guidance_scale: f32,
    ) -> Result<Tensor> {
        let spk = self.speaker(cond, ref_mel)?;
        let c = self.prepare(&spk, codes, guidance_scale >= 1e-5)?;
        self.velocity(&c, x, t, guidance_scale)
    }

    /// Standard normal noise `[1, frames, mel_dim]` from the runtime's
    /// seeded generator (row-major, so the first frames of a longer draw
    /// with the same seed are the same: draw once per utterance for
    /// [`Self::sample_window`]).
    pub fn noise(&self, frames: usize, seed: u64) -> Result<Tensor> {
        Ok(self
            .dev
            .rand_normal(&[1, frames, self.cfg.mel_dim], 0.0, 1.0, seed)?)
    }

    /// Integrate from noise `x0` `[1, codes * repeats, mel_dim]` to the mel
    /// spectrogram `[1, mel_dim, codes * repeats]` (upstream's `sample`).
    /// `cancelled()` is asked before every solver step; a `true` ends the
    /// run with [`Error::Cancelled`].
    pub fn sample(
        &self,
        spk: &Speaker,
        codes: &[u32],
        x0: &Tensor,
        opts: &SampleOptions,
        cancelled: impl FnMut() -> bool,
    ) -> Result<Tensor> {
        let sched = schedule(opts.num_steps, opts.sway_coefficient)?;
        let guided = opts.guidance_scale >= 1e-5;
        let c = self.prepare(spk, codes, guided)?;
        self.check_state(&c, x0)?;
        let x0 = self.dev.place(x0)?;
        let g = opts.guidance_scale;
        let x = OdeSampler::new(opts.method, sched).sample::<Error, _, _>(
            &self.dev,
            &x0,
            |x, t| self.velocity(&c, x, t, g),
            cancelled,
        )?;
        Ok(self.dev.transpose(&x, 1, 2)?)
    }

    /// [`Self::sample`] from [`Self::noise`]`(codes * repeats, seed)`.
    pub fn sample_seeded(
        &self,
        spk: &Speaker,
        codes: &[u32],
        seed: u64,
        opts: &SampleOptions,
        cancelled: impl FnMut() -> bool,
    ) -> Result<Tensor> {
        let x0 = self.noise(codes.len() * self.cfg.repeats, seed)?;
        self.sample(spk, codes, &x0, opts, cancelled)
    }

    /// The mel frames of codes `centre` (`[1, mel_dim, centre.len() *
    /// repeats]`), sampled on a window of the utterance's `codes` with at
    /// least `left` codes of context before (the window's start is moved
    /// back to a multiple of [`Self::window_alignment`], so its attention
    /// blocks are the utterance's) and up to `right` after (as many as
    /// `codes` has). `noise` is the utterance's noise `[1, >= window end *
    /// repeats, mel_dim]`; the window takes its frames, so overlapping
    /// windows start from the same noise.
    ///
    /// The result equals the centre of [`Self::sample`] over all of `codes`
    /// when the window covers them; with less context it is close, not
    /// equal: each evaluation reaches [`Self::receptive_blocks`] blocks and
    /// the ODE compounds that over its evaluations.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_window(
        &self,
        spk: &Speaker,
        codes: &[u32],
        noise: &Tensor,
        centre: Range<usize>,
        left: usize,
        right: usize,
        opts: &SampleOptions,
        cancelled: impl FnMut() -> bool,
    ) -> Result<Tensor> {
        if centre.is_empty() || centre.end > codes.len() {
            return Err(Error::BadInput(format!(
                "DiT window: centre codes {centre:?} must be a non-empty range within the {} codes given",
                codes.len()
            )));
        }
        let align = self.window_alignment();
        let start = centre.start.saturating_sub(left) / align * align;
        let end = (centre.end + right).min(codes.len());
        let r = self.cfg.repeats;
        match noise.dims() {
            &[1, n, m] if m == self.cfg.mel_dim && n >= end * r => {}
            other => {
                return Err(Error::BadInput(format!(
                    "DiT window: the noise must be [1, >= {}, {}] (the utterance's frames up to the window's end), got {other:?}",
                    end * r,
                    self.cfg.mel_dim
                )))
            }
        }
        let x0 = self.dev.narrow(noise, 1, start * r, (end - start) * r)?;
        let mel = self.sample(spk, &codes[start..end], &x0, opts, cancelled)?;
        Ok(self
            .dev
            .narrow(&mel, 2, (centre.start - start) * r, centre.len() * r)?)
    }

    /// Sinusoidal time features `[1, 256]`, in f32 as upstream.
    fn time_features(t: f32) -> Result<Tensor> {
        let half = FREQ_DIM / 2;
        let step = (10_000f64.ln() / (half - 1) as f64) as f32;
        let st = 1000.0f32 * t;
        let args: Vec<f32> = (0..half).map(|i| st * (i as f32 * -step).exp()).collect();
        let mut v: Vec<f32> = args.iter().map(|a| a.sin()).collect();
        v.extend(args.iter().map(|a| a.cos()));
        Ok(Tensor::from_vec(v, &[1, FREQ_DIM])?)
    }

    /// `n` modulation vectors `[1, 1, hidden]` from `lin(silu(temb))`.
    fn mods(&self, lin: &Linear, st: &Tensor, n: usize) -> Result<Mods> {
        let h = self.cfg.hidden_size;
        let m = lin.forward(&self.dev, st)?;
        (0..n)
            .map(|i| {
                let p = self.dev.narrow(&m, 1, i * h, h)?;
                Ok(self.dev.reshape(&p, &[1, 1, h])?)
            })
            .collect()
    }

    /// The modulations at time `t`: from the cache, or computed (the time
    /// embedding, then every block's `ada` linear) and kept.
    fn time_mods(&self, t: f32) -> Result<Arc<TimeMods>> {
        let key = t.to_bits();
        let lock = || self.times.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, m)) = lock().iter().find(|(k, _)| *k == key) {
            return Ok(Arc::clone(m));
        }
        let dev = &self.dev;
        // Time embedding [1, hidden]; every row of the batch has the same t.
        let tf = dev.place(&Self::time_features(t)?)?;
        let temb = self.time0.forward(dev, &tf)?;
        let temb = self.time2.forward(dev, &dev.silu(&temb)?)?;
        let st = dev.silu(&temb)?;
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                // shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
                let m = self.mods(&b.ada, &st, 6)?;
                Ok(BlockMods {
                    attn: self.norm_affine(&m[0], &m[1])?,
                    attn_gate: m[2].clone(),
                    ff: self.norm_affine(&m[3], &m[4])?,
                    ff_gate: m[5].clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // The final modulation: scale, then shift.
        let m = self.mods(&self.norm_out, &st, 2)?;
        let out = self.norm_affine(&m[1], &m[0])?;
        let mods = Arc::new(TimeMods { blocks, out });
        let mut cache = lock();
        // Another caller may have kept this time meanwhile: one entry each.
        if let Some((_, m)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(Arc::clone(m));
        }
        if cache.len() >= TIME_CACHE {
            cache.remove(0);
        }
        cache.push((key, Arc::clone(&mods)));
        Ok(mods)
    }

    /// A modulated norm's affine from its `shift` and `scale`.
    fn norm_affine(&self, shift: &Tensor, scale: &Tensor) -> Result<NormAffine> {
        let dev = &self.dev;
        let h = self.cfg.hidden_size;
        Ok(NormAffine {
            scale1: dev.reshape(&dev.affine(scale, 1.0, 1.0)?, &[h])?,
            shift: dev.reshape(shift, &[h])?,
        })
    }

    /// `layer_norm(x) * (1 + scale) + shift`, the norm without affine:
    /// one layer norm whose affine is the modulation (scale and shift are
    /// the same for every row: one time per batch).
    fn modulate(&self, x: &Tensor, a: &NormAffine) -> Result<Tensor> {
        Ok(self.dev.layer_norm(x, &a.scale1, Some(&a.shift), 1e-6)?)
    }

    fn attention(&self, b: &Block, c: &Conditioning, x: &Tensor) -> Result<Tensor> {
        let dev = &self.dev;
        let (nh, hd) = (self.cfg.num_attention_heads, self.cfg.head_dim);
        let q = split_heads(dev, &b.q.forward(dev, x)?, nh, hd)?;
        let k = split_heads(dev, &b.k.forward(dev, x)?, nh, hd)?;
        let v = split_heads(dev, &b.v.forward(dev, x)?, nh, hd)?;
        // Rotary positions on the first head only (as trained upstream).
        let first_head = |t: &Tensor| -> Result<Tensor> {
            let r = c.rope.apply(dev, &dev.narrow(t, 1, 0, 1)?)?;
            if nh == 1 {
                return Ok(r);
            }
            let rest = dev.narrow(t, 1, 1, nh - 1)?;
            Ok(dev.concat(&[&r, &rest], 1)?)
        };
        let q = first_head(&q)?;
        let k = first_head(&k)?;
        let mask = c
            .masks
            .iter()
            .find(|(key, _)| *key == (b.back, b.ahead))
            .map(|(_, m)| m)
            .ok_or_else(|| Error::BadInput("DiT: conditioning lacks a layer's mask".into()))?;
        let a = dev.attention(&q, &k, &v, Some(mask), 1.0 / (hd as f64).sqrt(), false)?;
        b.o.forward(dev, &merge_heads(dev, &a)?)
            .map_err(Error::from)
    }

    fn model_ops(&self, c: &Conditioning, x: &Tensor, t: f32) -> Result<Tensor> {
        let dev = &self.dev;
        let xb = if c.guided {
            dev.concat(&[x, x], 0)?
        } else {
            x.clone()
        };
        let mut h = self
            .proj_in
            .forward(dev, &dev.concat(&[&xb, &c.rest], 2)?)?;
        let tm = self.time_mods(t)?;
        for (b, m) in self.blocks.iter().zip(&tm.blocks) {
            let n = self.modulate(&h, &m.attn)?;
            let a = self.attention(b, c, &n)?;
            h = dev.add(&h, &dev.mul(&a, &m.attn_gate)?)?;
            let n = self.modulate(&h, &m.ff)?;
            let f = b.ff3.forward(dev, &dev.gelu(&b.ff0.forward(dev, &n)?)?)?;
            h = dev.add(&h, &dev.mul(&f, &m.ff_gate)?)?;
        }
        let n = self.modulate(&h, &tm.out)?;
        self.proj_out.forward(dev, &n).map_err(Error::from)
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Additive attention mask `[1, 1, n, n]`: 0 where key frame `j`'s block is
/// query frame `i`'s, or the previous one with `back`, or the next one with
/// `ahead`; a large negative value elsewhere (upstream's boolean
/// `_create_block_diff` mask).
fn block_mask(n: usize, block: usize, back: bool, ahead: bool) -> Result<Tensor> {
    let lo = if back { -1 } else { 0 };
    let hi = if ahead { 1 } else { 0 };
    let mut m = Vec::with_capacity(n * n);
    for i in 0..n {
        let bi = (i / block) as i64;
        for j in 0..n {
            let d = (j / block) as i64 - bi;
            m.push(if d >= lo && d <= hi { 0.0 } else { -1e30 });
        }
    }
    Ok(Tensor::from_vec(m, &[1, 1, n, n])?)
}
