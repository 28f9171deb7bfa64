//! How an op runs on the GPU: a [`Plan`] of dispatches, and the shape
//! helpers the plans share.

use super::kernels;
use super::pipeline::Kernel;
use edgeflow_runtime::{DType, Tensor};

/// A buffer a dispatch binds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Slot {
    /// Op input `i`.
    In(usize),
    /// Scratch buffer `i` of the plan.
    Tmp(usize),
    /// The op's output.
    Out,
    /// A 4-byte placeholder for an absent optional input.
    Unbound,
}

/// One kernel launch: its parameters (binding 0), the buffers it reads
/// (bindings 1..), the buffer it writes (the last binding), and how many
/// workgroups it needs.
#[derive(Debug)]
pub(super) struct Dispatch {
    pub(super) kernel: Kernel,
    pub(super) params: Vec<u32>,
    pub(super) inputs: Vec<Slot>,
    pub(super) out: Slot,
    pub(super) workgroups: u64,
}

/// How an op runs on this backend.
#[derive(Debug)]
pub(super) enum Plan {
    /// The result shares input 0's buffer under new dims (reshape, cast to f32).
    Alias(Vec<usize>),
    /// Dispatches, in order, into a fresh zero-initialised output of `dims`,
    /// using zero-initialised scratch buffers of `tmp` elements each.
    Compute {
        dims: Vec<usize>,
        tmp: Vec<usize>,
        dispatches: Vec<Dispatch>,
    },
}

impl Plan {
    /// A plan without scratch buffers.
    pub(super) fn simple(dims: Vec<usize>, dispatches: Vec<Dispatch>) -> Plan {
        Plan::Compute {
            dims,
            tmp: Vec::new(),
            dispatches,
        }
    }
}

/// A dispatch writing the op's output.
pub(super) fn dispatch(
    kernel: Kernel,
    params: Vec<u32>,
    inputs: Vec<Slot>,
    workgroups: u64,
) -> Dispatch {
    Dispatch {
        kernel,
        params,
        inputs,
        out: Slot::Out,
        workgroups,
    }
}

/// `Slot::In(i)` when the op has an `i`-th input, else `Slot::Unbound`.
pub(super) fn optional(inputs: &[&Tensor], i: usize) -> Slot {
    if i < inputs.len() {
        Slot::In(i)
    } else {
        Slot::Unbound
    }
}

pub(super) fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// The values of an integer host tensor in row-major order (`None`
/// otherwise or if one is negative).
pub(super) fn host_indices(t: &Tensor) -> Option<Vec<usize>> {
    if !matches!(t.dtype(), DType::I64 | DType::I32 | DType::U8) {
        return None;
    }
    let c = t.as_candle()?.to_dtype(candle_core::DType::I64).ok()?;
    let v = c.flatten_all().ok()?.to_vec1::<i64>().ok()?;
    v.into_iter().map(|i| usize::try_from(i).ok()).collect()
}

/// Row-major contiguous strides.
pub(super) fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// NumPy broadcast of two shapes, with the strides each input uses in the
/// output's index space (0 along broadcast dims). `None` if incompatible.
pub(super) fn broadcast(a: &[usize], b: &[usize]) -> Option<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let r = a.len().max(b.len());
    let pa: Vec<usize> = std::iter::repeat_n(1, r - a.len())
        .chain(a.iter().copied())
        .collect();
    let pb: Vec<usize> = std::iter::repeat_n(1, r - b.len())
        .chain(b.iter().copied())
        .collect();
    let (sa, sb) = (strides(&pa), strides(&pb));
    let mut out = Vec::with_capacity(r);
    let mut ea = Vec::with_capacity(r);
    let mut eb = Vec::with_capacity(r);
    for i in 0..r {
        let d = if pa[i] == pb[i] || pb[i] == 1 {
            pa[i]
        } else if pa[i] == 1 {
            pb[i]
        } else {
            return None;
        };
        out.push(d);
        ea.push(if pa[i] == d { sa[i] } else { 0 });
        eb.push(if pb[i] == d { sb[i] } else { 0 });
    }
    Some((out, ea, eb))
}

/// Converts sizes to u32 kernel parameters; `None` if any does not fit.
pub(super) fn u32s(v: impl IntoIterator<Item = usize>) -> Option<Vec<u32>> {
    v.into_iter().map(|x| u32::try_from(x).ok()).collect()
}

/// Workgroups for `n` elements at 256 threads each.
pub(super) fn groups_for(n: usize) -> u64 {
    (n as u64).div_ceil(u64::from(kernels::WG))
}

/// A strided-copy dispatch of input `input` over the index space `dims`.
pub(super) fn copy_dispatch(
    input: usize,
    dims: &[usize],
    in_off: usize,
    istr: &[usize],
    out_off: usize,
    ostr: &[usize],
) -> Option<Dispatch> {
    let n: usize = dims.iter().product();
    let mut p = vec![n, dims.len(), in_off, out_off];
    p.extend_from_slice(dims);
    p.extend_from_slice(istr);
    p.extend_from_slice(ostr);
    Some(dispatch(
        Kernel::Copy,
        u32s(p)?,
        vec![Slot::In(input)],
        groups_for(n),
    ))
}

pub(super) fn f32_bits(v: f64) -> u32 {
    (v as f32).to_bits()
}
