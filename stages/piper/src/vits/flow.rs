//! VITS's normalizing flow (`flow`): residual coupling layers with WaveNet
//! conditioning (`WN`), mean-only, interleaved with channel flips; run in
//! reverse at inference to map prior samples to the decoder's latent.

use super::layers::{flip_channels, split_channels};
use super::VitsConfig;
use crate::Result;
use edgeflow_nn::{Conv1d, Conv1dConfig, Pointwise, VarBuilder};
use edgeflow_runtime::{Device, Tensor};

#[derive(Debug)]
struct WaveNet {
    in_layers: Vec<Conv1d>,
    res_skip: Vec<Pointwise>,
    hidden: usize,
}

impl WaveNet {
    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let n = self.in_layers.len();
        let mut x = x.clone();
        let mut out: Option<Tensor> = None;
        for i in 0..n {
            let x_in = self.in_layers[i].forward(dev, &x)?;
            let (a, b) = split_channels(dev, &x_in, self.hidden)?;
            let acts = dev.mul(&dev.tanh(&a)?, &dev.sigmoid(&b)?)?;
            let rs = self.res_skip[i].forward(dev, &acts)?;
            let skip = if i + 1 < n {
                let (res, skip) = split_channels(dev, &rs, self.hidden)?;
                x = dev.add(&x, &res)?;
                skip
            } else {
                rs
            };
            out = Some(match out {
                Some(o) => dev.add(&o, &skip)?,
                None => skip,
            });
        }
        out.ok_or_else(|| crate::Error::BadInput("WaveNet with no layers".into()))
    }
}

#[derive(Debug)]
struct Coupling {
    pre: Pointwise,
    enc: WaveNet,
    post: Pointwise,
    half: usize,
}

impl Coupling {
    fn reverse(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let (x0, x1) = split_channels(dev, x, self.half)?;
        let h = self.pre.forward(dev, &x0)?;
        let h = self.enc.forward(dev, &h)?;
        let m = self.post.forward(dev, &h)?;
        let x1 = dev.sub(&x1, &m)?;
        Ok(dev.concat(&[&x0, &x1], 1)?)
    }
}

/// The residual coupling block.
#[derive(Debug)]
pub struct Flow {
    /// Coupling layers in forward order (`flow.flows.0`, `.2`, ...).
    layers: Vec<Coupling>,
}

impl Flow {
    /// Load `flow.*` (`vb` at the checkpoint's root).
    pub fn load(vb: &VarBuilder, cfg: &VitsConfig) -> Result<Self> {
        let c = cfg.inter_channels;
        let h = cfg.hidden_channels;
        let half = c / 2;
        let mut layers = Vec::new();
        for j in 0..cfg.flow_n_flows {
            let p = vb.pp("flow").pp("flows").pp(2 * j);
            let enc = p.pp("enc");
            let mut in_layers = Vec::new();
            let mut res_skip = Vec::new();
            for i in 0..cfg.flow_n_layers {
                let dilation = cfg.flow_dilation_rate.pow(i as u32);
                let c = Conv1dConfig {
                    dilation,
                    ..Conv1dConfig::default()
                };
                in_layers.push(Conv1d::load(
                    &enc.pp("in_layers").pp(i),
                    h,
                    2 * h,
                    cfg.flow_kernel_size,
                    c,
                )?);
                let out = if i + 1 < cfg.flow_n_layers { 2 * h } else { h };
                res_skip.push(Pointwise::load(&enc.pp("res_skip_layers").pp(i), h, out)?);
            }
            layers.push(Coupling {
                pre: Pointwise::load(&p.pp("pre"), half, h)?,
                enc: WaveNet {
                    in_layers,
                    res_skip,
                    hidden: h,
                },
                post: Pointwise::load(&p.pp("post"), h, half)?,
                half,
            });
        }
        Ok(Flow { layers })
    }

    /// How many frames on each side one output frame depends on.
    pub fn receptive_radius(cfg: &VitsConfig) -> usize {
        let per_wn: usize = (0..cfg.flow_n_layers)
            .map(|i| (cfg.flow_kernel_size - 1) / 2 * cfg.flow_dilation_rate.pow(i as u32))
            .sum();
        per_wn * cfg.flow_n_flows
    }

    /// Inverse pass: z_p[1, c, t] -> z[1, c, t].
    pub fn reverse(&self, dev: &Device, z: &Tensor) -> Result<Tensor> {
        let mut z = z.clone();
        for layer in self.layers.iter().rev() {
            z = flip_channels(dev, &z)?;
            z = layer.reverse(dev, &z)?;
        }
        Ok(z)
    }
}
