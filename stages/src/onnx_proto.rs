//! A minimal reader for the parts of an ONNX file that weight extraction
//! needs: the graph's nodes (name, op type, inputs, outputs) and its
//! initializers (name, dims, f32 / i64 data).
//!
//! It decodes the protobuf wire format directly (no code generation, no
//! `protoc`). It lives here, apart from the model code, so it can move to the
//! runtime's weight readers (`runtime/src/weights/onnx.rs`) once that exists.
//!
//! Field numbers are those of `onnx.proto` (IR version 3 and later):
//! `ModelProto.graph = 7`; `GraphProto.node = 1`, `initializer = 5`;
//! `NodeProto.input = 1`, `output = 2`, `name = 3`, `op_type = 4`;
//! `TensorProto.dims = 1`, `data_type = 2`, `float_data = 4`,
//! `int64_data = 7`, `name = 8`, `raw_data = 9`, `data_location = 14`.

use crate::{Error, Result};
use std::path::Path;

/// ONNX `TensorProto.DataType.FLOAT`.
pub const ONNX_FLOAT: i32 = 1;
/// ONNX `TensorProto.DataType.INT64`.
pub const ONNX_INT64: i32 = 7;

/// One graph node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OnnxNode {
    /// Node name (PyTorch exports use the module path, e.g. `/dec/ups.0/ConvTranspose`).
    pub name: String,
    /// Operator, e.g. `Conv`.
    pub op_type: String,
    /// Input tensor names.
    pub inputs: Vec<String>,
    /// Output tensor names.
    pub outputs: Vec<String>,
}

/// One initializer (a constant tensor stored in the file).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OnnxTensor {
    /// Tensor name.
    pub name: String,
    /// Dimensions.
    pub dims: Vec<usize>,
    /// ONNX data type code ([`ONNX_FLOAT`], [`ONNX_INT64`], ...).
    pub data_type: i32,
    /// Little-endian raw bytes (from `raw_data`, or re-encoded from the typed fields).
    pub raw: Vec<u8>,
    /// True when the data lives in an external file (not supported).
    pub external: bool,
}

impl OnnxTensor {
    /// The data as f32 values (only for [`ONNX_FLOAT`] tensors).
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        if self.data_type != ONNX_FLOAT || self.raw.len() % 4 != 0 {
            return None;
        }
        Some(
            self.raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }

    /// Number of elements implied by `dims`.
    pub fn elem_count(&self) -> usize {
        self.dims.iter().product()
    }
}

/// The graph of an ONNX model: nodes and initializers.
#[derive(Debug, Clone, Default)]
pub struct OnnxGraph {
    /// Nodes in file order.
    pub nodes: Vec<OnnxNode>,
    /// Initializers in file order.
    pub initializers: Vec<OnnxTensor>,
}

impl OnnxGraph {
    /// Read an ONNX file.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::parse(&bytes)
            .map_err(|msg| Error::bad_file(path, format!("not a valid ONNX model: {msg}")))
    }

    /// Parse ONNX bytes.
    pub fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        let mut graph = None;
        let mut r = Reader::new(bytes);
        while let Some((field, value)) = r.next()? {
            if let (7, Value::Bytes(b)) = (field, value) {
                graph = Some(parse_graph(b)?);
            }
        }
        graph.ok_or_else(|| "no graph in the model".to_string())
    }
}

fn parse_graph(b: &[u8]) -> std::result::Result<OnnxGraph, String> {
    let mut g = OnnxGraph::default();
    let mut r = Reader::new(b);
    while let Some((field, value)) = r.next()? {
        match (field, value) {
            (1, Value::Bytes(n)) => g.nodes.push(parse_node(n)?),
            (5, Value::Bytes(t)) => g.initializers.push(parse_tensor(t)?),
            _ => {}
        }
    }
    Ok(g)
}

fn utf8(b: &[u8]) -> std::result::Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "a name is not UTF-8".to_string())
}

fn parse_node(b: &[u8]) -> std::result::Result<OnnxNode, String> {
    let mut n = OnnxNode::default();
    let mut r = Reader::new(b);
    while let Some((field, value)) = r.next()? {
        match (field, value) {
            (1, Value::Bytes(s)) => n.inputs.push(utf8(s)?),
            (2, Value::Bytes(s)) => n.outputs.push(utf8(s)?),
            (3, Value::Bytes(s)) => n.name = utf8(s)?,
            (4, Value::Bytes(s)) => n.op_type = utf8(s)?,
            _ => {}
        }
    }
    Ok(n)
}

fn parse_tensor(b: &[u8]) -> std::result::Result<OnnxTensor, String> {
    let mut t = OnnxTensor::default();
    let mut floats: Vec<u8> = Vec::new();
    let mut int64s: Vec<u8> = Vec::new();
    let mut r = Reader::new(b);
    while let Some((field, value)) = r.next()? {
        match (field, value) {
            (1, Value::Varint(d)) => t.dims.push(d as usize),
            (1, Value::Bytes(packed)) => {
                let mut p = Reader::new(packed);
                while !p.done() {
                    t.dims.push(p.varint()? as usize);
                }
            }
            (2, Value::Varint(d)) => t.data_type = d as i32,
            (4, Value::Fixed32(v)) => floats.extend_from_slice(&v.to_le_bytes()),
            (4, Value::Bytes(packed)) => floats.extend_from_slice(packed),
            (7, Value::Varint(v)) => int64s.extend_from_slice(&(v as i64).to_le_bytes()),
            (7, Value::Bytes(packed)) => {
                let mut p = Reader::new(packed);
                while !p.done() {
                    int64s.extend_from_slice(&(p.varint()? as i64).to_le_bytes());
                }
            }
            (8, Value::Bytes(s)) => t.name = utf8(s)?,
            (9, Value::Bytes(raw)) => t.raw = raw.to_vec(),
            (14, Value::Varint(loc)) => t.external = loc == 1,
            _ => {}
        }
    }
    if t.raw.is_empty() {
        if !floats.is_empty() {
            t.raw = floats;
        } else if !int64s.is_empty() {
            t.raw = int64s;
        }
    }
    Ok(t)
}

/// One decoded protobuf field value.
enum Value<'a> {
    Varint(u64),
    /// 64-bit fixed values (doubles) are skipped: no reader here needs them.
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> std::result::Result<u64, String> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err("truncated varint".into());
            };
            self.pos += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| "truncated field".to_string())?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn next(&mut self) -> std::result::Result<Option<(u64, Value<'a>)>, String> {
        if self.done() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = key >> 3;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed64
            }
            2 => {
                let len = self.varint()? as usize;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            w => {
                return Err(format!(
                    "unsupported protobuf wire type {w} (field {field})"
                ))
            }
        };
        Ok(Some((field, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn field_bytes(field: u64, data: &[u8], out: &mut Vec<u8>) {
        varint(field << 3 | 2, out);
        varint(data.len() as u64, out);
        out.extend_from_slice(data);
    }

    #[test]
    fn parses_nodes_and_initializers() {
        let mut tensor = Vec::new();
        varint(1 << 3, &mut tensor);
        varint(2, &mut tensor);
        varint(1 << 3, &mut tensor);
        varint(3, &mut tensor);
        varint(2 << 3, &mut tensor);
        varint(1, &mut tensor);
        field_bytes(8, b"w", &mut tensor);
        let data: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        field_bytes(9, &data, &mut tensor);

        let mut node = Vec::new();
        field_bytes(1, b"x", &mut node);
        field_bytes(1, b"w", &mut node);
        field_bytes(2, b"y", &mut node);
        field_bytes(3, b"/m/Conv", &mut node);
        field_bytes(4, b"Conv", &mut node);

        let mut graph = Vec::new();
        field_bytes(1, &node, &mut graph);
        field_bytes(5, &tensor, &mut graph);
        let mut model = Vec::new();
        varint(1 << 3, &mut model);
        varint(8, &mut model);
        field_bytes(7, &graph, &mut model);

        let g = OnnxGraph::parse(&model).expect("parse");
        assert_eq!(g.nodes.len(), 1);
        assert_eq!(g.nodes[0].op_type, "Conv");
        assert_eq!(g.nodes[0].inputs, vec!["x", "w"]);
        let t = &g.initializers[0];
        assert_eq!(t.dims, vec![2, 3]);
        assert_eq!(t.to_f32().expect("f32"), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    }

    #[test]
    fn truncated_input_is_an_error() {
        let mut model = Vec::new();
        varint(7 << 3 | 2, &mut model);
        varint(100, &mut model);
        model.extend_from_slice(&[0; 10]);
        assert!(OnnxGraph::parse(&model).is_err());
    }
}
