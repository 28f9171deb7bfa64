//! CTranslate2 `model.bin` (faster-whisper's format).
//!
//! Layout (little-endian): `u32` binary version; from version 2 the spec
//! name (string) and `u32` spec revision; `u32` variable count, then per
//! variable: name (string), `u8` rank, `rank x u32` dims, and from version
//! 4 a `u8` type id (0 f32, 1 i8, 2 i16, 3 i32, 4 f16, 5 bf16) and a `u32`
//! byte count (before version 4: `u8` item size and `u32` element count),
//! then the raw data; from version 3 a `u32` alias count and
//! `(alias, target)` string pairs. A string is a `u16` length that counts a
//! trailing NUL, then the bytes.
//!
//! i8 / i16 variables (int8-quantized checkpoints) load widened to i64;
//! their `*_scale` companions are ordinary f32 variables.

use super::{from_le_bytes, missing, mmap, tensor_err, weights_err, TensorInfo, WeightReader};
use crate::{DType, Result, Tensor};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
struct Var {
    dims: Vec<usize>,
    type_id: u8,
    data: Range<usize>,
}

/// A memory-mapped CTranslate2 model file.
#[derive(Debug)]
pub struct Ct2File {
    path: PathBuf,
    map: memmap2::Mmap,
    spec: String,
    revision: u32,
    vars: BTreeMap<String, Var>,
    aliases: BTreeMap<String, String>,
}

struct Cur<'a> {
    b: &'a [u8],
    p: usize,
}

impl Cur<'_> {
    fn take(&mut self, n: usize, what: &str) -> std::result::Result<Range<usize>, String> {
        let end = self
            .p
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("truncated while reading {what} at byte {}", self.p))?;
        let r = self.p..end;
        self.p = end;
        Ok(r)
    }
    fn u8(&mut self, what: &str) -> std::result::Result<u8, String> {
        let r = self.take(1, what)?;
        Ok(self.b[r.start])
    }
    fn u16(&mut self, what: &str) -> std::result::Result<u16, String> {
        let r = self.take(2, what)?;
        Ok(u16::from_le_bytes([self.b[r.start], self.b[r.start + 1]]))
    }
    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        let r = self.take(4, what)?;
        let s = &self.b[r];
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn string(&mut self, what: &str) -> std::result::Result<String, String> {
        let n = self.u16(what)? as usize;
        let r = self.take(n, what)?;
        let s = &self.b[r];
        let s = s.strip_suffix(&[0]).unwrap_or(s);
        Ok(String::from_utf8_lossy(s).into_owned())
    }
}

fn type_dtype(id: u8) -> Option<(candle_core::DType, DType, usize)> {
    use candle_core::DType as C;
    Some(match id {
        0 => (C::F32, DType::F32, 4),
        1 => (C::I64, DType::I64, 1),
        2 => (C::I64, DType::I64, 2),
        3 => (C::I32, DType::I32, 4),
        4 => (C::F16, DType::F16, 2),
        5 => (C::BF16, DType::BF16, 2),
        _ => return None,
    })
}

impl Ct2File {
    /// Map the file and index its variables and aliases.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let map = mmap(&path)?;
        let mut c = Cur { b: &map, p: 0 };
        let parsed = (|| -> std::result::Result<_, String> {
            let version = c.u32("binary version")?;
            if version == 0 || version > 6 {
                return Err(format!(
                    "unsupported CTranslate2 binary version {version} (1 to 6 are read)"
                ));
            }
            let (spec, revision) = if version >= 2 {
                (c.string("spec name")?, c.u32("spec revision")?)
            } else {
                (String::new(), 1)
            };
            let n = c.u32("variable count")?;
            let mut vars = BTreeMap::new();
            for i in 0..n {
                let name = c.string(&format!("name of variable {i}"))?;
                let rank = c.u8(&format!("rank of `{name}`"))? as usize;
                let mut dims = Vec::with_capacity(rank);
                for _ in 0..rank {
                    dims.push(c.u32(&format!("dims of `{name}`"))? as usize);
                }
                let (type_id, bytes) = if version >= 4 {
                    let t = c.u8(&format!("type of `{name}`"))?;
                    (t, c.u32(&format!("size of `{name}`"))? as usize)
                } else {
                    let item = c.u8(&format!("item size of `{name}`"))?;
                    let count = c.u32(&format!("size of `{name}`"))? as usize;
                    let t = match item {
                        4 => 0,
                        2 => 4,
                        1 => 1,
                        other => return Err(format!("`{name}`: unknown item size {other}")),
                    };
                    (t, count * item as usize)
                };
                let (_, _, isz) = type_dtype(type_id)
                    .ok_or_else(|| format!("`{name}`: unknown type id {type_id}"))?;
                let n: usize = dims.iter().product();
                if n * isz != bytes {
                    return Err(format!(
                        "`{name}`: {bytes} bytes for dims {dims:?} (expected {})",
                        n * isz
                    ));
                }
                let data = c.take(bytes, &format!("data of `{name}`"))?;
                vars.insert(
                    name,
                    Var {
                        dims,
                        type_id,
                        data,
                    },
                );
            }
            let mut aliases = BTreeMap::new();
            if version >= 3 && c.p < c.b.len() {
                let n = c.u32("alias count")?;
                for _ in 0..n {
                    let a = c.string("alias")?;
                    let t = c.string("alias target")?;
                    aliases.insert(a, t);
                }
            }
            Ok((spec, revision, vars, aliases))
        })();
        let (spec, revision, vars, aliases) = parsed
            .map_err(|e| weights_err(&path, format!("not a valid CTranslate2 model: {e}")))?;
        Ok(Ct2File {
            path,
            map,
            spec,
            revision,
            vars,
            aliases,
        })
    }

    /// Model spec name (e.g. `WhisperSpec`).
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// Spec revision.
    pub fn revision(&self) -> u32 {
        self.revision
    }

    fn resolve<'a>(&'a self, name: &'a str) -> Option<(&'a str, &'a Var)> {
        if let Some(v) = self.vars.get(name) {
            return Some((name, v));
        }
        let t = self.aliases.get(name)?;
        self.vars.get(t.as_str()).map(|v| (t.as_str(), v))
    }
}

impl WeightReader for Ct2File {
    fn path(&self) -> &Path {
        &self.path
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .vars
            .keys()
            .chain(self.aliases.keys())
            .cloned()
            .collect();
        v.sort();
        v
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        let (_, v) = self.resolve(name)?;
        Some(TensorInfo {
            name: name.to_string(),
            dims: v.dims.clone(),
            dtype: type_dtype(v.type_id)?.1,
        })
    }

    fn load(&self, name: &str) -> Result<Tensor> {
        let (_, v) = self
            .resolve(name)
            .ok_or_else(|| missing(&self.path, name))?;
        let (cd, _, _) = type_dtype(v.type_id).ok_or_else(|| {
            tensor_err(&self.path, name, format!("unknown type id {}", v.type_id))
        })?;
        let bytes = &self.map[v.data.clone()];
        match v.type_id {
            1 => Tensor::from_i64(bytes.iter().map(|&b| b as i8 as i64).collect(), &v.dims),
            2 => Tensor::from_i64(
                bytes
                    .chunks_exact(2)
                    .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
                    .collect(),
                &v.dims,
            ),
            _ => from_le_bytes(&self.path, name, bytes, cd, &v.dims),
        }
    }
}
