//! Weights placed on the CPU in the int8 kernels' tile layout.

use super::gemv::{self, WeightFormat};
use super::huge_pages;
use super::tensors::{cdev, device_buffer, index_tensor};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType as CDType, Tensor as CTensor};
use edgeflow_runtime::{Error, Result, Storage, Tensor};
use std::sync::Arc;

/// Q8_0 / Q4_0 / Q4_1 / Q5_0 weights in the tile layout of the 256-bit int8 kernels
/// ([`gemv::pack`]), made by [`Backend::make_resident`] when a stage
/// places a matrix on the CPU. [`Op::Linear`] streams it (the same bits as
/// GGML's layout, faster); [`Op::IndexSelect`] reads its rows in place;
/// any other op gets it back in GGML's layout first, as does
/// [`Backend::download`]. Same size as the GGML bytes it replaces.
#[derive(Debug)]
pub(crate) struct PackedWeights {
    pub(crate) fmt: WeightFormat,
    dtype: GgmlDType,
    /// Rows and values per row.
    n: usize,
    k: usize,
    pub(crate) bytes: Vec<u8>,
}

impl edgeflow_runtime::DeviceBuffer for PackedWeights {
    fn backend(&self) -> &str {
        "cpu"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn size_bytes(&self) -> usize {
        self.bytes.len()
    }
}

impl PackedWeights {
    /// `t`'s packed weights, if it holds some.
    pub(crate) fn of(t: &Tensor) -> Option<&PackedWeights> {
        device_buffer(t)
    }

    /// `t` packed, when it is a block-quantized matrix of at least one tile that this
    /// machine's kernels read packed ([`gemv::packs`]).
    pub(crate) fn pack(t: &Tensor) -> Result<Option<Tensor>> {
        let Storage::Quantized(q) = t.storage() else {
            return Ok(None);
        };
        let Some(fmt) = WeightFormat::of_ggml(q.dtype()) else {
            return Ok(None);
        };
        let &[n, k] = t.dims() else { return Ok(None) };
        if n < gemv::PACK_ROWS || !gemv::packs(fmt) {
            return Ok(None);
        }
        let Some(bytes) = gemv::pack(fmt, &q.data()?, n, k) else {
            return Ok(None);
        };
        huge_pages::advise_range_later(bytes.as_ptr() as usize, bytes.len());
        let p = PackedWeights {
            fmt,
            dtype: q.dtype(),
            n,
            k,
            bytes,
        };
        Ok(Some(Tensor::from_device(Arc::new(p), t.dims(), t.dtype())))
    }

    /// The weights in GGML's layout again.
    pub(crate) fn to_qtensor(&self) -> Result<QTensor> {
        let ggml = gemv::unpack(self.fmt, &self.bytes, self.n, self.k).ok_or_else(|| {
            Error::bad_input("packed weights", "the packed bytes do not fit their shape")
        })?;
        Ok(candle_core::quantized::ggml_file::qtensor_from_ggml(
            self.dtype,
            &ggml,
            vec![self.n, self.k],
            &cdev(),
        )?)
    }

    /// Rows `idx` (1-D indices) dequantized, read in place.
    pub(crate) fn rows(&self, idx: &CTensor) -> Result<CTensor> {
        let ids = index_tensor(idx)?.to_dtype(CDType::I64)?.to_vec1::<i64>()?;
        let n = self.n;
        let ids: Vec<usize> = ids
            .into_iter()
            .map(|i| {
                usize::try_from(i).ok().filter(|&i| i < n).ok_or_else(|| {
                    Error::bad_input(
                        "index_select",
                        format!("index {i} out of range for {n} rows"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        let raw = gemv::packed_rows(self.fmt, &self.bytes, n, self.k, &ids).ok_or_else(|| {
            Error::bad_input("index_select", "packed rows do not fit their shape")
        })?;
        let sub = candle_core::quantized::ggml_file::qtensor_from_ggml(
            self.dtype,
            &raw,
            vec![ids.len(), self.k],
            &cdev(),
        )?;
        Ok(sub.dequantize(&cdev())?)
    }
}
