//! The plans of the ops with more than one dispatch or a shape of their
//! own: matmul / linear, row-wise ops, convolutions, attention.

use super::kernels;
use super::pipeline::Kernel;
use super::plan::*;
use edgeflow_runtime::Tensor;

pub(super) fn unary_plan(kernel: Kernel, inputs: &[&Tensor], c0: f64, c1: f64) -> Option<Plan> {
    let [x] = inputs else { return None };
    let n = x.elem_count();
    let params = vec![u32::try_from(n).ok()?, f32_bits(c0), f32_bits(c1)];
    Some(Plan::simple(
        x.dims().to_vec(),
        vec![dispatch(kernel, params, vec![Slot::In(0)], groups_for(n))],
    ))
}

pub(super) fn binary_plan(kernel: Kernel, a: &[usize], b: &[usize]) -> Option<Plan> {
    let (out, sa, sb) = broadcast(a, b)?;
    let n: usize = out.iter().product();
    let mut p = vec![n, out.len()];
    p.extend_from_slice(&out);
    p.extend_from_slice(&sa);
    p.extend_from_slice(&sb);
    let d = dispatch(
        kernel,
        u32s(p)?,
        vec![Slot::In(0), Slot::In(1)],
        groups_for(n),
    );
    Some(Plan::simple(out, vec![d]))
}

/// Matmul dispatch (see [`kernels::matmul_src`] for the params): the GEMV
/// kernel for few rows, the register-blocked tiled kernel otherwise.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_dispatch(
    m: usize,
    n: usize,
    k: usize,
    a_rs_cs: (usize, usize),
    b_rs_cs: (usize, usize),
    batch: (&[usize], &[usize], &[usize]),
    operands: [Slot; 3],
) -> Option<Dispatch> {
    let tile = kernels::TILE as usize;
    let (tn, tm) = (n.div_ceil(tile), m.div_ceil(tile));
    let nb: usize = batch.0.iter().product();
    let mut p = vec![
        m,
        n,
        k,
        tn,
        tm,
        nb,
        a_rs_cs.0,
        a_rs_cs.1,
        b_rs_cs.0,
        b_rs_cs.1,
        usize::from(operands[2] != Slot::Unbound),
        batch.0.len(),
    ];
    p.extend_from_slice(batch.0);
    p.extend_from_slice(batch.1);
    p.extend_from_slice(batch.2);
    let (kernel, workgroups) = if m <= kernels::GEMV_MAX_ROWS {
        (Kernel::Gemv, (m as u64) * (n as u64) * (nb as u64))
    } else {
        (Kernel::MatMul, (tn as u64) * (tm as u64) * (nb as u64))
    };
    Some(dispatch(kernel, u32s(p)?, operands.to_vec(), workgroups))
}

pub(super) fn matmul_plan(a: &[usize], b: &[usize]) -> Option<Plan> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
    let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
    if k != k2 {
        return None;
    }
    let (ba, bb) = (&a[..a.len() - 2], &b[..b.len() - 2]);
    let (bdims, mut sa, mut sb) = broadcast(ba, bb)?;
    // Batch strides in elements of whole matrices.
    sa.iter_mut().for_each(|s| *s *= m * k);
    sb.iter_mut().for_each(|s| *s *= k * n);
    let operands = [Slot::In(0), Slot::In(1), Slot::Unbound];
    let d = matmul_dispatch(m, n, k, (k, 1), (n, 1), (&bdims, &sa, &sb), operands)?;
    let mut out = bdims;
    out.extend([m, n]);
    Some(Plan::simple(out, vec![d]))
}

pub(super) fn linear_plan(inputs: &[&Tensor]) -> Option<Plan> {
    if !(2..=3).contains(&inputs.len()) {
        return None;
    }
    let x = inputs[0].dims();
    let &[n, k] = inputs[1].dims() else {
        return None;
    };
    if x.last() != Some(&k) || inputs.get(2).is_some_and(|b| b.elem_count() != n) {
        return None;
    }
    let m: usize = x[..x.len() - 1].iter().product();
    let operands = [Slot::In(0), Slot::In(1), optional(inputs, 2)];
    let d = matmul_dispatch(m, n, k, (k, 1), (1, k), (&[], &[], &[]), operands)?;
    let mut out = x[..x.len() - 1].to_vec();
    out.push(n);
    Some(Plan::simple(out, vec![d]))
}

pub(super) fn row_plan(
    kernel: Kernel,
    x: &[usize],
    extra: Vec<u32>,
    inputs: Vec<Slot>,
) -> Option<Plan> {
    let cols = *x.last()?;
    let rows: usize = x[..x.len() - 1].iter().product();
    if cols == 0 {
        return None;
    }
    let mut params = u32s([rows, cols])?;
    params.extend(extra);
    Some(Plan::simple(
        x.to_vec(),
        vec![dispatch(kernel, params, inputs, rows as u64)],
    ))
}

pub(super) fn conv1d_plan(
    inputs: &[&Tensor],
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
) -> Option<Plan> {
    if !(2..=3).contains(&inputs.len()) || stride == 0 || dilation == 0 || groups == 0 {
        return None;
    }
    let &[b, c_in, l] = inputs[0].dims() else {
        return None;
    };
    let &[c_out, cin_g, k] = inputs[1].dims() else {
        return None;
    };
    if c_in % groups != 0 || c_out % groups != 0 || cin_g != c_in / groups || k == 0 {
        return None;
    }
    if inputs.get(2).is_some_and(|t| t.elem_count() != c_out) {
        return None;
    }
    let span = dilation.checked_mul(k - 1)?.checked_add(1)?;
    let padded = l.checked_add(padding.checked_mul(2)?)?;
    if padded < span {
        return None;
    }
    let l_out = (padded - span) / stride + 1;
    let n = b * c_out * l_out;
    // The kernel computes positions in i32.
    if padded.checked_add(stride.checked_mul(l_out)?)? > i32::MAX as usize {
        return None;
    }
    let bias = optional(inputs, 2);
    let p = u32s([
        n,
        c_in,
        l,
        c_out,
        k,
        l_out,
        stride,
        padding,
        dilation,
        groups,
        usize::from(bias != Slot::Unbound),
    ])?;
    let d = dispatch(
        Kernel::Conv1d,
        p,
        vec![Slot::In(0), Slot::In(1), bias],
        groups_for(n),
    );
    Some(Plan::simple(vec![b, c_out, l_out], vec![d]))
}

/// Scaled dot-product attention as three dispatches: scores = q k^T
/// (query heads grouped over their kv head), masked softmax in place, then
/// probabilities @ v. The scores live in one scratch buffer.
pub(super) fn attention_plan(inputs: &[&Tensor], scale: f64, causal: bool) -> Option<Plan> {
    if !(3..=4).contains(&inputs.len()) {
        return None;
    }
    let &[b, h, s, d] = inputs[0].dims() else {
        return None;
    };
    let &[kb, hk, t, kd] = inputs[1].dims() else {
        return None;
    };
    let &[vb, vh, vt, dv] = inputs[2].dims() else {
        return None;
    };
    if kb != b || vb != b || kd != d || vh != hk || vt != t || hk == 0 || h % hk != 0 {
        return None;
    }
    if causal && s > t {
        return None;
    }
    let rep = h / hk;
    // Mask strides in the [b, h, s, t] index space.
    let (has_mask, ms) = match inputs.get(3) {
        Some(m) => {
            let (out, ms, _) = broadcast(m.dims(), &[b, h, s, t])?;
            if out != [b, h, s, t] {
                return None;
            }
            (1, ms)
        }
        None => (0, vec![0; 4]),
    };
    let rows = b * h * s;
    let bdims = [b, hk, rep];
    let qk = matmul_dispatch(
        s,
        t,
        d,
        (d, 1),
        (1, d),
        (
            &bdims,
            &[h * s * d, rep * s * d, s * d],
            &[hk * t * d, t * d, 0],
        ),
        [Slot::In(0), Slot::In(1), Slot::Unbound],
    )?;
    let qk = Dispatch {
        out: Slot::Tmp(0),
        ..qk
    };
    let mut p = u32s([rows, t])?;
    p.push(f32_bits(scale));
    p.extend(u32s([
        usize::from(causal),
        s,
        t.saturating_sub(s),
        has_mask,
        h,
        ms[0],
        ms[1],
        ms[2],
        ms[3],
    ])?);
    let mask = if has_mask == 1 {
        Slot::In(3)
    } else {
        Slot::Unbound
    };
    let sm = Dispatch {
        kernel: Kernel::AttnSoftmax,
        params: p,
        inputs: vec![mask],
        out: Slot::Tmp(0),
        workgroups: rows as u64,
    };
    let pv = matmul_dispatch(
        s,
        dv,
        t,
        (t, 1),
        (dv, 1),
        (
            &bdims,
            &[h * s * t, rep * s * t, s * t],
            &[hk * t * dv, t * dv, 0],
        ),
        [Slot::Tmp(0), Slot::In(2), Slot::Unbound],
    )?;
    Some(Plan::Compute {
        dims: vec![b, h, s, dv],
        tmp: vec![rows * t],
        dispatches: vec![qk, sm, pv],
    })
}

pub(super) fn conv_transpose1d_plan(
    inputs: &[&Tensor],
    stride: usize,
    padding: usize,
    output_padding: usize,
    dilation: usize,
    groups: usize,
) -> Option<Plan> {
    if !(2..=3).contains(&inputs.len()) || stride == 0 || dilation == 0 || groups == 0 {
        return None;
    }
    let &[b, c_in, l] = inputs[0].dims() else {
        return None;
    };
    let &[wc_in, cout_g, k] = inputs[1].dims() else {
        return None;
    };
    if wc_in != c_in
        || c_in % groups != 0
        || k == 0
        || l == 0
        || output_padding >= stride.max(dilation)
    {
        return None;
    }
    let c_out = cout_g * groups;
    if inputs.get(2).is_some_and(|t| t.elem_count() != c_out) {
        return None;
    }
    let full = (l - 1)
        .checked_mul(stride)?
        .checked_add(dilation.checked_mul(k - 1)?)?
        .checked_add(output_padding)?
        .checked_add(1)?;
    let l_out = full.checked_sub(padding.checked_mul(2)?)?;
    if l_out == 0 || full.checked_add(padding)? > i32::MAX as usize {
        return None;
    }
    let n = b * c_out * l_out;
    let bias = optional(inputs, 2);
    let p = u32s([
        n,
        c_in,
        l,
        c_out,
        k,
        l_out,
        stride,
        padding,
        dilation,
        groups,
        usize::from(bias != Slot::Unbound),
    ])?;
    let d = dispatch(
        Kernel::ConvTranspose1d,
        p,
        vec![Slot::In(0), Slot::In(1), bias],
        groups_for(n),
    );
    Some(Plan::simple(vec![b, c_out, l_out], vec![d]))
}

pub(super) fn conv2d_plan(
    inputs: &[&Tensor],
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
) -> Option<Plan> {
    if !(2..=3).contains(&inputs.len()) || stride == 0 || dilation == 0 || groups == 0 {
        return None;
    }
    let &[b, c_in, h, w] = inputs[0].dims() else {
        return None;
    };
    let &[c_out, cin_g, kh, kw] = inputs[1].dims() else {
        return None;
    };
    if c_in % groups != 0 || c_out % groups != 0 || cin_g != c_in / groups || kh == 0 || kw == 0 {
        return None;
    }
    if inputs.get(2).is_some_and(|t| t.elem_count() != c_out) {
        return None;
    }
    let out_len = |len: usize, k: usize| -> Option<usize> {
        let span = dilation.checked_mul(k - 1)?.checked_add(1)?;
        let padded = len.checked_add(padding.checked_mul(2)?)?;
        if padded < span || padded > i32::MAX as usize / 2 {
            return None;
        }
        Some((padded - span) / stride + 1)
    };
    let (oh, ow) = (out_len(h, kh)?, out_len(w, kw)?);
    let n = b * c_out * oh * ow;
    let bias = optional(inputs, 2);
    let p = u32s([
        n,
        c_in,
        h,
        w,
        c_out,
        kh,
        kw,
        oh,
        ow,
        stride,
        padding,
        dilation,
        groups,
        usize::from(bias != Slot::Unbound),
    ])?;
    let d = dispatch(
        Kernel::Conv2d,
        p,
        vec![Slot::In(0), Slot::In(1), bias],
        groups_for(n),
    );
    Some(Plan::simple(vec![b, c_out, oh, ow], vec![d]))
}
