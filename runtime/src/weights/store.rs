//! [`WeightStore`]: named weights placed on a [`Device`], with resident-byte
//! accounting.

use super::{tensor_err, weights_err, WeightReader};
use crate::{DType, Device, Result, Tensor};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
struct Inner {
    readers: Vec<Box<dyn WeightReader>>,
    device: Device,
    placed: Mutex<HashMap<String, Tensor>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The readers (a file's parsed header and read buffers) go first,
        // so the memory handed back includes theirs.
        self.readers.clear();
        self.device.release_load_memory();
    }
}

/// Loads named tensors from one or more weight files onto a [`Device`], once
/// each, and accounts their bytes in the device's
/// [`crate::DeviceStats::add_resident`].
///
/// Like candle's `VarBuilder`, [`WeightStore::pp`] returns a view with a
/// name prefix, so model code mirrors the checkpoint's names:
///
/// ```no_run
/// # use edgeflow_runtime::{weights::WeightStore, Device, Result};
/// # fn f(dev: Device) -> Result<()> {
/// let ws = WeightStore::open(&["model.safetensors"], dev)?;
/// let layer = ws.pp("encoder").pp("layers.0");
/// let w = layer.get("fc1.weight")?; // "encoder.layers.0.fc1.weight"
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct WeightStore {
    inner: Arc<Inner>,
    prefix: String,
}

impl WeightStore {
    /// A store over already opened readers (searched in order).
    pub fn new(readers: Vec<Box<dyn WeightReader>>, device: Device) -> Self {
        WeightStore {
            inner: Arc::new(Inner {
                readers,
                device,
                placed: Mutex::new(HashMap::new()),
            }),
            prefix: String::new(),
        }
    }

    /// Open the files with [`super::open`] and build a store.
    pub fn open<P: AsRef<Path>>(paths: &[P], device: Device) -> Result<Self> {
        let readers = paths.iter().map(super::open).collect::<Result<Vec<_>>>()?;
        Ok(Self::new(readers, device))
    }

    /// A view whose names are prefixed by `prefix.`.
    pub fn pp(&self, prefix: impl AsRef<str>) -> WeightStore {
        WeightStore {
            inner: self.inner.clone(),
            prefix: self.full(prefix.as_ref()),
        }
    }

    /// The device weights are placed on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    fn full(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// Whether some file holds `name` (under this view's prefix).
    pub fn contains(&self, name: &str) -> bool {
        let full = self.full(name);
        self.inner.readers.iter().any(|r| r.contains(&full))
    }

    /// Every tensor name across the files (full names, sorted, deduplicated).
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.readers.iter().flat_map(|r| r.names()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Load `name` (under this view's prefix), place it on the device and
    /// account it as resident. Later calls return the placed tensor.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let full = self.full(name);
        if let Ok(m) = self.inner.placed.lock() {
            if let Some(t) = m.get(&full) {
                return Ok(t.clone());
            }
        }
        let host = self.load_host(name)?;
        let placed = self.inner.device.place(&host)?;
        let mut m = self
            .inner
            .placed
            .lock()
            .map_err(|_| weights_err(&self.path(), "weight store lock poisoned"))?;
        if let Some(t) = m.get(&full) {
            return Ok(t.clone());
        }
        self.inner
            .device
            .stats()
            .add_resident(placed.size_bytes() as i64);
        m.insert(full, placed.clone());
        Ok(placed)
    }

    /// Dims and stored dtype of `name` (under this view's prefix), without
    /// loading it.
    pub fn info(&self, name: &str) -> Option<super::TensorInfo> {
        let full = self.full(name);
        self.inner.readers.iter().find_map(|r| r.info(&full))
    }

    /// Load `name` (under this view's prefix) to host memory as stored,
    /// without placing it or caching it: for weights a model rearranges
    /// (stacks, reshapes, folds) before placing them itself.
    pub fn load_host(&self, name: &str) -> Result<Tensor> {
        let full = self.full(name);
        match self.inner.readers.iter().find(|r| r.contains(&full)) {
            Some(reader) => reader.load(&full),
            None => Err(tensor_err(
                &self.path(),
                &full,
                format!(
                    "not found in {} file(s); the checkpoint does not match the model config",
                    self.inner.readers.len()
                ),
            )),
        }
    }

    /// The first file's path (for messages; empty with no files).
    pub fn path(&self) -> std::path::PathBuf {
        self.inner
            .readers
            .first()
            .map(|r| r.path().to_path_buf())
            .unwrap_or_default()
    }

    /// [`WeightStore::get`], checking the dims.
    pub fn get_with_shape(&self, name: &str, dims: &[usize]) -> Result<Tensor> {
        let t = self.get(name)?;
        if t.dims() != dims {
            let path = self
                .inner
                .readers
                .iter()
                .find(|r| r.contains(&self.full(name)))
                .map(|r| r.path().to_path_buf())
                .unwrap_or_default();
            return Err(tensor_err(
                &path,
                &self.full(name),
                format!("has dims {:?}, the model expects {dims:?}", t.dims()),
            ));
        }
        Ok(t)
    }

    /// [`WeightStore::get`] converted to `dtype` on the host before placing
    /// (e.g. f16 checkpoints for an f32 model; quantizing to Q8_0 / Q4_0).
    pub fn get_as(&self, name: &str, dtype: DType) -> Result<Tensor> {
        let full = self.full(name);
        let key = format!("{full}#{dtype}");
        if let Ok(m) = self.inner.placed.lock() {
            if let Some(t) = m.get(&key) {
                return Ok(t.clone());
            }
        }
        let Some(reader) = self.inner.readers.iter().find(|r| r.contains(&full)) else {
            return self.get(name);
        };
        let host = reader.load(&full)?;
        let host = if host.dtype() == dtype {
            host
        } else {
            self.inner.device.host().cast(&host, dtype)?
        };
        let placed = self.inner.device.place(&host)?;
        self.inner
            .device
            .stats()
            .add_resident(placed.size_bytes() as i64);
        if let Ok(mut m) = self.inner.placed.lock() {
            m.insert(key, placed.clone());
        }
        Ok(placed)
    }

    /// Bytes of every tensor this store has placed.
    pub fn resident_bytes(&self) -> u64 {
        self.inner
            .placed
            .lock()
            .map(|m| m.values().map(|t| t.size_bytes() as u64).sum())
            .unwrap_or(0)
    }
}
