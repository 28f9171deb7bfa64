//! 1-D convolution blocks: [`Conv1d`] (bias, stride, dilation, groups, the
//! runtime's fused leaky-ReLU / residual form), [`Pointwise`] (kernel 1 on
//! either layout), [`ConvTranspose1d`] (polyphase where exact), and
//! weight-norm folding ([`fold_weight_norm`], [`load_conv_weight`]).

use crate::{Error, Result, VarBuilder};
use edgeflow_runtime::{ConvCfg, ConvTransposeCfg, Device, Tensor};

/// Shape options of a [`Conv1d`] (PyTorch `nn.Conv1d` meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv1dConfig {
    /// Stride.
    pub stride: usize,
    /// Zero padding on each side; `None`: "same" for odd kernels,
    /// `dilation * (k - 1) / 2`.
    pub padding: Option<usize>,
    /// Dilation.
    pub dilation: usize,
    /// Groups (divide both channel counts).
    pub groups: usize,
    /// Whether the checkpoint has a `bias`.
    pub bias: bool,
}

impl Default for Conv1dConfig {
    fn default() -> Self {
        Conv1dConfig {
            stride: 1,
            padding: None,
            dilation: 1,
            groups: 1,
            bias: true,
        }
    }
}

/// PyTorch's weight norm folded: `w = g * v / ||v||`, the norm over every
/// dim but the first, for `v` with `out = g.len()` rows (`dim=0`, the
/// default of `torch.nn.utils.weight_norm` for convolutions and their
/// transposes alike).
pub fn fold_weight_norm(g: &[f32], v: &[f32]) -> Result<Vec<f32>> {
    if g.is_empty() || !v.len().is_multiple_of(g.len()) {
        return Err(Error::BadInput(format!(
            "weight norm: {} magnitudes do not divide {} direction values",
            g.len(),
            v.len()
        )));
    }
    let per = v.len() / g.len();
    let mut w = Vec::with_capacity(v.len());
    for (row, &gi) in v.chunks(per).zip(g) {
        let norm = row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        let s = if norm > 0.0 { gi as f64 / norm } else { 0.0 };
        w.extend(row.iter().map(|&x| (x as f64 * s) as f32));
    }
    Ok(w)
}

/// The weight of a layer under `vb` on the host as f32, checked against
/// `dims`: `weight`, or the weight-norm pair folded by
/// [`fold_weight_norm`] (`weight_g` / `weight_v`, or PyTorch 2's
/// `parametrizations.weight.original0` / `original1`).
pub fn load_conv_weight(vb: &VarBuilder, dims: &[usize]) -> Result<Tensor> {
    if vb.contains("weight") {
        return vb.host_f32("weight", dims);
    }
    let (gn, vn) = if vb.contains("weight_v") {
        ("weight_g", "weight_v")
    } else if vb.contains("parametrizations.weight.original1") {
        (
            "parametrizations.weight.original0",
            "parametrizations.weight.original1",
        )
    } else {
        return Err(vb.error(
            "weight",
            "not found, nor a weight-norm pair (weight_g / weight_v)",
        ));
    };
    let v = vb.host_f32(vn, dims)?.to_vec_f32()?;
    let g = vb.host_unchecked(gn)?;
    if g.elem_count() != dims[0] {
        return Err(vb.error(
            gn,
            format!("has dims {:?}, expected {} magnitudes", g.dims(), dims[0]),
        ));
    }
    let g = vb.device().host().cast(&g, edgeflow_runtime::DType::F32)?;
    let w = fold_weight_norm(&g.to_vec_f32()?, &v)?;
    Ok(Tensor::from_vec(w, dims)?)
}

/// A 1-D convolution `x[b, c_in, l] -> [b, c_out, l_out]` with its weights.
#[derive(Debug, Clone)]
pub struct Conv1d {
    w: Tensor,
    b: Option<Tensor>,
    /// The bias the fused op takes: `b`, or zeros for a bias-free layer.
    fused_b: Tensor,
    cfg: ConvCfg,
}

impl Conv1d {
    /// `weight` `[c_out, c_in / groups, k]` (or its weight-norm pair) and
    /// `bias` `[c_out]` under `vb`, as f32.
    pub fn load(
        vb: &VarBuilder,
        c_in: usize,
        c_out: usize,
        k: usize,
        cfg: Conv1dConfig,
    ) -> Result<Self> {
        if cfg.groups == 0 || !c_in.is_multiple_of(cfg.groups) || !c_out.is_multiple_of(cfg.groups)
        {
            return Err(Error::BadInput(format!(
                "{}: {} groups do not divide {c_in} -> {c_out} channels",
                vb.prefix(),
                cfg.groups
            )));
        }
        let dims = [c_out, c_in / cfg.groups, k];
        let w = if vb.contains("weight") {
            vb.get_f32("weight", &dims)?
        } else {
            vb.place(&load_conv_weight(vb, &dims)?)?
        };
        let b = if cfg.bias {
            Some(vb.get_f32("bias", &[c_out])?)
        } else {
            None
        };
        let conv = ConvCfg {
            stride: cfg.stride,
            padding: cfg
                .padding
                .unwrap_or((k * cfg.dilation).saturating_sub(cfg.dilation) / 2),
            dilation: cfg.dilation,
            groups: cfg.groups,
        };
        Self::new(vb.device(), w, b, conv)
    }

    /// Over placed weights `w[c_out, c_in / groups, k]` and `b[c_out]`.
    pub fn new(dev: &Device, w: Tensor, b: Option<Tensor>, cfg: ConvCfg) -> Result<Self> {
        let c_out = w.dims().first().copied().unwrap_or(0);
        let fused_b = match &b {
            Some(b) => b.clone(),
            None => dev.place(&Tensor::zeros(&[c_out])?)?,
        };
        Ok(Conv1d { w, b, fused_b, cfg })
    }

    /// The weights.
    pub fn weight(&self) -> &Tensor {
        &self.w
    }

    /// Stride, padding, dilation, groups.
    pub fn config(&self) -> ConvCfg {
        self.cfg
    }

    /// `x[b, c_in, l] -> [b, c_out, l_out]`.
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

/// A kernel-size-1 convolution: a linear layer on time-major activations
/// (`[b, t, c]`), a convolution on channel-major ones (`[b, c, t]`), with
/// no transposes either way.
#[derive(Debug, Clone)]
pub struct Pointwise {
    /// `[c_out, c_in]`.
    w: Tensor,
    /// The same weights as `[c_out, c_in, 1]`.
    w3: Tensor,
    b: Option<Tensor>,
}

impl Pointwise {
    /// `weight` `[c_out, c_in, 1]` and `bias` `[c_out]` under `vb` (f32).
    pub fn load(vb: &VarBuilder, c_in: usize, c_out: usize) -> Result<Self> {
        let w = vb.get_reshaped("weight", &[c_out, c_in, 1], &[c_out, c_in])?;
        let w3 = vb.device().reshape(&w, &[c_out, c_in, 1])?;
        Ok(Pointwise {
            w,
            w3,
            b: Some(vb.get_f32("bias", &[c_out])?),
        })
    }

    /// On time-major activations: `x[b, t, c_in] -> [b, t, c_out]`.
    pub fn forward_tc(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        Ok(dev.linear(x, &self.w, self.b.as_ref())?)
    }

    /// On channel-major activations: `x[b, c_in, t] -> [b, c_out, t]`.
    pub fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        Ok(dev.conv1d(x, &self.w3, self.b.as_ref(), ConvCfg::default())?)
    }
}

/// A transposed 1-D convolution (vocoder upsampling), weights `[c_in,
/// c_out, k]`.
///
/// With stride `u`, kernel `k = u + 2p`, padding `p`, one group and no
/// dilation or output padding (HiFi-GAN's upsampling: the output is exactly
/// `u` times longer) it runs as its polyphase form
/// ([`edgeflow_runtime::Polyphase`]): one ordinary convolution with `u *
/// c_out` output channels over weights rearranged once at load, written
/// interleaved in time by the convolution itself where the device can
/// ([`Device::conv1d_fused_phases`]), the leaky ReLU before it folded in.
/// Same result as the transposed convolution, on the fast convolution
/// path of every backend. Other shapes run the runtime's
/// `conv_transpose1d`.
#[derive(Debug, Clone)]
pub struct ConvTranspose1d {
    w: Tensor,
    b: Tensor,
    form: Form,
}

#[derive(Debug, Clone, Copy)]
enum Form {
    Polyphase { u: usize, cfg: ConvCfg },
    Direct(ConvTransposeCfg),
}

impl ConvTranspose1d {
    /// `weight` `[c_in, c_out, k]` (or its weight-norm pair) and `bias`
    /// `[c_out]` under `vb`.
    pub fn load(
        vb: &VarBuilder,
        c_in: usize,
        c_out: usize,
        k: usize,
        cfg: ConvTransposeCfg,
    ) -> Result<Self> {
        let w = load_conv_weight(vb, &[c_in, c_out, k])?;
        let b = vb.host_f32("bias", &[c_out])?;
        let u = cfg.stride;
        let exact = cfg.groups == 1
            && cfg.dilation == 1
            && cfg.output_padding == 0
            && k >= u
            && (k - u).is_multiple_of(2)
            && cfg.padding == (k - u) / 2;
        let poly = if exact {
            cfg.polyphase(c_in, c_out, k)
        } else {
            None
        };
        let Some(poly) = poly else {
            return Ok(ConvTranspose1d {
                w: vb.place(&w)?,
                b: vb.place(&b)?,
                form: Form::Direct(cfg),
            });
        };
        let wp = poly
            .rearrange(&w.to_vec_f32()?)
            .ok_or_else(|| vb.error("weight", format!("is not [{c_in}, {c_out}, {k}]")))?;
        let bp = poly.bias(&b.to_vec_f32()?);
        let dev = vb.device();
        let w = dev.place(&Tensor::from_vec(wp, &[u * c_out, c_in, poly.taps])?)?;
        let b = dev.place(&Tensor::from_vec(bp, &[u * c_out])?)?;
        dev.stats()
            .add_resident((w.size_bytes() + b.size_bytes()) as i64);
        Ok(ConvTranspose1d {
            w,
            b,
            form: Form::Polyphase {
                u,
                cfg: poly.conv_cfg(),
            },
        })
    }

    /// Whether it runs in polyphase form.
    pub fn is_polyphase(&self) -> bool {
        matches!(self.form, Form::Polyphase { .. })
    }

    /// `x[b, c_in, t] -> [b, c_out, t_out]` (`t * u` in polyphase form).
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
        match self.form {
            // u * c_out channels over t steps, interleaved: [b, c_out, t * u]
            // (k = u + 2p makes the steps exactly t).
            Form::Polyphase { u, cfg } => {
                Ok(dev.conv1d_fused_phases(x, &self.w, &self.b, cfg, pre_slope, None, u)?)
            }
            Form::Direct(cfg) => {
                let xa = match pre_slope {
                    Some(s) => dev.leaky_relu(x, s)?,
                    None => x.clone(),
                };
                Ok(dev.conv_transpose1d(&xa, &self.w, Some(&self.b), cfg)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn dev() -> Device {
        edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu")
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((((i * 41 + seed * 13) % 89) as f32) / 44.0 - 1.0) * 0.5)
            .collect()
    }

    /// PyTorch conv1d by definition, one batch item: `[c_out, l_out]`.
    #[allow(clippy::too_many_arguments)]
    fn conv_ref(
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        (c_in, c_out, k, l): (usize, usize, usize, usize),
        stride: usize,
        pad: usize,
        dil: usize,
        groups: usize,
    ) -> Vec<f64> {
        let l_out = (l + 2 * pad - dil * (k - 1) - 1) / stride + 1;
        let (gi, go) = (c_in / groups, c_out / groups);
        let mut y = vec![0f64; c_out * l_out];
        for o in 0..c_out {
            let g = o / go;
            for t in 0..l_out {
                let mut s = b.map_or(0.0, |b| b[o] as f64);
                for c in 0..gi {
                    for j in 0..k {
                        let p = (t * stride + j * dil) as isize - pad as isize;
                        if (0..l as isize).contains(&p) {
                            s += w[(o * gi + c) * k + j] as f64
                                * x[(g * gi + c) * l + p as usize] as f64;
                        }
                    }
                }
                y[o * l_out + t] = s;
            }
        }
        y
    }

    fn write(dir: &std::path::Path, tensors: &[(&str, Vec<f32>, Vec<usize>)]) -> VarBuilder {
        let path = dir.join("w.safetensors");
        let m: BTreeMap<String, Tensor> = tensors
            .iter()
            .map(|(n, v, d)| (n.to_string(), Tensor::from_vec(v.clone(), d).expect("t")))
            .collect();
        edgeflow_runtime::weights::write_safetensors(&path, &m, None).expect("write");
        VarBuilder::open(&[&path], &dev()).expect("open")
    }

    #[test]
    fn conv1d_with_bias_stride_dilation_and_groups_matches_the_reference() {
        let dir = tempfile::tempdir().expect("tmp");
        let dev = dev();
        let (c_in, c_out, k, l) = (4, 6, 3, 11);
        let x = values(c_in * l, 1);
        let xt = Tensor::from_vec(x.clone(), &[1, c_in, l]).expect("x");
        for (stride, dil, groups, bias) in [
            (1, 1, 1, true),
            (2, 1, 1, false),
            (1, 3, 2, true),
            (1, 2, 1, true),
        ] {
            let w = values(c_out * (c_in / groups) * k, 2 + groups);
            let b = values(c_out, 3);
            let vb = write(
                dir.path(),
                &[
                    ("c.weight", w.clone(), vec![c_out, c_in / groups, k]),
                    ("c.bias", b.clone(), vec![c_out]),
                ],
            );
            let cfg = Conv1dConfig {
                stride,
                padding: None,
                dilation: dil,
                groups,
                bias,
            };
            let conv = Conv1d::load(&vb.pp("c"), c_in, c_out, k, cfg).expect("load");
            let got = conv
                .forward(&dev, &xt)
                .expect("conv")
                .to_vec_f32()
                .expect("v");
            let pad = dil * (k - 1) / 2;
            let want = conv_ref(
                &x,
                &w,
                bias.then_some(&b[..]),
                (c_in, c_out, k, l),
                stride,
                pad,
                dil,
                groups,
            );
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() < 1e-5,
                    "s{stride} d{dil} g{groups}: {g} vs {w}"
                );
            }
        }
        // Fused leaky-ReLU + residual against its parts.
        let w = values(c_in * c_in * k, 9);
        let vb = write(
            dir.path(),
            &[
                ("r.weight", w.clone(), vec![c_in, c_in, k]),
                ("r.bias", values(c_in, 4), vec![c_in]),
            ],
        );
        let conv = Conv1d::load(&vb.pp("r"), c_in, c_in, k, Conv1dConfig::default()).expect("load");
        let fused = conv
            .forward_fused(&dev, &xt, Some(0.1), Some(&xt))
            .expect("fused")
            .to_vec_f32()
            .expect("v");
        let parts = dev
            .add(
                &conv
                    .forward(&dev, &dev.leaky_relu(&xt, 0.1).expect("lr"))
                    .expect("c"),
                &xt,
            )
            .expect("add")
            .to_vec_f32()
            .expect("v");
        for (a, b) in fused.iter().zip(&parts) {
            assert!((a - b).abs() < 1e-5);
        }
        assert!(Conv1d::load(
            &vb.pp("r"),
            3,
            4,
            k,
            Conv1dConfig {
                groups: 2,
                ..Default::default()
            }
        )
        .is_err());
    }

    #[test]
    fn weight_norm_folds_to_g_times_the_unit_direction() {
        let dir = tempfile::tempdir().expect("tmp");
        let dev = dev();
        let (c_in, c_out, k) = (2, 3, 3);
        let v = values(c_out * c_in * k, 5);
        let g = vec![0.5f32, 2.0, -1.0];
        let mut want = Vec::new();
        for o in 0..c_out {
            let row = &v[o * c_in * k..(o + 1) * c_in * k];
            let n = row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            want.extend(row.iter().map(|&x| (g[o] as f64 * x as f64 / n) as f32));
        }
        assert_eq!(fold_weight_norm(&g, &v).expect("fold"), want);
        assert!(fold_weight_norm(&g[..2], &v[..7]).is_err());
        let vb = write(
            dir.path(),
            &[
                ("a.weight_g", g.clone(), vec![c_out, 1, 1]),
                ("a.weight_v", v.clone(), vec![c_out, c_in, k]),
                ("a.bias", vec![0.0; c_out], vec![c_out]),
                (
                    "b.parametrizations.weight.original0",
                    g.clone(),
                    vec![c_out, 1, 1],
                ),
                (
                    "b.parametrizations.weight.original1",
                    v.clone(),
                    vec![c_out, c_in, k],
                ),
                ("b.bias", vec![0.0; c_out], vec![c_out]),
                ("c.weight", want.clone(), vec![c_out, c_in, k]),
                ("c.bias", vec![0.0; c_out], vec![c_out]),
            ],
        );
        let x = Tensor::from_vec(values(c_in * 7, 6), &[1, c_in, 7]).expect("x");
        let run = |p: &str| {
            Conv1d::load(&vb.pp(p), c_in, c_out, k, Conv1dConfig::default())
                .expect("load")
                .forward(&dev, &x)
                .expect("conv")
                .to_vec_f32()
                .expect("v")
        };
        assert_eq!(run("a"), run("c"));
        assert_eq!(run("b"), run("c"));
        let e =
            Conv1d::load(&vb.pp("d"), c_in, c_out, k, Conv1dConfig::default()).expect_err("none");
        assert!(e.to_string().contains("d.weight"), "{e}");
    }

    /// The transposed convolution by its definition (every input scattered
    /// through every tap), `[c_out, t_out]`.
    fn transpose_ref(
        x: &[f32],
        w: &[f32],
        b: &[f32],
        (c_in, c_out, k, l): (usize, usize, usize, usize),
        cfg: &ConvTransposeCfg,
    ) -> Vec<f64> {
        let t_out = (l - 1) * cfg.stride + cfg.dilation * (k - 1) + 1 + cfg.output_padding
            - 2 * cfg.padding;
        let mut y: Vec<f64> = (0..c_out * t_out).map(|i| b[i / t_out] as f64).collect();
        for c in 0..c_in {
            for m in 0..l {
                for o in 0..c_out {
                    for j in 0..k {
                        let n = (m * cfg.stride + j * cfg.dilation) as isize - cfg.padding as isize;
                        if (0..t_out as isize).contains(&n) {
                            y[o * t_out + n as usize] +=
                                w[(c * c_out + o) * k + j] as f64 * x[c * l + m] as f64;
                        }
                    }
                }
            }
        }
        y
    }

    #[test]
    fn conv_transpose1d_polyphase_and_direct_match_the_reference() {
        let dir = tempfile::tempdir().expect("tmp");
        let dev = dev();
        let (c_in, c_out, l) = (4, 2, 6);
        let x = values(c_in * l, 7);
        let xt = Tensor::from_vec(x.clone(), &[1, c_in, l]).expect("x");
        // (stride, kernel, padding, output padding): HiFi-GAN shapes take the
        // polyphase form, the others the direct op.
        for (s, k, p, op, poly) in [
            (4, 8, 2, 0, true),
            (2, 4, 1, 0, true),
            (3, 3, 0, 0, true),
            (2, 3, 1, 1, false),
            (2, 5, 0, 0, false),
        ] {
            let w = values(c_in * c_out * k, s + k);
            let b = values(c_out, 8);
            let vb = write(
                dir.path(),
                &[
                    ("up.weight", w.clone(), vec![c_in, c_out, k]),
                    ("up.bias", b.clone(), vec![c_out]),
                ],
            );
            let cfg = ConvTransposeCfg {
                stride: s,
                padding: p,
                output_padding: op,
                ..Default::default()
            };
            let up = ConvTranspose1d::load(&vb.pp("up"), c_in, c_out, k, cfg).expect("load");
            assert_eq!(up.is_polyphase(), poly, "s{s} k{k}");
            let want = transpose_ref(&x, &w, &b, (c_in, c_out, k, l), &cfg);
            let got = up.forward(&dev, &xt).expect("up").to_vec_f32().expect("v");
            assert_eq!(got.len(), want.len(), "s{s} k{k}");
            for (g, w) in got.iter().zip(&want) {
                assert!((*g as f64 - w).abs() < 1e-5, "s{s} k{k}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn pointwise_agrees_on_both_layouts() {
        let dir = tempfile::tempdir().expect("tmp");
        let dev = dev();
        let (c_in, c_out, t) = (3, 5, 4);
        let vb = write(
            dir.path(),
            &[
                ("p.weight", values(c_out * c_in, 1), vec![c_out, c_in, 1]),
                ("p.bias", values(c_out, 2), vec![c_out]),
            ],
        );
        let pw = Pointwise::load(&vb.pp("p"), c_in, c_out).expect("load");
        let xc = Tensor::from_vec(values(c_in * t, 3), &[1, c_in, t]).expect("x");
        let yc = pw.forward(&dev, &xc).expect("c");
        let yt = pw
            .forward_tc(&dev, &dev.transpose(&xc, 1, 2).expect("t"))
            .expect("tc");
        let a = yc.to_vec_f32().expect("v");
        let b = dev
            .to_host(&dev.transpose(&yt, 1, 2).expect("t"))
            .expect("h")
            .to_vec_f32()
            .expect("v");
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-6);
        }
    }
}
