//! GGUF (llama.cpp's format), through candle's reader.

use super::{missing, mmap, tensor_err, weights_err, TensorInfo, WeightReader};
use crate::{DType, Result, Tensor};
use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::GgmlDType;
use std::collections::HashMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A memory-mapped GGUF file.
///
/// Q4_0, Q4_1, Q5_0, Q8_0 and the K-quants Q4_K, Q5_K and Q6_K load
/// quantized ([`Tensor::from_quantized`]) and run through the backends'
/// quantized matmul; f32 / f16 tensors load as plain host tensors; other
/// block formats (Q2_K, Q3_K, Q5_1, ...) are dequantized to f32 at load,
/// since the runtime's op set does not carry them.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    content: Content,
}

fn load_dtype(g: GgmlDType) -> DType {
    match g {
        GgmlDType::Q4_0 => DType::Q4_0,
        GgmlDType::Q4_1 => DType::Q4_1,
        GgmlDType::Q8_0 => DType::Q8_0,
        GgmlDType::Q5_0 => DType::Q5_0,
        GgmlDType::Q4K => DType::Q4K,
        GgmlDType::Q5K => DType::Q5K,
        GgmlDType::Q6K => DType::Q6K,
        GgmlDType::F16 => DType::F16,
        _ => DType::F32,
    }
}

/// Where a tensor's data starts in the file and how many bytes it takes
/// (saturating: a hostile offset cannot overflow).
fn data_range(data_offset: u64, info: &gguf_file::TensorInfo) -> (u64, u64) {
    let n = info.shape.elem_count();
    let bytes = (n / info.ggml_dtype.block_size() * info.ggml_dtype.type_size()) as u64;
    (data_offset.saturating_add(info.offset), bytes)
}

impl GgufFile {
    /// Map the file and parse its header, metadata and tensor table.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let map = mmap(&path)?;
        let content = Content::read(&mut Cursor::new(&map[..]))
            .map_err(|e| weights_err(&path, format!("not a valid GGUF file: {e}")))?;
        let len = map.len() as u64;
        for (name, info) in &content.tensor_infos {
            let (start, bytes) = data_range(content.tensor_data_offset, info);
            let end = start.saturating_add(bytes);
            if info.shape.elem_count() % info.ggml_dtype.block_size() != 0 || end > len {
                return Err(tensor_err(
                    &path,
                    name,
                    format!("data ends at byte {end} but the file has {len}: truncated or corrupt"),
                ));
            }
        }
        Ok(GgufFile { path, map, content })
    }

    /// All metadata key/values (`general.architecture`, `tokenizer.ggml.tokens`,
    /// `tokenizer.chat_template`, hyper-parameters...).
    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    /// A string value (e.g. `tokenizer.chat_template`).
    pub fn meta_str(&self, key: &str) -> Option<&str> {
        self.content
            .metadata
            .get(key)
            .and_then(|v| v.to_string().ok())
            .map(|s| s.as_str())
    }

    /// An integer value of any width.
    pub fn meta_u64(&self, key: &str) -> Option<u64> {
        let v = self.content.metadata.get(key)?;
        v.to_u64()
            .ok()
            .or_else(|| v.to_u32().ok().map(u64::from))
            .or_else(|| v.to_i32().ok().and_then(|x| u64::try_from(x).ok()))
            .or_else(|| v.to_i64().ok().and_then(|x| u64::try_from(x).ok()))
            .or_else(|| v.to_u16().ok().map(u64::from))
            .or_else(|| v.to_u8().ok().map(u64::from))
    }

    /// A float value (f32 or f64).
    pub fn meta_f64(&self, key: &str) -> Option<f64> {
        let v = self.content.metadata.get(key)?;
        v.to_f64().ok().or_else(|| v.to_f32().ok().map(f64::from))
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`, `tokenizer.ggml.merges`).
    pub fn meta_strings(&self, key: &str) -> Option<Vec<String>> {
        let arr = self.content.metadata.get(key)?.to_vec().ok()?;
        arr.iter().map(|v| v.to_string().ok().cloned()).collect()
    }

    /// Drop the mapped pages of bytes `start..start + len` from this
    /// process's resident set once they are copied out: otherwise a load
    /// holds the whole file resident beside its copy, doubling its peak.
    /// The page cache keeps them, so a second read faults them back in.
    fn forget_pages(&self, start: usize, len: usize) {
        #[cfg(unix)]
        // SAFETY: the map is read-only and never written, so `MADV_DONTNEED`
        // only unmaps pages that the next access reads back from the file
        // with the same bytes; no slice of them is held across this call.
        unsafe {
            let _ = self
                .map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len);
        }
        #[cfg(not(unix))]
        let _ = (start, len);
    }

    /// Stored GGML block format of a tensor.
    pub fn ggml_dtype(&self, name: &str) -> Option<GgmlDType> {
        self.content.tensor_infos.get(name).map(|i| i.ggml_dtype)
    }
}

impl WeightReader for GgufFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.content.tensor_infos.keys().cloned().collect();
        v.sort();
        v
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        let i = self.content.tensor_infos.get(name)?;
        Some(TensorInfo {
            name: name.to_string(),
            dims: i.shape.dims().to_vec(),
            dtype: load_dtype(i.ggml_dtype),
        })
    }

    fn load(&self, name: &str) -> Result<Tensor> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| missing(&self.path, name))?;
        let dev = candle_core::Device::Cpu;
        // Straight from the map (bounds checked in `open`): one copy into
        // the tensor's blocks, where candle's reader makes two. Blocks are
        // read in place as 2- or 4-byte aligned structs; an offset that is
        // not (GGUF aligns tensors to 32 bytes) goes through the reader.
        let (start, bytes) = data_range(self.content.tensor_data_offset, info);
        let (start, bytes) = (start as usize, bytes as usize);
        let q = if start.is_multiple_of(4) {
            candle_core::quantized::ggml_file::qtensor_from_ggml(
                info.ggml_dtype,
                &self.map[start..start + bytes],
                info.shape.dims().to_vec(),
                &dev,
            )
        } else {
            self.content
                .tensor(&mut Cursor::new(&self.map[..]), name, &dev)
        }
        .map_err(|e| tensor_err(&self.path, name, e))?;
        self.forget_pages(start, bytes);
        let terr = |e: candle_core::Error| tensor_err(&self.path, name, e);
        match info.ggml_dtype {
            GgmlDType::Q4_0
            | GgmlDType::Q4_1
            | GgmlDType::Q8_0
            | GgmlDType::Q5_0
            | GgmlDType::Q4K
            | GgmlDType::Q5K
            | GgmlDType::Q6K => Tensor::from_quantized(Arc::new(q)),
            GgmlDType::F16 => Tensor::from_candle(q.dequantize_f16(&dev).map_err(terr)?),
            _ => Tensor::from_candle(q.dequantize(&dev).map_err(terr)?),
        }
    }
}
