//! ONNX initializers by name, read straight from the protobuf wire format.
//!
//! Only the path to the weights is decoded: `ModelProto.graph` (field 7) ->
//! `GraphProto.initializer` (field 5, `TensorProto`) and `GraphProto.node`
//! (field 1) `Constant` nodes, whose `value` attribute holds a tensor (many
//! exporters put small weights there). Subgraphs (`If` / `Loop` / `Scan`
//! bodies: `AttributeProto.g`, field 6, and `graphs`, field 11) are searched
//! too; their tensors are named `<attribute>/<name>`, nested as deep as the
//! subgraphs (`then_branch/else_branch/w`) — silero-vad keeps each sample
//! rate's weights as constants in one branch of an `If`. External data is
//! not supported.
//!
//! The top-level nodes themselves (name, op type, inputs, outputs) are kept
//! too, see [`OnnxFile::nodes`]: model conversions use them to recover the
//! module an exporter-renamed initializer belongs to (`onnx::Conv_8168`
//! feeding `/flow/flows.6/enc/in_layers.0/Conv`).
//!
//! Field numbers are those of `onnx.proto` (IR version 3 and later):
//! `NodeProto.input = 1`, `output = 2`, `name = 3`, `op_type = 4`,
//! `attribute = 5`; `TensorProto.dims = 1`, `data_type = 2`,
//! `float_data = 4`, `int32_data = 5`, `int64_data = 7`, `name = 8`,
//! `raw_data = 9`, `double_data = 10`, `data_location = 14`.

use super::{from_le_bytes, missing, mmap, tensor_err, weights_err, TensorInfo, WeightReader};
use crate::{DType, Result, Tensor};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A protobuf wire-format cursor over a byte slice.
struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// A field's payload.
enum Val {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(Range<usize>),
}

impl<'a> Wire<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Wire { buf, pos: 0 }
    }

    fn varint(&mut self) -> std::result::Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> std::result::Result<Range<usize>, String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| format!("field of {n} bytes runs past the end of its message"))?;
        let r = self.pos..end;
        self.pos = end;
        Ok(r)
    }

    /// Next `(field number, value)`, or None at the end. Byte ranges are
    /// relative to this cursor's slice.
    fn next(&mut self) -> std::result::Result<Option<(u64, Val)>, String> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (field, wt) = (key >> 3, key & 7);
        let v = match wt {
            0 => Val::Varint(self.varint()?),
            1 => {
                let r = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(&self.buf[r]);
                Val::Fixed64(u64::from_le_bytes(a))
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| "length overflow")?;
                Val::Bytes(self.take(n)?)
            }
            5 => {
                let r = self.take(4)?;
                let mut a = [0u8; 4];
                a.copy_from_slice(&self.buf[r]);
                Val::Fixed32(u32::from_le_bytes(a))
            }
            other => return Err(format!("unsupported wire type {other} (field {field})")),
        };
        Ok(Some((field, v)))
    }
}

fn shift(r: &Range<usize>, base: usize) -> Range<usize> {
    r.start + base..r.end + base
}

/// ONNX `TensorProto.DataType` values this reader loads.
fn onnx_dtype(code: u64) -> Option<(candle_core::DType, DType)> {
    use candle_core::DType as C;
    Some(match code {
        1 => (C::F32, DType::F32),
        11 => (C::F64, DType::F32),
        10 => (C::F16, DType::F16),
        16 => (C::BF16, DType::BF16),
        7 => (C::I64, DType::I64),
        6 => (C::I32, DType::I32),
        2 | 9 => (C::U8, DType::U8),
        // int8 / int16 / uint16 have no candle dtype: widened to i64.
        3..=5 => (C::I64, DType::I64),
        _ => return None,
    })
}

/// A decoded `TensorProto` header: where its parts are in the file.
#[derive(Debug, Clone)]
struct Entry {
    dims: Vec<usize>,
    data_type: u64,
    /// The TensorProto message, absolute in the file.
    msg: Range<usize>,
    /// From `GraphProto.initializer` (else a `Constant` node's value).
    initializer: bool,
}

/// One top-level node of the graph.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OnnxNode {
    /// Node name (PyTorch exports use the module path, e.g.
    /// `/dec/ups.0/ConvTranspose`).
    pub name: String,
    /// Operator, e.g. `Conv`.
    pub op_type: String,
    /// Input tensor names, by slot (an optional input left out is `""`).
    pub inputs: Vec<String>,
    /// Output tensor names.
    pub outputs: Vec<String>,
}

impl OnnxNode {
    /// True for a `Constant` node; when its value is a tensor, it loads by
    /// the node's first output name ([`WeightReader::load`]).
    pub fn is_constant(&self) -> bool {
        self.op_type == "Constant"
    }
}

fn parse_tensor_header(
    file: &[u8],
    msg: Range<usize>,
) -> std::result::Result<(String, Entry), String> {
    let mut w = Wire::new(&file[msg.clone()]);
    let mut name = String::new();
    let mut dims = Vec::new();
    let mut data_type = 0;
    while let Some((f, v)) = w.next()? {
        match (f, v) {
            (1, Val::Varint(d)) => dims.push(usize::try_from(d).map_err(|_| "negative dim")?),
            (1, Val::Bytes(r)) => {
                let mut p = Wire::new(&file[shift(&r, msg.start)]);
                while p.pos < p.buf.len() {
                    dims.push(usize::try_from(p.varint()?).map_err(|_| "negative dim")?);
                }
            }
            (2, Val::Varint(t)) => data_type = t,
            (8, Val::Bytes(r)) => {
                name = String::from_utf8_lossy(&file[shift(&r, msg.start)]).into_owned()
            }
            (14, Val::Varint(1)) => {
                return Err(format!(
                    "tensor `{name}` uses external data, which is not supported"
                ))
            }
            _ => {}
        }
    }
    Ok((
        name,
        Entry {
            dims,
            data_type,
            msg,
            initializer: true,
        },
    ))
}

/// The initializers of an ONNX model, memory-mapped and indexed by name,
/// with the graph's top-level nodes.
#[derive(Debug)]
pub struct OnnxFile {
    path: PathBuf,
    map: memmap2::Mmap,
    entries: BTreeMap<String, Entry>,
    nodes: Vec<OnnxNode>,
}

impl OnnxFile {
    /// Map the file and index its initializers, `Constant` node values and
    /// nodes.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let map = mmap(&path)?;
        let (entries, nodes) = Self::index(&map)
            .map_err(|e| weights_err(&path, format!("not a valid ONNX model: {e}")))?;
        Ok(OnnxFile {
            path,
            map,
            entries,
            nodes,
        })
    }

    /// The graph's top-level nodes, in file order (topological for a valid
    /// model).
    pub fn nodes(&self) -> &[OnnxNode] {
        &self.nodes
    }

    /// Names of the tensors stored as `GraphProto.initializer`, sorted;
    /// unlike [`WeightReader::names`], without `Constant` node values.
    pub fn initializer_names(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, e)| e.initializer)
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn index(file: &[u8]) -> std::result::Result<(BTreeMap<String, Entry>, Vec<OnnxNode>), String> {
        let mut out = BTreeMap::new();
        let mut nodes = Vec::new();
        let mut model = Wire::new(file);
        let mut graph = None;
        while let Some((f, v)) = model.next()? {
            if let (7, Val::Bytes(r)) = (f, v) {
                graph = Some(r);
            }
        }
        let g = graph.ok_or("no graph (ModelProto field 7)")?;
        Self::walk_graph(file, g, "", &mut out, Some(&mut nodes), 0)?;
        Ok((out, nodes))
    }

    /// Index the initializers and `Constant` values of the graph at `g`
    /// under `prefix`, recursing into subgraph attributes; top-level nodes
    /// go to `nodes`.
    fn walk_graph(
        file: &[u8],
        g: Range<usize>,
        prefix: &str,
        out: &mut BTreeMap<String, Entry>,
        mut nodes: Option<&mut Vec<OnnxNode>>,
        depth: usize,
    ) -> std::result::Result<(), String> {
        if depth > 32 {
            return Err("subgraphs nested more than 32 deep".into());
        }
        let mut w = Wire::new(&file[g.clone()]);
        while let Some((f, v)) = w.next()? {
            match (f, v) {
                (5, Val::Bytes(r)) => {
                    let (name, e) = parse_tensor_header(file, shift(&r, g.start))?;
                    out.insert(format!("{prefix}{name}"), e);
                }
                (1, Val::Bytes(r)) => {
                    let node = shift(&r, g.start);
                    if let Some(nodes) = nodes.as_deref_mut() {
                        nodes.push(Self::node(file, node.clone())?);
                    }
                    if let Some((name, e)) = Self::constant_node(file, node.clone())? {
                        out.entry(format!("{prefix}{name}")).or_insert(e);
                    }
                    for (attr, sub) in Self::subgraphs(file, node)? {
                        let p = format!("{prefix}{attr}/");
                        Self::walk_graph(file, sub, &p, out, None, depth + 1)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `(attribute name, graph)` of each subgraph attribute of a node.
    fn subgraphs(
        file: &[u8],
        node: Range<usize>,
    ) -> std::result::Result<Vec<(String, Range<usize>)>, String> {
        let mut found = Vec::new();
        let mut w = Wire::new(&file[node.clone()]);
        while let Some((f, v)) = w.next()? {
            let (5, Val::Bytes(r)) = (f, v) else { continue };
            let attr = shift(&r, node.start);
            let mut a = Wire::new(&file[attr.clone()]);
            let (mut name, mut graphs) = (String::new(), Vec::new());
            while let Some((af, av)) = a.next()? {
                match (af, av) {
                    (1, Val::Bytes(n)) => {
                        name = String::from_utf8_lossy(&file[shift(&n, attr.start)]).into_owned()
                    }
                    (6 | 11, Val::Bytes(gr)) => graphs.push(shift(&gr, attr.start)),
                    _ => {}
                }
            }
            let many = graphs.len() > 1;
            for (i, g) in graphs.into_iter().enumerate() {
                let n = if many {
                    format!("{name}.{i}")
                } else {
                    name.clone()
                };
                found.push((n, g));
            }
        }
        Ok(found)
    }

    fn node(file: &[u8], node: Range<usize>) -> std::result::Result<OnnxNode, String> {
        let mut n = OnnxNode::default();
        let mut w = Wire::new(&file[node.clone()]);
        while let Some((f, v)) = w.next()? {
            let Val::Bytes(r) = v else { continue };
            // Lossy, as tensor names are: a stray byte must not make the
            // weights unreadable.
            let s = String::from_utf8_lossy(&file[shift(&r, node.start)]).into_owned();
            match f {
                1 => n.inputs.push(s),
                2 => n.outputs.push(s),
                3 => n.name = s,
                4 => n.op_type = s,
                _ => {}
            }
        }
        Ok(n)
    }

    /// `(output name, tensor)` of a `Constant` node with a tensor `value`.
    fn constant_node(
        file: &[u8],
        node: Range<usize>,
    ) -> std::result::Result<Option<(String, Entry)>, String> {
        let mut w = Wire::new(&file[node.clone()]);
        let (mut output, mut op_type, mut tensor) = (None, None, None);
        while let Some((f, v)) = w.next()? {
            match (f, v) {
                (2, Val::Bytes(r)) if output.is_none() => {
                    output =
                        Some(String::from_utf8_lossy(&file[shift(&r, node.start)]).into_owned())
                }
                (4, Val::Bytes(r)) => op_type = Some(shift(&r, node.start)),
                (5, Val::Bytes(r)) => {
                    let attr = shift(&r, node.start);
                    let mut a = Wire::new(&file[attr.clone()]);
                    let (mut is_value, mut t) = (false, None);
                    while let Some((af, av)) = a.next()? {
                        match (af, av) {
                            (1, Val::Bytes(n)) => {
                                is_value = &file[shift(&n, attr.start)] == b"value"
                            }
                            (5, Val::Bytes(tr)) => t = Some(shift(&tr, attr.start)),
                            _ => {}
                        }
                    }
                    if is_value {
                        tensor = t;
                    }
                }
                _ => {}
            }
        }
        let is_const = op_type.is_some_and(|r| &file[r] == b"Constant");
        match (is_const, output, tensor) {
            (true, Some(name), Some(t)) => {
                let (_, e) = parse_tensor_header(file, t)?;
                let e = Entry {
                    initializer: false,
                    ..e
                };
                Ok(Some((name, e)))
            }
            _ => Ok(None),
        }
    }

    fn decode(&self, name: &str, e: &Entry) -> std::result::Result<Tensor, String> {
        let (cd, _) = onnx_dtype(e.data_type)
            .ok_or_else(|| format!("unsupported ONNX data_type {}", e.data_type))?;
        let file = &self.map[..];
        let base = e.msg.start;
        let mut w = Wire::new(&file[e.msg.clone()]);
        let mut raw: Option<Range<usize>> = None;
        // Typed repeated fields, widened: floats (4), int32 family (5),
        // int64 (7), doubles (10).
        let mut floats: Vec<f64> = Vec::new();
        let mut ints: Vec<i64> = Vec::new();
        let push_packed = |field: u64,
                           r: Range<usize>,
                           floats: &mut Vec<f64>,
                           ints: &mut Vec<i64>|
         -> std::result::Result<(), String> {
            let b = &file[r];
            match field {
                4 => floats.extend(
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64),
                ),
                10 => floats.extend(b.chunks_exact(8).map(|c| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(c);
                    f64::from_le_bytes(a)
                })),
                5 | 7 => {
                    let mut p = Wire::new(b);
                    while p.pos < p.buf.len() {
                        let v = p.varint()?;
                        ints.push(if field == 5 {
                            v as u32 as i32 as i64
                        } else {
                            v as i64
                        });
                    }
                }
                _ => {}
            }
            Ok(())
        };
        while let Some((f, v)) = w.next()? {
            match (f, v) {
                (9, Val::Bytes(r)) => raw = Some(shift(&r, base)),
                (4 | 5 | 7 | 10, Val::Bytes(r)) => {
                    push_packed(f, shift(&r, base), &mut floats, &mut ints)?
                }
                (4, Val::Fixed32(x)) => floats.push(f32::from_bits(x) as f64),
                (10, Val::Fixed64(x)) => floats.push(f64::from_bits(x)),
                (5, Val::Varint(x)) => ints.push(x as u32 as i32 as i64),
                (7, Val::Varint(x)) => ints.push(x as i64),
                _ => {}
            }
        }
        let n: usize = e.dims.iter().product();
        let path = &self.path;
        let t = if let Some(r) = raw {
            let bytes = &file[r];
            match e.data_type {
                3 => from_i64(bytes.iter().map(|&b| b as i8 as i64).collect(), &e.dims)?,
                5 => from_i64(
                    bytes
                        .chunks_exact(2)
                        .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
                        .collect(),
                    &e.dims,
                )?,
                4 => from_i64(
                    bytes
                        .chunks_exact(2)
                        .map(|c| u16::from_le_bytes([c[0], c[1]]) as i64)
                        .collect(),
                    &e.dims,
                )?,
                _ => from_le_bytes(path, name, bytes, cd, &e.dims).map_err(|x| x.to_string())?,
            }
        } else {
            match e.data_type {
                1 | 11 => {
                    let v: Vec<f32> = floats.iter().map(|&x| x as f32).collect();
                    check_len(v.len(), n)?;
                    Tensor::from_vec(v, &e.dims).map_err(|x| x.to_string())?
                }
                7 | 6 | 3..=5 | 2 | 9 => {
                    check_len(ints.len(), n)?;
                    let c = candle_core::Tensor::from_vec(
                        ints,
                        e.dims.as_slice(),
                        &candle_core::Device::Cpu,
                    )
                    .and_then(|t| t.to_dtype(cd))
                    .map_err(|x| x.to_string())?;
                    Tensor::from_candle(c).map_err(|x| x.to_string())?
                }
                10 | 16 => {
                    check_len(ints.len(), n)?;
                    let bits: Vec<u8> = ints
                        .iter()
                        .flat_map(|&x| (x as u16).to_le_bytes())
                        .collect();
                    from_le_bytes(path, name, &bits, cd, &e.dims).map_err(|x| x.to_string())?
                }
                other => return Err(format!("unsupported ONNX data_type {other}")),
            }
        };
        if t.elem_count() != n {
            return Err(format!("{} values for dims {:?}", t.elem_count(), e.dims));
        }
        if cd == candle_core::DType::F64 {
            let c = t
                .candle("load")
                .map_err(|x| x.to_string())?
                .to_dtype(candle_core::DType::F32)
                .map_err(|x| x.to_string())?;
            return Tensor::from_candle(c).map_err(|x| x.to_string());
        }
        Ok(t)
    }
}

fn check_len(got: usize, want: usize) -> std::result::Result<(), String> {
    if got != want {
        return Err(format!(
            "{got} values stored, {want} expected from the dims; file truncated or corrupt"
        ));
    }
    Ok(())
}

fn from_i64(v: Vec<i64>, dims: &[usize]) -> std::result::Result<Tensor, String> {
    check_len(v.len(), dims.iter().product())?;
    Tensor::from_i64(v, dims).map_err(|e| e.to_string())
}

impl WeightReader for OnnxFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        let e = self.entries.get(name)?;
        Some(TensorInfo {
            name: name.to_string(),
            dims: e.dims.clone(),
            dtype: onnx_dtype(e.data_type)?.1,
        })
    }

    fn load(&self, name: &str) -> Result<Tensor> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| missing(&self.path, name))?;
        self.decode(name, e)
            .map_err(|m| tensor_err(&self.path, name, m))
    }
}
