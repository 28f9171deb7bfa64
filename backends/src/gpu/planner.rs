//! Choosing the plan of each op ([`GpuBackend::plan`]): which ops, dtypes
//! and shapes run on the GPU, and with which dispatches.

use super::op_plans::*;
use super::pipeline::Kernel;
use super::plan::*;
use super::GpuBackend;
use edgeflow_runtime::{DType, Op, PadMode, ReduceOp, Tensor};

impl GpuBackend {
    /// How `op` runs here, or `None` when it does not (the dispatcher falls back).
    pub(super) fn plan(&self, op: &Op, inputs: &[&Tensor]) -> Option<Plan> {
        // Index inputs (input 1) are checked by their op's own plan.
        let is_index =
            |i: usize| i == 1 && matches!(op, Op::IndexSelect { .. } | Op::Gather { .. });
        if !inputs
            .iter()
            .enumerate()
            .all(|(i, t)| is_index(i) || self.usable(t))
        {
            return None;
        }
        let dims = |i: usize| inputs.get(i).map(|t| t.dims());
        let plan = match op {
            Op::Unary(u) => unary_plan(Kernel::Unary(*u), inputs, 0.0, 0.0)?,
            Op::Affine { mul, add } => unary_plan(Kernel::Affine, inputs, *mul, *add)?,
            Op::LeakyRelu { slope } => unary_plan(Kernel::LeakyRelu, inputs, *slope, 0.0)?,
            Op::Binary(b) => {
                let [a, bb] = inputs else { return None };
                binary_plan(Kernel::Binary(*b), a.dims(), bb.dims())?
            }
            Op::Snake => {
                let [x, alpha] = inputs else { return None };
                let &[_, c, _] = x.dims() else { return None };
                if alpha.elem_count() != c {
                    return None;
                }
                binary_plan(Kernel::Snake, x.dims(), &[c, 1])?
            }
            Op::MatMul => {
                let [a, b] = inputs else { return None };
                matmul_plan(a.dims(), b.dims())?
            }
            Op::Linear => linear_plan(inputs)?,
            Op::Softmax { dim } => {
                let [x] = inputs else { return None };
                let xd = x.dims();
                if *dim >= xd.len() || xd[*dim] == 0 {
                    return None;
                }
                let inner: usize = xd[dim + 1..].iter().product();
                let rows = x.elem_count() / xd[*dim];
                let p = u32s([rows, xd[*dim], inner])?;
                let d = dispatch(Kernel::Softmax, p, vec![Slot::In(0)], rows as u64);
                Plan::simple(xd.to_vec(), vec![d])
            }
            Op::Cumsum { dim } => {
                let [x] = inputs else { return None };
                let xd = x.dims();
                if *dim >= xd.len() || xd[*dim] == 0 {
                    return None;
                }
                let inner: usize = xd[dim + 1..].iter().product();
                let lines = x.elem_count() / xd[*dim];
                let p = u32s([lines, xd[*dim], inner])?;
                let d = dispatch(Kernel::Cumsum, p, vec![Slot::In(0)], groups_for(lines));
                Plan::simple(xd.to_vec(), vec![d])
            }
            Op::LayerNorm { eps } => {
                let x = dims(0)?;
                let d = *x.last()?;
                let ok = |i: usize| inputs.get(i).is_none_or(|t| t.elem_count() == d);
                if !(2..=3).contains(&inputs.len()) || !ok(1) || !ok(2) {
                    return None;
                }
                let has_beta = u32::from(inputs.len() == 3);
                row_plan(
                    Kernel::LayerNorm,
                    x,
                    vec![f32_bits(*eps), has_beta],
                    vec![Slot::In(0), Slot::In(1), optional(inputs, 2)],
                )?
            }
            Op::RmsNorm { eps } => {
                let x = dims(0)?;
                let d = *x.last()?;
                if inputs.len() != 2 || inputs[1].elem_count() != d {
                    return None;
                }
                row_plan(
                    Kernel::RmsNorm,
                    x,
                    vec![f32_bits(*eps)],
                    vec![Slot::In(0), Slot::In(1)],
                )?
            }
            Op::Conv1d {
                stride,
                padding,
                dilation,
                groups,
            } => conv1d_plan(inputs, *stride, *padding, *dilation, *groups)?,
            Op::Reshape { shape } => {
                if inputs.len() != 1 || shape.iter().product::<usize>() != inputs[0].elem_count() {
                    return None;
                }
                Plan::Alias(shape.clone())
            }
            Op::Cast { dtype: DType::F32 } if inputs.len() == 1 => {
                Plan::Alias(inputs[0].dims().to_vec())
            }
            Op::Permute { dims: perm } => {
                let x = dims(0)?;
                if inputs.len() != 1 || perm.len() != x.len() {
                    return None;
                }
                let mut seen = vec![false; x.len()];
                for &d in perm {
                    if d >= x.len() || std::mem::replace(&mut seen[d], true) {
                        return None;
                    }
                }
                let s = strides(x);
                let out: Vec<usize> = perm.iter().map(|&d| x[d]).collect();
                let istr: Vec<usize> = perm.iter().map(|&d| s[d]).collect();
                let d = copy_dispatch(0, &out, 0, &istr, 0, &strides(&out))?;
                Plan::simple(out, vec![d])
            }
            Op::Narrow { dim, start, len } => {
                let x = dims(0)?;
                if inputs.len() != 1 || *dim >= x.len() || start.checked_add(*len)? > x[*dim] {
                    return None;
                }
                let s = strides(x);
                let mut out = x.to_vec();
                out[*dim] = *len;
                let d = copy_dispatch(0, &out, start * s[*dim], &s, 0, &strides(&out))?;
                Plan::simple(out, vec![d])
            }
            Op::Concat { dim } => {
                let first = dims(0)?;
                if *dim >= first.len() {
                    return None;
                }
                let mut out = first.to_vec();
                out[*dim] = 0;
                for t in inputs {
                    let d = t.dims();
                    if d.len() != first.len() || (0..d.len()).any(|i| i != *dim && d[i] != first[i])
                    {
                        return None;
                    }
                    out[*dim] += d[*dim];
                }
                let ostr = strides(&out);
                let mut at = 0;
                let mut ds = Vec::with_capacity(inputs.len());
                for (i, t) in inputs.iter().enumerate() {
                    let d = t.dims();
                    if t.elem_count() > 0 {
                        ds.push(copy_dispatch(i, d, 0, &strides(d), at * ostr[*dim], &ostr)?);
                    }
                    at += d[*dim];
                }
                Plan::simple(out, ds)
            }
            Op::Pad {
                dim,
                before,
                after,
                mode: PadMode::Zeros,
            } => {
                let x = dims(0)?;
                if inputs.len() != 1 || *dim >= x.len() {
                    return None;
                }
                let mut out = x.to_vec();
                out[*dim] = x[*dim].checked_add(*before)?.checked_add(*after)?;
                let ostr = strides(&out);
                let d = copy_dispatch(0, x, 0, &strides(x), before * ostr[*dim], &ostr)?;
                Plan::simple(out, vec![d])
            }
            Op::Pad {
                dim,
                before,
                after,
                mode,
            } => {
                let [x] = inputs else { return None };
                let xd = x.dims();
                let n = *xd.get(*dim)?;
                let code = match mode {
                    PadMode::Reflect if *before < n && *after < n => 0,
                    PadMode::Replicate if n > 0 => 1,
                    _ => return None,
                };
                let inner: usize = xd[dim + 1..].iter().product();
                let mut out = xd.to_vec();
                out[*dim] = n.checked_add(*before)?.checked_add(*after)?;
                let total: usize = out.iter().product();
                let p = u32s([total, out[*dim], n, inner, *before, code])?;
                let d = dispatch(Kernel::Pad, p, vec![Slot::In(0)], groups_for(total));
                Plan::simple(out, vec![d])
            }
            Op::Gather { dim } => {
                let [x, idx] = inputs else { return None };
                let (xd, id) = (x.dims(), idx.dims());
                if *dim >= xd.len()
                    || id.len() != xd.len()
                    || (0..xd.len()).any(|d| d != *dim && id[d] != xd[d])
                {
                    return None;
                }
                if host_indices(idx)?.iter().any(|&i| i >= xd[*dim]) {
                    return None;
                }
                let n = idx.elem_count();
                let mut p = vec![n, xd.len(), *dim];
                p.extend_from_slice(id);
                p.extend(strides(xd));
                let ins = vec![Slot::In(0), Slot::In(1)];
                let d = dispatch(Kernel::Gather, u32s(p)?, ins, groups_for(n));
                Plan::simple(id.to_vec(), vec![d])
            }
            Op::Attention { scale, causal } => attention_plan(inputs, *scale, *causal)?,
            Op::Rope { interleaved } => {
                let [x, cos, sin] = inputs else { return None };
                let &[_, _, s, d] = x.dims() else { return None };
                if d % 2 != 0 || cos.dims() != [s, d / 2] || sin.dims() != [s, d / 2] {
                    return None;
                }
                let n = x.elem_count();
                let p = u32s([n, s, d, usize::from(*interleaved)])?;
                let ins = vec![Slot::In(0), Slot::In(1), Slot::In(2)];
                let d = dispatch(Kernel::Rope, p, ins, groups_for(n));
                Plan::simple(x.dims().to_vec(), vec![d])
            }
            Op::Reduce { op, dim, keepdim } => {
                let code = match op {
                    ReduceOp::Sum => 0,
                    ReduceOp::Mean => 1,
                    ReduceOp::Max => 2,
                    ReduceOp::Min => 3,
                    ReduceOp::ArgMax => return None,
                };
                let [x] = inputs else { return None };
                let xd = x.dims();
                if *dim >= xd.len() || xd[*dim] == 0 {
                    return None;
                }
                let inner: usize = xd[dim + 1..].iter().product();
                let mut out = xd.to_vec();
                if *keepdim {
                    out[*dim] = 1;
                } else {
                    out.remove(*dim);
                }
                let n: usize = out.iter().product();
                let p = u32s([n, xd[*dim], inner, code])?;
                let d = dispatch(Kernel::Reduce, p, vec![Slot::In(0)], groups_for(n));
                Plan::simple(out, vec![d])
            }
            Op::IndexSelect { dim } => {
                let [x, idx] = inputs else { return None };
                let xd = x.dims();
                if *dim >= xd.len() {
                    return None;
                }
                if idx.rank() != 1 {
                    return None;
                }
                let v = host_indices(idx)?;
                if v.iter().any(|&i| i >= xd[*dim]) {
                    return None;
                }
                let inner: usize = xd[dim + 1..].iter().product();
                let mut out = xd.to_vec();
                out[*dim] = v.len();
                let n: usize = out.iter().product();
                let p = u32s([n, xd[*dim], inner.max(1), v.len()])?;
                let ins = vec![Slot::In(0), Slot::In(1)];
                let d = dispatch(Kernel::IndexSelect, p, ins, groups_for(n));
                Plan::simple(out, vec![d])
            }
            Op::ConvTranspose1d {
                stride,
                padding,
                output_padding,
                dilation,
                groups,
            } => conv_transpose1d_plan(
                inputs,
                *stride,
                *padding,
                *output_padding,
                *dilation,
                *groups,
            )?,
            Op::Conv2d {
                stride,
                padding,
                dilation,
                groups,
            } => conv2d_plan(inputs, *stride, *padding, *dilation, *groups)?,
            _ => return None,
        };
        if let Plan::Compute { dims, tmp, .. } = &plan {
            let max = self.max_elems();
            if dims.iter().product::<usize>() > max || tmp.iter().any(|&n| n > max) {
                return None;
            }
        }
        Some(plan)
    }
}
