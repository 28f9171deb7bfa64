//! Host tensors as candle sees them: conversions, checks and slices the
//! CPU backend's ops share.

use super::math;
use candle_core::quantized::GgmlDType;
use candle_core::{DType as CDType, Tensor as CTensor};
use edgeflow_runtime::{DType, Error, Op, Result, Storage, Tensor};

pub(crate) fn cdev() -> candle_core::Device {
    candle_core::Device::Cpu
}

/// This backend's buffer of type `B` behind `t`, if that is what holds it
/// (weights placed in one of its layouts).
pub(crate) fn device_buffer<B: 'static>(t: &Tensor) -> Option<&B> {
    match t.storage() {
        Storage::Device(b) => b.as_any().downcast_ref(),
        _ => None,
    }
}

/// `t`'s candle tensor when it is a f32 host tensor of rank `rank` with at
/// least `min` values: weights worth placing in one of this backend's
/// layouts.
pub(crate) fn placeable_f32(t: &Tensor, rank: usize, min: usize) -> Option<&CTensor> {
    let Storage::Host(c) = t.storage() else {
        return None;
    };
    (c.rank() == rank && c.dtype() == CDType::F32 && c.elem_count() >= min).then_some(c)
}

/// Map a runtime dtype to candle's (quantized dtypes have no plain form).
pub(crate) fn to_candle_dtype(op: &'static str, d: DType) -> Result<CDType> {
    Ok(match d {
        DType::F32 => CDType::F32,
        DType::F16 => CDType::F16,
        DType::BF16 => CDType::BF16,
        DType::I64 => CDType::I64,
        DType::I32 => CDType::I32,
        DType::U8 => CDType::U8,
        DType::Q4_0
        | DType::Q4_1
        | DType::Q8_0
        | DType::Q5_0
        | DType::Q4K
        | DType::Q5K
        | DType::Q6K => {
            return Err(Error::bad_input(
                op,
                format!("{d} is a block format with no plain candle dtype"),
            ))
        }
    })
}

pub(crate) fn ggml_dtype(d: DType) -> Option<GgmlDType> {
    match d {
        DType::Q4_0 => Some(GgmlDType::Q4_0),
        DType::Q4_1 => Some(GgmlDType::Q4_1),
        DType::Q8_0 => Some(GgmlDType::Q8_0),
        DType::Q5_0 => Some(GgmlDType::Q5_0),
        DType::Q4K => Some(GgmlDType::Q4K),
        DType::Q5K => Some(GgmlDType::Q5K),
        DType::Q6K => Some(GgmlDType::Q6K),
        _ => None,
    }
}

pub(crate) fn wrap(t: CTensor) -> Result<Tensor> {
    Tensor::from_candle(t)
}

pub(crate) fn arity(op: &Op, inputs: &[&Tensor], min: usize, max: usize) -> Result<()> {
    if inputs.len() < min || inputs.len() > max {
        let want = if min == max {
            format!("{min}")
        } else {
            format!("{min} to {max}")
        };
        return Err(Error::bad_input(
            op.name(),
            format!("expected {want} inputs, got {}", inputs.len()),
        ));
    }
    Ok(())
}

pub(crate) fn check_dim(op: &'static str, dim: usize, rank: usize) -> Result<()> {
    if dim >= rank {
        return Err(Error::bad_input(
            op,
            format!("dim {dim} out of range for a rank-{rank} tensor"),
        ));
    }
    Ok(())
}

/// Indices as a candle integer dtype its gather / index_select accept.
pub(crate) fn index_tensor(t: &CTensor) -> Result<CTensor> {
    Ok(match t.dtype() {
        CDType::U8 | CDType::U32 | CDType::I64 => t.clone(),
        CDType::I32 | CDType::I16 => t.to_dtype(CDType::I64)?,
        other => {
            return Err(Error::bad_input(
                "index",
                format!("indices must be an integer tensor, got {other:?}"),
            ))
        }
    })
}

/// The values of a contiguous host tensor of element type `T`, without
/// copying; None when it is not contiguous.
pub(crate) fn with_host_slice<T: candle_core::WithDType, R>(
    t: &CTensor,
    f: impl FnOnce(&[T]) -> R,
) -> Result<Option<R>> {
    let (st, layout) = t.storage_and_layout();
    let (candle_core::Storage::Cpu(cpu), Some((s, e))) = (&*st, layout.contiguous_offsets()) else {
        return Ok(None);
    };
    let all = cpu.as_slice::<T>()?;
    Ok(Some(f(&all[s..e])))
}

/// `t` laid out contiguously. A host f32 tensor that is a view with its
/// last two dims swapped (what `transpose(x, -1, -2)` of a contiguous
/// tensor gives: channel-major <-> time-major activations) is copied by a
/// blocked transpose; candle's strided copy walks such a view element by
/// element, and its element-wise ops on views take the same slow path.
pub(crate) fn dense(t: &CTensor) -> Result<CTensor> {
    if t.is_contiguous() {
        return Ok(t.clone());
    }
    let dims = t.dims();
    let r = dims.len();
    if t.dtype() != CDType::F32 || r < 2 {
        return Ok(t.contiguous()?);
    }
    let (m, n) = (dims[r - 2], dims[r - 1]);
    let stride = t.stride();
    let leading_ok = (0..r - 2).all(|i| stride[i] == dims[i + 1..].iter().product::<usize>());
    if stride[r - 2] != 1 || stride[r - 1] != m || !leading_ok {
        return Ok(t.contiguous()?);
    }
    let (st, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*st else {
        return Ok(t.contiguous()?);
    };
    let batch: usize = dims[..r - 2].iter().product();
    let all = cpu.as_slice::<f32>()?;
    let src = &all[layout.start_offset()..][..batch * m * n];
    let mut y = vec![0f32; batch * m * n];
    // View element (b, i, j) is src[b][j][i] of a contiguous [batch, n, m].
    let transpose = |(b, out): (usize, &mut [f32])| {
        math::transpose(&src[b * m * n..][..m * n], n, m, out);
    };
    if batch * m * n >= 1 << 16 && batch > 1 {
        use rayon::prelude::*;
        y.par_chunks_mut(m * n).enumerate().for_each(transpose);
    } else {
        y.chunks_mut(m * n).enumerate().for_each(transpose);
    }
    drop(st);
    Ok(CTensor::from_vec(y, dims, &cdev())?)
}

/// The f32 values of a contiguous host tensor, without copying.
pub(crate) fn with_f32_slice<R>(t: &CTensor, f: impl FnOnce(&[f32]) -> R) -> Result<Option<R>> {
    if t.dtype() != CDType::F32 {
        return Ok(None);
    }
    with_host_slice(t, f)
}
