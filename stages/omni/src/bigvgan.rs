//! Qwen2.5-Omni's token2wav vocoder: a BigVGAN (Lee et al. 2023) that turns
//! the DiT's natural-log mel spectrogram into 24 kHz audio, as
//! `Qwen2_5OmniToken2WavBigVGANModel` in transformers.
//!
//! The mel goes through upstream's `process_mel_spectrogram` (to decibels,
//! normalised to [-1, 1]), `conv_pre` (kernel 7), then per upsampling stage
//! a transposed convolution and the mean of the stage's anti-aliased
//! multi-periodicity residual blocks (AMP blocks: three units of
//! activation, dilated convolution, activation, convolution, residual),
//! then a last activation, `conv_post` (kernel 7, no bias) and a clamp to
//! [-1, 1]. No tanh, no weight norm.
//!
//! Every activation is SnakeBeta,
//! `x + 1 / (e^beta + 1e-9) * sin^2(e^alpha x)` (log-scale parameters), wrapped in upstream's `TorchActivation1d`:
//! 2x upsampling through a 12-tap kaiser-windowed sinc low-pass, the
//! activation, 2x downsampling through the same filter, both with
//! replicate padding. Upsampling runs in its polyphase form (two 7-tap
//! phase filters); the whole of it is one runtime op
//! (`Device::resampled_snake_beta`), which backends without it run as
//! pads, convolutions and the snake op.
//!
//! Tensor names read (upstream's, at the root of `vb`; in the released
//! checkpoint they sit under `token2wav.code2wav_bigvgan_model.`):
//! `conv_pre.{weight,bias}`, `ups.N.0.{weight,bias}`,
//! `resblocks.N.convs1.M.{weight,bias}`, `resblocks.N.convs2.M.{weight,bias}`,
//! `resblocks.N.activations.M.act.{alpha,beta}`,
//! `activation_post.act.{alpha,beta}`, `conv_post.weight`. Convolutions
//! may instead carry a weight-norm pair (`weight_g` / `weight_v`), folded at
//! load. The anti-aliasing filters are non-persistent buffers upstream (not
//! in its state dict): they are computed ([`kaiser_sinc_filter`]), or read
//! from `...activations.M.upsample.filter` / `downsample.filter` where a
//! checkpoint has them (the original BigVGAN saves them).
//!
//! [`BigVgan::forward`] vocodes a whole spectrogram; [`MelStream`] vocodes
//! one that arrives in pieces, with explicit left and right context per
//! chunk ([`receptive_field`] says how much makes the joined audio equal
//! the one-shot output).
//!
//! Real weights are not shipped: users bring the Qwen2.5-Omni checkpoint.
//! Parity with transformers is tested on a small random configuration
//! (`scripts/omni_bigvgan_reference.py`).

use crate::{Error, Result};
use edgeflow_nn::{Conv1d, Conv1dConfig, ConvTranspose1d, VarBuilder};
pub use edgeflow_nn::{MelStream, MelVocoder};
use edgeflow_runtime::{BinaryOp, ConvTransposeCfg, DType, Device, SnakeResampling, Tensor};
use serde::Deserialize;

/// The vocoder's shape: upstream `Qwen2_5OmniBigVGANConfig` (the
/// `bigvgan_config` object inside `token2wav_config` of the checkpoint's
/// `config.json`; other keys are ignored). Defaults are Qwen2.5-Omni's.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Mel bins in (80).
    pub mel_dim: usize,
    /// Channels after `conv_pre` (1536); each upsampling stage halves them.
    pub upsample_initial_channel: usize,
    /// Kernel size of each residual block of a stage ([3, 7, 11]).
    pub resblock_kernel_sizes: Vec<usize>,
    /// Dilations of each residual block's three units (`[1, 3, 5]` each).
    pub resblock_dilation_sizes: Vec<Vec<usize>>,
    /// Upsampling factor of each stage ([5, 3, 2, 2, 2, 2]: 240 samples per frame).
    pub upsample_rates: Vec<usize>,
    /// Transposed-convolution kernel of each stage ([11, 7, 4, 4, 4, 4]).
    pub upsample_kernel_sizes: Vec<usize>,
}

impl Default for Config {
    /// Qwen2.5-Omni's BigVGAN.
    fn default() -> Self {
        Config {
            mel_dim: 80,
            upsample_initial_channel: 1536,
            resblock_kernel_sizes: vec![3, 7, 11],
            resblock_dilation_sizes: vec![vec![1, 3, 5], vec![1, 3, 5], vec![1, 3, 5]],
            upsample_rates: vec![5, 3, 2, 2, 2, 2],
            upsample_kernel_sizes: vec![11, 7, 4, 4, 4, 4],
        }
    }
}

/// Units per AMP block (upstream builds exactly three).
const AMP_UNITS: usize = 3;

impl Config {
    /// Check that the lists agree and every layer keeps lengths exact.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.mel_dim == 0 {
            return Err("mel_dim must be at least 1".into());
        }
        if self.upsample_rates.is_empty()
            || self.upsample_rates.len() != self.upsample_kernel_sizes.len()
        {
            return Err(format!(
                "upsample_rates ({}) and upsample_kernel_sizes ({}) must be non-empty and of the same length",
                self.upsample_rates.len(),
                self.upsample_kernel_sizes.len()
            ));
        }
        for (i, (&u, &k)) in self
            .upsample_rates
            .iter()
            .zip(&self.upsample_kernel_sizes)
            .enumerate()
        {
            if u == 0 || k < u || !(k - u).is_multiple_of(2) {
                return Err(format!(
                    "ups.{i}: kernel {k} with stride {u} is not an exact {u}x upsampling \
                     (needs kernel >= stride and kernel - stride even)"
                ));
            }
        }
        if self.resblock_kernel_sizes.is_empty()
            || self.resblock_kernel_sizes.len() != self.resblock_dilation_sizes.len()
        {
            return Err(format!(
                "resblock_kernel_sizes ({}) and resblock_dilation_sizes ({}) must be non-empty and of the same length",
                self.resblock_kernel_sizes.len(),
                self.resblock_dilation_sizes.len()
            ));
        }
        for (j, (&k, d)) in self
            .resblock_kernel_sizes
            .iter()
            .zip(&self.resblock_dilation_sizes)
            .enumerate()
        {
            if k.is_multiple_of(2) {
                return Err(format!(
                    "resblock kernel {j} is {k}: it must be odd to keep the length"
                ));
            }
            if d.len() != AMP_UNITS || d.contains(&0) {
                return Err(format!(
                    "resblock_dilation_sizes[{j}] is {d:?}: an AMP block takes exactly \
                     {AMP_UNITS} dilations, each at least 1"
                ));
            }
        }
        if self.upsample_initial_channel >> self.upsample_rates.len() == 0 {
            return Err(format!(
                "upsample_initial_channel {} is too few for {} halving stages",
                self.upsample_initial_channel,
                self.upsample_rates.len()
            ));
        }
        Ok(())
    }

    /// Audio samples per mel frame: the product of `upsample_rates` (240).
    pub fn hop_length(&self) -> usize {
        self.upsample_rates.iter().product()
    }

    /// Channels after upsampling stage `stage` (0: after `conv_pre`).
    fn channels(&self, stage: usize) -> usize {
        self.upsample_initial_channel >> stage
    }
}

/// Every tensor [`BigVgan::load`] reads, with its shape (plain weights, as
/// transformers saves them).
pub fn weight_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let mut v: Vec<(String, Vec<usize>)> = Vec::new();
    let c0 = cfg.channels(0);
    v.push(("conv_pre.weight".into(), vec![c0, cfg.mel_dim, 7]));
    v.push(("conv_pre.bias".into(), vec![c0]));
    for (i, &k) in cfg.upsample_kernel_sizes.iter().enumerate() {
        let (ci, co) = (cfg.channels(i), cfg.channels(i + 1));
        v.push((format!("ups.{i}.0.weight"), vec![ci, co, k]));
        v.push((format!("ups.{i}.0.bias"), vec![co]));
    }
    let nb = cfg.resblock_kernel_sizes.len();
    for i in 0..cfg.upsample_rates.len() {
        let ch = cfg.channels(i + 1);
        for (b, &k) in cfg.resblock_kernel_sizes.iter().enumerate() {
            let p = format!("resblocks.{}", i * nb + b);
            for conv in ["convs1", "convs2"] {
                for m in 0..AMP_UNITS {
                    v.push((format!("{p}.{conv}.{m}.weight"), vec![ch, ch, k]));
                    v.push((format!("{p}.{conv}.{m}.bias"), vec![ch]));
                }
            }
            for a in 0..2 * AMP_UNITS {
                for n in ["alpha", "beta"] {
                    v.push((format!("{p}.activations.{a}.act.{n}"), vec![ch]));
                }
            }
        }
    }
    let last = cfg.channels(cfg.upsample_rates.len());
    for n in ["alpha", "beta"] {
        v.push((format!("activation_post.act.{n}"), vec![last]));
    }
    v.push(("conv_post.weight".into(), vec![1, last, 7]));
    v
}

/// Zeroth-order modified Bessel function of the first kind (power series).
fn bessel_i0(x: f64) -> f64 {
    let q = x * x / 4.0;
    let (mut sum, mut term) = (1.0f64, 1.0f64);
    for k in 1..200 {
        term *= q / (k * k) as f64;
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    sum
}

/// Upstream's `kaiser_sinc_filter1d(cutoff, half_width, kernel_size)`: a
/// kaiser-windowed sinc low-pass of `kernel_size` taps summing to 1
/// (`cutoff` and `half_width` in cycles per sample; the window's beta from
/// the usual attenuation formula). Computed in f64, rounded to f32.
pub fn kaiser_sinc_filter(cutoff: f64, half_width: f64, kernel_size: usize) -> Vec<f32> {
    if cutoff == 0.0 || kernel_size == 0 {
        return vec![0.0; kernel_size];
    }
    let even = kernel_size.is_multiple_of(2);
    let half = (kernel_size / 2) as f64;
    let attenuation = 2.285 * (half - 1.0) * std::f64::consts::PI * 4.0 * half_width + 7.95;
    let beta = if attenuation > 50.0 {
        0.1102 * (attenuation - 8.7)
    } else if attenuation >= 21.0 {
        0.5842 * (attenuation - 21.0).powf(0.4) + 0.07886 * (attenuation - 21.0)
    } else {
        0.0
    };
    let n = kernel_size as f64;
    let window = |i: usize| -> f64 {
        if kernel_size == 1 {
            return 1.0;
        }
        // torch.kaiser_window(periodic=False).
        let r = 2.0 * i as f64 / (n - 1.0) - 1.0;
        bessel_i0(beta * (1.0 - r * r).max(0.0).sqrt()) / bessel_i0(beta)
    };
    let sinc = |x: f64| -> f64 {
        if x == 0.0 {
            1.0
        } else {
            let px = std::f64::consts::PI * x;
            px.sin() / px
        }
    };
    let taps: Vec<f64> = (0..kernel_size)
        .map(|i| {
            let t = if even {
                i as f64 - half + 0.5
            } else {
                i as f64 - half
            };
            2.0 * cutoff * window(i) * sinc(2.0 * cutoff * t)
        })
        .collect();
    let sum: f64 = taps.iter().sum();
    taps.iter().map(|&t| (t / sum) as f32).collect()
}

/// Upstream `TorchActivation1d`'s resampling factor and filter length
/// (fixed there: `up_ratio = down_ratio = 2`, kernels of 12).
const ACT_RATIO: usize = 2;
const ACT_KERNEL: usize = 12;

/// The index arithmetic of upstream's `UpSample1d` / `DownSample1d` for
/// ratio `r` and a `k`-tap filter.
#[derive(Debug, Clone, Copy)]
struct Resampling {
    r: usize,
    k: usize,
}

impl Resampling {
    const ACT: Resampling = Resampling {
        r: ACT_RATIO,
        k: ACT_KERNEL,
    };

    /// `UpSample1d`: replicate padding of the input, and the crop of the
    /// transposed convolution's output on the left.
    fn up_pads(&self) -> (i64, i64) {
        let pad = self.k / self.r - 1;
        (pad as i64, (pad * self.r + (self.k - self.r) / 2) as i64)
    }

    /// `DownSample1d`'s replicate padding (left, right).
    fn down_pads(&self) -> (usize, usize) {
        let even = usize::from(self.k.is_multiple_of(2));
        (self.k / 2 - even, self.k / 2)
    }

    /// The upsampler as `r` phase filters over the input: output `r * m +
    /// q` is `sum_t w[q][t] * x[m + t - left]` (x replicate-padded by
    /// `left` / `right`). Returns (weights `[r, taps]` row-major, taps,
    /// left, right); the ratio gain is folded in.
    fn up_polyphase(&self, filter: &[f32]) -> (Vec<f32>, usize, usize, usize) {
        let (pad, crop) = self.up_pads();
        let r = self.r as i64;
        // Tap j of the filter feeds output phase q from input offset d
        // (in the padded input) when q + crop - j = r * d.
        let mut taps: Vec<(usize, i64, usize)> = Vec::new();
        for q in 0..self.r {
            for j in 0..self.k {
                let n = q as i64 + crop - j as i64;
                if n.rem_euclid(r) == 0 {
                    taps.push((q, n.div_euclid(r), j));
                }
            }
        }
        let dmin = taps.iter().map(|t| t.1).min().unwrap_or(0);
        let dmax = taps.iter().map(|t| t.1).max().unwrap_or(0);
        let width = (dmax - dmin + 1) as usize;
        let mut w = vec![0f32; self.r * width];
        for &(q, d, j) in &taps {
            w[q * width + (d - dmin) as usize] = self.r as f32 * filter[j];
        }
        // x index = padded index - pad; tap t reads x[m + dmin + t - pad].
        let left = (pad - dmin).max(0) as usize;
        let right = (width - 1).saturating_sub(left);
        (w, width, left, right)
    }

    /// Input samples output samples `[lo, hi]` of the upsampler read.
    fn up_needs(&self, lo: i64, hi: i64) -> (i64, i64) {
        let (pad, crop) = self.up_pads();
        let (r, k) = (self.r as i64, self.k as i64);
        (
            ceil_div(lo + crop - k + 1, r) - pad,
            (hi + crop).div_euclid(r) - pad,
        )
    }

    /// Input samples output samples `[lo, hi]` of the downsampler read.
    fn down_needs(&self, lo: i64, hi: i64) -> (i64, i64) {
        let (left, _) = self.down_pads();
        let r = self.r as i64;
        (
            lo * r - left as i64,
            hi * r - left as i64 + self.k as i64 - 1,
        )
    }
}

fn ceil_div(a: i64, b: i64) -> i64 {
    -((-a).div_euclid(b))
}

/// SnakeBeta inside upstream's `TorchActivation1d`: 2x up, activation, 2x down.
#[derive(Debug, Clone)]
struct AntiAliasedSnake {
    /// `e^alpha`, `[1, c, 1]`.
    freq: Tensor,
    /// `1 / (e^beta + 1e-9)`, `[1, c, 1]`.
    gain: Tensor,
    /// Upsampling phase filters `[r, 1, taps]`, their zero bias `[r]`, the padding.
    up_w: Tensor,
    up_b: Tensor,
    up_pad: (usize, usize),
    /// Downsampling filter `[1, 1, k]`.
    down_w: Tensor,
}

/// The anti-aliasing filters (upsampling's, downsampling's) as computed.
fn computed_filters() -> (Vec<f32>, Vec<f32>) {
    let r = ACT_RATIO as f64;
    let f = kaiser_sinc_filter(0.5 / r, 0.6 / r, ACT_KERNEL);
    (f.clone(), f)
}

impl AntiAliasedSnake {
    /// `act.alpha` / `act.beta` `[c]` under `vb` (a `TorchActivation1d`),
    /// the filters from `upsample.filter` / `downsample.filter` where
    /// present, else `computed`.
    fn load(vb: &VarBuilder, c: usize, computed: &(Vec<f32>, Vec<f32>)) -> Result<Self> {
        let act = vb.pp("act");
        let alpha = act.host_f32("alpha", &[c])?.to_vec_f32()?;
        let beta = act.host_f32("beta", &[c])?.to_vec_f32()?;
        // As upstream in f32: exp, then 1 / (exp + 1e-9).
        let freq: Vec<f32> = alpha.iter().map(|&a| a.exp()).collect();
        let gain: Vec<f32> = beta.iter().map(|&b| 1.0 / (b.exp() + 1e-9)).collect();
        let filter = |name: &str, default: &[f32]| -> Result<Vec<f32>> {
            if vb.contains(name) {
                Ok(vb.host_f32(name, &[1, 1, ACT_KERNEL])?.to_vec_f32()?)
            } else {
                Ok(default.to_vec())
            }
        };
        let up = filter("upsample.filter", &computed.0)?;
        let down = filter("downsample.filter", &computed.1)?;
        let rs = Resampling::ACT;
        let (w, taps, left, right) = rs.up_polyphase(&up);
        let place = |v: Vec<f32>, dims: &[usize]| -> Result<Tensor> {
            Ok(vb.place(&Tensor::from_vec(v, dims)?)?)
        };
        Ok(AntiAliasedSnake {
            freq: place(freq, &[1, c, 1])?,
            gain: place(gain, &[1, c, 1])?,
            up_w: place(w, &[ACT_RATIO, 1, taps])?,
            up_b: place(vec![0.0; ACT_RATIO], &[ACT_RATIO])?,
            up_pad: (left, right),
            down_w: place(down, &[1, 1, ACT_KERNEL])?,
        })
    }

    /// `x[b, c, t] -> [b, c, t]`: one [`Device::resampled_snake_beta`].
    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let rs = SnakeResampling {
            ratio: ACT_RATIO,
            up_pad: self.up_pad,
            down_pad: Resampling::ACT.down_pads(),
        };
        let filters = (&self.up_w, &self.up_b, &self.down_w);
        Ok(dev.resampled_snake_beta(x, &self.freq, &self.gain, filters, rs)?)
    }
}

/// Upstream `AMPBlock`: three units `x + conv2(act(conv1(act(x))))`.
#[derive(Debug, Clone)]
struct AmpBlock {
    /// (activation, dilated conv, activation, conv) per unit.
    units: Vec<(AntiAliasedSnake, Conv1d, AntiAliasedSnake, Conv1d)>,
}

impl AmpBlock {
    fn load(
        vb: &VarBuilder,
        ch: usize,
        k: usize,
        dilations: &[usize],
        filters: &(Vec<f32>, Vec<f32>),
    ) -> Result<Self> {
        let mut units = Vec::with_capacity(AMP_UNITS);
        for (m, &d) in dilations.iter().enumerate() {
            let conv = |name: &str, d: usize| {
                Conv1d::load(
                    &vb.pp(name).pp(m),
                    ch,
                    ch,
                    k,
                    Conv1dConfig {
                        padding: Some(d * (k - 1) / 2),
                        dilation: d,
                        ..Conv1dConfig::default()
                    },
                )
            };
            // Upstream pairs activations[0::2] with convs1, [1::2] with convs2.
            let acts = vb.pp("activations");
            units.push((
                AntiAliasedSnake::load(&acts.pp(2 * m), ch, filters)?,
                conv("convs1", d)?,
                AntiAliasedSnake::load(&acts.pp(2 * m + 1), ch, filters)?,
                conv("convs2", 1)?,
            ));
        }
        Ok(AmpBlock { units })
    }

    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for (a1, c1, a2, c2) in &self.units {
            let h = c1.forward(dev, &a1.forward(dev, &x)?)?;
            let h = a2.forward(dev, &h)?;
            x = c2.forward_fused(dev, &h, None, Some(&x))?;
        }
        Ok(x)
    }
}

/// One upsampling stage: a transposed convolution, then the mean of the
/// stage's AMP blocks.
#[derive(Debug, Clone)]
struct Stage {
    up: ConvTranspose1d,
    blocks: Vec<AmpBlock>,
}

/// `process_mel_spectrogram` as one affine map of the log mel before the
/// clamp: `exp`, floored at -115 dB, to dB, -20, normalised by
/// `2 (db + 115) / 115 - 1`, clamped to [-1, 1]. With `db = 20 / ln 10 *
/// mel - 20` that is `mel * 40 / (115 ln 10) + 75 / 115`; the -115 dB floor
/// lies below the clamp's -1 and so never shows.
fn process_mel_affine() -> (f64, f64) {
    (40.0 / (115.0 * std::f64::consts::LN_10), 75.0 / 115.0)
}

/// Qwen2.5-Omni's BigVGAN vocoder on a device.
#[derive(Debug, Clone)]
pub struct BigVgan {
    cfg: Config,
    dev: Device,
    conv_pre: Conv1d,
    stages: Vec<Stage>,
    activation_post: AntiAliasedSnake,
    conv_post: Conv1d,
    /// `[1, 1, 1]` constants -1 and 1 (the clamps).
    lo: Tensor,
    hi: Tensor,
}

impl BigVgan {
    /// Load the vocoder from `vb` (upstream names at its root: point it at
    /// `token2wav.code2wav_bigvgan_model` of the released checkpoint) onto
    /// the device it carries.
    pub fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        cfg.check()
            .map_err(|m| Error::BadInput(format!("BigVGAN config: {m}")))?;
        let dev = vb.device().clone();
        let filters = computed_filters();
        let k7 = |bias| Conv1dConfig {
            padding: Some(3),
            bias,
            ..Conv1dConfig::default()
        };
        let conv_pre = Conv1d::load(
            &vb.pp("conv_pre"),
            cfg.mel_dim,
            cfg.channels(0),
            7,
            k7(true),
        )?;
        let nb = cfg.resblock_kernel_sizes.len();
        let mut stages = Vec::with_capacity(cfg.upsample_rates.len());
        for (i, (&u, &k)) in cfg
            .upsample_rates
            .iter()
            .zip(&cfg.upsample_kernel_sizes)
            .enumerate()
        {
            let ch = cfg.channels(i + 1);
            let up = ConvTranspose1d::load(
                &vb.pp("ups").pp(i).pp(0),
                cfg.channels(i),
                ch,
                k,
                ConvTransposeCfg {
                    stride: u,
                    padding: (k - u) / 2,
                    ..ConvTransposeCfg::default()
                },
            )?;
            let blocks = cfg
                .resblock_kernel_sizes
                .iter()
                .zip(&cfg.resblock_dilation_sizes)
                .enumerate()
                .map(|(b, (&k, d))| {
                    AmpBlock::load(&vb.pp("resblocks").pp(i * nb + b), ch, k, d, &filters)
                })
                .collect::<Result<Vec<_>>>()?;
            stages.push(Stage { up, blocks });
        }
        let last = cfg.channels(cfg.upsample_rates.len());
        let activation_post = AntiAliasedSnake::load(&vb.pp("activation_post"), last, &filters)?;
        let conv_post = Conv1d::load(&vb.pp("conv_post"), last, 1, 7, k7(false))?;
        let constant =
            |v: f32| -> Result<Tensor> { Ok(dev.place(&Tensor::from_vec(vec![v], &[1, 1, 1])?)?) };
        Ok(BigVgan {
            cfg: cfg.clone(),
            lo: constant(-1.0)?,
            hi: constant(1.0)?,
            dev,
            conv_pre,
            stages,
            activation_post,
            conv_post,
        })
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// `mel[b, mel_dim, frames]` (natural-log mel, as the DiT produces it)
    /// -> audio in [-1, 1]: `[frames * hop]` for one spectrogram, `[b,
    /// frames * hop]` for more (upstream squeezes the result the same way).
    pub fn forward(&self, mel: &Tensor) -> Result<Tensor> {
        let d = mel.dims();
        if d.len() != 3 || d[0] == 0 || d[1] != self.cfg.mel_dim || d[2] == 0 {
            return Err(Error::BadInput(format!(
                "BigVGAN takes a mel spectrogram [batch, {}, frames] with at least one frame, \
                 got {d:?} (mel_dim is {}; pass frames last)",
                self.cfg.mel_dim, self.cfg.mel_dim
            )));
        }
        self.dev.batch(|| self.forward_ops(mel))
    }

    fn forward_ops(&self, mel: &Tensor) -> Result<Tensor> {
        let dev = &self.dev;
        let (b, frames) = (mel.dims()[0], mel.dims()[2]);
        let mut x = mel.clone();
        if x.dtype() != DType::F32 {
            x = dev.cast(&x, DType::F32)?;
        }
        let (mul, add) = process_mel_affine();
        let x = self.clamp(&dev.affine(&x, mul, add)?)?;
        let mut x = self.conv_pre.forward(dev, &x)?;
        for stage in &self.stages {
            x = stage.up.forward(dev, &x)?;
            let mut sum: Option<Tensor> = None;
            for block in &stage.blocks {
                let y = block.forward(dev, &x)?;
                sum = Some(match sum {
                    Some(s) => dev.add(&s, &y)?,
                    None => y,
                });
            }
            if let Some(s) = sum {
                x = dev.scale(&s, 1.0 / stage.blocks.len() as f64)?;
            }
        }
        let x = self.activation_post.forward(dev, &x)?;
        let y = self.clamp(&self.conv_post.forward(dev, &x)?)?;
        let samples = frames * self.cfg.hop_length();
        let shape: &[usize] = if b == 1 { &[samples] } else { &[b, samples] };
        Ok(dev.reshape(&y, shape)?)
    }

    fn clamp(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.dev.binary(BinaryOp::Max, x, &self.lo)?;
        Ok(self.dev.binary(BinaryOp::Min, &x, &self.hi)?)
    }
}

/// Mel frames on the left and on the right of its own frame that one
/// output sample depends on (the most over the frame's samples), from the
/// index arithmetic of every layer: the context a chunk needs on each side
/// to come out exactly as in one-shot vocoding. 34 on each side for
/// Qwen2.5-Omni's configuration.
///
/// This is the structural bound (every tap counted). The outermost paths
/// pass through the anti-aliasing filters' smallest taps many times, so in
/// f32 their contribution vanishes somewhat earlier: on the small test
/// configuration (bound 38) a change reaches 23 frames and a context of 24
/// already gives bit-identical audio.
pub fn receptive_field(cfg: &Config) -> (usize, usize) {
    // Back from the samples of one frame far from either end, through the
    // layers in reverse, to the mel frames they read (inclusive ranges).
    let f0: i64 = 1 << 20;
    let hop = cfg.hop_length() as i64;
    let conv = |(lo, hi): (i64, i64), k: usize, d: usize| {
        let p = (d * (k - 1) / 2) as i64;
        (lo - p, hi - p + (d * (k - 1)) as i64)
    };
    let act = |(lo, hi): (i64, i64)| {
        let (lo, hi) = Resampling::ACT.down_needs(lo, hi);
        Resampling::ACT.up_needs(lo, hi)
    };
    let union = |a: (i64, i64), b: (i64, i64)| (a.0.min(b.0), a.1.max(b.1));
    let mut need = (f0 * hop, f0 * hop + hop - 1);
    need = conv(need, 7, 1);
    need = act(need);
    for (&u, &k) in cfg
        .upsample_rates
        .iter()
        .zip(&cfg.upsample_kernel_sizes)
        .rev()
    {
        let mut all = need;
        for (&kb, dil) in cfg
            .resblock_kernel_sizes
            .iter()
            .zip(&cfg.resblock_dilation_sizes)
        {
            // Units in reverse; each reads what its residual does and more.
            let mut n = need;
            for &d in dil.iter().rev() {
                n = union(n, act(conv(act(conv(n, kb, 1)), kb, d)));
            }
            all = union(all, n);
        }
        let (u, k) = (u as i64, k as i64);
        let p = (k - u) / 2;
        need = (ceil_div(all.0 + p - k + 1, u), (all.1 + p).div_euclid(u));
    }
    need = conv(need, 7, 1);
    ((f0 - need.0).max(0) as usize, (need.1 - f0).max(0) as usize)
}

/// The larger side of [`receptive_field`]: a context that makes chunked
/// vocoding exact on both sides.
pub fn receptive_radius(cfg: &Config) -> usize {
    let (l, r) = receptive_field(cfg);
    l.max(r)
}

impl MelVocoder for BigVgan {
    type Error = Error;

    fn mel_bins(&self) -> usize {
        self.cfg.mel_dim
    }

    fn samples_per_frame(&self) -> usize {
        self.cfg.hop_length()
    }

    fn device(&self) -> &Device {
        &self.dev
    }

    fn vocode(&self, mel: &Tensor) -> Result<Vec<f32>> {
        let audio = self.forward(mel)?;
        Ok(self.dev.to_host(&audio)?.to_vec_f32()?)
    }
}
