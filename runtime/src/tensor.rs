//! [`Tensor`]: a cheaply clonable handle to data on the host or on a backend.

use crate::{DType, Error, Result};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Data held by a backend other than the host (GPU buffer, NPU tensor...).
///
/// Backends downcast through [`DeviceBuffer::as_any`] to their own type.
pub trait DeviceBuffer: Send + Sync + fmt::Debug {
    /// Name of the backend that owns this buffer (matches [`crate::Backend::name`]).
    fn backend(&self) -> &str;
    /// For downcasting by the owning backend.
    fn as_any(&self) -> &dyn Any;
    /// Bytes this buffer occupies on its device.
    fn size_bytes(&self) -> usize;
}

/// Where a tensor's data lives.
#[derive(Clone, Debug)]
pub enum Storage {
    /// Host memory, as a candle tensor (the CPU backend's native form).
    Host(candle_core::Tensor),
    /// Block-quantized weights (GGML layout), kept quantized.
    Quantized(Arc<candle_core::quantized::QTensor>),
    /// Memory owned by another backend.
    Device(Arc<dyn DeviceBuffer>),
}

/// An n-dimensional array. Cloning shares the data (`Arc`), never copies it,
/// so a tensor can travel through a pipeline's edges at no cost per hop.
#[derive(Clone, Debug)]
pub struct Tensor {
    storage: Storage,
    dims: Arc<[usize]>,
    dtype: DType,
}

impl Tensor {
    /// Wrap a host candle tensor.
    pub fn from_candle(t: candle_core::Tensor) -> Result<Self> {
        let dtype = match t.dtype() {
            candle_core::DType::F32 => DType::F32,
            candle_core::DType::F16 => DType::F16,
            candle_core::DType::BF16 => DType::BF16,
            candle_core::DType::I64 => DType::I64,
            candle_core::DType::U32 | candle_core::DType::I32 => DType::I32,
            candle_core::DType::U8 => DType::U8,
            other => {
                return Err(Error::bad_input(
                    "from_candle",
                    format!("unsupported candle dtype {other:?}"),
                ))
            }
        };
        Ok(Tensor {
            dims: t.dims().into(),
            dtype,
            storage: Storage::Host(t),
        })
    }

    /// Wrap quantized weights. `dims` are the logical (dequantized) dims.
    pub fn from_quantized(q: Arc<candle_core::quantized::QTensor>) -> Result<Self> {
        let dtype = match q.dtype() {
            candle_core::quantized::GgmlDType::Q4_0 => DType::Q4_0,
            candle_core::quantized::GgmlDType::Q4_1 => DType::Q4_1,
            candle_core::quantized::GgmlDType::Q8_0 => DType::Q8_0,
            candle_core::quantized::GgmlDType::Q5_0 => DType::Q5_0,
            candle_core::quantized::GgmlDType::Q4K => DType::Q4K,
            candle_core::quantized::GgmlDType::Q5K => DType::Q5K,
            candle_core::quantized::GgmlDType::Q6K => DType::Q6K,
            candle_core::quantized::GgmlDType::F32 => DType::F32,
            candle_core::quantized::GgmlDType::F16 => DType::F16,
            other => {
                return Err(Error::bad_input(
                    "from_quantized",
                    format!("unsupported GGML dtype {other:?}"),
                ))
            }
        };
        Ok(Tensor {
            dims: q.shape().dims().into(),
            dtype,
            storage: Storage::Quantized(q),
        })
    }

    /// Wrap a backend buffer.
    pub fn from_device(buf: Arc<dyn DeviceBuffer>, dims: &[usize], dtype: DType) -> Self {
        Tensor {
            storage: Storage::Device(buf),
            dims: dims.into(),
            dtype,
        }
    }

    /// f32 host tensor from a vector.
    pub fn from_vec(data: Vec<f32>, dims: &[usize]) -> Result<Self> {
        let t = candle_core::Tensor::from_vec(data, dims, &candle_core::Device::Cpu)?;
        Self::from_candle(t)
    }

    /// f32 host tensor from a slice.
    pub fn from_slice(data: &[f32], dims: &[usize]) -> Result<Self> {
        let t = candle_core::Tensor::from_slice(data, dims, &candle_core::Device::Cpu)?;
        Self::from_candle(t)
    }

    /// i64 host tensor (indices).
    pub fn from_i64(data: Vec<i64>, dims: &[usize]) -> Result<Self> {
        let t = candle_core::Tensor::from_vec(data, dims, &candle_core::Device::Cpu)?;
        Self::from_candle(t)
    }

    /// f32 zeros on the host.
    pub fn zeros(dims: &[usize]) -> Result<Self> {
        let t =
            candle_core::Tensor::zeros(dims, candle_core::DType::F32, &candle_core::Device::Cpu)?;
        Self::from_candle(t)
    }

    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.dims.iter().product()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the data is.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// True when the data is in host memory (plain or quantized).
    pub fn is_host(&self) -> bool {
        !matches!(self.storage, Storage::Device(_))
    }

    /// The host candle tensor, if the data is plain host memory.
    pub fn as_candle(&self) -> Option<&candle_core::Tensor> {
        match &self.storage {
            Storage::Host(t) => Some(t),
            _ => None,
        }
    }

    /// The host candle tensor or an error naming `op`.
    pub fn candle(&self, op: &'static str) -> Result<&candle_core::Tensor> {
        self.as_candle().ok_or_else(|| {
            Error::bad_input(
                op,
                "tensor is not in plain host memory; move it with Device::to_host first",
            )
        })
    }

    /// Bytes occupied where the data lives.
    pub fn size_bytes(&self) -> usize {
        match &self.storage {
            Storage::Host(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Storage::Quantized(q) => q.storage_size_in_bytes(),
            Storage::Device(b) => b.size_bytes(),
        }
    }

    /// Copy host f32 data out (converting other float dtypes). Errors for device data.
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        let t = self.candle("to_vec_f32")?;
        Ok(t.to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }
}
