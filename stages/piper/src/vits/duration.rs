//! VITS's stochastic duration predictor (`dp`), run in reverse: noise (scaled
//! by `noise_w`) goes through the inverted flows — channel flips, three
//! neural-spline coupling layers and an element-wise affine — conditioned
//! on the text encoding, giving log-durations.
//!
//! The convolutions run on the device; the rational-quadratic spline's bin
//! search and root solve are per-element control logic on two channels and
//! run on the host (`spline`).

use super::layers::{split_channels, LN_EPS};
use super::spline::inverse_rq_spline;
use super::VitsConfig;
use crate::Result;
use edgeflow_nn::{Conv1d, Conv1dConfig, LayerNorm, Pointwise, VarBuilder};
use edgeflow_runtime::{Device, Tensor, UnaryOp};

/// Dilated depth-separable convolutions (`DDSConv`).
#[derive(Debug)]
struct DdsConv {
    sep: Vec<Conv1d>,
    pw: Vec<Pointwise>,
    norm1: Vec<LayerNorm>,
    norm2: Vec<LayerNorm>,
}

impl DdsConv {
    fn load(vb: &VarBuilder, c: usize, k: usize, layers: usize) -> Result<Self> {
        let mut d = DdsConv {
            sep: Vec::new(),
            pw: Vec::new(),
            norm1: Vec::new(),
            norm2: Vec::new(),
        };
        for i in 0..layers {
            let dilation = k.pow(i as u32);
            let sep = Conv1dConfig {
                dilation,
                groups: c,
                ..Conv1dConfig::default()
            };
            d.sep
                .push(Conv1d::load(&vb.pp("convs_sep").pp(i), c, c, k, sep)?);
            d.pw.push(Pointwise::load(&vb.pp("convs_1x1").pp(i), c, c)?);
            d.norm1.push(LayerNorm::load_gamma_beta(
                &vb.pp("norms_1").pp(i),
                c,
                LN_EPS,
            )?);
            d.norm2.push(LayerNorm::load_gamma_beta(
                &vb.pp("norms_2").pp(i),
                c,
                LN_EPS,
            )?);
        }
        Ok(d)
    }

    fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for i in 0..self.sep.len() {
            let y = self.sep[i].forward(dev, &x)?;
            let y = self.norm1[i].forward_channels(dev, &y)?;
            let y = dev.unary(UnaryOp::GeluErf, &y)?;
            let y = self.pw[i].forward(dev, &y)?;
            let y = self.norm2[i].forward_channels(dev, &y)?;
            let y = dev.unary(UnaryOp::GeluErf, &y)?;
            x = dev.add(&x, &y)?;
        }
        Ok(x)
    }
}

/// A neural-spline coupling layer (`ConvFlow`) on two channels.
#[derive(Debug)]
struct ConvFlow {
    pre: Pointwise,
    convs: DdsConv,
    proj: Pointwise,
    filter: usize,
    bins: usize,
    tail_bound: f32,
}

impl ConvFlow {
    fn load(vb: &VarBuilder, cfg: &VitsConfig) -> Result<Self> {
        let f = cfg.dp_filter_channels;
        let bins = cfg.dp_num_bins;
        Ok(ConvFlow {
            pre: Pointwise::load(&vb.pp("pre"), 1, f)?,
            convs: DdsConv::load(&vb.pp("convs"), f, cfg.dp_kernel_size, 3)?,
            proj: Pointwise::load(&vb.pp("proj"), f, 3 * bins - 1)?,
            filter: f,
            bins,
            tail_bound: cfg.dp_tail_bound,
        })
    }

    /// Inverse pass: z[1, 2, t], conditioned on g[1, filter, t].
    fn reverse(&self, dev: &Device, z: &Tensor, g: &Tensor) -> Result<Tensor> {
        let (x0, x1) = split_channels(dev, z, 1)?;
        let h = self.pre.forward(dev, &x0)?;
        let h = dev.add(&h, g)?;
        let h = self.convs.forward(dev, &h)?;
        let h = self.proj.forward(dev, &h)?; // [1, 3 * bins - 1, t]
        let t = z.dims()[2];
        let params = dev.to_host(&dev.transpose(&h, 1, 2)?)?.to_vec_f32()?; // [t, 3 * bins - 1]
        let x1_host = dev.to_host(&x1)?.to_vec_f32()?;
        let k = 3 * self.bins - 1;
        let norm = (self.filter as f32).sqrt();
        let mut out = Vec::with_capacity(t);
        for (i, &v) in x1_host.iter().enumerate() {
            let p = &params[i * k..(i + 1) * k];
            let widths: Vec<f32> = p[..self.bins].iter().map(|w| w / norm).collect();
            let heights: Vec<f32> = p[self.bins..2 * self.bins]
                .iter()
                .map(|w| w / norm)
                .collect();
            out.push(inverse_rq_spline(
                v,
                &widths,
                &heights,
                &p[2 * self.bins..],
                self.tail_bound,
            ));
        }
        let x1 = dev.place(&Tensor::from_vec(out, &[1, 1, t])?)?;
        Ok(dev.concat(&[&x0, &x1], 1)?)
    }
}

/// The stochastic duration predictor.
#[derive(Debug)]
pub struct DurationPredictor {
    pre: Pointwise,
    convs: DdsConv,
    proj: Pointwise,
    /// In reverse order of application: flows 7, 5, 3 (flow 1 is unused at inference).
    flows: Vec<ConvFlow>,
    m: Tensor,
    neg_logs: Tensor,
}

impl DurationPredictor {
    /// Load `dp.*` (`vb` at the checkpoint's root).
    pub fn load(vb: &VarBuilder, cfg: &VitsConfig) -> Result<Self> {
        let c = cfg.hidden_channels;
        let f = cfg.dp_filter_channels;
        let vb = vb.pp("dp");
        let fl = vb.pp("flows");
        // flows = [affine, (conv_flow, flip) x n]; reversed, minus the first conv_flow.
        let flows = (2..=cfg.dp_n_flows)
            .rev()
            .map(|j| ConvFlow::load(&fl.pp(2 * j - 1), cfg))
            .collect::<Result<Vec<_>>>()?;
        let logs = fl.pp(0).host_f32("logs", &[2, 1])?;
        let neg_logs = edgeflow_runtime::Tensor::from_vec(
            logs.to_vec_f32()?.iter().map(|v| -v).collect(),
            &[1, 2, 1],
        )?;
        let dev = vb.device();
        Ok(DurationPredictor {
            pre: Pointwise::load(&vb.pp("pre"), c, f)?,
            convs: DdsConv::load(&vb.pp("convs"), f, cfg.dp_kernel_size, 3)?,
            proj: Pointwise::load(&vb.pp("proj"), f, f)?,
            flows,
            m: fl.pp(0).get_reshaped("m", &[2, 1], &[1, 2, 1])?,
            neg_logs: dev.place(&neg_logs)?,
        })
    }

    /// Log-durations [1, 1, t] for encoder states x[1, c, t].
    pub fn forward(&self, dev: &Device, x: &Tensor, noise_w: f32, seed: u64) -> Result<Tensor> {
        let t = x.dims()[2];
        let h = self.pre.forward(dev, x)?;
        let h = self.convs.forward(dev, &h)?;
        let g = self.proj.forward(dev, &h)?;
        let mut z = if noise_w > 0.0 {
            dev.rand_normal(&[1, 2, t], 0.0, f64::from(noise_w), seed)?
        } else {
            dev.place(&Tensor::zeros(&[1, 2, t])?)?
        };
        for flow in &self.flows {
            z = swap_two(dev, &z)?;
            z = flow.reverse(dev, &z, &g)?;
        }
        z = swap_two(dev, &z)?;
        // Element-wise affine, inverted: (z - m) * exp(-logs).
        let z = dev.sub(&z, &self.m)?;
        let z = dev.mul(&z, &dev.exp(&self.neg_logs)?)?;
        Ok(dev.narrow(&z, 1, 0, 1)?)
    }
}

/// `Flip` on two channels.
fn swap_two(dev: &Device, z: &Tensor) -> Result<Tensor> {
    let (a, b) = split_channels(dev, z, 1)?;
    Ok(dev.concat(&[&b, &a], 1)?)
}
