//! [`VarBuilder`]: named checkpoint tensors under a prefix, on top of the
//! runtime's [`WeightStore`].

use crate::{Error, Result};
use edgeflow_runtime::weights::{TensorInfo, WeightReader, WeightStore};
use edgeflow_runtime::{DType, Device, Tensor};
use std::fmt::Display;
use std::path::{Path, PathBuf};

/// Fetches a model's tensors by their checkpoint names, like candle's
/// `VarBuilder`: [`VarBuilder::pp`] pushes a name component, so model code
/// mirrors the checkpoint's structure (`vb.pp("layers").pp(i).pp("fc1")`
/// reads `layers.3.fc1.weight`). The separator is `.` (PyTorch, GGUF)
/// unless set with [`VarBuilder::with_separator`] (`/` for CTranslate2).
///
/// Tensors come from a [`WeightStore`], which reads each file lazily and
/// places a tensor on the device once ([`VarBuilder::get`]); the device
/// travels with the builder, so a model's `load(vb, &cfg)` needs nothing
/// else. Tensors a layer rearranges before use (stacked projections,
/// reshaped kernels, folded weight norm) are read to the host with
/// [`VarBuilder::host`] and placed with [`VarBuilder::place`].
#[derive(Debug, Clone)]
pub struct VarBuilder {
    store: WeightStore,
    prefix: String,
    sep: &'static str,
}

impl VarBuilder {
    /// Open weight files (any format [`edgeflow_runtime::weights::open`]
    /// reads; searched in order) for `dev`.
    pub fn open<P: AsRef<Path>>(paths: &[P], dev: &Device) -> Result<Self> {
        Ok(Self::from_store(WeightStore::open(paths, dev.clone())?))
    }

    /// A builder over an already opened reader (e.g. a GGUF file whose
    /// metadata was read first).
    pub fn from_reader(reader: impl WeightReader + 'static, dev: &Device) -> Self {
        Self::from_store(WeightStore::new(vec![Box::new(reader)], dev.clone()))
    }

    /// A builder over a store (its prefix, if any, is kept).
    pub fn from_store(store: WeightStore) -> Self {
        VarBuilder {
            store,
            prefix: String::new(),
            sep: ".",
        }
    }

    /// The same tensors with `sep` between name components.
    pub fn with_separator(mut self, sep: &'static str) -> Self {
        self.sep = sep;
        self
    }

    /// A view one component deeper: names are prefixed by `name` and the
    /// separator. Takes anything displayable, so `pp(i)` indexes a layer.
    pub fn pp(&self, name: impl Display) -> Self {
        VarBuilder {
            store: self.store.clone(),
            prefix: self.full(&name.to_string()),
            sep: self.sep,
        }
    }

    /// The current prefix (empty at the root).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The device tensors are placed on.
    pub fn device(&self) -> &Device {
        self.store.device()
    }

    /// The first weight file (for messages).
    pub fn path(&self) -> PathBuf {
        self.store.path()
    }

    /// The underlying store.
    pub fn store(&self) -> &WeightStore {
        &self.store
    }

    /// The full checkpoint name of `name` under this prefix.
    pub fn full(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}{}{name}", self.prefix, self.sep)
        }
    }

    /// Whether the checkpoint holds `name` under this prefix.
    pub fn contains(&self, name: &str) -> bool {
        self.store.contains(&self.full(name))
    }

    /// Dims and stored dtype of `name`, without loading it.
    pub fn info(&self, name: &str) -> Option<TensorInfo> {
        self.store.info(&self.full(name))
    }

    /// An error about tensor `name` (under this prefix).
    pub fn error(&self, name: &str, msg: impl Into<String>) -> Error {
        Error::Weights {
            path: self.path(),
            name: self.full(name),
            msg: msg.into(),
        }
    }

    fn check(&self, name: &str, t: &Tensor, dims: &[usize]) -> Result<()> {
        if t.dims() != dims {
            return Err(self.error(name, format!("has dims {:?}, expected {dims:?}", t.dims())));
        }
        Ok(())
    }

    /// `name` placed on the device in its stored format (quantized blocks
    /// stay quantized), checked against `dims`. Placed once per store.
    pub fn get(&self, name: &str, dims: &[usize]) -> Result<Tensor> {
        let t = self.get_unchecked(name)?;
        self.check(name, &t, dims)?;
        Ok(t)
    }

    /// [`Self::get`] without a dims check (the model reads its shape from it).
    pub fn get_unchecked(&self, name: &str) -> Result<Tensor> {
        Ok(self.store.get(&self.full(name))?)
    }

    /// `name` converted to f32 on the host (f16 / bf16 checkpoints) and
    /// placed, checked against `dims`.
    pub fn get_f32(&self, name: &str, dims: &[usize]) -> Result<Tensor> {
        let t = self.get_f32_unchecked(name)?;
        self.check(name, &t, dims)?;
        Ok(t)
    }

    /// [`Self::get_f32`] without a dims check.
    pub fn get_f32_unchecked(&self, name: &str) -> Result<Tensor> {
        Ok(self.store.get_as(&self.full(name), DType::F32)?)
    }

    /// `name` on the host in its stored format, checked against `dims`;
    /// not placed (see [`Self::place`]).
    pub fn host(&self, name: &str, dims: &[usize]) -> Result<Tensor> {
        let t = self.host_unchecked(name)?;
        self.check(name, &t, dims)?;
        Ok(t)
    }

    /// [`Self::host`] without a dims check.
    pub fn host_unchecked(&self, name: &str) -> Result<Tensor> {
        Ok(self.store.load_host(&self.full(name))?)
    }

    /// `name` on the host as f32 (cast from other float formats, quantized
    /// blocks dequantized), checked against `dims`.
    pub fn host_f32(&self, name: &str, dims: &[usize]) -> Result<Tensor> {
        let t = self.host(name, dims)?;
        if t.dtype() == DType::F32 {
            return Ok(t);
        }
        Ok(self.device().host().cast(&t, DType::F32)?)
    }

    /// `name` as f32, checked against `dims`, reshaped on the host to
    /// `as_dims` (same element count) and placed: a kernel-size-1
    /// convolution's `[o, i, 1]` as a linear's `[o, i]`.
    pub fn get_reshaped(&self, name: &str, dims: &[usize], as_dims: &[usize]) -> Result<Tensor> {
        let t = self.host_f32(name, dims)?;
        if t.elem_count() != as_dims.iter().product::<usize>() {
            return Err(self.error(
                name,
                format!("of dims {dims:?} cannot be read as {as_dims:?}"),
            ));
        }
        let t = self.device().host().reshape(&t, as_dims)?;
        self.place(&t)
    }

    /// Place a tensor the model built on the host (rearranged weights) and
    /// account its bytes as resident.
    pub fn place(&self, t: &Tensor) -> Result<Tensor> {
        let placed = self.device().place(t)?;
        self.device()
            .stats()
            .add_resident(placed.size_bytes() as i64);
        Ok(placed)
    }

    /// [`Self::place`], keeping the host tensor where the placed backend
    /// cannot hold it (quantized blocks on a backend without quantized
    /// kernels): its ops then fall back to the CPU per op, counted in the
    /// device's stats.
    pub fn place_or_host(&self, t: &Tensor) -> Tensor {
        let placed = self.device().place(t).unwrap_or_else(|_| t.clone());
        self.device()
            .stats()
            .add_resident(placed.size_bytes() as i64);
        placed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn dev() -> Device {
        edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu")
    }

    #[test]
    fn names_mirror_the_checkpoint_and_bad_shapes_name_the_tensor() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("m.safetensors");
        let mut m = BTreeMap::new();
        m.insert(
            "layers.1.fc.weight".to_string(),
            Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3, 1]).expect("t"),
        );
        edgeflow_runtime::weights::write_safetensors(&path, &m, None).expect("write");
        let vb = VarBuilder::open(&[&path], &dev()).expect("open");
        let fc = vb.pp("layers").pp(1).pp("fc");
        assert_eq!(fc.full("weight"), "layers.1.fc.weight");
        assert!(fc.contains("weight") && !fc.contains("bias"));
        assert_eq!(fc.info("weight").expect("info").dims, vec![2, 3, 1]);
        let w = fc.get("weight", &[2, 3, 1]).expect("get");
        assert_eq!(
            vb.device()
                .to_host(&w)
                .expect("h")
                .to_vec_f32()
                .expect("v")
                .len(),
            6
        );
        let r = fc
            .get_reshaped("weight", &[2, 3, 1], &[2, 3])
            .expect("reshaped");
        assert_eq!(r.dims(), &[2, 3]);
        let e = fc.get("weight", &[3, 2, 1]).expect_err("shape");
        let msg = e.to_string();
        assert!(
            msg.contains("`layers.1.fc.weight`") && msg.contains("expected [3, 2, 1]"),
            "{msg}"
        );
        let e = fc.get("bias", &[2]).expect_err("missing");
        assert!(e.to_string().contains("layers.1.fc.bias"), "{e}");
        let slash = VarBuilder::open(&[&path], &dev())
            .expect("open")
            .with_separator("/");
        assert_eq!(slash.pp("encoder").pp(0).full("w"), "encoder/0/w");
    }
}
