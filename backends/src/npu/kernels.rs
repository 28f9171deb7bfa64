//! The simulator's op set: validation, the int8 kernels (int32 accumulation,
//! fixed-point requantization, 256-entry lookup tables) and the f32
//! reference of each op (through candle) used for calibration and for the
//! shadow error measurement.

use super::quant::{ActivationScheme, Multiplier, QParams, QWeight, QMAX, QMIN};
use edgeflow_runtime::candle_core::{Device as CDevice, Tensor as CTensor};
use edgeflow_runtime::{BinaryOp, Error, Op, Result, UnaryOp};

/// Activation functions the simulator runs through a 256-entry int8 lookup
/// table (what NPU LUT units do): `table[q_in] = quant_out(f(dequant_in(q_in)))`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum LutFn {
    Relu,
    LeakyRelu(f64),
    Sigmoid,
    Tanh,
    Gelu,
    GeluErf,
    Silu,
}

/// An op of the simulator's int8 set, with its attributes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// `x @ w^T + b`, w per-channel int8.
    Linear,
    /// `a @ b`, both per-tensor int8 activations.
    MatMul,
    /// 1-D convolution, w per-channel int8.
    Conv1d {
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    },
    /// 2-D convolution, w per-channel int8.
    Conv2d {
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    },
    /// Broadcast add / sub (rescale to a common scale, add in int32).
    AddSub { sub: bool },
    /// Broadcast multiply.
    Mul,
    /// Lookup-table activation.
    Lut(LutFn),
    /// Softmax: dequantize, compute, requantize to the fixed [0, 1) scale.
    Softmax { dim: usize },
    /// Metadata-only reshape (keeps codes and parameters).
    Reshape { shape: Vec<usize> },
}

impl Kind {
    /// The simulator's view of `op`, or `None` when it is outside the int8 set.
    pub(crate) fn of(op: &Op) -> Option<Kind> {
        Some(match op {
            Op::Linear => Kind::Linear,
            Op::MatMul => Kind::MatMul,
            Op::Conv1d {
                stride,
                padding,
                dilation,
                groups,
            } => Kind::Conv1d {
                stride: *stride,
                padding: *padding,
                dilation: *dilation,
                groups: *groups,
            },
            Op::Conv2d {
                stride,
                padding,
                dilation,
                groups,
            } => Kind::Conv2d {
                stride: *stride,
                padding: *padding,
                dilation: *dilation,
                groups: *groups,
            },
            Op::Binary(BinaryOp::Add) => Kind::AddSub { sub: false },
            Op::Binary(BinaryOp::Sub) => Kind::AddSub { sub: true },
            Op::Binary(BinaryOp::Mul) => Kind::Mul,
            Op::Unary(UnaryOp::Relu) => Kind::Lut(LutFn::Relu),
            Op::Unary(UnaryOp::Sigmoid) => Kind::Lut(LutFn::Sigmoid),
            Op::Unary(UnaryOp::Tanh) => Kind::Lut(LutFn::Tanh),
            Op::Unary(UnaryOp::Gelu) => Kind::Lut(LutFn::Gelu),
            Op::Unary(UnaryOp::GeluErf) => Kind::Lut(LutFn::GeluErf),
            Op::Unary(UnaryOp::Silu) => Kind::Lut(LutFn::Silu),
            Op::LeakyRelu { slope } => Kind::Lut(LutFn::LeakyRelu(*slope)),
            Op::Softmax { dim } => Kind::Softmax { dim: *dim },
            Op::Reshape { shape } => Kind::Reshape {
                shape: shape.clone(),
            },
            _ => return None,
        })
    }

    /// Whether input `i` is a weight (quantized per output channel, part of
    /// the op-site identity) rather than an activation.
    pub(crate) fn is_weight_input(&self, i: usize) -> bool {
        matches!(
            self,
            Kind::Linear | Kind::Conv1d { .. } | Kind::Conv2d { .. }
        ) && i >= 1
    }

    /// Number of activation inputs (they come first).
    pub(crate) fn activation_inputs(&self) -> usize {
        match self {
            Kind::MatMul | Kind::AddSub { .. } | Kind::Mul => 2,
            _ => 1,
        }
    }

    /// Output parameters fixed by the op rather than calibrated.
    pub(crate) fn fixed_output_q(&self, scheme: ActivationScheme) -> Option<QParams> {
        match self {
            // TFLite int8 softmax convention: [0, 1) in 256 steps.
            Kind::Softmax { .. } => Some(match scheme {
                ActivationScheme::Asymmetric => QParams {
                    scale: 1.0 / 256.0,
                    zero_point: QMIN,
                },
                ActivationScheme::Symmetric => QParams {
                    scale: 1.0 / 127.0,
                    zero_point: 0,
                },
            }),
            _ => None,
        }
    }

    /// Validate arity and shapes; return the output dims.
    pub(crate) fn out_dims(&self, name: &'static str, dims: &[&[usize]]) -> Result<Vec<usize>> {
        let bad = |m: String| Error::bad_input(name, m);
        let arity = |lo: usize, hi: usize| -> Result<()> {
            if dims.len() < lo || dims.len() > hi {
                return Err(bad(format!(
                    "expected {lo}..={hi} inputs, got {}",
                    dims.len()
                )));
            }
            Ok(())
        };
        match self {
            Kind::Linear => {
                arity(2, 3)?;
                let (x, w) = (dims[0], dims[1]);
                if x.is_empty() || w.len() != 2 || x[x.len() - 1] != w[1] {
                    return Err(bad(format!("x {x:?} and w {w:?}: need x[..., k], w[n, k]")));
                }
                if dims.len() == 3 && dims[2] != [w[0]] {
                    return Err(bad(format!("bias {:?}: need [{}]", dims[2], w[0])));
                }
                let mut o = x[..x.len() - 1].to_vec();
                o.push(w[0]);
                Ok(o)
            }
            Kind::MatMul => {
                arity(2, 2)?;
                let (a, b) = (dims[0], dims[1]);
                if a.len() < 2 || b.len() < 2 || a[a.len() - 1] != b[b.len() - 2] {
                    return Err(bad(format!(
                        "a {a:?} and b {b:?}: need a[..., m, k], b[..., k, n]"
                    )));
                }
                let batch =
                    broadcast_dims(&a[..a.len() - 2], &b[..b.len() - 2]).ok_or_else(|| {
                        bad(format!("batch dims of {a:?} and {b:?} do not broadcast"))
                    })?;
                let mut o = batch;
                o.push(a[a.len() - 2]);
                o.push(b[b.len() - 1]);
                Ok(o)
            }
            Kind::Conv1d {
                stride,
                padding,
                dilation,
                groups,
            } => {
                arity(2, 3)?;
                let (x, w) = (dims[0], dims[1]);
                conv_check(
                    name,
                    x,
                    w,
                    dims.get(2).copied(),
                    1,
                    *stride,
                    *dilation,
                    *groups,
                )?;
                let l =
                    conv_out_len(x[2], w[2], *stride, *padding, *dilation).ok_or_else(|| {
                        bad(format!(
                            "input length {} too short for kernel {}",
                            x[2], w[2]
                        ))
                    })?;
                Ok(vec![x[0], w[0], l])
            }
            Kind::Conv2d {
                stride,
                padding,
                dilation,
                groups,
            } => {
                arity(2, 3)?;
                let (x, w) = (dims[0], dims[1]);
                conv_check(
                    name,
                    x,
                    w,
                    dims.get(2).copied(),
                    2,
                    *stride,
                    *dilation,
                    *groups,
                )?;
                let h = conv_out_len(x[2], w[2], *stride, *padding, *dilation);
                let wd = conv_out_len(x[3], w[3], *stride, *padding, *dilation);
                match (h, wd) {
                    (Some(h), Some(wd)) => Ok(vec![x[0], w[0], h, wd]),
                    _ => Err(bad(format!("input {x:?} too small for kernel {w:?}"))),
                }
            }
            Kind::AddSub { .. } | Kind::Mul => {
                arity(2, 2)?;
                broadcast_dims(dims[0], dims[1])
                    .ok_or_else(|| bad(format!("{:?} and {:?} do not broadcast", dims[0], dims[1])))
            }
            Kind::Lut(_) => {
                arity(1, 1)?;
                Ok(dims[0].to_vec())
            }
            Kind::Softmax { dim } => {
                arity(1, 1)?;
                if *dim >= dims[0].len() {
                    return Err(bad(format!("dim {dim} out of range for {:?}", dims[0])));
                }
                Ok(dims[0].to_vec())
            }
            Kind::Reshape { shape } => {
                arity(1, 1)?;
                if shape.iter().product::<usize>() != dims[0].iter().product::<usize>() {
                    return Err(bad(format!("cannot reshape {:?} to {shape:?}", dims[0])));
                }
                Ok(shape.clone())
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn conv_check(
    name: &'static str,
    x: &[usize],
    w: &[usize],
    bias: Option<&[usize]>,
    spatial: usize,
    stride: usize,
    dilation: usize,
    groups: usize,
) -> Result<()> {
    let rank = spatial + 2;
    let ok = x.len() == rank
        && w.len() == rank
        && groups >= 1
        && stride >= 1
        && dilation >= 1
        && x[1].is_multiple_of(groups)
        && w[0].is_multiple_of(groups)
        && w[1] * groups == x[1]
        && bias.is_none_or(|b| b == [w[0]]);
    if ok {
        Ok(())
    } else {
        Err(Error::bad_input(
            name,
            format!(
                "x {x:?}, w {w:?}, bias {bias:?}, groups {groups}, stride {stride}, \
                 dilation {dilation}: need x[b, c_in, ...], w[c_out, c_in/groups, ...], bias[c_out]"
            ),
        ))
    }
}

fn conv_out_len(
    l: usize,
    k: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    let span = dilation * (k.max(1) - 1) + 1;
    let padded = l + 2 * padding;
    if padded < span || stride == 0 {
        return None;
    }
    Some((padded - span) / stride + 1)
}

/// NumPy broadcast of two shapes.
pub(crate) fn broadcast_dims(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// For each element of `out` (row-major), its offset in a tensor of dims
/// `src` broadcast to `out`.
fn broadcast_offsets(src: &[usize], out: &[usize]) -> Vec<usize> {
    let n = out.len();
    let mut strides = vec![0usize; n];
    let mut acc = 1;
    for i in (0..src.len()).rev() {
        let oi = i + n - src.len();
        strides[oi] = if src[i] == 1 { 0 } else { acc };
        acc *= src[i];
    }
    let total: usize = out.iter().product();
    let mut offs = Vec::with_capacity(total);
    let mut idx = vec![0usize; n];
    let mut off = 0usize;
    for _ in 0..total {
        offs.push(off);
        for d in (0..n).rev() {
            idx[d] += 1;
            off += strides[d];
            if idx[d] < out[d] {
                break;
            }
            off -= strides[d] * idx[d];
            idx[d] = 0;
        }
    }
    offs
}

/// An int8 activation input: f32 values (quantized with `q` on entry; values
/// already on `q`'s grid pass through exactly).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActIn<'a> {
    pub data: &'a [f32],
    pub dims: &'a [usize],
    pub q: QParams,
}

impl ActIn<'_> {
    fn centered(&self) -> Vec<i32> {
        self.data
            .iter()
            .map(|&x| self.q.quantize_centered(x))
            .collect()
    }
}

#[inline]
fn requant(acc: i64, m: Multiplier, out: QParams) -> f32 {
    let acc = acc.clamp(i32::MIN as i64, i32::MAX as i64) as i32;
    let q = m
        .apply(acc)
        .saturating_add(out.zero_point)
        .clamp(QMIN, QMAX);
    out.dequantize(q)
}

/// int32 bias codes for accumulator scale `sx * sw[c]`.
fn bias_codes(bias: Option<&[f32]>, sx: f32, w: &QWeight) -> Vec<i64> {
    (0..w.channels())
        .map(|c| match bias {
            Some(b) => {
                let s = sx as f64 * w.scales[c] as f64;
                let q = (b[c] as f64 / s).round();
                q.clamp(i32::MIN as f64, i32::MAX as f64) as i64
            }
            None => 0,
        })
        .collect()
}

fn channel_multipliers(sx: f32, w: &QWeight, out: QParams) -> Vec<Multiplier> {
    w.scales
        .iter()
        .map(|&sw| Multiplier::new(sx as f64 * sw as f64 / out.scale as f64))
        .collect()
}

/// Run one op of the int8 set. `acts` are the activation inputs, `weight` and
/// `bias` the (already quantized) weight and f32 bias for Linear / Conv.
/// Returns the dequantized output (every value is on `out_q`'s int8 grid).
pub(crate) fn exec_int8(
    kind: &Kind,
    acts: &[ActIn<'_>],
    weight: Option<&QWeight>,
    bias: Option<&[f32]>,
    out_q: QParams,
    out_dims: &[usize],
) -> Result<Vec<f32>> {
    let missing = || Error::Backend {
        backend: "npu-sim".into(),
        msg: "internal: int8 kernel called without its inputs".into(),
    };
    let x = acts.first().ok_or_else(missing)?;
    let total: usize = out_dims.iter().product();
    match kind {
        Kind::Linear => {
            let w = weight.ok_or_else(missing)?;
            let k = w.per_channel;
            let n = w.channels();
            let xq = x.centered();
            let bq = bias_codes(bias, x.q.scale, w);
            let ms = channel_multipliers(x.q.scale, w, out_q);
            let rows = xq.len().checked_div(k).unwrap_or(0);
            let mut out = Vec::with_capacity(rows * n);
            for r in 0..rows {
                let xr = &xq[r * k..(r + 1) * k];
                for c in 0..n {
                    let wr = &w.data[c * k..(c + 1) * k];
                    let dot: i64 = xr
                        .iter()
                        .zip(wr)
                        .map(|(&a, &b)| (a * b as i32) as i64)
                        .sum();
                    out.push(requant(dot + bq[c], ms[c], out_q));
                }
            }
            Ok(out)
        }
        Kind::MatMul => {
            let y = acts.get(1).ok_or_else(missing)?;
            let (ad, bd) = (x.dims, y.dims);
            let (m, k) = (ad[ad.len() - 2], ad[ad.len() - 1]);
            let n = bd[bd.len() - 1];
            let batch = &out_dims[..out_dims.len() - 2];
            let a_off = broadcast_offsets(&ad[..ad.len() - 2], batch);
            let b_off = broadcast_offsets(&bd[..bd.len() - 2], batch);
            let aq = x.centered();
            let bq = y.centered();
            let mult = Multiplier::new(x.q.scale as f64 * y.q.scale as f64 / out_q.scale as f64);
            let mut out = Vec::with_capacity(total);
            let mut acc = vec![0i64; n];
            for (ao, bo) in a_off.iter().zip(&b_off) {
                let a = &aq[ao * m * k..(ao + 1) * m * k];
                let b = &bq[bo * k * n..(bo + 1) * k * n];
                for i in 0..m {
                    acc.iter_mut().for_each(|v| *v = 0);
                    for kk in 0..k {
                        let av = a[i * k + kk] as i64;
                        let br = &b[kk * n..(kk + 1) * n];
                        for (s, &bv) in acc.iter_mut().zip(br) {
                            *s += av * bv as i64;
                        }
                    }
                    out.extend(acc.iter().map(|&s| requant(s, mult, out_q)));
                }
            }
            Ok(out)
        }
        Kind::Conv1d {
            stride,
            padding,
            dilation,
            groups,
        } => {
            let w = weight.ok_or_else(missing)?;
            let (b, cin, l) = (x.dims[0], x.dims[1], x.dims[2]);
            let (cout, lout) = (out_dims[1], out_dims[2]);
            let cin_g = cin / groups;
            let cout_g = cout / groups;
            let kw = w.dims[2];
            let xq = x.centered();
            let bq = bias_codes(bias, x.q.scale, w);
            let ms = channel_multipliers(x.q.scale, w, out_q);
            let mut out = Vec::with_capacity(total);
            for bi in 0..b {
                for co in 0..cout {
                    let g = co / cout_g;
                    for t in 0..lout {
                        let mut acc = bq[co];
                        for ci in 0..cin_g {
                            let xr = &xq[(bi * cin + g * cin_g + ci) * l..][..l];
                            let wr = &w.data[(co * cin_g + ci) * kw..][..kw];
                            for (kk, &wv) in wr.iter().enumerate() {
                                let pos = t * stride + kk * dilation;
                                if pos >= *padding && pos - padding < l {
                                    acc += (xr[pos - padding] * wv as i32) as i64;
                                }
                            }
                        }
                        out.push(requant(acc, ms[co], out_q));
                    }
                }
            }
            Ok(out)
        }
        Kind::Conv2d {
            stride,
            padding,
            dilation,
            groups,
        } => {
            let w = weight.ok_or_else(missing)?;
            let (b, cin, h, wd) = (x.dims[0], x.dims[1], x.dims[2], x.dims[3]);
            let (cout, ho, wo) = (out_dims[1], out_dims[2], out_dims[3]);
            let cin_g = cin / groups;
            let cout_g = cout / groups;
            let (kh, kw) = (w.dims[2], w.dims[3]);
            let ksz = kh * kw;
            let xq = x.centered();
            let bq = bias_codes(bias, x.q.scale, w);
            let ms = channel_multipliers(x.q.scale, w, out_q);
            let mut out = Vec::with_capacity(total);
            for bi in 0..b {
                for co in 0..cout {
                    let g = co / cout_g;
                    for oy in 0..ho {
                        for ox in 0..wo {
                            let mut acc = bq[co];
                            for ci in 0..cin_g {
                                let xp = &xq[(bi * cin + g * cin_g + ci) * h * wd..][..h * wd];
                                let wp = &w.data[(co * cin_g + ci) * ksz..][..ksz];
                                for ky in 0..kh {
                                    let py = oy * stride + ky * dilation;
                                    if py < *padding || py - padding >= h {
                                        continue;
                                    }
                                    let row = &xp[(py - padding) * wd..][..wd];
                                    for kx in 0..kw {
                                        let px = ox * stride + kx * dilation;
                                        if px >= *padding && px - padding < wd {
                                            acc += (row[px - padding] * wp[ky * kw + kx] as i32)
                                                as i64;
                                        }
                                    }
                                }
                            }
                            out.push(requant(acc, ms[co], out_q));
                        }
                    }
                }
            }
            Ok(out)
        }
        Kind::AddSub { sub } => {
            let y = acts.get(1).ok_or_else(missing)?;
            // TFLite int8 ADD: rescale both to 2*max(scale) with 20 bits of
            // headroom, add in int32, requantize.
            const LEFT_SHIFT: i32 = 20;
            let twice_max = 2.0 * (x.q.scale.max(y.q.scale)) as f64;
            let m1 = Multiplier::new(x.q.scale as f64 / twice_max);
            let m2 = Multiplier::new(y.q.scale as f64 / twice_max);
            let mo =
                Multiplier::new(twice_max / ((1i64 << LEFT_SHIFT) as f64 * out_q.scale as f64));
            let aq = x.centered();
            let bq = y.centered();
            let ao = broadcast_offsets(x.dims, out_dims);
            let bo = broadcast_offsets(y.dims, out_dims);
            Ok(ao
                .iter()
                .zip(&bo)
                .map(|(&i, &j)| {
                    let a = m1.apply(aq[i] << LEFT_SHIFT);
                    let b = m2.apply(bq[j] << LEFT_SHIFT);
                    let s = if *sub { a - b } else { a + b };
                    requant(s as i64, mo, out_q)
                })
                .collect())
        }
        Kind::Mul => {
            let y = acts.get(1).ok_or_else(missing)?;
            let m = Multiplier::new(x.q.scale as f64 * y.q.scale as f64 / out_q.scale as f64);
            let aq = x.centered();
            let bq = y.centered();
            let ao = broadcast_offsets(x.dims, out_dims);
            let bo = broadcast_offsets(y.dims, out_dims);
            Ok(ao
                .iter()
                .zip(&bo)
                .map(|(&i, &j)| requant((aq[i] * bq[j]) as i64, m, out_q))
                .collect())
        }
        Kind::Lut(f) => {
            let table = build_lut(*f, x.q, out_q)?;
            Ok(x.data
                .iter()
                .map(|&v| out_q.dequantize(table[(x.q.quantize(v) - QMIN) as usize]))
                .collect())
        }
        Kind::Softmax { dim } => {
            let deq: Vec<f32> = x
                .data
                .iter()
                .map(|&v| x.q.dequantize(x.q.quantize(v)))
                .collect();
            let y = exec_f32(&Kind::Softmax { dim: *dim }, &[(&deq, x.dims)], out_dims)?;
            Ok(out_q.fake_quantize(&y))
        }
        Kind::Reshape { .. } => Ok(x.data.to_vec()),
    }
}

/// The 256-entry table of an activation for these input / output parameters.
pub(crate) fn build_lut(f: LutFn, inq: QParams, outq: QParams) -> Result<[i32; 256]> {
    let xs: Vec<f32> = (QMIN..=QMAX).map(|q| inq.dequantize(q)).collect();
    let ys = exec_f32(&Kind::Lut(f), &[(&xs, &[256])], &[256])?;
    let mut table = [0i32; 256];
    for (t, y) in table.iter_mut().zip(ys) {
        *t = outq.quantize(y);
    }
    Ok(table)
}

fn ct(data: &[f32], dims: &[usize]) -> Result<CTensor> {
    Ok(CTensor::from_slice(data, dims, &CDevice::Cpu)?)
}

fn vec_of(t: &CTensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

/// The f32 reference of an op (candle kernels on the host).
pub(crate) fn exec_f32(
    kind: &Kind,
    inputs: &[(&[f32], &[usize])],
    out_dims: &[usize],
) -> Result<Vec<f32>> {
    let t: Vec<CTensor> = inputs
        .iter()
        .map(|(d, s)| ct(d, s))
        .collect::<Result<_>>()?;
    let missing = || Error::Backend {
        backend: "npu-sim".into(),
        msg: "internal: reference kernel called without its inputs".into(),
    };
    let x = t.first().ok_or_else(missing)?;
    let y: CTensor = match kind {
        Kind::Linear => {
            let w = t.get(1).ok_or_else(missing)?;
            let k = w.dim(1)?;
            let rows = x.elem_count() / k.max(1);
            let mut y = x.reshape((rows, k))?.matmul(&w.t()?)?;
            if let Some(b) = t.get(2) {
                y = y.broadcast_add(b)?;
            }
            y
        }
        Kind::MatMul => x.broadcast_matmul(t.get(1).ok_or_else(missing)?)?,
        Kind::Conv1d {
            stride,
            padding,
            dilation,
            groups,
        } => {
            let mut y = x.conv1d(
                t.get(1).ok_or_else(missing)?,
                *padding,
                *stride,
                *dilation,
                *groups,
            )?;
            if let Some(b) = t.get(2) {
                y = y.broadcast_add(&b.reshape((1, b.elem_count(), 1))?)?;
            }
            y
        }
        Kind::Conv2d {
            stride,
            padding,
            dilation,
            groups,
        } => {
            let mut y = x.conv2d(
                t.get(1).ok_or_else(missing)?,
                *padding,
                *stride,
                *dilation,
                *groups,
            )?;
            if let Some(b) = t.get(2) {
                y = y.broadcast_add(&b.reshape((1, b.elem_count(), 1, 1))?)?;
            }
            y
        }
        Kind::AddSub { sub } => {
            let b = t.get(1).ok_or_else(missing)?;
            if *sub {
                x.broadcast_sub(b)?
            } else {
                x.broadcast_add(b)?
            }
        }
        Kind::Mul => x.broadcast_mul(t.get(1).ok_or_else(missing)?)?,
        Kind::Lut(f) => match f {
            LutFn::Relu => x.relu()?,
            LutFn::LeakyRelu(s) => candle_nn::ops::leaky_relu(x, *s)?,
            LutFn::Sigmoid => candle_nn::ops::sigmoid(x)?,
            LutFn::Tanh => x.tanh()?,
            LutFn::Gelu => x.gelu()?,
            LutFn::GeluErf => x.gelu_erf()?,
            LutFn::Silu => x.silu()?,
        },
        Kind::Softmax { dim } => candle_nn::ops::softmax(x, *dim)?,
        Kind::Reshape { .. } => x.clone(),
    };
    let out = vec_of(&y)?;
    if out.len() != out_dims.iter().product::<usize>() {
        return Err(Error::Backend {
            backend: "npu-sim".into(),
            msg: format!(
                "internal: reference output has {} elements, expected dims {out_dims:?}",
                out.len()
            ),
        });
    }
    Ok(out)
}
