//! Weight loading and the small building blocks VITS is made of (convs,
//! channel layer norm), on the runtime's [`Device`] API.

use crate::{Error, Result};
use edgeflow_runtime::candle_core;
use edgeflow_runtime::{ConvCfg, ConvTransposeCfg, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Weights from a safetensors file, by PyTorch name, placed on a device on
/// request.
#[derive(Debug)]
pub struct Weights {
    path: PathBuf,
    map: HashMap<String, candle_core::Tensor>,
    dev: Device,
}

impl Weights {
    /// Read every tensor of `path` (f32) to the host.
    pub fn load(path: &Path, dev: &Device) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::bad_file(path, "weights file not found"));
        }
        let map = candle_core::safetensors::load(path, &candle_core::Device::Cpu)
            .map_err(|e| Error::bad_file(path, format!("not a readable safetensors file: {e}")))?;
        Ok(Weights {
            path: path.to_path_buf(),
            map,
            dev: dev.clone(),
        })
    }

    /// The device weights are placed on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// A tensor on the host, checked against `dims`, reshaped to `as_dims`.
    pub fn host(&self, name: &str, dims: &[usize], as_dims: &[usize]) -> Result<Tensor> {
        let t = self
            .map
            .get(name)
            .ok_or_else(|| Error::bad_file(&self.path, format!("tensor `{name}` is missing")))?;
        if t.dims() != dims {
            return Err(Error::bad_file(
                &self.path,
                format!(
                    "tensor `{name}` has shape {:?}, expected {dims:?}",
                    t.dims()
                ),
            ));
        }
        let t = t
            .to_dtype(candle_core::DType::F32)?
            .reshape(as_dims)?
            .contiguous()?;
        Ok(Tensor::from_candle(t)?)
    }

    /// A tensor placed on the device, checked against `dims`.
    pub fn get(&self, name: &str, dims: &[usize]) -> Result<Tensor> {
        self.get_as(name, dims, dims)
    }

    /// A tensor placed on the device, checked against `dims`, reshaped to `as_dims`.
    pub fn get_as(&self, name: &str, dims: &[usize], as_dims: &[usize]) -> Result<Tensor> {
        let t = self.host(name, dims, as_dims)?;
        let placed = self.dev.place(&t)?;
        self.dev.stats().add_resident(t.size_bytes() as i64);
        Ok(placed)
    }
}

/// A 1-D convolution with its weights.
#[derive(Debug, Clone)]
pub struct Conv1d {
    w: Tensor,
    b: Option<Tensor>,
    /// The bias the fused op takes: `b`, or zeros for a bias-free layer.
    fused_b: Tensor,
    cfg: ConvCfg,
}

impl Conv1d {
    /// `prefix.weight` [c_out, c_in/groups, k] (+ `prefix.bias` when `bias`),
    /// "same" padding for odd kernels. The arguments mirror PyTorch's
    /// `nn.Conv1d(c_in, c_out, k, dilation=, groups=, bias=)`.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        ws: &Weights,
        prefix: &str,
        c_in: usize,
        c_out: usize,
        k: usize,
        dilation: usize,
        groups: usize,
        bias: bool,
    ) -> Result<Self> {
        let w = ws.get(&format!("{prefix}.weight"), &[c_out, c_in / groups, k])?;
        let b = if bias {
            Some(ws.get(&format!("{prefix}.bias"), &[c_out])?)
        } else {
            None
        };
        let fused_b = match &b {
            Some(b) => b.clone(),
            None => ws.device().place(&Tensor::zeros(&[c_out])?)?,
        };
        Ok(Conv1d {
            w,
            b,
            fused_b,
            cfg: ConvCfg {
                stride: 1,
                padding: (k * dilation - dilation) / 2,
                dilation,
                groups,
            },
        })
    }

    /// x[1, c_in, t] -> [1, c_out, t].
    pub fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        Ok(dev.conv1d(x, &self.w, self.b.as_ref(), self.cfg)?)
    }

    /// Multiply the weights (not the bias) by `s`: the convolution then
    /// computes `conv(s * x)`, which folds a scale of its input into it.
    pub fn scale_weights(&mut self, dev: &Device, s: f64) -> Result<()> {
        self.w = dev.scale(&self.w, s)?;
        Ok(())
    }

    /// `conv(leaky_relu(x, pre_slope)) + residual`, as one fused op where
    /// the device has it (the HiFi-GAN residual unit).
    pub fn forward_fused(
        &self,
        dev: &Device,
        x: &Tensor,
        pre_slope: Option<f64>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        Ok(dev.conv1d_fused(x, &self.w, &self.fused_b, self.cfg, pre_slope, residual)?)
    }
}

/// A kernel-size-1 convolution: a linear layer on time-major activations,
/// a convolution on channel-major ones (no transposes).
#[derive(Debug, Clone)]
pub struct Pointwise {
    /// [c_out, c_in].
    w: Tensor,
    /// The same weights as [c_out, c_in, 1].
    w3: Tensor,
    b: Option<Tensor>,
}

impl Pointwise {
    /// `prefix.weight` [c_out, c_in, 1] and `prefix.bias` [c_out].
    pub fn load(ws: &Weights, prefix: &str, c_in: usize, c_out: usize) -> Result<Self> {
        let w = ws.get_as(
            &format!("{prefix}.weight"),
            &[c_out, c_in, 1],
            &[c_out, c_in],
        )?;
        let w3 = ws.device().reshape(&w, &[c_out, c_in, 1])?;
        Ok(Pointwise {
            w,
            w3,
            b: Some(ws.get(&format!("{prefix}.bias"), &[c_out])?),
        })
    }

    /// On time-major activations: x[1, t, c_in] -> [1, t, c_out].
    pub fn forward_tc(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        Ok(dev.linear(x, &self.w, self.b.as_ref())?)
    }

    /// On channel-major activations: x[1, c_in, t] -> [1, c_out, t].
    pub fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        Ok(dev.conv1d(x, &self.w3, self.b.as_ref(), ConvCfg::default())?)
    }
}

/// A transposed 1-D convolution (HiFi-GAN upsampling) with stride `u`,
/// kernel `k` and padding `p` where `k = u + 2p`, so the output is exactly
/// `u` times longer.
///
/// It runs as its polyphase form ([`edgeflow_runtime::Polyphase`]): output sample `n*u + r`
/// only sees inputs `n-1`, `n`, `n+1`, so one ordinary convolution
/// (kernel 3, `u * c_out` output channels, weights rearranged once at
/// load) computes all `u` phases, written interleaved in time by the
/// convolution itself where the device can
/// ([`Device::conv1d_fused_phases`]), with the leaky ReLU before it folded
/// in. Same result as `ConvTranspose1d`, on the fast convolution path of
/// every backend.
#[derive(Debug, Clone)]
pub struct ConvTranspose1d {
    w: Tensor,
    b: Tensor,
    u: usize,
    cfg: ConvCfg,
}

impl ConvTranspose1d {
    /// `prefix.weight` [c_in, c_out, k], `prefix.bias` [c_out], stride `u`,
    /// padding `(k - u) / 2`.
    pub fn load(
        ws: &Weights,
        prefix: &str,
        c_in: usize,
        c_out: usize,
        k: usize,
        u: usize,
    ) -> Result<Self> {
        if k < u || !(k - u).is_multiple_of(2) || k > 3 * u {
            return Err(Error::BadInput(format!(
                "{prefix}: kernel {k} with stride {u} is not an exact {u}x upsampling"
            )));
        }
        let t = ConvTransposeCfg {
            stride: u,
            padding: (k - u) / 2,
            ..ConvTransposeCfg::default()
        };
        let poly = t.polyphase(c_in, c_out, k).ok_or_else(|| {
            Error::BadInput(format!(
                "{prefix}: no polyphase form for kernel {k}, stride {u}"
            ))
        })?;
        let w = ws.host(
            &format!("{prefix}.weight"),
            &[c_in, c_out, k],
            &[c_in, c_out, k],
        )?;
        let wp = poly.rearrange(&w.to_vec_f32()?).ok_or_else(|| {
            Error::BadInput(format!("{prefix}.weight: not [{c_in}, {c_out}, {k}]"))
        })?;
        let b = ws
            .host(&format!("{prefix}.bias"), &[c_out], &[c_out])?
            .to_vec_f32()?;
        let dev = ws.device();
        let w = dev.place(&Tensor::from_vec(wp, &[u * c_out, c_in, poly.taps])?)?;
        let b = dev.place(&Tensor::from_vec(poly.bias(&b), &[u * c_out])?)?;
        dev.stats()
            .add_resident((w.size_bytes() + b.size_bytes()) as i64);
        Ok(ConvTranspose1d {
            w,
            b,
            u,
            cfg: poly.conv_cfg(),
        })
    }

    /// x[1, c_in, t] -> [1, c_out, t * u].
    pub fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        self.forward_pre(dev, x, None)
    }

    /// Multiply the weights (not the bias) by `s`, as
    /// [`Conv1d::scale_weights`].
    pub fn scale_weights(&mut self, dev: &Device, s: f64) -> Result<()> {
        self.w = dev.scale(&self.w, s)?;
        Ok(())
    }

    /// [`Self::forward`] of `leaky_relu(x, pre_slope)`, the activation
    /// folded into the convolution where the device can.
    pub fn forward_pre(&self, dev: &Device, x: &Tensor, pre_slope: Option<f64>) -> Result<Tensor> {
        // u * c_out channels over t steps, interleaved: [1, c_out, t * u]
        // (k = u + 2p makes the steps exactly t).
        Ok(dev.conv1d_fused_phases(x, &self.w, &self.b, self.cfg, pre_slope, None, self.u)?)
    }
}

/// VITS's LayerNorm over the channel dim of `[1, c, t]` (`gamma`, `beta`).
#[derive(Debug, Clone)]
pub struct ChannelNorm {
    gamma: Tensor,
    beta: Tensor,
}

/// The epsilon of VITS's layer norms.
pub const LN_EPS: f64 = 1e-5;

impl ChannelNorm {
    /// `prefix.gamma` and `prefix.beta`, both [c].
    pub fn load(ws: &Weights, prefix: &str, c: usize) -> Result<Self> {
        Ok(ChannelNorm {
            gamma: ws.get(&format!("{prefix}.gamma"), &[c])?,
            beta: ws.get(&format!("{prefix}.beta"), &[c])?,
        })
    }

    /// Normalize time-major activations x[1, t, c].
    pub fn forward_tc(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        Ok(dev.layer_norm(x, &self.gamma, Some(&self.beta), LN_EPS)?)
    }

    /// Normalize channel-major activations x[1, c, t].
    pub fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let xt = dev.transpose(x, 1, 2)?;
        let y = self.forward_tc(dev, &xt)?;
        Ok(dev.transpose(&y, 1, 2)?)
    }
}

/// Split `[1, c, t]` into its first `a` channels and the rest.
pub fn split_channels(dev: &Device, x: &Tensor, a: usize) -> Result<(Tensor, Tensor)> {
    let c = x.dims()[1];
    Ok((dev.narrow(x, 1, 0, a)?, dev.narrow(x, 1, a, c - a)?))
}

/// Reverse the channel order of `[1, c, t]` (VITS's `Flip`).
pub fn flip_channels(dev: &Device, x: &Tensor) -> Result<Tensor> {
    let c = x.dims()[1];
    let idx = Tensor::from_i64((0..c as i64).rev().collect(), &[c])?;
    Ok(dev.index_select(x, &idx, 1)?)
}
