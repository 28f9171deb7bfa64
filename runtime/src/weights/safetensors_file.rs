//! safetensors, memory-mapped.

use super::{from_le_bytes, missing, mmap, tensor_err, weights_err, TensorInfo, WeightReader};
use crate::{DType, Result, Tensor};
use safetensors::tensor::{Dtype, Metadata};
use std::path::{Path, PathBuf};

/// A memory-mapped `.safetensors` file. Tensors are copied out of the map
/// on [`WeightReader::load`]; f64 tensors load as f32 and bool as u8.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    map: memmap2::Mmap,
    header_len: usize,
    meta: Metadata,
}

fn dtype_of(d: Dtype) -> Option<(candle_core::DType, DType)> {
    use candle_core::DType as C;
    Some(match d {
        Dtype::F32 => (C::F32, DType::F32),
        Dtype::F64 => (C::F64, DType::F32),
        Dtype::F16 => (C::F16, DType::F16),
        Dtype::BF16 => (C::BF16, DType::BF16),
        Dtype::I64 => (C::I64, DType::I64),
        Dtype::I32 => (C::I32, DType::I32),
        Dtype::U32 => (C::U32, DType::I32),
        Dtype::U8 | Dtype::BOOL => (C::U8, DType::U8),
        _ => return None,
    })
}

impl SafetensorsFile {
    /// Map and validate the header (offsets, sizes, total length).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let map = mmap(&path)?;
        let (n, meta) = safetensors::SafeTensors::read_metadata(&map)
            .map_err(|e| weights_err(&path, format!("not a valid safetensors file: {e}")))?;
        Ok(SafetensorsFile {
            path,
            map,
            header_len: n + 8,
            meta,
        })
    }

    /// The free-form `__metadata__` of the header.
    pub fn metadata(&self) -> Option<&std::collections::HashMap<String, String>> {
        self.meta.metadata().as_ref()
    }
}

/// Write f32 tensors (any device; read back to the host) to a safetensors
/// file at `path`, with optional `__metadata__`. The data goes to
/// `<path>.partial` first and is renamed over `path` only when complete, so
/// an interrupted write never leaves a half-written file under that name.
pub fn write_safetensors(
    path: &Path,
    tensors: &std::collections::BTreeMap<String, Tensor>,
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<()> {
    struct F32Bytes {
        shape: Vec<usize>,
        bytes: Vec<u8>,
    }
    impl safetensors::View for &F32Bytes {
        fn dtype(&self) -> Dtype {
            Dtype::F32
        }
        fn shape(&self) -> &[usize] {
            &self.shape
        }
        fn data(&self) -> std::borrow::Cow<'_, [u8]> {
            std::borrow::Cow::Borrowed(&self.bytes)
        }
        fn data_len(&self) -> usize {
            self.bytes.len()
        }
    }
    let mut views = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if t.dtype() != DType::F32 {
            return Err(tensor_err(
                path,
                name,
                format!("only f32 tensors are written, this one is {}", t.dtype()),
            ));
        }
        let bytes = t
            .to_vec_f32()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        views.push((
            name.clone(),
            F32Bytes {
                shape: t.dims().to_vec(),
                bytes,
            },
        ));
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    let refs = views.iter().map(|(n, v)| (n.clone(), v));
    safetensors::tensor::serialize_to_file(refs, metadata, &tmp)
        .map_err(|e| weights_err(&tmp, format!("writing safetensors: {e}")))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| weights_err(path, format!("renaming {} into place: {e}", tmp.display())))
}

impl WeightReader for SafetensorsFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.meta.tensors().into_keys().collect();
        v.sort();
        v
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        let t = self.meta.info(name)?;
        let (_, dtype) = dtype_of(t.dtype)?;
        Some(TensorInfo {
            name: name.to_string(),
            dims: t.shape.clone(),
            dtype,
        })
    }

    fn load(&self, name: &str) -> Result<Tensor> {
        let info = self
            .meta
            .info(name)
            .ok_or_else(|| missing(&self.path, name))?;
        let (cd, _) = dtype_of(info.dtype).ok_or_else(|| {
            tensor_err(
                &self.path,
                name,
                format!("unsupported dtype {:?}", info.dtype),
            )
        })?;
        let (s, e) = info.data_offsets;
        let bytes = self
            .map
            .get(self.header_len + s..self.header_len + e)
            .ok_or_else(|| tensor_err(&self.path, name, "data lies past the end of the file"))?;
        let t = from_le_bytes(&self.path, name, bytes, cd, &info.shape)?;
        if cd == candle_core::DType::F64 {
            let c = t.candle("load")?.to_dtype(candle_core::DType::F32)?;
            return Tensor::from_candle(c);
        }
        Ok(t)
    }
}
