//! Inputs as plain host candle tensors, whatever holds them (a host
//! tensor, GGML blocks, weights packed on placement), and the conversions
//! built on that.

use super::pack_cache::PlacedConv;
use super::placed::PackedWeights;
use super::placed_linear::{PlacedBf16, PlacedLinear};
use super::tensors::{cdev, ggml_dtype, to_candle_dtype, wrap};
use candle_core::quantized::QTensor;
use candle_core::{DType as CDType, Tensor as CTensor};
use edgeflow_runtime::{DType, Error, Result, Storage, Tensor};
use std::sync::Arc;

/// The input as a plain host candle tensor (dequantizing block formats).
pub(crate) fn plain(t: &Tensor, op: &'static str) -> Result<CTensor> {
    match t.storage() {
        Storage::Host(c) => Ok(c.clone()),
        Storage::Quantized(q) => Ok(q.dequantize(&cdev())?),
        Storage::Device(_) => {
            if let Some(p) = PackedWeights::of(t) {
                Ok(p.to_qtensor()?.dequantize(&cdev())?)
            } else if let Some(p) = PlacedConv::of(t) {
                Ok(p.plain.clone())
            } else if let Some(p) = PlacedLinear::of(t) {
                p.plain()
            } else if let Some(p) = PlacedBf16::of(t) {
                p.plain()
            } else {
                Err(Error::bad_input(
                    op,
                    "CPU backend got a device tensor; Device::run moves it to the host first",
                ))
            }
        }
    }
}

/// Add a per-channel bias `[c]` to `[b, c, ...]`.
pub(crate) fn add_channel_bias(
    y: CTensor,
    bias: Option<&Tensor>,
    op: &'static str,
) -> Result<CTensor> {
    let Some(b) = bias else { return Ok(y) };
    let b = plain(b, op)?.to_dtype(y.dtype())?;
    let mut shape = vec![1usize; y.rank()];
    shape[1] = b.elem_count();
    Ok(y.broadcast_add(&b.reshape(shape)?)?)
}

/// The values of an optional host tensor (a bias) as f32, flattened.
pub(crate) fn f32_values(t: Option<&Tensor>, op: &'static str) -> Result<Option<Vec<f32>>> {
    Ok(match t {
        Some(t) => Some(
            plain(t, op)?
                .to_dtype(CDType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        ),
        None => None,
    })
}

/// `x` cast to `to`: quantized to a GGML block format, or converted.
pub(crate) fn cast(x: &Tensor, to: DType) -> Result<Tensor> {
    if let Some(g) = ggml_dtype(to) {
        let f = plain(x, "cast")?.to_dtype(CDType::F32)?;
        if f.dims().last().is_none_or(|&k| k % g.block_size() != 0) {
            return Err(Error::bad_input(
                "cast",
                format!(
                    "quantizing to {to} needs the last dim divisible by {}, got {:?}",
                    g.block_size(),
                    f.dims()
                ),
            ));
        }
        return Tensor::from_quantized(Arc::new(QTensor::quantize(&f, g)?));
    }
    let c = plain(x, "cast")?;
    wrap(c.to_dtype(to_candle_dtype("cast", to)?)?)
}
