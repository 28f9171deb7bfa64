//! VITS's decoder (`dec`): a HiFi-GAN generator (edgeflow-nn's
//! [`HifiGanGenerator`]) on VITS's latent channels.

use super::VitsConfig;
use crate::{Error, Result};
use edgeflow_nn::{HifiGanConfig, HifiGanGenerator, VarBuilder};
use edgeflow_runtime::{Device, Tensor};

/// The decoder.
#[derive(Debug)]
pub struct Generator(HifiGanGenerator);

/// The generator's shape from the VITS config (`type1`: the residual block
/// type, read from the weight names).
fn shape(cfg: &VitsConfig, type1: bool) -> HifiGanConfig {
    HifiGanConfig {
        in_channels: cfg.inter_channels,
        upsample_initial_channel: cfg.upsample_initial_channel,
        upsample_rates: cfg.upsample_rates.clone(),
        upsample_kernel_sizes: cfg.upsample_kernel_sizes.clone(),
        resblock_kernel_sizes: cfg.resblock_kernel_sizes.clone(),
        resblock_dilation_sizes: cfg.resblock_dilation_sizes.clone(),
        resblock_type1: type1,
        post_bias: false,
    }
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
        for (i, (&u, &k)) in cfg
            .upsample_rates
            .iter()
            .zip(&cfg.upsample_kernel_sizes)
            .enumerate()
        {
            // An exact u-times upsampling: kernel u + 2p, padding p.
            if k < u || !(k - u).is_multiple_of(2) || k > 3 * u {
                return Err(Error::BadInput(format!(
                    "dec.ups.{i}: kernel {k} with stride {u} is not an exact {u}x upsampling"
                )));
            }
        }
        let vb = vb.pp("dec");
        let type1 = vb.contains("resblocks.0.convs1.0.weight");
        Ok(Generator(HifiGanGenerator::load(&vb, &shape(cfg, type1))?))
    }

    /// How many latent frames on each side one output sample depends on
    /// (rounded up), for type-1 residual blocks (the wider of the two).
    pub fn receptive_radius(cfg: &VitsConfig) -> usize {
        shape(cfg, true).receptive_radius()
    }

    /// Latent z[1, c, t] -> audio [1, 1, t * hop].
    pub fn forward(&self, dev: &Device, z: &Tensor) -> Result<Tensor> {
        Ok(self.0.forward(dev, z)?)
    }
}
