//! The HiFi-GAN generator: transposed-convolution upsampling,
//! multi-receptive-field residual blocks, tanh output. VITS's decoder
//! (Piper) and the HiFi-GAN vocoders are this network; each model file
//! maps its own config onto [`HifiGanConfig`] and loads it at its prefix.

use crate::{Conv1d, Conv1dConfig, ConvTranspose1d, Error, Result, VarBuilder};
use edgeflow_runtime::{ConvTransposeCfg, Device, Tensor};

/// Leaky-ReLU slope inside the generator (upstream `LRELU_SLOPE`).
const LRELU_SLOPE: f64 = 0.1;

/// The generator's shape, as upstream configs give it.
#[derive(Debug, Clone, PartialEq)]
pub struct HifiGanConfig {
    /// Channels of the input (mel bins, or VITS's latent channels).
    pub in_channels: usize,
    /// Channels after `conv_pre`; halved at each upsampling.
    pub upsample_initial_channel: usize,
    /// Upsampling factor per stage.
    pub upsample_rates: Vec<usize>,
    /// Transposed-convolution kernel per stage.
    pub upsample_kernel_sizes: Vec<usize>,
    /// Kernel of each residual block of a stage.
    pub resblock_kernel_sizes: Vec<usize>,
    /// Dilations of each residual block.
    pub resblock_dilation_sizes: Vec<Vec<usize>>,
    /// Residual block type "1" (a dilated and an undilated convolution per
    /// dilation, `convs1` / `convs2`) rather than "2" (one, `convs`).
    pub resblock_type1: bool,
    /// `conv_post` has a bias (HiFi-GAN V1 does; VITS's decoder does not).
    pub post_bias: bool,
}

impl HifiGanConfig {
    /// Consistent lists, and each stage an exact upsampling.
    pub fn check(&self) -> Result<()> {
        if self.upsample_rates.len() != self.upsample_kernel_sizes.len()
            || self.resblock_kernel_sizes.is_empty()
            || self.resblock_kernel_sizes.len() != self.resblock_dilation_sizes.len()
        {
            return Err(Error::BadInput(
                "HiFi-GAN config: upsample / resblock lists are empty or of different lengths"
                    .into(),
            ));
        }
        for (i, (&u, &k)) in self
            .upsample_rates
            .iter()
            .zip(&self.upsample_kernel_sizes)
            .enumerate()
        {
            if u == 0 || k < u || !(k - u).is_multiple_of(2) {
                return Err(Error::BadInput(format!(
                    "ups.{i}: kernel {k} with stride {u} is not an exact {u}x upsampling"
                )));
            }
        }
        Ok(())
    }

    /// How many input frames on each side one output sample depends on
    /// (rounded up): the context a chunk needs to come out exactly as in
    /// one-shot synthesis.
    pub fn receptive_radius(&self) -> usize {
        let block_radius: usize = self
            .resblock_kernel_sizes
            .iter()
            .zip(&self.resblock_dilation_sizes)
            .map(|(&k, dil)| {
                let half = (k - 1) / 2;
                let second = if self.resblock_type1 { half } else { 0 };
                dil.iter().map(|&d| half * d + second).sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        // In samples at each stage's rate, from the output back.
        let mut r = 3.0f64; // conv_post
        for (&u, &k) in self
            .upsample_rates
            .iter()
            .zip(&self.upsample_kernel_sizes)
            .rev()
        {
            r += block_radius as f64;
            r = r / u as f64 + (k as f64 / u as f64).ceil();
        }
        r += 3.0; // conv_pre
        r.ceil() as usize
    }
}

/// One residual block.
#[derive(Debug)]
struct ResBlock {
    /// (dilated conv, the undilated second conv of a type-1 block).
    convs: Vec<(Conv1d, Option<Conv1d>)>,
}

impl ResBlock {
    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        // x + conv(leaky(x)) per unit, each a fused op where the device has it.
        let mut x = x.clone();
        for (c1, c2) in &self.convs {
            x = match c2 {
                None => c1.forward_fused(dev, &x, Some(LRELU_SLOPE), Some(&x))?,
                Some(c2) => {
                    let xt = c1.forward_fused(dev, &x, Some(LRELU_SLOPE), None)?;
                    c2.forward_fused(dev, &xt, Some(LRELU_SLOPE), Some(&x))?
                }
            };
        }
        Ok(x)
    }
}

/// The HiFi-GAN generator.
#[derive(Debug)]
pub struct HifiGanGenerator {
    conv_pre: Conv1d,
    ups: Vec<ConvTranspose1d>,
    /// `resblock_kernel_sizes.len()` blocks per upsampling stage.
    blocks: Vec<ResBlock>,
    kernels: usize,
    conv_post: Conv1d,
}

impl HifiGanGenerator {
    /// Load `conv_pre`, `ups.N`, `resblocks.N` and `conv_post` under `vb`.
    pub fn load(vb: &VarBuilder, cfg: &HifiGanConfig) -> Result<Self> {
        cfg.check()?;
        let conv = |p: VarBuilder, c_in: usize, c_out: usize, k: usize, dilation: usize| {
            let c = Conv1dConfig {
                dilation,
                ..Conv1dConfig::default()
            };
            Conv1d::load(&p, c_in, c_out, k, c)
        };
        let c0 = cfg.upsample_initial_channel;
        let conv_pre = conv(vb.pp("conv_pre"), cfg.in_channels, c0, 7, 1)?;
        let kernels = cfg.resblock_kernel_sizes.len();
        let mut ups = Vec::new();
        let mut blocks = Vec::new();
        let mut ch = c0;
        for (i, (&u, &k)) in cfg
            .upsample_rates
            .iter()
            .zip(&cfg.upsample_kernel_sizes)
            .enumerate()
        {
            let out = ch / 2;
            let t = ConvTransposeCfg {
                stride: u,
                padding: (k - u) / 2,
                ..ConvTransposeCfg::default()
            };
            ups.push(ConvTranspose1d::load(&vb.pp("ups").pp(i), ch, out, k, t)?);
            for (j, (&rk, dil)) in cfg
                .resblock_kernel_sizes
                .iter()
                .zip(&cfg.resblock_dilation_sizes)
                .enumerate()
            {
                let p = vb.pp("resblocks").pp(i * kernels + j);
                let mut convs = Vec::new();
                for (n, &d) in dil.iter().enumerate() {
                    if cfg.resblock_type1 {
                        let a = conv(p.pp("convs1").pp(n), out, out, rk, d)?;
                        let b = conv(p.pp("convs2").pp(n), out, out, rk, 1)?;
                        convs.push((a, Some(b)));
                    } else {
                        convs.push((conv(p.pp("convs").pp(n), out, out, rk, d)?, None));
                    }
                }
                blocks.push(ResBlock { convs });
            }
            ch = out;
        }
        let post = Conv1dConfig {
            bias: cfg.post_bias,
            ..Conv1dConfig::default()
        };
        let mut conv_post = Conv1d::load(&vb.pp("conv_post"), ch, 1, 7, post)?;
        // Each stage ends with the mean of its residual blocks, and what reads
        // it (the next upsampling, or conv_post) takes a leaky ReLU of it
        // first: leaky_relu(x / n) = leaky_relu(x) / n, so the 1 / n goes into
        // those layers' weights once instead of a pass over the activations.
        if kernels > 1 {
            let s = 1.0 / kernels as f64;
            for up in ups.iter_mut().skip(1) {
                up.scale_weights(vb.device(), s)?;
            }
            conv_post.scale_weights(vb.device(), s)?;
        }
        Ok(HifiGanGenerator {
            conv_pre,
            ups,
            blocks,
            kernels,
            conv_post,
        })
    }

    /// `x[b, in_channels, t]` -> audio `[b, 1, t * hop]` in [-1, 1].
    pub fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let mut x = self.conv_pre.forward(dev, x)?;
        for (i, up) in self.ups.iter().enumerate() {
            x = up.forward_pre(dev, &x, Some(LRELU_SLOPE))?;
            let mut acc: Option<Tensor> = None;
            for b in &self.blocks[i * self.kernels..(i + 1) * self.kernels] {
                let y = b.forward(dev, &x)?;
                acc = Some(match acc {
                    Some(a) => dev.add(&a, &y)?,
                    None => y,
                });
            }
            // The sum, not the mean: the next layer's weights carry the 1 / n.
            if let Some(a) = acc {
                x = a;
            }
        }
        // PyTorch's default leaky ReLU slope here (0.01), not LRELU_SLOPE.
        let x = self.conv_post.forward_fused(dev, &x, Some(0.01), None)?;
        Ok(dev.tanh(&x)?)
    }
}
