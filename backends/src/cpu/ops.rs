//! The CPU backend's other ops on candle: unary / binary (with this
//! crate's element-wise loops where they apply), reductions, padding,
//! attention, quantized row lookup.

use super::tensors::{cdev, check_dim, dense, index_tensor, with_f32_slice};
use super::{act, ew};
use candle_core::quantized::QTensor;
use candle_core::{DType as CDType, Tensor as CTensor};
use edgeflow_runtime::{BinaryOp, PadMode, ReduceOp, UnaryOp};
use edgeflow_runtime::{Error, Result};

/// [`unary`] on [`ew`] for the ops of vocoders and flows.
pub(crate) fn unary_own(u: UnaryOp, x: &CTensor) -> Result<Option<CTensor>> {
    if !matches!(
        u,
        UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Exp
            | UnaryOp::Neg
            | UnaryOp::Relu
            | UnaryOp::GeluErf
            | UnaryOp::Gelu
    ) {
        return Ok(None);
    }
    let x = &dense(x)?;
    match u {
        UnaryOp::Relu => ew::map(x, |v| v.max(0.0)),
        UnaryOp::GeluErf => Ok(with_f32_slice(x, act::gelu_erf)?
            .flatten()
            .map(|y| CTensor::from_vec(y, x.shape(), &cdev()))
            .transpose()?),
        // Vectorized, within 1e-6 relative of libm's (crate::cpu::math).
        UnaryOp::Tanh => ew::map_vec(x, crate::cpu::math::tanh),
        UnaryOp::Sigmoid => ew::map_vec(x, crate::cpu::math::sigmoid),
        UnaryOp::Gelu => ew::map_vec(x, crate::cpu::math::gelu_tanh),
        UnaryOp::Exp => ew::map(x, f32::exp),
        UnaryOp::Neg => ew::map(x, |v| -v),
        _ => Ok(None),
    }
}

/// [`binary`] on [`ew`] for same-shape operands.
pub(crate) fn binary_own(b: BinaryOp, x: &CTensor, y: &CTensor) -> Result<Option<CTensor>> {
    if x.dims() != y.dims() {
        return binary_rows(b, x, y);
    }
    let (x, y) = (&dense(x)?, &dense(y)?);
    match b {
        BinaryOp::Add => ew::zip(x, y, |a, b| a + b),
        BinaryOp::Sub => ew::zip(x, y, |a, b| a - b),
        BinaryOp::Mul => ew::zip(x, y, |a, b| a * b),
        BinaryOp::Div => ew::zip(x, y, |a, b| a / b),
        _ => Ok(None),
    }
}

/// Fewest elements of a row [`binary_rows`] takes.
const ROW_MIN: usize = 16;

/// Whether `row` broadcasts to `full` as one row repeated: its dims are
/// `full`'s trailing dims, after any number of leading ones.
fn is_row_of(row: &[usize], full: &[usize]) -> bool {
    // Short rows (a scalar) would run the loop a few elements at a time.
    if row.iter().product::<usize>() < ROW_MIN {
        return false;
    }
    let lead = row.iter().take_while(|&&d| d == 1).count();
    let tail = &row[lead..];
    tail.len() <= full.len() && full.ends_with(tail) && row.len() <= full.len()
}

/// [`binary_own`] where one operand is a row the other repeats (a
/// per-channel scale or shift): the same per-element arithmetic as
/// candle's broadcast, on this crate's loops. None for other broadcasts.
fn binary_rows(b: BinaryOp, x: &CTensor, y: &CTensor) -> Result<Option<CTensor>> {
    let f: fn(f32, f32) -> f32 = match b {
        BinaryOp::Add => |a, b| a + b,
        BinaryOp::Sub => |a, b| a - b,
        BinaryOp::Mul => |a, b| a * b,
        BinaryOp::Div => |a, b| a / b,
        _ => return Ok(None),
    };
    if is_row_of(y.dims(), x.dims()) {
        ew::zip_rows(&dense(x)?, &dense(y)?, f)
    } else if is_row_of(x.dims(), y.dims()) {
        ew::zip_rows(&dense(y)?, &dense(x)?, |v, u| f(u, v))
    } else {
        Ok(None)
    }
}

pub(crate) fn unary(u: UnaryOp, x: &CTensor) -> Result<CTensor> {
    Ok(match u {
        UnaryOp::Neg => x.neg()?,
        UnaryOp::Abs => x.abs()?,
        UnaryOp::Exp => x.exp()?,
        UnaryOp::Log => x.log()?,
        UnaryOp::Sqrt => x.sqrt()?,
        UnaryOp::Sqr => x.sqr()?,
        UnaryOp::Recip => x.recip()?,
        UnaryOp::Sin => x.sin()?,
        UnaryOp::Cos => x.cos()?,
        UnaryOp::Tanh => x.tanh()?,
        UnaryOp::Sigmoid => match with_f32_slice(x, act::sigmoid)?.flatten() {
            Some(y) => CTensor::from_vec(y, x.shape(), &cdev())?,
            None => candle_nn::ops::sigmoid(x)?,
        },
        UnaryOp::Relu => x.relu()?,
        UnaryOp::Gelu => x.gelu()?,
        UnaryOp::GeluErf => match with_f32_slice(x, act::gelu_erf)?.flatten() {
            Some(y) => CTensor::from_vec(y, x.shape(), &cdev())?,
            None => x.gelu_erf()?,
        },
        // A view (the gate half of a fused gate/up product) is made dense
        // first, so every layout takes the same vector code: a prefill's
        // rows equal decode's bit for bit.
        UnaryOp::Silu => match with_f32_slice(&dense(x)?, act::silu)?.flatten() {
            Some(y) => CTensor::from_vec(y, x.shape(), &cdev())?,
            None => x.silu()?,
        },
        // log(1 + e^x) = relu(x) + log(1 + e^-|x|): no overflow for large |x|.
        UnaryOp::Softplus => (x.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?)?,
    })
}

/// `silu(gate) * up` ([`edgeflow_runtime::Op::SwiGlu`]): `up` None takes
/// gate then up stacked on `x`'s last dim. One pass on AVX2 + FMA
/// ([`act::swiglu`]); elsewhere the composition the runtime would make
/// (narrow, silu, multiply), with the same values either way.
pub(crate) fn swiglu(x: &CTensor, up: Option<&CTensor>) -> Result<CTensor> {
    let dims = x.dims().to_vec();
    let Some(&w) = dims.last() else {
        return Err(Error::bad_input(
            "swiglu",
            "a scalar has no last dim to gate",
        ));
    };
    let f = match up {
        Some(u) if u.dims() != dims.as_slice() => {
            return Err(Error::bad_input(
                "swiglu",
                format!("gate {:?} and up {:?} must have one shape", dims, u.dims()),
            ))
        }
        Some(_) => w,
        None if !w.is_multiple_of(2) => {
            return Err(Error::bad_input(
                "swiglu",
                format!("gate and up stacked on the last dim need an even last dim, got {dims:?}"),
            ))
        }
        None => w / 2,
    };
    let mut out_dims = dims.clone();
    if let Some(l) = out_dims.last_mut() {
        *l = f;
    }
    let rows = x.elem_count() / w.max(1);
    if x.dtype() == CDType::F32 && up.is_none_or(|u| u.dtype() == CDType::F32) {
        let xd = dense(x)?;
        let ud = up.map(dense).transpose()?;
        let y = with_f32_slice(&xd, |xs| match &ud {
            Some(u) => with_f32_slice(u, |us| act::swiglu(xs, Some(us), rows, f)),
            None => Ok(Some(act::swiglu(xs, None, rows, f))),
        })?;
        if let Some(y) = y.transpose()?.flatten().flatten() {
            return Ok(CTensor::from_vec(y, out_dims, &cdev())?);
        }
    }
    let last = dims.len() - 1;
    let (g, u) = match up {
        Some(u) => (x.clone(), u.clone()),
        None => (x.narrow(last, 0, f)?, x.narrow(last, f, f)?),
    };
    binary(BinaryOp::Mul, &unary(UnaryOp::Silu, &g)?, &u)
}

pub(crate) fn binary(b: BinaryOp, x: &CTensor, y: &CTensor) -> Result<CTensor> {
    let y = if y.dtype() != x.dtype() {
        y.to_dtype(x.dtype())?
    } else {
        y.clone()
    };
    Ok(match b {
        BinaryOp::Add => x.broadcast_add(&y)?,
        BinaryOp::Sub => x.broadcast_sub(&y)?,
        BinaryOp::Mul => x.broadcast_mul(&y)?,
        BinaryOp::Div => x.broadcast_div(&y)?,
        BinaryOp::Max => x.broadcast_maximum(&y)?,
        BinaryOp::Min => x.broadcast_minimum(&y)?,
        BinaryOp::Pow => x.broadcast_pow(&y)?,
    })
}

pub(crate) fn reduce(r: ReduceOp, x: &CTensor, dim: usize, keepdim: bool) -> Result<CTensor> {
    check_dim("reduce", dim, x.rank())?;
    let y = match r {
        ReduceOp::Sum => x.sum_keepdim(dim)?,
        ReduceOp::Mean => x.mean_keepdim(dim)?,
        ReduceOp::Max => x.max_keepdim(dim)?,
        ReduceOp::Min => x.min_keepdim(dim)?,
        ReduceOp::ArgMax => x.argmax_keepdim(dim)?,
    };
    Ok(if keepdim { y } else { y.squeeze(dim)? })
}

pub(crate) fn pad(
    x: &CTensor,
    dim: usize,
    before: usize,
    after: usize,
    mode: PadMode,
) -> Result<CTensor> {
    check_dim("pad", dim, x.rank())?;
    Ok(match mode {
        PadMode::Zeros => x.pad_with_zeros(dim, before, after)?,
        PadMode::Replicate => x.pad_with_same(dim, before, after)?,
        PadMode::Reflect => {
            let n = x.dim(dim)?;
            if before >= n || after >= n {
                return Err(Error::bad_input(
                    "pad",
                    format!(
                        "reflect padding ({before}, {after}) needs a dim longer than both, got {n}"
                    ),
                ));
            }
            // torch.nn.functional.pad(mode="reflect"): the edge is not repeated.
            let idx: Vec<u32> = (0..before)
                .map(|i| (before - i) as u32)
                .chain((0..n).map(|i| i as u32))
                .chain((0..after).map(|i| (n - 2 - i) as u32))
                .collect();
            let len = idx.len();
            let idx = CTensor::from_vec(idx, len, &cdev())?;
            x.index_select(&idx, dim)?
        }
    })
}

/// Scaled dot-product attention with grouped-query heads, an additive mask
/// and an end-aligned causal mask, computed as softmax(q k^T * scale + m) v.
pub(crate) fn attention(
    q: &CTensor,
    k: &CTensor,
    v: &CTensor,
    mask: Option<&CTensor>,
    scale: f64,
    causal: bool,
) -> Result<CTensor> {
    let (b, h, s, d) = q.dims4()?;
    let (kb, hk, t, kd) = k.dims4()?;
    let (vb, vh, vt, dv) = v.dims4()?;
    if kb != b || vb != b || kd != d || vh != hk || vt != t || hk == 0 || h % hk != 0 {
        return Err(Error::bad_input(
            "attention",
            format!(
                "q {:?}, k {:?}, v {:?}: need q[b,h,s,d], k/v[b,hk,t,d] with hk dividing h",
                q.dims(),
                k.dims(),
                v.dims()
            ),
        ));
    }
    if causal && s > t {
        return Err(Error::bad_input(
            "attention",
            format!("causal attention needs at least as many keys ({t}) as queries ({s})"),
        ));
    }
    // f32 on the host (the common case): the fused, blocked kernel.
    if let Some(y) = crate::cpu::attn::attention(q, k, v, mask, scale, causal)? {
        return Ok(y);
    }
    let rep = h / hk;
    let k = k.to_dtype(q.dtype())?;
    let v = v.to_dtype(q.dtype())?;
    // Query head i uses kv head i / rep: fold the rep query heads of a group
    // into the row dim so keys and values are never copied.
    let qg = q.contiguous()?.reshape((b, hk, rep * s, d))?;
    let scores = (qg.matmul(&k.t()?)? * scale)?.reshape((b, h, s, t))?;
    let scores = match mask {
        Some(m) => scores.broadcast_add(&m.to_dtype(scores.dtype())?)?,
        None => scores,
    };
    let scores = if causal {
        let off = t - s;
        let m: Vec<f32> = (0..s)
            .flat_map(|i| (0..t).map(move |j| if j > i + off { f32::NEG_INFINITY } else { 0.0 }))
            .collect();
        let m = CTensor::from_vec(m, (s, t), &cdev())?.to_dtype(scores.dtype())?;
        scores.broadcast_add(&m)?
    } else {
        scores
    };
    let p = candle_nn::ops::softmax_last_dim(&scores.contiguous()?)?;
    let p = p.reshape((b, hk, rep * s, t))?;
    Ok(p.matmul(&v)?.reshape((b, h, s, dv))?)
}

/// Rows `idx` of a quantized `[n, k]` matrix, dequantized, without
/// dequantizing the rest (embedding lookup in a GGUF model).
pub(crate) fn quantized_rows(q: &QTensor, idx: &CTensor) -> Result<CTensor> {
    let (n, k) = q.shape().dims2()?;
    let dt = q.dtype();
    let row_bytes = k / dt.block_size() * dt.type_size();
    let data = q.data()?;
    let ids = index_tensor(idx)?.to_dtype(CDType::I64)?.to_vec1::<i64>()?;
    let mut raw = Vec::with_capacity(ids.len() * row_bytes);
    for &i in &ids {
        if i < 0 || i as usize >= n {
            return Err(Error::bad_input(
                "index_select",
                format!("index {i} out of range for {n} rows"),
            ));
        }
        let i = i as usize;
        raw.extend_from_slice(&data[i * row_bytes..(i + 1) * row_bytes]);
    }
    let sub = candle_core::quantized::ggml_file::qtensor_from_ggml(
        dt,
        &raw,
        vec![ids.len(), k],
        &cdev(),
    )?;
    Ok(sub.dequantize(&cdev())?)
}
