//! Weight readers and the [`WeightStore`] that places weights on a device.
//!
//! Formats:
//! - [`SafetensorsFile`]: safetensors via mmap (f32 / f16 / bf16 / ints);
//! - [`GgufFile`]: GGUF; Q4_0 / Q4_1 / Q8_0 tensors stay quantized, metadata
//!   (tokenizer, chat template...) is exposed as key/values;
//! - [`OnnxFile`]: initializers (and `Constant` node values) of an ONNX
//!   model, by tensor name, and its nodes ([`OnnxNode`]: op type, inputs,
//!   outputs), read by an in-tree protobuf wire-format reader;
//! - [`Ct2File`]: CTranslate2 `model.bin` (used for Whisper);
//! - [`RandomWeights`]: no file, seeded random tensors of given names and
//!   shapes (a model's real configuration when its weights cannot be had).
//!
//! Every reader implements [`WeightReader`]; [`open`] picks one by content.
//! A missing, truncated or corrupt file is an [`Error::Weights`] naming the
//! file and, where one is concerned, the tensor.

mod ct2;
mod gguf;
mod onnx;
mod random;
mod safetensors_file;
mod store;

pub use ct2::Ct2File;
pub use gguf::GgufFile;
pub use onnx::{OnnxFile, OnnxNode};
pub use random::RandomWeights;
pub use safetensors_file::{write_safetensors, SafetensorsFile};
pub use store::WeightStore;

use crate::{DType, Error, Result, Tensor};
use std::fmt;
use std::path::{Path, PathBuf};

/// Name, dims and stored element type of one tensor in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Name in the file.
    pub name: String,
    /// Dims.
    pub dims: Vec<usize>,
    /// Element type the tensor loads as.
    pub dtype: DType,
}

/// A file of named tensors.
pub trait WeightReader: Send + Sync + fmt::Debug {
    /// The file.
    fn path(&self) -> &Path;
    /// Every tensor name, sorted.
    fn names(&self) -> Vec<String>;
    /// Dims and dtype of a tensor without loading it.
    fn info(&self, name: &str) -> Option<TensorInfo>;
    /// Load one tensor to host memory.
    fn load(&self, name: &str) -> Result<Tensor>;
    /// Whether the file holds `name`.
    fn contains(&self, name: &str) -> bool {
        self.info(name).is_some()
    }
}

/// A shared reader reads as the reader itself: what lets one open file
/// serve a [`WeightStore`] and, at the same time, a reader of its metadata
/// on another thread (a GGUF's tokenizer).
impl<R: WeightReader + ?Sized> WeightReader for std::sync::Arc<R> {
    fn path(&self) -> &Path {
        (**self).path()
    }
    fn names(&self) -> Vec<String> {
        (**self).names()
    }
    fn info(&self, name: &str) -> Option<TensorInfo> {
        (**self).info(name)
    }
    fn load(&self, name: &str) -> Result<Tensor> {
        (**self).load(name)
    }
    fn contains(&self, name: &str) -> bool {
        (**self).contains(name)
    }
}

/// Open a weight file, choosing the reader from its content (GGUF magic,
/// safetensors header) or extension (`.onnx`, CTranslate2 `model.bin`).
pub fn open(path: impl AsRef<Path>) -> Result<Box<dyn WeightReader>> {
    let path = path.as_ref();
    let mut head = [0u8; 8];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
        let n = f.read(&mut head).map_err(|e| io_err(path, e))?;
        if n < 8 {
            return Err(weights_err(
                path,
                "file is shorter than any weight format's header",
            ));
        }
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if &head[..4] == b"GGUF" {
        return Ok(Box::new(GgufFile::open(path)?));
    }
    match ext.as_str() {
        "safetensors" => Ok(Box::new(SafetensorsFile::open(path)?)),
        "onnx" => Ok(Box::new(OnnxFile::open(path)?)),
        "bin" => Ok(Box::new(Ct2File::open(path)?)),
        "gguf" => Ok(Box::new(GgufFile::open(path)?)),
        _ => Err(weights_err(
            path,
            "unknown weight format: expected .safetensors, .gguf, .onnx or a CTranslate2 model.bin",
        )),
    }
}

pub(crate) fn weights_err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Weights {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

pub(crate) fn tensor_err(path: &Path, name: &str, msg: impl fmt::Display) -> Error {
    Error::Weights {
        path: path.to_path_buf(),
        msg: format!("tensor `{name}`: {msg}"),
    }
}

pub(crate) fn missing(path: &Path, name: &str) -> Error {
    tensor_err(path, name, "no such tensor in this file")
}

pub(crate) fn io_err(path: &Path, error: std::io::Error) -> Error {
    Error::Io {
        path: PathBuf::from(path),
        error,
    }
}

/// Map a file read-only. The file must not be modified while mapped (weights
/// are read-only artifacts); that is the one safety condition of mmap.
pub(crate) fn mmap(path: &Path) -> Result<memmap2::Mmap> {
    let f = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    // SAFETY: the map is read-only and weight files are not written while a
    // model is loaded; a concurrent truncation could fault, as with any mmap.
    unsafe { memmap2::Mmap::map(&f) }.map_err(|e| io_err(path, e))
}

/// Host tensor from little-endian bytes of a candle dtype.
pub(crate) fn from_le_bytes(
    path: &Path,
    name: &str,
    bytes: &[u8],
    dtype: candle_core::DType,
    dims: &[usize],
) -> Result<Tensor> {
    let n: usize = dims.iter().product();
    let want = n * dtype.size_in_bytes();
    if bytes.len() != want {
        return Err(tensor_err(
            path,
            name,
            format!(
                "{} data bytes for {:?} {dtype:?} (expected {want}); file truncated or corrupt",
                bytes.len(),
                dims
            ),
        ));
    }
    let t = candle_core::Tensor::from_raw_buffer(bytes, dtype, dims, &candle_core::Device::Cpu)
        .map_err(|e| tensor_err(path, name, e))?;
    Tensor::from_candle(t)
}
