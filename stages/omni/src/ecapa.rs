//! ECAPA-TDNN (Desplanques et al. 2020), the speaker encoder inside
//! Qwen2.5-Omni's token2wav DiT (`ECAPA_TimeDelayNet` in transformers): it
//! turns the reference mel spectrogram `[b, frames, mel_dim]` into one
//! vector `[b, enc_dim]` that conditions every frame the DiT generates.
//!
//! Layers, under their upstream names (relative to the encoder, which the
//! DiT holds at `input_embed.spk_encoder`):
//!
//! - `blocks.0.conv`: a time-delay layer (convolution, "same" reflect
//!   padding, ReLU);
//! - `blocks.1..n-1`: SE-Res2Net blocks (`tdnn1.conv`, Res2Net
//!   `res2net_block.blocks.j.conv` over channel groups, `tdnn2.conv`,
//!   squeeze-excitation `se_block.conv1` / `conv2`, a residual add);
//! - `mfa.conv`: a time-delay layer over the SE blocks' outputs
//!   concatenated;
//! - `asp.tdnn.conv`, `asp.conv`: attentive statistics pooling (attention
//!   weights over time from the frames and their global mean and standard
//!   deviation; the weighted mean and standard deviation out);
//! - `fc`: a kernel-1 convolution to `enc_dim`.
//!
//! No weights are shipped: users bring the Qwen2.5-Omni checkpoint. Parity
//! with transformers is tested on a small random configuration
//! (`tests/dit.rs`, fixture from `scripts/omni_dit_reference.py`).

use crate::{Error, Result};
use edgeflow_nn::VarBuilder;
use edgeflow_runtime::{BinaryOp, ConvCfg, Device, PadMode, Tensor, UnaryOp};
use serde::Deserialize;

/// The speaker encoder's settings, as the DiT's upstream config holds them
/// (`Qwen2_5OmniDiTConfig`'s `enc_*` keys and `mel_dim`; defaults are
/// Qwen2.5-Omni's).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Mel bins in.
    pub mel_dim: usize,
    /// Output size (the conditioning vector's part of the DiT input).
    pub enc_dim: usize,
    /// Output channels of each layer: the first time-delay layer, the
    /// SE-Res2Net blocks, the multi-layer aggregation (last).
    pub enc_channels: Vec<usize>,
    /// Kernel sizes, one per entry of `enc_channels`.
    pub enc_kernel_sizes: Vec<usize>,
    /// Dilations, one per entry of `enc_channels`.
    pub enc_dilations: Vec<usize>,
    /// Channels of the attentive pooling's hidden layer.
    pub enc_attention_channels: usize,
    /// Channel groups of each Res2Net block.
    pub enc_res2net_scale: usize,
    /// Squeeze-excitation bottleneck channels.
    pub enc_se_channels: usize,
}

impl Default for Config {
    /// Qwen2.5-Omni's.
    fn default() -> Self {
        Config {
            mel_dim: 80,
            enc_dim: 128,
            enc_channels: vec![256, 256, 256, 256, 768],
            enc_kernel_sizes: vec![5, 3, 3, 3, 1],
            enc_dilations: vec![1, 2, 3, 4, 1],
            enc_attention_channels: 64,
            enc_res2net_scale: 2,
            enc_se_channels: 64,
        }
    }
}

impl Config {
    /// Reject settings the encoder cannot be built from (the message names
    /// the key and says what fits).
    pub fn check(&self) -> std::result::Result<(), String> {
        let n = self.enc_channels.len();
        if n < 3 {
            return Err(format!(
                "enc_channels needs at least 3 entries (first layer, SE-Res2Net blocks, aggregation), got {n}"
            ));
        }
        if self.enc_kernel_sizes.len() != n || self.enc_dilations.len() != n {
            return Err(format!(
                "enc_channels ({n}), enc_kernel_sizes ({}) and enc_dilations ({}) must have the same length",
                self.enc_kernel_sizes.len(),
                self.enc_dilations.len()
            ));
        }
        for (key, v) in [
            ("mel_dim", self.mel_dim),
            ("enc_dim", self.enc_dim),
            ("enc_attention_channels", self.enc_attention_channels),
            ("enc_res2net_scale", self.enc_res2net_scale),
            ("enc_se_channels", self.enc_se_channels),
        ] {
            if v == 0 {
                return Err(format!("{key} must be positive"));
            }
        }
        if let Some(i) = (0..n).find(|&i| {
            self.enc_channels[i] == 0 || self.enc_kernel_sizes[i] == 0 || self.enc_dilations[i] == 0
        }) {
            return Err(format!(
                "enc_channels, enc_kernel_sizes and enc_dilations must be positive (entry {i})"
            ));
        }
        for i in 1..n - 1 {
            let c = self.enc_channels[i];
            if self.enc_channels[i - 1] != c {
                return Err(format!(
                    "SE-Res2Net block {i} adds its input ({} channels) to its output ({c}): enc_channels[{}] and enc_channels[{i}] must be equal",
                    self.enc_channels[i - 1],
                    i - 1
                ));
            }
            if !c.is_multiple_of(self.enc_res2net_scale) {
                return Err(format!(
                    "enc_res2net_scale {} must divide enc_channels[{i}] = {c}",
                    self.enc_res2net_scale
                ));
            }
        }
        let mfa_in: usize = self.enc_channels[1..n - 1].iter().sum();
        if mfa_in != self.enc_channels[n - 1] {
            return Err(format!(
                "the aggregation layer reads the SE blocks' outputs concatenated ({mfa_in} channels), so enc_channels' last entry must be {mfa_in}, got {}",
                self.enc_channels[n - 1]
            ));
        }
        Ok(())
    }

    /// The longest reflect padding any layer applies on one side: the
    /// reference mel needs more frames than this.
    pub fn max_padding(&self) -> usize {
        self.enc_kernel_sizes
            .iter()
            .zip(&self.enc_dilations)
            .map(|(&k, &d)| (d * (k - 1)).div_ceil(2))
            .max()
            .unwrap_or(0)
    }

    /// Every tensor the loader reads, relative to the encoder, with its
    /// shape.
    pub fn weight_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        let mut conv = |name: String, c_out: usize, c_in: usize, k: usize| {
            out.push((format!("{name}.weight"), vec![c_out, c_in, k]));
            out.push((format!("{name}.bias"), vec![c_out]));
        };
        let ch = &self.enc_channels;
        let n = ch.len();
        conv(
            "blocks.0.conv".into(),
            ch[0],
            self.mel_dim,
            self.enc_kernel_sizes[0],
        );
        for i in 1..n.saturating_sub(1) {
            let c = ch[i];
            let g = c / self.enc_res2net_scale.max(1);
            conv(format!("blocks.{i}.tdnn1.conv"), c, ch[i - 1], 1);
            for j in 0..self.enc_res2net_scale.saturating_sub(1) {
                conv(
                    format!("blocks.{i}.res2net_block.blocks.{j}.conv"),
                    g,
                    g,
                    self.enc_kernel_sizes[i],
                );
            }
            conv(format!("blocks.{i}.tdnn2.conv"), c, c, 1);
            conv(
                format!("blocks.{i}.se_block.conv1"),
                self.enc_se_channels,
                c,
                1,
            );
            conv(
                format!("blocks.{i}.se_block.conv2"),
                c,
                self.enc_se_channels,
                1,
            );
        }
        let last = ch[n - 1];
        conv("mfa.conv".into(), last, last, self.enc_kernel_sizes[n - 1]);
        conv(
            "asp.tdnn.conv".into(),
            self.enc_attention_channels,
            3 * last,
            1,
        );
        conv("asp.conv".into(), last, self.enc_attention_channels, 1);
        conv("fc".into(), self.enc_dim, 2 * last, 1);
        out
    }
}

/// A convolution with PyTorch's `padding="same", padding_mode="reflect"`
/// (stride 1), optionally followed by ReLU (`TimeDelayNetBlock`).
#[derive(Debug, Clone)]
struct SameConv {
    w: Tensor,
    b: Tensor,
    dilation: usize,
    left: usize,
    right: usize,
    relu: bool,
}

impl SameConv {
    /// `weight` `[c_out, c_in, k]` and `bias` under `vb`.
    fn load(
        vb: &VarBuilder,
        c_in: usize,
        c_out: usize,
        k: usize,
        dilation: usize,
        relu: bool,
    ) -> Result<Self> {
        let total = dilation * (k - 1);
        Ok(SameConv {
            w: vb.get_f32("weight", &[c_out, c_in, k])?,
            b: vb.get_f32("bias", &[c_out])?,
            dilation,
            // torch's "same": the odd element goes to the right.
            left: total / 2,
            right: total - total / 2,
            relu,
        })
    }

    /// `x[b, c_in, t] -> [b, c_out, t]`.
    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let xp = if self.left + self.right > 0 {
            dev.pad(x, 2, self.left, self.right, PadMode::Reflect)?
        } else {
            x.clone()
        };
        let cfg = ConvCfg {
            dilation: self.dilation,
            ..ConvCfg::default()
        };
        let y = dev.conv1d(&xp, &self.w, Some(&self.b), cfg)?;
        Ok(if self.relu {
            dev.unary(UnaryOp::Relu, &y)?
        } else {
            y
        })
    }
}

/// Time-delay, Res2Net, time-delay, squeeze-excitation, plus the input.
#[derive(Debug, Clone)]
struct SeRes2NetBlock {
    tdnn1: SameConv,
    res2net: Vec<SameConv>,
    scale: usize,
    tdnn2: SameConv,
    se1: SameConv,
    se2: SameConv,
}

impl SeRes2NetBlock {
    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let h = self.tdnn1.forward(dev, x)?;
        // Res2Net: channel groups, each (after the first) convolved with
        // the previous group's output added.
        let c = h.dims()[1] / self.scale;
        let mut parts: Vec<Tensor> = Vec::with_capacity(self.scale);
        for i in 0..self.scale {
            let part = dev.narrow(&h, 1, i * c, c)?;
            let out = match i {
                0 => part,
                1 => self.res2net[0].forward(dev, &part)?,
                _ => {
                    let prev = &parts[i - 1];
                    self.res2net[i - 1].forward(dev, &dev.add(&part, prev)?)?
                }
            };
            parts.push(out);
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        let h = dev.concat(&refs, 1)?;
        let h = self.tdnn2.forward(dev, &h)?;
        // Squeeze-excitation: channel gates from the mean over time.
        let m = dev.mean(&h, 2, true)?;
        let m = self.se1.forward(dev, &m)?;
        let gate = dev.sigmoid(&self.se2.forward(dev, &m)?)?;
        let h = dev.mul(&h, &gate)?;
        Ok(dev.add(&h, x)?)
    }
}

/// The ECAPA-TDNN speaker encoder (`ECAPA_TimeDelayNet`).
#[derive(Debug, Clone)]
pub struct Ecapa {
    cfg: Config,
    first: SameConv,
    blocks: Vec<SeRes2NetBlock>,
    mfa: SameConv,
    asp_tdnn: SameConv,
    asp_conv: SameConv,
    fc: SameConv,
    /// `[1]` holding the statistics' variance floor (1e-12).
    eps: Tensor,
}

impl Ecapa {
    /// Read the encoder's weights under `vb` (the DiT's
    /// `input_embed.spk_encoder`).
    pub fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        cfg.check()
            .map_err(|m| Error::bad_file(vb.path(), format!("speaker encoder config: {m}")))?;
        let ch = &cfg.enc_channels;
        let (ks, ds) = (&cfg.enc_kernel_sizes, &cfg.enc_dilations);
        let n = ch.len();
        let first = SameConv::load(
            &vb.pp("blocks.0.conv"),
            cfg.mel_dim,
            ch[0],
            ks[0],
            ds[0],
            true,
        )?;
        let mut blocks = Vec::with_capacity(n - 2);
        for i in 1..n - 1 {
            let b = vb.pp("blocks").pp(i);
            let c = ch[i];
            let g = c / cfg.enc_res2net_scale;
            let res2net = (0..cfg.enc_res2net_scale - 1)
                .map(|j| {
                    SameConv::load(
                        &b.pp("res2net_block.blocks").pp(j).pp("conv"),
                        g,
                        g,
                        ks[i],
                        ds[i],
                        true,
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            blocks.push(SeRes2NetBlock {
                tdnn1: SameConv::load(&b.pp("tdnn1.conv"), ch[i - 1], c, 1, 1, true)?,
                res2net,
                scale: cfg.enc_res2net_scale,
                tdnn2: SameConv::load(&b.pp("tdnn2.conv"), c, c, 1, 1, true)?,
                se1: SameConv::load(&b.pp("se_block.conv1"), c, cfg.enc_se_channels, 1, 1, true)?,
                se2: SameConv::load(&b.pp("se_block.conv2"), cfg.enc_se_channels, c, 1, 1, false)?,
            });
        }
        let last = ch[n - 1];
        let eps = vb.place(&Tensor::from_vec(vec![1e-12], &[1])?)?;
        Ok(Ecapa {
            cfg: cfg.clone(),
            first,
            blocks,
            mfa: SameConv::load(&vb.pp("mfa.conv"), last, last, ks[n - 1], ds[n - 1], true)?,
            asp_tdnn: SameConv::load(
                &vb.pp("asp.tdnn.conv"),
                3 * last,
                cfg.enc_attention_channels,
                1,
                1,
                true,
            )?,
            asp_conv: SameConv::load(
                &vb.pp("asp.conv"),
                cfg.enc_attention_channels,
                last,
                1,
                1,
                false,
            )?,
            fc: SameConv::load(&vb.pp("fc"), 2 * last, cfg.enc_dim, 1, 1, false)?,
            eps,
        })
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Check a reference mel `[b, frames, mel_dim]` (`frames` longer than
    /// the widest reflect padding).
    pub fn check_input(&self, mel: &Tensor) -> Result<()> {
        let pad = self.cfg.max_padding();
        match mel.dims() {
            &[b, t, m] if b > 0 && m == self.cfg.mel_dim && t > pad => Ok(()),
            &[_, t, m] if m == self.cfg.mel_dim => Err(Error::BadInput(format!(
                "speaker encoder: the reference mel has {t} frames; it needs more than {pad} (its widest reflect padding)"
            ))),
            other => Err(Error::BadInput(format!(
                "speaker encoder: the reference mel must be [batch, frames, {}] (mel_dim), got {other:?}",
                self.cfg.mel_dim
            ))),
        }
    }

    /// `mel[b, frames, mel_dim] -> [b, enc_dim]`.
    pub fn forward(&self, dev: &Device, mel: &Tensor) -> Result<Tensor> {
        self.check_input(mel)?;
        // Channel-major; the reshape makes the transposed view contiguous
        // (the CPU backend's reflect padding reads rows by index, which
        // needs a contiguous input).
        let x = dev.transpose(mel, 1, 2)?;
        let x = dev.reshape(&x, x.dims())?;
        let mut h = self.first.forward(dev, &x)?;
        let mut outs = Vec::with_capacity(self.blocks.len());
        for b in &self.blocks {
            h = b.forward(dev, &h)?;
            outs.push(h.clone());
        }
        let refs: Vec<&Tensor> = outs.iter().collect();
        let h = dev.concat(&refs, 1)?;
        let h = self.mfa.forward(dev, &h)?;
        let pooled = self.pool(dev, &h)?;
        let y = self.fc.forward(dev, &pooled)?;
        let b = y.dims()[0];
        Ok(dev.reshape(&y, &[b, self.cfg.enc_dim])?)
    }

    /// Mean and standard deviation over time, weighted by `w[b, c, t]`
    /// (summing to 1 over `t`) or uniform: `([b, c, 1], [b, c, 1])`.
    fn stats(&self, dev: &Device, x: &Tensor, w: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let avg = |v: &Tensor| -> Result<Tensor> {
            Ok(match w {
                Some(w) => dev.sum(&dev.mul(v, w)?, 2, true)?,
                None => dev.mean(v, 2, true)?,
            })
        };
        let mean = avg(x)?;
        let d = dev.sub(x, &mean)?;
        let var = avg(&dev.unary(UnaryOp::Sqr, &d)?)?;
        let var = dev.binary(BinaryOp::Max, &var, &self.eps)?;
        Ok((mean, dev.unary(UnaryOp::Sqrt, &var)?))
    }

    /// Attentive statistics pooling: `[b, c, t] -> [b, 2c, 1]`.
    fn pool(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let t = x.dims()[2];
        // Global statistics (every frame is valid: uniform weights).
        let (mean, std) = self.stats(dev, x, None)?;
        // Repeat over time (replicate padding of one frame).
        let mean_t = dev.pad(&mean, 2, 0, t - 1, PadMode::Replicate)?;
        let std_t = dev.pad(&std, 2, 0, t - 1, PadMode::Replicate)?;
        let a = dev.concat(&[x, &mean_t, &std_t], 1)?;
        let a = dev.tanh(&self.asp_tdnn.forward(dev, &a)?)?;
        let a = self.asp_conv.forward(dev, &a)?;
        let w = dev.softmax(&a, 2)?;
        let (mean, std) = self.stats(dev, x, Some(&w))?;
        Ok(dev.concat(&[&mean, &std], 1)?)
    }
}
