//! VITS's decoder (`dec`): a HiFi-GAN generator — transposed-convolution
//! upsampling, multi-receptive-field residual blocks, tanh output.

use super::VitsConfig;
use crate::{Error, Result};
use edgeflow_nn::{Conv1d, Conv1dConfig, ConvTranspose1d, VarBuilder};
use edgeflow_runtime::{ConvTransposeCfg, Device, Tensor};

const LRELU_SLOPE: f64 = 0.1;

/// One residual block: type "1" (two convs per dilation) or "2" (one).
#[derive(Debug)]
struct ResBlock {
    /// (dilated conv, optional second conv with dilation 1).
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
pub struct Generator {
    conv_pre: Conv1d,
    ups: Vec<ConvTranspose1d>,
    /// `resblock_kernel_sizes.len()` blocks per upsampling stage.
    blocks: Vec<ResBlock>,
    kernels: usize,
    conv_post: Conv1d,
}

impl Generator {
    /// Load `dec.*` (`vb` at the checkpoint's root). The residual block
    /// type is read from the weight names.
    pub fn load(vb: &VarBuilder, cfg: &VitsConfig) -> Result<Self> {
        if cfg.upsample_rates.len() != cfg.upsample_kernel_sizes.len()
            || cfg.resblock_kernel_sizes.len() != cfg.resblock_dilation_sizes.len()
        {
            return Err(Error::BadInput(
                "VITS config: upsample / resblock lists have different lengths".into(),
            ));
        }
        let vb = vb.pp("dec");
        let type1 = vb.contains("resblocks.0.convs1.0.weight");
        let c0 = cfg.upsample_initial_channel;
        let conv = |p: VarBuilder, c_in: usize, c_out: usize, k: usize, dilation: usize| {
            let c = Conv1dConfig {
                dilation,
                ..Conv1dConfig::default()
            };
            Conv1d::load(&p, c_in, c_out, k, c)
        };
        let conv_pre = conv(vb.pp("conv_pre"), cfg.inter_channels, c0, 7, 1)?;
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
            // An exact u-times upsampling: kernel u + 2p, padding p.
            if k < u || !(k - u).is_multiple_of(2) || k > 3 * u {
                return Err(Error::BadInput(format!(
                    "dec.ups.{i}: kernel {k} with stride {u} is not an exact {u}x upsampling"
                )));
            }
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
                let p = vb
                    .pp("resblocks")
                    .pp(i * cfg.resblock_kernel_sizes.len() + j);
                let mut convs = Vec::new();
                for (n, &d) in dil.iter().enumerate() {
                    if type1 {
                        let a = conv(p.pp("convs1").pp(n), out, out, rk, d)?;
                        let b = conv(p.pp("convs2").pp(n), out, out, rk, 1)?;
                        convs.push((a, Some(b)));
                    } else {
                        let a = conv(p.pp("convs").pp(n), out, out, rk, d)?;
                        convs.push((a, None));
                    }
                }
                blocks.push(ResBlock { convs });
            }
            ch = out;
        }
        let post = Conv1dConfig {
            bias: false,
            ..Conv1dConfig::default()
        };
        let mut conv_post = Conv1d::load(&vb.pp("conv_post"), ch, 1, 7, post)?;
        // Each stage ends with the mean of its residual blocks, and whatever
        // reads it (the next upsampling, or conv_post) takes leaky_relu of
        // it first. leaky_relu(x / n) = leaky_relu(x) / n, so the 1 / n goes
        // into those layers' weights once instead of a pass over the
        // largest activations per stage.
        let kernels = cfg.resblock_kernel_sizes.len();
        if kernels > 1 {
            let s = 1.0 / kernels as f64;
            for up in ups.iter_mut().skip(1) {
                up.scale_weights(vb.device(), s)?;
            }
            conv_post.scale_weights(vb.device(), s)?;
        }
        Ok(Generator {
            conv_pre,
            ups,
            blocks,
            kernels,
            conv_post,
        })
    }

    /// How many latent frames on each side one output sample depends on
    /// (rounded up).
    pub fn receptive_radius(cfg: &VitsConfig) -> usize {
        let block_radius: usize = cfg
            .resblock_kernel_sizes
            .iter()
            .zip(&cfg.resblock_dilation_sizes)
            .map(|(&k, dil)| dil.iter().map(|&d| (k - 1) / 2 * (d + 1)).sum::<usize>())
            .max()
            .unwrap_or(0);
        // Radius in samples at the current rate, accumulated from the output back.
        let mut radius_samples = 3.0f64; // conv_post
        for (&u, &k) in cfg
            .upsample_rates
            .iter()
            .zip(&cfg.upsample_kernel_sizes)
            .rev()
        {
            radius_samples += block_radius as f64;
            radius_samples = radius_samples / u as f64 + (k as f64 / u as f64).ceil();
        }
        radius_samples += 3.0; // conv_pre
        radius_samples.ceil() as usize
    }

    /// Latent z[1, c, t] -> audio [1, 1, t * hop].
    pub fn forward(&self, dev: &Device, z: &Tensor) -> Result<Tensor> {
        let mut x = self.conv_pre.forward(dev, z)?;
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
        // PyTorch's default leaky_relu slope here, not LRELU_SLOPE.
        let x = self.conv_post.forward_fused(dev, &x, Some(0.01), None)?;
        Ok(dev.tanh(&x)?)
    }
}
