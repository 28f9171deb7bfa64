//! Typed helpers on [`Device`]: each builds one [`Op`] and dispatches it with
//! [`Device::run`], so model code reads like candle code while keeping
//! per-op placement, fallback and counting.
//!
//! ```no_run
//! # use edgeflow_runtime::{Device, Tensor, UnaryOp, Result};
//! # fn f(dev: &Device, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
//! let h = dev.linear(x, w, Some(b))?;
//! let h = dev.unary(UnaryOp::Gelu, &h)?;
//! dev.softmax(&h, h.rank() - 1)
//! # }
//! ```

use crate::{BinaryOp, DType, Device, Op, PadMode, ReduceOp, Result, Tensor, UnaryOp};

/// Stride, padding, dilation and groups of a convolution (PyTorch meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvCfg {
    /// Stride.
    pub stride: usize,
    /// Zero padding on each side.
    pub padding: usize,
    /// Dilation.
    pub dilation: usize,
    /// Groups.
    pub groups: usize,
}

impl Default for ConvCfg {
    fn default() -> Self {
        ConvCfg {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

/// Parameters of a transposed convolution (PyTorch `ConvTranspose1d` meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvTransposeCfg {
    /// Stride (the upsampling factor).
    pub stride: usize,
    /// Padding removed from both ends of the output.
    pub padding: usize,
    /// Extra length added at the end of the output.
    pub output_padding: usize,
    /// Dilation.
    pub dilation: usize,
    /// Groups.
    pub groups: usize,
}

impl Default for ConvTransposeCfg {
    fn default() -> Self {
        ConvTransposeCfg {
            stride: 1,
            padding: 0,
            output_padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

impl ConvTransposeCfg {
    /// This transposed convolution of weights `[c_in, c_out, k]` as an
    /// ordinary one ([`Polyphase`]); None with dilation or groups, or when
    /// no output phase has a tap.
    pub fn polyphase(&self, c_in: usize, c_out: usize, k: usize) -> Option<Polyphase> {
        Polyphase::of(self, c_in, c_out, k)
    }
}

/// A transposed convolution (weights `[c_in, c_out, k]`, stride `s`,
/// padding `p`, one group, no dilation) as an ordinary stride-1
/// convolution over [`Self::taps`] taps with symmetric [`Self::padding`],
/// whose `s * c_out` output channels (`r * c_out + o`) are the phases `r`
/// of output channel `o`: interleaved in time ([`Device::conv1d_fused_phases`]
/// with `s` phases) they are the transposed convolution's output, whole
/// steps of every phase, of which the first `(l - 1) * s - 2p + k +
/// output_padding` are its length. A vocoder's upsampling then runs on a
/// backend's fast convolution instead of a scatter through all `k` taps.
///
/// Output `n = q * s + r` sums `w[c, o, j] * x[c, m]` over
/// `m * s + j = n + p`: with `a = r + p`, the taps `j = a % s + i * s`
/// (`i` from 0 while `j < k`) read input `m = q + a / s - i`, an offset
/// `e = a / s - i` from `q`. The ordinary convolution reads
/// `x[q + t - padding]` at tap `t`, so tap `t` holds offset
/// `e = t - padding`; `padding` is large enough for the most negative
/// offset and for every output step, and taps no phase uses stay zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polyphase {
    c_in: usize,
    c_out: usize,
    k: usize,
    s: usize,
    p: usize,
    /// Taps of the ordinary convolution.
    pub taps: usize,
    /// Its zero padding on each side.
    pub padding: usize,
}

impl Polyphase {
    fn of(cfg: &ConvTransposeCfg, c_in: usize, c_out: usize, k: usize) -> Option<Self> {
        let (s, p) = (cfg.stride, cfg.padding);
        if s == 0 || cfg.dilation != 1 || cfg.groups != 1 || c_in == 0 || c_out == 0 || k == 0 {
            return None;
        }
        let (mut lo, mut hi) = (isize::MAX, isize::MIN);
        for r in 0..s {
            let a = r + p;
            let first = a % s;
            if first < k {
                let used = (k - first).div_ceil(s) as isize;
                let base = (a / s) as isize;
                lo = lo.min(base - (used - 1));
                hi = hi.max(base);
            }
        }
        if lo > hi {
            return None;
        }
        // Steps per phase for l inputs: ceil(((l - 1) s + x) / s) = l - 1 +
        // ceil(x / s), x = k + output_padding - 2p; the last reads input
        // steps - 1 + hi, which must lie within l - 1 + padding.
        let x = (k + cfg.output_padding) as isize - 2 * p as isize;
        let extra = -(-x).div_euclid(s as isize) - 1;
        let padding = 0.max(-lo).max(extra + hi);
        Some(Polyphase {
            c_in,
            c_out,
            k,
            s,
            p,
            taps: usize::try_from(hi + padding + 1).ok()?,
            padding: usize::try_from(padding).ok()?,
        })
    }

    /// `w` `[c_in, c_out, k]` as the ordinary convolution's weights
    /// `[s * c_out, c_in, taps]`; None when `w` does not have that size.
    pub fn rearrange(&self, w: &[f32]) -> Option<Vec<f32>> {
        let (c_in, c_out, k, s, l) = (self.c_in, self.c_out, self.k, self.s, self.taps);
        if w.len() != c_in * c_out * k {
            return None;
        }
        let mut wp = vec![0f32; s * c_out * c_in * l];
        for r in 0..s {
            let a = r + self.p;
            let (first, base) = (a % s, (a / s) as isize);
            for t in 0..l {
                // Tap t holds offset e = t - padding, reached by i = base - e.
                let i = base - (t as isize - self.padding as isize);
                let Ok(i) = usize::try_from(i) else { continue };
                let j = first + i * s;
                if j >= k {
                    continue;
                }
                for o in 0..c_out {
                    for c in 0..c_in {
                        wp[((r * c_out + o) * c_in + c) * l + t] = w[(c * c_out + o) * k + j];
                    }
                }
            }
        }
        Some(wp)
    }

    /// The bias `[c_out]` of every phase: `[s * c_out]`.
    pub fn bias(&self, b: &[f32]) -> Vec<f32> {
        b.repeat(self.s)
    }

    /// The ordinary convolution's parameters.
    pub fn conv_cfg(&self) -> ConvCfg {
        ConvCfg {
            stride: 1,
            padding: self.padding,
            dilation: 1,
            groups: 1,
        }
    }
}

fn with_opt<'a>(base: &[&'a Tensor], opt: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    let mut v = base.to_vec();
    if let Some(t) = opt {
        v.push(t);
    }
    v
}

impl Device {
    /// `a[..., m, k] @ b[..., k, n]` with batch broadcasting.
    pub fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.run(Op::MatMul, &[a, b])
    }

    /// `x[..., k] @ w[n, k]^T (+ bias[n])`; `w` may be quantized (Q4_0/Q4_1/Q8_0).
    pub fn linear(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.run(Op::Linear, &with_opt(&[x, w], bias))
    }

    /// 1-D convolution: x[b, c_in, l], w[c_out, c_in/groups, k], `bias[c_out]`.
    pub fn conv1d(
        &self,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        cfg: ConvCfg,
    ) -> Result<Tensor> {
        let op = Op::Conv1d {
            stride: cfg.stride,
            padding: cfg.padding,
            dilation: cfg.dilation,
            groups: cfg.groups,
        };
        self.run(op, &with_opt(&[x, w], bias))
    }

    /// `conv1d(leaky_relu(x, pre_slope), w, bias) + residual` as one
    /// [`Op::Conv1dFused`] where the placed backend has it, else composed
    /// from its parts on the same device (same result up to rounding).
    /// `pre_slope: None` skips the activation, `residual: None` the add.
    pub fn conv1d_fused(
        &self,
        x: &Tensor,
        w: &Tensor,
        bias: &Tensor,
        cfg: ConvCfg,
        pre_slope: Option<f64>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.conv1d_fused_phases(x, w, bias, cfg, pre_slope, residual, 1)
    }

    /// [`Self::conv1d_fused`] with its `c_out = phases * c` output channels
    /// interleaved in time, as the phases of a transposed convolution in
    /// its polyphase form: x[b, c_in, l] -> [b, c, l_out * phases], channel
    /// `p * c + o` at time `t` landing at `[o, t * phases + p]`; `residual`
    /// is laid out as the output. One [`Op::Conv1dFused`] where the placed
    /// backend has it, else composed (a reshape / permute copy after it).
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d_fused_phases(
        &self,
        x: &Tensor,
        w: &Tensor,
        bias: &Tensor,
        cfg: ConvCfg,
        pre_slope: Option<f64>,
        residual: Option<&Tensor>,
        phases: usize,
    ) -> Result<Tensor> {
        let op = Op::Conv1dFused {
            stride: cfg.stride,
            padding: cfg.padding,
            dilation: cfg.dilation,
            groups: cfg.groups,
            pre_slope,
            residual: residual.is_some(),
            phases,
        };
        let inputs = with_opt(&[x, w, bias], residual);
        if self.runs_natively(&op, &inputs) {
            return self.run(op, &inputs);
        }
        let phases = phases.max(1);
        let c_out = w.dims().first().copied().unwrap_or(0);
        if phases > 1 {
            if !c_out.is_multiple_of(phases) || x.rank() != 3 {
                return Err(crate::Error::bad_input(
                    "conv1d_fused",
                    format!(
                        "{phases} phases do not divide {c_out} output channels of x {:?}",
                        x.dims()
                    ),
                ));
            }
            let xa = match pre_slope {
                Some(slope) => self.leaky_relu(x, slope)?,
                None => x.clone(),
            };
            let y = self.conv1d(&xa, w, Some(bias), cfg)?;
            let (b, l) = (y.dims()[0], y.dims()[2]);
            let y = self.reshape(&y, &[b, phases, c_out / phases, l])?;
            let y = self.permute(&y, &[0, 2, 3, 1])?;
            let y = self.reshape(&y, &[b, c_out / phases, l * phases])?;
            return match residual {
                Some(r) => self.add(&y, r),
                None => Ok(y),
            };
        }
        let xa = match pre_slope {
            Some(slope) => self.leaky_relu(x, slope)?,
            None => x.clone(),
        };
        let y = self.conv1d(&xa, w, Some(bias), cfg)?;
        match residual {
            Some(r) => self.add(&y, r),
            None => Ok(y),
        }
    }

    /// 2-D convolution: x[b, c_in, h, w], w[c_out, c_in/groups, kh, kw], `bias[c_out]`.
    pub fn conv2d(
        &self,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        cfg: ConvCfg,
    ) -> Result<Tensor> {
        let op = Op::Conv2d {
            stride: cfg.stride,
            padding: cfg.padding,
            dilation: cfg.dilation,
            groups: cfg.groups,
        };
        self.run(op, &with_opt(&[x, w], bias))
    }

    /// Transposed 1-D convolution (vocoder upsampling):
    /// x[b, c_in, l], w[c_in, c_out/groups, k] (PyTorch layout), `bias[c_out]`.
    pub fn conv_transpose1d(
        &self,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        cfg: ConvTransposeCfg,
    ) -> Result<Tensor> {
        let op = Op::ConvTranspose1d {
            stride: cfg.stride,
            padding: cfg.padding,
            output_padding: cfg.output_padding,
            dilation: cfg.dilation,
            groups: cfg.groups,
        };
        self.run(op, &with_opt(&[x, w], bias))
    }

    /// Layer norm over the last dim.
    pub fn layer_norm(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        self.run(Op::LayerNorm { eps }, &with_opt(&[x, gamma], beta))
    }

    /// RMS norm over the last dim.
    pub fn rms_norm(&self, x: &Tensor, gamma: &Tensor, eps: f64) -> Result<Tensor> {
        self.run(Op::RmsNorm { eps }, &[x, gamma])
    }

    /// Softmax over `dim`.
    pub fn softmax(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        self.run(Op::Softmax { dim }, &[x])
    }

    /// Scaled dot-product attention: q[b, h, s, d], k/v[b, hk, t, d] (`hk`
    /// divides `h`), optional additive mask broadcastable to [b, h, s, t].
    /// `causal` masks key j > i + (t - s) (aligned to the end, for KV-cache decode).
    pub fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        scale: f64,
        causal: bool,
    ) -> Result<Tensor> {
        self.run(Op::Attention { scale, causal }, &with_opt(&[q, k, v], mask))
    }

    /// Rotary embedding: x[b, h, s, d], cos/sin[s, d/2].
    pub fn rope(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        interleaved: bool,
    ) -> Result<Tensor> {
        self.run(Op::Rope { interleaved }, &[x, cos, sin])
    }

    /// Element-wise unary function.
    pub fn unary(&self, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
        self.run(Op::Unary(op), &[x])
    }

    /// GELU, tanh approximation.
    pub fn gelu(&self, x: &Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu, x)
    }

    /// SiLU (swish).
    pub fn silu(&self, x: &Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Silu, x)
    }

    /// tanh.
    pub fn tanh(&self, x: &Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh, x)
    }

    /// Logistic sigmoid.
    pub fn sigmoid(&self, x: &Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid, x)
    }

    /// e^x.
    pub fn exp(&self, x: &Tensor) -> Result<Tensor> {
        self.unary(UnaryOp::Exp, x)
    }

    /// `max(x, slope * x)`.
    pub fn leaky_relu(&self, x: &Tensor, slope: f64) -> Result<Tensor> {
        self.run(Op::LeakyRelu { slope }, &[x])
    }

    /// Snake activation: x[b, c, t], `alpha[c]`.
    pub fn snake(&self, x: &Tensor, alpha: &Tensor) -> Result<Tensor> {
        self.run(Op::Snake, &[x, alpha])
    }

    /// `x + gain * sin^2(freq x)` for x[b, c, t] and per-channel `freq`,
    /// `gain` (`[c]`, or any shape of `c` values broadcasting as `[1, c,
    /// 1]`): SnakeBeta. One three-input [`Op::Snake`] where the placed
    /// backend has it, else composed (multiply, sin, square, multiply, add:
    /// the same result up to rounding).
    pub fn snake_beta(&self, x: &Tensor, freq: &Tensor, gain: &Tensor) -> Result<Tensor> {
        let inputs = [x, freq, gain];
        if self.runs_natively(&Op::Snake, &inputs) {
            return self.run(Op::Snake, &inputs);
        }
        let c = match x.dims() {
            &[_, c, _] => c,
            d => {
                return Err(crate::Error::bad_input(
                    "snake",
                    format!("x must be [batch, channels, time], got {d:?}"),
                ))
            }
        };
        let f = self.reshape(freq, &[1, c, 1])?;
        let g = self.reshape(gain, &[1, c, 1])?;
        let s = self.unary(crate::UnaryOp::Sin, &self.mul(x, &f)?)?;
        let s = self.unary(crate::UnaryOp::Sqr, &s)?;
        self.add(x, &self.mul(&s, &g)?)
    }

    /// SnakeBeta between anti-aliasing resamplers ([`Op::ResampledSnake`]):
    /// `x[b, c, t]`, per-channel `freq` / `gain` as [`Device::snake_beta`]
    /// takes them, `filters` = (`up[ratio, 1, taps]`, `up_bias[ratio]`,
    /// `down[1, 1, k]`). One op where the placed backend has it, else
    /// composed: replicate pad, [`Device::conv1d_fused_phases`], snake,
    /// replicate pad, strided [`Device::conv1d`] (the same result up to
    /// rounding).
    pub fn resampled_snake_beta(
        &self,
        x: &Tensor,
        freq: &Tensor,
        gain: &Tensor,
        filters: (&Tensor, &Tensor, &Tensor),
        rs: crate::SnakeResampling,
    ) -> Result<Tensor> {
        let (up, up_bias, down) = filters;
        let op = Op::ResampledSnake(rs);
        let inputs = [x, freq, gain, up, up_bias, down];
        if self.runs_natively(&op, &inputs) {
            return self.run(op, &inputs);
        }
        let &[b, c, t] = x.dims() else {
            return Err(crate::Error::bad_input(
                "resampled_snake",
                format!("x must be [batch, channels, time], got {:?}", x.dims()),
            ));
        };
        let r = rs.ratio;
        // Every channel through the same filters: channels as batch.
        let h = self.reshape(x, &[b * c, 1, t])?;
        let h = self.pad(&h, 2, rs.up_pad.0, rs.up_pad.1, PadMode::Replicate)?;
        let h = self.conv1d_fused_phases(&h, up, up_bias, ConvCfg::default(), None, None, r)?;
        let len = h.dims().get(2).copied().unwrap_or(0);
        let h = self.reshape(&h, &[b, c, len])?;
        let h = self.snake_beta(&h, freq, gain)?;
        let h = self.reshape(&h, &[b * c, 1, len])?;
        let h = self.pad(&h, 2, rs.down_pad.0, rs.down_pad.1, PadMode::Replicate)?;
        let h = self.conv1d(
            &h,
            down,
            None,
            ConvCfg {
                stride: r,
                ..ConvCfg::default()
            },
        )?;
        let len = h.dims().get(2).copied().unwrap_or(0);
        self.reshape(&h, &[b, c, len])
    }

    /// `silu(gate) * up` ([`Op::SwiGlu`]): `up` None takes both from `x`,
    /// gate then up stacked on its last dim (`[..., 2f]` -> `[..., f]`);
    /// else `x` is the gate, of `up`'s shape. One op where the placed
    /// backend has it, else composed (narrow, silu, multiply).
    pub fn swiglu(&self, x: &Tensor, up: Option<&Tensor>) -> Result<Tensor> {
        let inputs = with_opt(&[x], up);
        if self.runs_natively(&Op::SwiGlu, &inputs) {
            return self.run(Op::SwiGlu, &inputs);
        }
        let (g, u) = match up {
            Some(u) => (x.clone(), u.clone()),
            None => {
                let last = x
                    .rank()
                    .checked_sub(1)
                    .filter(|&l| x.dims()[l].is_multiple_of(2));
                let Some(last) = last else {
                    return Err(crate::Error::bad_input(
                        "swiglu",
                        format!(
                            "gate and up stacked on the last dim need an even last dim, got {:?}",
                            x.dims()
                        ),
                    ));
                };
                let f = x.dims()[last] / 2;
                (self.narrow(x, last, 0, f)?, self.narrow(x, last, f, f)?)
            }
        };
        self.mul(&self.silu(&g)?, &u)
    }

    /// Element-wise binary function with broadcasting.
    pub fn binary(&self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.run(Op::Binary(op), &[a, b])
    }

    /// `a + b` (broadcasting).
    pub fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Add, a, b)
    }

    /// `a - b` (broadcasting).
    pub fn sub(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Sub, a, b)
    }

    /// `a * b` (broadcasting).
    pub fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Mul, a, b)
    }

    /// `a / b` (broadcasting).
    pub fn div(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Div, a, b)
    }

    /// `x * mul + add`.
    pub fn affine(&self, x: &Tensor, mul: f64, add: f64) -> Result<Tensor> {
        self.run(Op::Affine { mul, add }, &[x])
    }

    /// `x * s`.
    pub fn scale(&self, x: &Tensor, s: f64) -> Result<Tensor> {
        self.affine(x, s, 0.0)
    }

    /// Reduction over `dim`.
    pub fn reduce(&self, op: ReduceOp, x: &Tensor, dim: usize, keepdim: bool) -> Result<Tensor> {
        self.run(Op::Reduce { op, dim, keepdim }, &[x])
    }

    /// Sum over `dim`.
    pub fn sum(&self, x: &Tensor, dim: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, x, dim, keepdim)
    }

    /// Mean over `dim`.
    pub fn mean(&self, x: &Tensor, dim: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, x, dim, keepdim)
    }

    /// Index of the maximum over `dim`, as [`DType::I32`] (candle stores it as u32).
    pub fn argmax(&self, x: &Tensor, dim: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMax, x, dim, keepdim)
    }

    /// Inclusive cumulative sum over `dim`.
    pub fn cumsum(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        self.run(Op::Cumsum { dim }, &[x])
    }

    /// Same data, new shape.
    pub fn reshape(&self, x: &Tensor, shape: &[usize]) -> Result<Tensor> {
        self.run(
            Op::Reshape {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }

    /// Reorder dimensions.
    pub fn permute(&self, x: &Tensor, dims: &[usize]) -> Result<Tensor> {
        self.run(
            Op::Permute {
                dims: dims.to_vec(),
            },
            &[x],
        )
    }

    /// Swap two dimensions (a [`Op::Permute`]).
    pub fn transpose(&self, x: &Tensor, d0: usize, d1: usize) -> Result<Tensor> {
        let mut dims: Vec<usize> = (0..x.rank()).collect();
        if d0 >= dims.len() || d1 >= dims.len() {
            return Err(crate::Error::bad_input(
                "permute",
                format!("transpose({d0}, {d1}) of a rank-{} tensor", x.rank()),
            ));
        }
        dims.swap(d0, d1);
        self.permute(x, &dims)
    }

    /// Concatenate along `dim`.
    pub fn concat(&self, xs: &[&Tensor], dim: usize) -> Result<Tensor> {
        self.run(Op::Concat { dim }, xs)
    }

    /// `len` elements of `dim` from `start`.
    pub fn narrow(&self, x: &Tensor, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        self.run(Op::Narrow { dim, start, len }, &[x])
    }

    /// Pad `dim` with `before` / `after` elements.
    pub fn pad(
        &self,
        x: &Tensor,
        dim: usize,
        before: usize,
        after: usize,
        mode: PadMode,
    ) -> Result<Tensor> {
        self.run(
            Op::Pad {
                dim,
                before,
                after,
                mode,
            },
            &[x],
        )
    }

    /// torch.gather along `dim`.
    pub fn gather(&self, x: &Tensor, idx: &Tensor, dim: usize) -> Result<Tensor> {
        self.run(Op::Gather { dim }, &[x, idx])
    }

    /// Select slices of `dim` by index (embedding lookup: `dim = 0`).
    pub fn index_select(&self, x: &Tensor, idx: &Tensor, dim: usize) -> Result<Tensor> {
        self.run(Op::IndexSelect { dim }, &[x, idx])
    }

    /// Convert the element type (dequantizes quantized tensors to f32/f16).
    pub fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        self.run(Op::Cast { dtype }, &[x])
    }

    /// Seeded normal samples; identical for a seed on every backend
    /// (see [`crate::rng`]).
    pub fn rand_normal(&self, shape: &[usize], mean: f64, std: f64, seed: u64) -> Result<Tensor> {
        self.run(
            Op::RandNormal {
                shape: shape.to_vec(),
                mean,
                std,
                seed,
            },
            &[],
        )
    }
}

/// A growing key/value cache for autoregressive attention.
///
/// Keys and values are `[b, hk, t, d]`; each [`KvCache::append`] adds rows
/// along `t` (dim 2) and returns the whole cache.
///
/// On the host (f32, the CPU backend) the cache is a buffer with spare
/// rows: new rows are written in place and the returned tensors are views
/// of its first `len` rows (the CPU attention reads them with their
/// strides), so a decode step copies only its own row instead of the whole
/// cache. The buffer doubles when full (amortized one copy per row).
/// Tensors returned earlier keep their contents: writes land only past
/// their length, and a clone holds views of the used rows. Elsewhere the
/// cache concatenates on its device.
#[derive(Debug, Default)]
pub struct KvCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
    /// Rows in use; with host buffers, `k` and `v` hold more.
    len: usize,
    /// `k` and `v` are host buffers with spare rows.
    in_place: bool,
}

/// Rows of a fresh host buffer at least: growth below that would copy often.
const KV_MIN_ROWS: usize = 64;

impl Clone for KvCache {
    /// A cache with the same contents that never writes into this one's
    /// buffer: it holds views of the used rows (no copy) and concatenates
    /// on its own appends, while this cache's appends write only past those
    /// rows, which the views do not see.
    fn clone(&self) -> Self {
        let view = |t: &Option<Tensor>| -> Option<Tensor> {
            let t = t.as_ref()?;
            match (self.in_place, t.as_candle()) {
                (true, Some(c)) => c
                    .narrow(2, 0, self.len)
                    .ok()
                    .and_then(|c| Tensor::from_candle(c).ok()),
                _ => Some(t.clone()),
            }
        };
        let (k, v) = (view(&self.k), view(&self.v));
        if k.is_none() || v.is_none() {
            // Only an empty cache has no tensors (narrowing the used rows
            // of a host buffer cannot fail).
            return KvCache::default();
        }
        KvCache {
            k,
            v,
            len: self.len,
            in_place: false,
        }
    }
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cached length along the sequence dim (0 when empty).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append new keys/values `[b, hk, s, d]` and return the whole cache.
    pub fn append(&mut self, dev: &Device, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        if k.rank() != 4 || v.rank() != 4 {
            return Err(crate::Error::bad_input(
                "attention",
                format!(
                    "KV cache expects [b, h, t, d] keys and values, got {:?} and {:?}",
                    k.dims(),
                    v.dims()
                ),
            ));
        }
        if let Some(kv) = self.append_in_place(k, v)? {
            return Ok(kv);
        }
        if self.in_place {
            // Host buffers, but these rows cannot go in place (another
            // dtype or device): continue by concatenation from a copy.
            let (ck, cv) = (self.view(&self.k)?, self.view(&self.v)?);
            self.k = Some(ck);
            self.v = Some(cv);
            self.in_place = false;
        }
        let (nk, nv) = match (&self.k, &self.v) {
            (Some(ck), Some(cv)) => (dev.concat(&[ck, k], 2)?, dev.concat(&[cv, v], 2)?),
            _ => (k.clone(), v.clone()),
        };
        self.len = nk.dims()[2];
        self.k = Some(nk.clone());
        self.v = Some(nv.clone());
        Ok((nk, nv))
    }

    /// The first `len` rows of a host buffer.
    fn view(&self, t: &Option<Tensor>) -> Result<Tensor> {
        match t.as_ref().and_then(|t| t.as_candle()) {
            Some(c) => Tensor::from_candle(c.narrow(2, 0, self.len)?),
            None => Err(crate::Error::bad_input(
                "attention",
                "KV cache buffer is missing".to_string(),
            )),
        }
    }

    /// The host path: None when `k`/`v` (or the cache so far) are not f32
    /// host tensors of matching shape.
    fn append_in_place(&mut self, k: &Tensor, v: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        let (Some(kc), Some(vc)) = (k.as_candle(), v.as_candle()) else {
            return Ok(None);
        };
        let f32 = candle_core::DType::F32;
        if kc.dtype() != f32 || vc.dtype() != f32 {
            return Ok(None);
        }
        let (kd, vd) = (kc.dims(), vc.dims());
        if kd[2] != vd[2] || kd[..2] != vd[..2] {
            return Ok(None);
        }
        if self.len > 0 && !self.in_place {
            return Ok(None);
        }
        let need = self.len + kd[2];
        let fits = |buf: &Option<Tensor>, d: &[usize]| match buf.as_ref().map(|t| t.dims()) {
            Some(b) => b[0] == d[0] && b[1] == d[1] && b[3] == d[3] && b[2] >= need,
            None => false,
        };
        if self.len > 0 {
            let same = |buf: &Option<Tensor>, d: &[usize]| match buf.as_ref().map(|t| t.dims()) {
                Some(b) => b[0] == d[0] && b[1] == d[1] && b[3] == d[3],
                None => false,
            };
            if !same(&self.k, kd) || !same(&self.v, vd) {
                return Ok(None);
            }
        }
        if !fits(&self.k, kd) || !fits(&self.v, vd) {
            // Grow: a fresh buffer of twice the rows, the old rows copied in.
            let rows = need.next_power_of_two().max(KV_MIN_ROWS);
            let grow = |old: &Option<Tensor>, d: &[usize]| -> Result<Tensor> {
                let buf = candle_core::Tensor::zeros(
                    (d[0], d[1], rows, d[3]),
                    f32,
                    &candle_core::Device::Cpu,
                )?;
                if self.len > 0 {
                    if let Some(o) = old.as_ref().and_then(|t| t.as_candle()) {
                        buf.slice_set(&o.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                    }
                }
                Tensor::from_candle(buf)
            };
            let (nk, nv) = (grow(&self.k, kd)?, grow(&self.v, vd)?);
            self.k = Some(nk);
            self.v = Some(nv);
        }
        for (buf, new) in [(&self.k, kc), (&self.v, vc)] {
            if let Some(b) = buf.as_ref().and_then(|t| t.as_candle()) {
                b.slice_set(&new.contiguous()?, 2, self.len)?;
            }
        }
        self.len = need;
        self.in_place = true;
        Ok(Some((self.view(&self.k)?, self.view(&self.v)?)))
    }

    /// Keep only the first `len` rows (a conversation rolled back to a
    /// shared prefix); no-op when `len` is not shorter. Tensors returned
    /// earlier keep their contents: a host buffer is replaced by a copy of
    /// the kept rows, so later appends never write under an old view.
    pub fn truncate(&mut self, dev: &Device, len: usize) -> Result<()> {
        if len >= self.len {
            return Ok(());
        }
        if len == 0 {
            self.reset();
            return Ok(());
        }
        let keep = |t: &Option<Tensor>, in_place: bool| -> Result<Option<Tensor>> {
            let Some(t) = t else { return Ok(None) };
            Ok(Some(match (in_place, t.as_candle()) {
                (true, Some(c)) => {
                    let d = c.dims();
                    let rows = len.next_power_of_two().max(KV_MIN_ROWS);
                    let buf = candle_core::Tensor::zeros(
                        (d[0], d[1], rows, d[3]),
                        c.dtype(),
                        &candle_core::Device::Cpu,
                    )?;
                    buf.slice_set(&c.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
                    Tensor::from_candle(buf)?
                }
                // Concatenated tensors, on any device.
                _ => dev.narrow(t, 2, 0, len)?,
            }))
        };
        self.k = keep(&self.k, self.in_place)?;
        self.v = keep(&self.v, self.in_place)?;
        self.len = len;
        Ok(())
    }

    /// Forget everything (new turn / cancelled epoch).
    pub fn reset(&mut self) {
        self.k = None;
        self.v = None;
        self.len = 0;
        self.in_place = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transposed convolution by its definition: every input scattered
    /// through every tap, `[c_out, t_out]` for one batch item.
    fn scatter(
        x: &[f64],
        w: &[f64],
        (c_in, c_out, k, l): (usize, usize, usize, usize),
        cfg: &ConvTransposeCfg,
    ) -> Vec<f64> {
        let t_out = (l - 1) * cfg.stride + k + cfg.output_padding - 2 * cfg.padding;
        let mut y = vec![0f64; c_out * t_out];
        for c in 0..c_in {
            for m in 0..l {
                for o in 0..c_out {
                    for j in 0..k {
                        let n = (m * cfg.stride + j) as isize - cfg.padding as isize;
                        if (0..t_out as isize).contains(&n) {
                            y[o * t_out + n as usize] += w[(c * c_out + o) * k + j] * x[c * l + m];
                        }
                    }
                }
            }
        }
        y
    }

    /// Every small (stride, kernel, padding, output padding) with a
    /// nonempty output: the ordinary convolution over the rearranged
    /// weights, its phases interleaved, is the transposed convolution
    /// (exactly: small integers, sums exact in f64), over whole steps of
    /// every phase that cover the output.
    #[test]
    fn polyphase_form_is_the_transposed_convolution() {
        let (c_in, c_out, l) = (2, 3, 6);
        let x: Vec<f64> = (0..c_in * l).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
        let mut checked = 0;
        for s in 1..=5 {
            for k in 1..=9 {
                for p in 0..=6 {
                    for op in 0..s {
                        let cfg = ConvTransposeCfg {
                            stride: s,
                            padding: p,
                            output_padding: op,
                            ..ConvTransposeCfg::default()
                        };
                        let Some(t_out) = ((l - 1) * s + k + op).checked_sub(2 * p) else {
                            continue;
                        };
                        if t_out == 0 {
                            continue;
                        }
                        let w: Vec<f32> = (0..c_in * c_out * k)
                            .map(|i| ((i * 5) % 13) as f32 - 6.0)
                            .collect();
                        let w64: Vec<f64> = w.iter().map(|&v| v as f64).collect();
                        let want = scatter(&x, &w64, (c_in, c_out, k, l), &cfg);
                        let poly = cfg.polyphase(c_in, c_out, k).expect("a form");
                        let wp = poly.rearrange(&w).expect("size");
                        let taps = poly.taps;
                        let pad = poly.padding;
                        let steps = (l + 2 * pad).checked_sub(taps - 1).expect("steps");
                        assert!(steps * s >= t_out, "s{s} k{k} p{p} op{op}: short");
                        for o in 0..c_out {
                            for (n, &v) in want[o * t_out..][..t_out].iter().enumerate() {
                                let (q, r) = (n / s, n % s);
                                let mut got = 0f64;
                                for c in 0..c_in {
                                    for t in 0..taps {
                                        let m = (q + t) as isize - pad as isize;
                                        if (0..l as isize).contains(&m) {
                                            got += wp[((r * c_out + o) * c_in + c) * taps + t]
                                                as f64
                                                * x[c * l + m as usize];
                                        }
                                    }
                                }
                                assert_eq!(got, v, "s{s} k{k} p{p} op{op}: o{o} n{n}");
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 400, "{checked}");
        let cfg = ConvTransposeCfg {
            dilation: 2,
            ..ConvTransposeCfg::default()
        };
        assert!(cfg.polyphase(2, 3, 4).is_none());
        let poly = ConvTransposeCfg::default()
            .polyphase(2, 3, 4)
            .expect("form");
        assert!(poly.rearrange(&[0.0; 5]).is_none());
    }
}
