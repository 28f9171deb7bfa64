//! Weight readers on small files written by the tests themselves: values
//! round-trip, and truncated / corrupt files give `Error::Weights` naming the
//! file (and the tensor where one is concerned).

#![allow(clippy::unwrap_used)]

use edgeflow_runtime::candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use edgeflow_runtime::candle_core::{self, Device as CDevice, Tensor as CTensor};
use edgeflow_runtime::weights::WeightStore;
use edgeflow_runtime::weights::{self, Ct2File, GgufFile, OnnxFile, SafetensorsFile, WeightReader};
use edgeflow_runtime::{Backend, DType, Device, DeviceKind, Error, Op, Storage, Tensor};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn assert_weights_err(e: Error, path: &Path, needle: &str) {
    let msg = e.to_string();
    assert!(
        matches!(e, Error::Weights { .. }),
        "not a Weights error: {msg}"
    );
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains(needle), "`{needle}` not in: {msg}");
}

fn truncate(path: &Path, keep: usize) {
    let bytes = std::fs::read(path).unwrap();
    std::fs::write(path, &bytes[..keep]).unwrap();
}

#[test]
fn safetensors_roundtrip_and_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    let h: Vec<half::f16> = (0..5)
        .map(|i| half::f16::from_f32(i as f32 / 4.0))
        .collect();
    let wb: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    let hb: Vec<u8> = h.iter().flat_map(|x| x.to_le_bytes()).collect();
    let views = vec![
        (
            "layer.w",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3, 4], &wb).unwrap(),
        ),
        (
            "layer.h",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F16, vec![5], &hb).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(views, None, &path).unwrap();

    let f = SafetensorsFile::open(&path).unwrap();
    assert_eq!(f.names(), vec!["layer.h", "layer.w"]);
    let t = f.load("layer.w").unwrap();
    assert_eq!(t.dims(), &[3, 4]);
    assert_eq!(t.to_vec_f32().unwrap(), w);
    let t = f.load("layer.h").unwrap();
    assert_eq!(t.dtype(), DType::F16);
    assert_eq!(t.to_vec_f32().unwrap(), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    assert_weights_err(f.load("nope").unwrap_err(), &path, "`nope`");
    // Through the generic opener too.
    let g = weights::open(&path).unwrap();
    assert_eq!(g.info("layer.w").unwrap().dims, vec![3, 4]);
    drop((f, g));

    let len = std::fs::metadata(&path).unwrap().len() as usize;
    truncate(&path, len - 3);
    assert_weights_err(
        SafetensorsFile::open(&path).unwrap_err(),
        &path,
        "safetensors",
    );
}

#[test]
fn gguf_keeps_quantized_tensors_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let dev = CDevice::Cpu;
    let wv: Vec<f32> = (0..4 * 64)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let w = CTensor::from_vec(wv.clone(), (4, 64), &dev).unwrap();
    let q = QTensor::quantize(&w, GgmlDType::Q4_0).unwrap();
    let q8 = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
    let n = QTensor::quantize(
        &CTensor::new(&[1f32, 2., 3.], &dev).unwrap(),
        GgmlDType::F32,
    )
    .unwrap();
    let arch = gguf_file::Value::String("tiny".into());
    let ctx = gguf_file::Value::U32(2048);
    let toks = gguf_file::Value::Array(vec![
        gguf_file::Value::String("<s>".into()),
        gguf_file::Value::String("hi".into()),
    ]);
    {
        let mut f = std::fs::File::create(&path).unwrap();
        gguf_file::write(
            &mut f,
            &[
                ("general.architecture", &arch),
                ("tiny.context_length", &ctx),
                ("tokenizer.ggml.tokens", &toks),
            ],
            &[("blk.0.w", &q), ("blk.0.w8", &q8), ("norm", &n)],
        )
        .unwrap();
    }
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.meta_str("general.architecture"), Some("tiny"));
    assert_eq!(f.meta_u64("tiny.context_length"), Some(2048));
    assert_eq!(
        f.meta_strings("tokenizer.ggml.tokens").unwrap(),
        vec!["<s>".to_string(), "hi".to_string()]
    );
    let t = f.load("blk.0.w").unwrap();
    assert_eq!(t.dtype(), DType::Q4_0);
    assert_eq!(t.dims(), &[4, 64]);
    let Storage::Quantized(qt) = t.storage() else {
        panic!("Q4_0 tensor was dequantized at load");
    };
    let back = qt
        .dequantize(&dev)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    // Q4_0: 16 levels over [-max, max] per block of 32: step max/8.
    for (a, b) in back.iter().zip(&wv) {
        assert!((a - b).abs() <= 1.0 / 8.0 + 1e-3, "{a} vs {b}");
    }
    let t8 = f.load("blk.0.w8").unwrap();
    assert_eq!(t8.dtype(), DType::Q8_0);
    let Storage::Quantized(q8t) = t8.storage() else {
        panic!("Q8_0 tensor was dequantized at load");
    };
    // Read straight from the map: the very bytes written.
    assert_eq!(q8t.data().unwrap(), q8.data().unwrap());
    let t = f.load("norm").unwrap();
    assert!(t.is_host() && t.as_candle().is_some());
    assert_eq!(t.to_vec_f32().unwrap(), vec![1.0, 2.0, 3.0]);
    drop(f);

    let len = std::fs::metadata(&path).unwrap().len() as usize;
    truncate(&path, len - 40);
    let e = GgufFile::open(&path).unwrap_err();
    assert_weights_err(e, &path, "tensor `");
    truncate(&path, 20);
    assert_weights_err(GgufFile::open(&path).unwrap_err(), &path, "GGUF");
}

/// A backend that runs nothing and counts [`Backend::release_load_memory`].
#[derive(Debug, Default)]
struct CountsReleases(AtomicUsize);

impl Backend for CountsReleases {
    fn name(&self) -> &str {
        "counts-releases"
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }
    fn supports(&self, _: &Op, _: &[&Tensor]) -> bool {
        false
    }
    fn holds(&self, t: &Tensor) -> bool {
        t.is_host()
    }
    fn upload(&self, t: &Tensor) -> edgeflow_runtime::Result<Tensor> {
        Ok(t.clone())
    }
    fn download(&self, t: &Tensor) -> edgeflow_runtime::Result<Tensor> {
        Ok(t.clone())
    }
    fn execute(&self, _: &Op, _: &[&Tensor]) -> edgeflow_runtime::Result<Tensor> {
        Err(Error::bad_input("execute", "this test backend runs no ops"))
    }
    fn release_load_memory(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn dropping_the_last_store_view_ends_loading_once() {
    let b = Arc::new(CountsReleases::default());
    let dev = Device::new(b.clone(), b.clone());
    let store = WeightStore::new(Vec::new(), dev);
    let layer = store.pp("encoder").pp("layers.0");
    drop(store);
    assert_eq!(b.0.load(Ordering::SeqCst), 0, "a view is still loading");
    drop(layer);
    // Primary and CPU backend are one here: told once.
    assert_eq!(b.0.load(Ordering::SeqCst), 1);
}

/// A reader of no tensors that records, when it is dropped, how many times
/// loading had been declared over by then.
#[derive(Debug)]
struct NotesDrop {
    releases: Arc<CountsReleases>,
    at_drop: Arc<AtomicUsize>,
}

impl Drop for NotesDrop {
    fn drop(&mut self) {
        let n = self.releases.0.load(Ordering::SeqCst);
        self.at_drop.store(n + 1, Ordering::SeqCst);
    }
}

impl WeightReader for NotesDrop {
    fn path(&self) -> &Path {
        Path::new("notes-drop")
    }
    fn names(&self) -> Vec<String> {
        Vec::new()
    }
    fn info(&self, _: &str) -> Option<weights::TensorInfo> {
        None
    }
    fn load(&self, name: &str) -> edgeflow_runtime::Result<Tensor> {
        Err(Error::bad_input("load", format!("no tensor `{name}` here")))
    }
}

/// The readers (a file's parsed header, its read buffers) are freed before
/// the backend is told that loading is over, so the memory it hands back
/// includes theirs.
#[test]
fn readers_are_freed_before_loading_ends() {
    let b = Arc::new(CountsReleases::default());
    let dev = Device::new(b.clone(), b.clone());
    let at_drop = Arc::new(AtomicUsize::new(0));
    let reader = NotesDrop {
        releases: b.clone(),
        at_drop: at_drop.clone(),
    };
    let store = WeightStore::new(vec![Box::new(reader)], dev);
    drop(store);
    // 1 + the releases seen when the reader went: none yet.
    assert_eq!(
        at_drop.load(Ordering::SeqCst),
        1,
        "the reader outlived the release"
    );
    assert_eq!(b.0.load(Ordering::SeqCst), 1);
}

// --- a hand-written ONNX protobuf -------------------------------------------

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
fn key(field: u64, wt: u64, out: &mut Vec<u8>) {
    varint(field << 3 | wt, out);
}
fn field_bytes(field: u64, data: &[u8], out: &mut Vec<u8>) {
    key(field, 2, out);
    varint(data.len() as u64, out);
    out.extend_from_slice(data);
}
fn field_varint(field: u64, v: u64, out: &mut Vec<u8>) {
    key(field, 0, out);
    varint(v, out);
}

/// TensorProto: dims (unpacked varints), data_type, name, payload fields.
fn tensor_proto(name: &str, dims: &[u64], dt: u64, payload: &[u8]) -> Vec<u8> {
    let mut t = Vec::new();
    for &d in dims {
        field_varint(1, d, &mut t);
    }
    field_varint(2, dt, &mut t);
    field_bytes(8, name.as_bytes(), &mut t);
    t.extend_from_slice(payload);
    t
}

fn onnx_model() -> Vec<u8> {
    let mut graph = Vec::new();
    // A Constant node: output "c", attribute value = tensor [2] f32 raw.
    let cval: Vec<u8> = [7.5f32, -1.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let mut raw = Vec::new();
    field_bytes(9, &cval, &mut raw);
    let ct = tensor_proto("", &[2], 1, &raw);
    let mut attr = Vec::new();
    field_bytes(1, b"value", &mut attr);
    field_bytes(5, &ct, &mut attr);
    field_varint(20, 4, &mut attr);
    let mut node = Vec::new();
    field_bytes(2, b"c", &mut node);
    field_bytes(3, b"const0", &mut node);
    field_bytes(4, b"Constant", &mut node);
    field_bytes(5, &attr, &mut node);
    field_bytes(1, &node, &mut graph);
    field_bytes(2, b"g", &mut graph);
    // "w": [2, 3] f32 in raw_data.
    let wv: Vec<u8> = (0..6)
        .flat_map(|i| (i as f32 * 1.5).to_le_bytes())
        .collect();
    let mut p = Vec::new();
    field_bytes(9, &wv, &mut p);
    field_bytes(5, &tensor_proto("w", &[2, 3], 1, &p), &mut graph);
    // "b": [3] f32 as packed float_data.
    let bv: Vec<u8> = [0.25f32, 0.5, 0.75]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let mut p = Vec::new();
    field_bytes(4, &bv, &mut p);
    field_bytes(5, &tensor_proto("b", &[3], 1, &p), &mut graph);
    // "i": [2] int64 as packed int64_data (one negative).
    let mut packed = Vec::new();
    varint(5, &mut packed);
    varint(-3i64 as u64, &mut packed);
    let mut p = Vec::new();
    field_bytes(7, &packed, &mut p);
    field_bytes(5, &tensor_proto("i", &[2], 7, &p), &mut graph);
    let mut model = Vec::new();
    field_varint(1, 8, &mut model); // ir_version
    field_bytes(7, &graph, &mut model);
    model
}

#[test]
fn onnx_initializers_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, onnx_model()).unwrap();
    let f = OnnxFile::open(&path).unwrap();
    assert_eq!(f.names(), vec!["b", "c", "i", "w"]);
    let w = f.load("w").unwrap();
    assert_eq!(w.dims(), &[2, 3]);
    assert_eq!(w.to_vec_f32().unwrap(), vec![0.0, 1.5, 3.0, 4.5, 6.0, 7.5]);
    assert_eq!(
        f.load("b").unwrap().to_vec_f32().unwrap(),
        vec![0.25, 0.5, 0.75]
    );
    assert_eq!(f.load("c").unwrap().to_vec_f32().unwrap(), vec![7.5, -1.0]);
    let i = f.load("i").unwrap();
    assert_eq!(i.dtype(), DType::I64);
    assert_eq!(
        i.as_candle().unwrap().to_vec1::<i64>().unwrap(),
        vec![5, -3]
    );
    assert_weights_err(f.load("zz").unwrap_err(), &path, "`zz`");
    // Nodes come with op type and outputs; Constant values are not initializers.
    assert_eq!(f.initializer_names(), vec!["b", "i", "w"]);
    let nodes = f.nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].name, "const0");
    assert!(nodes[0].is_constant());
    assert_eq!(nodes[0].outputs, vec!["c"]);
    assert!(nodes[0].inputs.is_empty());
    drop(f);

    // Cut inside the graph: the wire reader reports it instead of reading past the end.
    let len = onnx_model().len();
    truncate(&path, len - 7);
    assert_weights_err(OnnxFile::open(&path).unwrap_err(), &path, "ONNX");
}

#[test]
fn onnx_raw_data_shorter_than_dims_names_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.onnx");
    let mut graph = Vec::new();
    let mut p = Vec::new();
    field_bytes(9, &[0u8; 8], &mut p); // 2 floats for dims [3]
    field_bytes(5, &tensor_proto("short", &[3], 1, &p), &mut graph);
    let mut model = Vec::new();
    field_bytes(7, &graph, &mut model);
    std::fs::write(&path, model).unwrap();
    let f = OnnxFile::open(&path).unwrap();
    assert_weights_err(f.load("short").unwrap_err(), &path, "`short`");
}

/// A graph with one `Constant` node `out` = `vals` (f32 raw data).
fn const_graph(out: &str, vals: &[f32], inner: Option<Vec<u8>>) -> Vec<u8> {
    let raw_vals: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut raw = Vec::new();
    field_bytes(9, &raw_vals, &mut raw);
    let mut attr = Vec::new();
    field_bytes(1, b"value", &mut attr);
    field_bytes(
        5,
        &tensor_proto("", &[vals.len() as u64], 1, &raw),
        &mut attr,
    );
    let mut node = Vec::new();
    field_bytes(2, out.as_bytes(), &mut node);
    field_bytes(4, b"Constant", &mut node);
    field_bytes(5, &attr, &mut node);
    let mut graph = Vec::new();
    field_bytes(1, &node, &mut graph);
    if let Some(g) = inner {
        // A nested If inside this branch.
        let mut a = Vec::new();
        field_bytes(1, b"else_branch", &mut a);
        field_bytes(6, &g, &mut a);
        let mut n = Vec::new();
        field_bytes(4, b"If", &mut n);
        field_bytes(5, &a, &mut n);
        field_bytes(1, &n, &mut graph);
    }
    graph
}

/// Constants inside `If` branches (silero-vad keeps its weights there) load
/// as `<attribute>/<output>`, nested branches as a path; top-level nodes
/// stay the graph's own.
#[test]
fn onnx_subgraph_constants_by_branch_path() {
    let then_g = const_graph("w", &[1.0, 2.0], Some(const_graph("deep", &[9.0], None)));
    let else_g = const_graph("w", &[3.0, 4.0, 5.0], None);
    let mut node = Vec::new();
    field_bytes(4, b"If", &mut node);
    for (name, g) in [("then_branch", &then_g), ("else_branch", &else_g)] {
        let mut a = Vec::new();
        field_bytes(1, name.as_bytes(), &mut a);
        field_bytes(6, g, &mut a);
        field_bytes(5, &a, &mut node);
    }
    let mut graph = const_graph("top", &[0.5], None);
    field_bytes(1, &node, &mut graph);
    let mut model = Vec::new();
    field_bytes(7, &graph, &mut model);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("if.onnx");
    std::fs::write(&path, model).unwrap();
    let f = OnnxFile::open(&path).unwrap();
    assert_eq!(
        f.names(),
        vec![
            "else_branch/w",
            "then_branch/else_branch/deep",
            "then_branch/w",
            "top"
        ]
    );
    let v = |n: &str| f.load(n).unwrap().to_vec_f32().unwrap();
    assert_eq!(v("then_branch/w"), vec![1.0, 2.0]);
    assert_eq!(v("else_branch/w"), vec![3.0, 4.0, 5.0]);
    assert_eq!(v("then_branch/else_branch/deep"), vec![9.0]);
    assert_eq!(f.nodes().len(), 2, "only the top-level nodes");
}

#[test]
fn write_safetensors_round_trips_and_replaces_atomically() {
    use edgeflow_runtime::{weights::write_safetensors, Tensor};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.safetensors");
    let mut m = std::collections::BTreeMap::new();
    m.insert(
        "b".to_string(),
        Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5], &[2, 3]).unwrap(),
    );
    m.insert("a".to_string(), Tensor::from_vec(vec![0.25], &[1]).unwrap());
    let mut meta = std::collections::HashMap::new();
    meta.insert("source".to_string(), "test".to_string());
    write_safetensors(&path, &m, Some(meta)).unwrap();
    let f = SafetensorsFile::open(&path).unwrap();
    assert_eq!(f.names(), vec!["a".to_string(), "b".to_string()]);
    assert_eq!(f.load("b").unwrap().dims(), &[2, 3]);
    assert_eq!(
        f.load("b").unwrap().to_vec_f32().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5]
    );
    assert_eq!(
        f.metadata()
            .and_then(|m| m.get("source"))
            .map(String::as_str),
        Some("test")
    );
    assert!(!dir.path().join("out.safetensors.partial").exists());
    // Non-f32 tensors are refused with the tensor named, and the file
    // written before stays as it was.
    m.insert(
        "ids".to_string(),
        Tensor::from_i64(vec![1, 2], &[2]).unwrap(),
    );
    let e = write_safetensors(&path, &m, None).unwrap_err();
    assert!(e.to_string().contains("`ids`"), "{e}");
    assert_eq!(SafetensorsFile::open(&path).unwrap().names().len(), 2);
}

// --- a hand-written CTranslate2 model.bin -----------------------------------

fn ct2_string(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&((s.len() + 1) as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

fn ct2_model() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&6u32.to_le_bytes());
    ct2_string("WhisperSpec", &mut b);
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&2u32.to_le_bytes());
    // f32 [2, 2]
    ct2_string("encoder/conv1/weight", &mut b);
    b.push(2);
    b.extend_from_slice(&2u32.to_le_bytes());
    b.extend_from_slice(&2u32.to_le_bytes());
    b.push(0);
    b.extend_from_slice(&16u32.to_le_bytes());
    for v in [1.0f32, 2.0, 3.0, 4.0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    // f16 [3]
    ct2_string("decoder/embeddings/weight", &mut b);
    b.push(1);
    b.extend_from_slice(&3u32.to_le_bytes());
    b.push(4);
    b.extend_from_slice(&6u32.to_le_bytes());
    for v in [0.5f32, -0.5, 2.0] {
        b.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
    }
    b.extend_from_slice(&1u32.to_le_bytes());
    ct2_string("decoder/projection/weight", &mut b);
    ct2_string("decoder/embeddings/weight", &mut b);
    b
}

#[test]
fn ct2_variables_and_aliases() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.bin");
    std::fs::write(&path, ct2_model()).unwrap();
    let f = Ct2File::open(&path).unwrap();
    assert_eq!(f.spec(), "WhisperSpec");
    assert_eq!(f.revision(), 3);
    let t = f.load("encoder/conv1/weight").unwrap();
    assert_eq!(t.dims(), &[2, 2]);
    assert_eq!(t.to_vec_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    let e = f.load("decoder/projection/weight").unwrap();
    assert_eq!(e.dtype(), DType::F16);
    assert_eq!(e.to_vec_f32().unwrap(), vec![0.5, -0.5, 2.0]);
    drop(f);
    let g = weights::open(&path).unwrap();
    assert!(g.contains("decoder/embeddings/weight"));
    drop(g);

    truncate(&path, 60);
    assert_weights_err(Ct2File::open(&path).unwrap_err(), &path, "truncated");
}

#[test]
fn unknown_and_missing_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.pt");
    std::fs::write(&p, b"0123456789").unwrap();
    assert_weights_err(weights::open(&p).unwrap_err(), &p, "unknown weight format");
    let missing = dir.path().join("absent.safetensors");
    let e = weights::open(&missing).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("absent.safetensors"));
    // The message already names the I/O error; as a `source` too, `{:#}`
    // chains (anyhow) would print it twice.
    assert!(std::error::Error::source(&e).is_none(), "{e}");
    let _ = candle_core::DType::F32;
}
