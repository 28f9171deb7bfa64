//! The CPU backend's convolutions on the direct kernel ([`super::conv`]):
//! candle tensors in and out, the transposed convolution in polyphase form.

use super::conv;
use super::pack_cache::{packed_weights, PackKind, PlacedConv};
use super::plain::f32_values;
use super::tensors::{cdev, dense, with_f32_slice};
use candle_core::{DType as CDType, Tensor as CTensor};
use edgeflow_runtime::{Result, Tensor};

/// Stride-1, single-group f32 `conv1d` on the direct kernel
/// ([`conv`]), optionally with a leaky ReLU on `x`, a residual added
/// and the output written as `phases` interleaved phases
/// ([`Op::Conv1dFused`]); None for shapes it does not take (candle runs
/// those). `placed`: where `w` came from placed weights, which keep its pack.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv1d_direct(
    x: &CTensor,
    w: &CTensor,
    placed: Option<&PlacedConv>,
    bias: Option<&Tensor>,
    padding: usize,
    dilation: usize,
    pre_slope: Option<f64>,
    residual: Option<&CTensor>,
    phases: usize,
) -> Result<Option<CTensor>> {
    let (&[batch, c_in, t_in], &[c_out, wc, k]) = (x.dims(), w.dims()) else {
        return Ok(None);
    };
    let phases = phases.max(1);
    if wc != c_in || x.dtype() != CDType::F32 || !c_out.is_multiple_of(phases) {
        return Ok(None);
    }
    let shape = conv::Conv1dShape {
        batch,
        c_in,
        t_in,
        c_out,
        k,
        padding,
        dilation,
    };
    let Some(t_out) = shape.t_out() else {
        return Ok(None);
    };
    let b = f32_values(bias, "conv1d")?;
    // [batch, c_out, t_out], or interleaved [batch, c_out / phases, t_out * phases].
    let out_dims = [batch, c_out / phases, t_out * phases];
    let r = match residual {
        Some(r) if r.dims() == out_dims && r.dtype() == CDType::F32 => Some(dense(r)?),
        Some(_) => return Ok(None),
        None => None,
    };
    let Some(pw) = packed_weights(placed, w, PackKind::Conv { phases }, |ws| {
        conv::PackedWeights::new(c_out, c_in, k, ws, phases)
    })?
    else {
        return Ok(None);
    };
    let x = dense(x)?;
    let run = |xs: &[f32], rs: Option<&[f32]>| {
        let fused = conv::Fused {
            pre_slope: pre_slope.map(|a| a as f32),
            residual: rs,
            phases,
        };
        conv::conv1d_packed(shape, xs, &pw, b.as_deref(), fused)
    };
    // Each layer: Result<Option<inner>> -> Option<Vec<f32>>.
    let y = with_f32_slice(&x, |xs| -> Result<Option<Vec<f32>>> {
        Ok(match &r {
            Some(r) => with_f32_slice(r, |rs| run(xs, Some(rs)))?.flatten(),
            None => run(xs, None),
        })
    })?;
    let Some(y) = y.transpose()?.flatten() else {
        return Ok(None);
    };
    Ok(Some(CTensor::from_vec(y, &out_dims[..], &cdev())?))
}

/// f32 `conv_transpose1d` (one group, no dilation) on the direct kernel,
/// in its polyphase form: output `n = q * s + r` only sees the inputs the
/// taps `j = (r + p) mod s + i * s` reach, so the `s` phases are one
/// ordinary convolution with `s * c_out` output channels over a few taps
/// ([`edgeflow_runtime::Polyphase`], rearranged once per weight tensor and cached), written
/// interleaved in time by the kernel. candle scatters every input through
/// all `k` taps instead (31 GFLOP/s on the bench shape, against ~140 for
/// the direct kernel on the same machine). None for shapes it does not take.
/// `placed`: where `w` came from placed weights, which keep its pack.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_transpose1d_direct(
    x: &CTensor,
    w: &CTensor,
    placed: Option<&PlacedConv>,
    bias: Option<&Tensor>,
    stride: usize,
    padding: usize,
    output_padding: usize,
    dilation: usize,
    groups: usize,
) -> Result<Option<CTensor>> {
    let (&[batch, c_in, l], &[wc, c_out, k]) = (x.dims(), w.dims()) else {
        return Ok(None);
    };
    if wc != c_in || groups != 1 || dilation != 1 || stride == 0 || x.dtype() != CDType::F32 {
        return Ok(None);
    }
    let Some(t_out) = ((l.saturating_sub(1)) * stride + k + output_padding)
        .checked_sub(2 * padding)
        .filter(|&t| t > 0 && l > 0)
    else {
        return Ok(None);
    };
    let cfg = edgeflow_runtime::ConvTransposeCfg {
        stride,
        padding,
        output_padding,
        dilation,
        groups,
    };
    let Some(poly) = cfg.polyphase(c_in, c_out, k) else {
        return Ok(None);
    };
    let kind = PackKind::Transposed {
        stride,
        padding,
        output_padding,
    };
    let Some(pw) = packed_weights(placed, w, kind, |ws| {
        let wp = poly.rearrange(ws)?;
        conv::PackedWeights::new(stride * c_out, c_in, poly.taps, &wp, stride)
    })?
    else {
        return Ok(None);
    };
    let shape = conv::Conv1dShape {
        batch,
        c_in,
        t_in: l,
        c_out: stride * c_out,
        k: poly.taps,
        padding: poly.padding,
        dilation: 1,
    };
    let Some(q_len) = shape.t_out().filter(|&q| q * stride >= t_out) else {
        return Ok(None);
    };
    // Every phase carries the bias of its output channel.
    let b = f32_values(bias, "conv_transpose1d")?;
    if b.as_ref().is_some_and(|b| b.len() != c_out) {
        return Ok(None);
    }
    let b = b.map(|b| poly.bias(&b));
    let x = dense(x)?;
    let fused = conv::Fused {
        phases: stride,
        ..Default::default()
    };
    let y = with_f32_slice(&x, |xs| {
        conv::conv1d_packed(shape, xs, &pw, b.as_deref(), fused)
    })?
    .flatten();
    let Some(y) = y else {
        return Ok(None);
    };
    let y = CTensor::from_vec(y, (batch, c_out, q_len * stride), &cdev())?;
    // The phases run whole steps; the last may overshoot the output.
    Ok(Some(if q_len * stride == t_out {
        y
    } else {
        y.narrow(2, 0, t_out)?.contiguous()?
    }))
}

/// f32 depthwise `conv1d` (`groups == c_in == c_out`, any stride; one
/// channel with `groups == 1` is one too) on [`conv::depthwise`]; None
/// for other shapes (candle runs those).
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv1d_depthwise(
    x: &CTensor,
    w: &CTensor,
    bias: Option<&Tensor>,
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
) -> Result<Option<CTensor>> {
    let (&[batch, c_in, t_in], &[c_out, 1, k]) = (x.dims(), w.dims()) else {
        return Ok(None);
    };
    if groups != c_in || c_out != c_in || x.dtype() != CDType::F32 {
        return Ok(None);
    }
    let shape = conv::Conv1dShape {
        batch,
        c_in,
        t_in,
        c_out,
        k,
        padding,
        dilation,
    };
    let Some(t_out) = shape.t_out().filter(|_| stride > 0) else {
        return Ok(None);
    };
    let t_out = (t_out - 1) / stride + 1;
    let b = f32_values(bias, "conv1d")?;
    let (x, w) = (dense(x)?, w.contiguous()?);
    let y = with_f32_slice(&x, |xs| {
        with_f32_slice(&w, |ws| {
            conv::depthwise(shape, stride, xs, ws, b.as_deref())
        })
    })?
    .transpose()?
    .flatten()
    .flatten();
    Ok(match y {
        Some(y) => Some(CTensor::from_vec(y, (batch, c_out, t_out), &cdev())?),
        None => None,
    })
}
