//! Just enough of the ONNX protobuf wire format to pull the `Constant`
//! tensors out of a model's `If` subgraphs (silero-vad's ONNX export keeps
//! each sample rate's weights as constants inside one branch of an `If`),
//! and a writer for the safetensors format.

use std::collections::BTreeMap;
use std::ops::Range;

/// A float tensor found in an ONNX graph.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstTensor {
    /// Dims.
    pub dims: Vec<usize>,
    /// Values (float32 data only).
    pub data: Vec<f32>,
}

struct Wire<'a> {
    b: &'a [u8],
    p: usize,
}

enum Val {
    Int(u64),
    Bytes(Range<usize>),
}

impl<'a> Wire<'a> {
    fn new(b: &'a [u8]) -> Self {
        Wire { b, p: 0 }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.p).ok_or("truncated varint")?;
            self.p += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }

    fn next(&mut self) -> Result<Option<(u64, Val)>, String> {
        if self.p >= self.b.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (field, wt) = (key >> 3, key & 7);
        let v = match wt {
            0 => Val::Int(self.varint()?),
            1 | 5 => {
                let n = if wt == 1 { 8 } else { 4 };
                if self.p + n > self.b.len() {
                    return Err("truncated fixed field".into());
                }
                self.p += n;
                Val::Int(0)
            }
            2 => {
                let n = self.varint()? as usize;
                let end = self.p.checked_add(n).filter(|&e| e <= self.b.len());
                let end = end.ok_or("truncated length-delimited field")?;
                let r = self.p..end;
                self.p = end;
                Val::Bytes(r)
            }
            _ => return Err(format!("unsupported wire type {wt}")),
        };
        Ok(Some((field, v)))
    }
}

fn tensor(b: &[u8]) -> Result<Option<ConstTensor>, String> {
    let mut w = Wire::new(b);
    let (mut dims, mut dtype, mut raw, mut floats) = (Vec::new(), 0, None, Vec::new());
    while let Some((f, v)) = w.next()? {
        match (f, v) {
            (1, Val::Int(d)) => dims.push(d as usize),
            (1, Val::Bytes(r)) => {
                let mut p = Wire::new(&b[r]);
                while p.p < p.b.len() {
                    dims.push(p.varint()? as usize);
                }
            }
            (2, Val::Int(t)) => dtype = t,
            (4, Val::Bytes(r)) => floats.extend(
                b[r].chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            (9, Val::Bytes(r)) => raw = Some(r),
            _ => {}
        }
    }
    if dtype != 1 {
        return Ok(None);
    }
    let data: Vec<f32> = match raw {
        Some(r) => b[r]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        None => floats,
    };
    if data.len() != dims.iter().product::<usize>() {
        return Err(format!(
            "tensor of dims {dims:?} holds {} values",
            data.len()
        ));
    }
    Ok(Some(ConstTensor { dims, data }))
}

fn walk_graph(
    b: &[u8],
    prefix: &str,
    out: &mut BTreeMap<String, ConstTensor>,
) -> Result<(), String> {
    let mut g = Wire::new(b);
    while let Some((f, v)) = g.next()? {
        let (1, Val::Bytes(node)) = (f, v) else {
            continue;
        };
        let nb = &b[node];
        let mut n = Wire::new(nb);
        let (mut output, mut op) = (None, None);
        let mut attrs = Vec::new();
        while let Some((nf, nv)) = n.next()? {
            match (nf, nv) {
                (2, Val::Bytes(r)) if output.is_none() => {
                    output = Some(String::from_utf8_lossy(&nb[r]).into_owned())
                }
                (4, Val::Bytes(r)) => op = Some(String::from_utf8_lossy(&nb[r]).into_owned()),
                (5, Val::Bytes(r)) => attrs.push(r),
                _ => {}
            }
        }
        for a in attrs {
            let ab = &nb[a];
            let mut aw = Wire::new(ab);
            let (mut name, mut t, mut sub) = (String::new(), None, None);
            while let Some((af, av)) = aw.next()? {
                match (af, av) {
                    (1, Val::Bytes(r)) => name = String::from_utf8_lossy(&ab[r]).into_owned(),
                    (5, Val::Bytes(r)) => t = Some(r),
                    (6, Val::Bytes(r)) => sub = Some(r),
                    _ => {}
                }
            }
            if let Some(r) = sub {
                walk_graph(&ab[r], &format!("{prefix}{name}/"), out)?;
            }
            if let (Some("Constant"), Some(o), "value", Some(r)) =
                (op.as_deref(), &output, name.as_str(), t)
            {
                if let Some(ct) = tensor(&ab[r])? {
                    out.insert(format!("{prefix}{o}"), ct);
                }
            }
        }
    }
    Ok(())
}

/// Every float `Constant` of an ONNX model, including those inside
/// subgraphs, keyed by `branch/…/output name` (`then_branch/<output>`).
pub fn constants(model: &[u8]) -> Result<BTreeMap<String, ConstTensor>, String> {
    let mut m = Wire::new(model);
    let mut out = BTreeMap::new();
    while let Some((f, v)) = m.next()? {
        if let (7, Val::Bytes(g)) = (f, v) {
            walk_graph(&model[g], "", &mut out)?;
        }
    }
    Ok(out)
}

/// Serialize f32 tensors in the safetensors format (sorted by name).
pub fn safetensors_bytes(tensors: &BTreeMap<String, ConstTensor>) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (name, t) in tensors {
        let n = t.data.len() * 4;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": t.dims, "data_offsets": [off, off + n]}),
        );
        off += n;
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + off);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for t in tensors.values() {
        for v in &t.data {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeflow_runtime::weights::{SafetensorsFile, WeightReader};

    #[test]
    fn safetensors_round_trip() {
        let mut m = BTreeMap::new();
        m.insert(
            "b".to_string(),
            ConstTensor {
                dims: vec![2, 3],
                data: vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5],
            },
        );
        m.insert(
            "a".to_string(),
            ConstTensor {
                dims: vec![1],
                data: vec![0.25],
            },
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t.safetensors");
        std::fs::write(&p, safetensors_bytes(&m)).expect("write");
        let f = SafetensorsFile::open(&p).expect("open");
        assert_eq!(f.names(), vec!["a".to_string(), "b".to_string()]);
        let b = f.load("b").expect("b");
        assert_eq!(b.dims(), &[2, 3]);
        assert_eq!(b.to_vec_f32().expect("f32"), m["b"].data);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(constants(&[0x0a, 0xff, 0xff, 0xff]).is_err());
        assert!(constants(&[0x3a, 0x05, 0x0a]).is_err());
        assert!(constants(&[]).expect("empty").is_empty());
    }
}
