//! The NPU delegate interface ([`NpuDelegate`]) with its graph types, and the
//! simulator's implementation of it.

use super::kernels::{exec_f32, exec_int8, ActIn, Kind};
use super::quant::{QParams, QWeight, RangeObserver};
use super::report::ErrorBook;
use super::sim::SimNpu;
use edgeflow_runtime::{candle_core, DType, Error, Op, Result, Storage, Tensor};
use std::fmt;
use std::sync::{Arc, Mutex};

/// Where a node input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueRef {
    /// Graph input `i` (an activation, fed at every execution).
    Input(usize),
    /// Constant `i` (a weight, known at compile time).
    Const(usize),
    /// Output of node `i` (which must come earlier in `nodes`).
    Node(usize),
}

/// One op of a captured graph, its inputs in [`Op`]'s documented order.
#[derive(Debug, Clone)]
pub struct Node {
    /// The op.
    pub op: Op,
    /// Its inputs.
    pub inputs: Vec<ValueRef>,
}

/// A captured static-shape graph: what a delegate partitions and compiles.
/// Nodes are in topological order (every [`ValueRef::Node`] points back).
#[derive(Debug, Clone, Default)]
pub struct Subgraph {
    /// Exact shapes of the graph inputs (static: the compiled graph accepts
    /// only these).
    pub input_shapes: Vec<Vec<usize>>,
    /// Constant tensors (weights, biases) on the host.
    pub constants: Vec<Tensor>,
    /// The ops.
    pub nodes: Vec<Node>,
    /// Values returned by an execution.
    pub outputs: Vec<ValueRef>,
}

impl Subgraph {
    /// Static dims of every node output, checking references and shapes.
    pub fn infer_dims(&self) -> Result<Vec<Vec<usize>>> {
        let mut out: Vec<Vec<usize>> = Vec::with_capacity(self.nodes.len());
        for (i, n) in self.nodes.iter().enumerate() {
            let dims: Vec<Vec<usize>> = n
                .inputs
                .iter()
                .map(|r| self.value_dims(*r, &out, i))
                .collect::<Result<_>>()?;
            let refs: Vec<&[usize]> = dims.iter().map(|d| d.as_slice()).collect();
            let d = match Kind::of(&n.op) {
                Some(k) => k.out_dims(n.op.name(), &refs)?,
                None => {
                    return Err(Error::Unsupported {
                        backend: "npu".into(),
                        op: n.op.name(),
                        msg: format!("node {i}: cannot infer static shapes for this op"),
                    })
                }
            };
            out.push(d);
        }
        for r in &self.outputs {
            self.value_dims(*r, &out, self.nodes.len())?;
        }
        Ok(out)
    }

    fn value_dims(&self, r: ValueRef, nodes: &[Vec<usize>], at: usize) -> Result<Vec<usize>> {
        let bad = |m: String| Error::bad_input("subgraph", m);
        match r {
            ValueRef::Input(i) => self
                .input_shapes
                .get(i)
                .cloned()
                .ok_or_else(|| bad(format!("node {at}: no graph input {i}"))),
            ValueRef::Const(i) => self
                .constants
                .get(i)
                .map(|t| t.dims().to_vec())
                .ok_or_else(|| bad(format!("node {at}: no constant {i}"))),
            ValueRef::Node(i) if i < at => nodes
                .get(i)
                .cloned()
                .ok_or_else(|| bad(format!("node {at}: no node {i}"))),
            ValueRef::Node(i) => Err(bad(format!(
                "node {at} reads node {i}, which does not come before it"
            ))),
        }
    }
}

/// A run of nodes (indices into [`Subgraph::nodes`]) a delegate takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Node indices, ascending.
    pub nodes: Vec<usize>,
}

/// A subgraph compiled for fixed input shapes, ready to execute.
pub trait CompiledSubgraph: Send + Sync + fmt::Debug {
    /// The only input shapes it accepts.
    fn input_shapes(&self) -> &[Vec<usize>];
    /// Run on host inputs of exactly [`CompiledSubgraph::input_shapes`];
    /// returns host tensors, one per [`Subgraph::outputs`]. Any other shape
    /// is an error: compile again for it.
    fn execute(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>>;
}

/// An NPU delegate: the seam where a vendor NPU stack (QNN, RKNN, Ethos-U
/// Vela, CoreML, ...) or the in-tree simulator plugs into edgeflow.
///
/// # Design
/// NPUs are not op-at-a-time devices. Their toolchains take a whole graph
/// with **static shapes**, decide which ops the accelerator can run
/// (**partition**), quantize and schedule those ops with representative
/// **calibration** inputs, and emit a binary for the exact shapes
/// (**compile**); execution then feeds inputs and reads outputs. The trait
/// mirrors those three steps so a vendor delegate maps onto its SDK one to
/// one (e.g. QNN: op validation / `graphFinalize` / `graphExecute`; RKNN:
/// `rknn.build(dataset=...)` / `rknn_run`) and keeps everything vendor
/// specific (op support tables, quantization schemes, binary caches) behind
/// it. What the delegate does not take stays on the CPU: the caller runs the
/// nodes outside every [`Partition`] there, so a model never needs to know
/// which ops its NPU has. Static shapes are part of the contract: a
/// [`CompiledSubgraph`] refuses other shapes, and the caller decides whether
/// a new shape is worth a recompile.
///
/// Eager model code (ops dispatched one by one through
/// [`edgeflow_runtime::Device`]) reaches the simulator through its
/// [`edgeflow_runtime::Backend`] implementation instead, which compiles each
/// op site lazily under the same constraints.
pub trait NpuDelegate: Send + Sync + fmt::Debug {
    /// Delegate name (e.g. `npu-sim:0`).
    fn delegate_name(&self) -> &str;

    /// Whether the accelerator runs node `node` of `graph` (op kind,
    /// attributes, dtypes, constant-ness of weights).
    fn supports_node(&self, graph: &Subgraph, node: usize) -> bool;

    /// The parts of `graph` this delegate takes. The default takes maximal
    /// runs of consecutive supported nodes (with nodes in topological order
    /// each run is a connected, compile-able region).
    fn partition(&self, graph: &Subgraph) -> Vec<Partition> {
        let mut parts = Vec::new();
        let mut cur = Vec::new();
        for i in 0..graph.nodes.len() {
            if self.supports_node(graph, i) {
                cur.push(i);
            } else if !cur.is_empty() {
                parts.push(Partition {
                    nodes: std::mem::take(&mut cur),
                });
            }
        }
        if !cur.is_empty() {
            parts.push(Partition { nodes: cur });
        }
        parts
    }

    /// Compile a whole graph (every node must be supported) for its
    /// [`Subgraph::input_shapes`], using `calibration` (each entry one set of
    /// graph inputs, host tensors of those shapes) to fix activation ranges.
    fn compile(
        &self,
        graph: &Subgraph,
        calibration: &[Vec<Tensor>],
    ) -> Result<Box<dyn CompiledSubgraph>>;
}

/// Host f32 values of a tensor.
fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    match t.storage() {
        Storage::Quantized(q) => Ok(q
            .dequantize(&candle_core::Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?),
        _ => t.to_vec_f32(),
    }
}

impl NpuDelegate for SimNpu {
    fn delegate_name(&self) -> &str {
        edgeflow_runtime::Backend::name(self)
    }

    fn supports_node(&self, graph: &Subgraph, node: usize) -> bool {
        let Some(n) = graph.nodes.get(node) else {
            return false;
        };
        let Some(kind) = Kind::of(&n.op) else {
            return false;
        };
        n.inputs.iter().enumerate().all(|(i, r)| {
            if kind.is_weight_input(i) {
                // AOT compilation needs weights known at compile time.
                matches!(r, ValueRef::Const(c) if graph.constants.get(*c).is_some_and(|t|
                    matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) || t.dtype().is_quantized()))
            } else {
                match r {
                    ValueRef::Const(c) => graph
                        .constants
                        .get(*c)
                        .is_some_and(|t| matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16)),
                    _ => true,
                }
            }
        })
    }

    fn compile(
        &self,
        graph: &Subgraph,
        calibration: &[Vec<Tensor>],
    ) -> Result<Box<dyn CompiledSubgraph>> {
        for i in 0..graph.nodes.len() {
            if !self.supports_node(graph, i) {
                return Err(Error::Unsupported {
                    backend: self.delegate_name().to_string(),
                    op: graph.nodes[i].op.name(),
                    msg: format!("node {i} is outside the simulated NPU's int8 op set; partition the graph first"),
                });
            }
        }
        let node_dims = graph.infer_dims()?;
        if calibration.is_empty() {
            return Err(Error::bad_input(
                "npu compile",
                "at least one calibration sample is needed to fix activation ranges",
            ));
        }
        let consts: Vec<Arc<Vec<f32>>> = graph
            .constants
            .iter()
            .map(|t| host_f32(t).map(Arc::new))
            .collect::<Result<_>>()?;
        let mut g = SimGraph {
            name: self.delegate_name().to_string(),
            graph: graph.clone(),
            node_dims,
            consts,
            input_q: vec![],
            node_q: vec![],
            const_q: vec![],
            weights: vec![None; graph.nodes.len()],
            book: self.book(),
            shadow: self.shadow_enabled(),
        };
        // Calibration: run in f32, observe every activation value.
        let mut in_obs = vec![RangeObserver::default(); graph.input_shapes.len()];
        let mut node_obs = vec![RangeObserver::default(); graph.nodes.len()];
        for sample in calibration {
            let inputs = g.check_inputs(&sample.iter().collect::<Vec<_>>())?;
            for (o, x) in in_obs.iter_mut().zip(&inputs) {
                o.observe(x);
            }
            let vals = g.run_f32(&inputs)?;
            for (o, v) in node_obs.iter_mut().zip(&vals) {
                o.observe(v);
            }
        }
        let scheme = self.scheme();
        g.const_q = g
            .consts
            .iter()
            .map(|c| {
                let mut o = RangeObserver::default();
                o.observe(c);
                o.qparams(scheme)
            })
            .collect();
        g.input_q = in_obs.iter().map(|o| o.qparams(scheme)).collect();
        for (i, n) in graph.nodes.iter().enumerate() {
            let kind =
                Kind::of(&n.op).ok_or_else(|| Error::bad_input("npu compile", "unsupported op"))?;
            let q = match (&kind, kind.fixed_output_q(scheme)) {
                (_, Some(q)) => q,
                // Reshape keeps its input's codes and parameters.
                (Kind::Reshape { .. }, None) => g.value_q(n.inputs[0])?,
                _ => node_obs[i].qparams(scheme),
            };
            g.node_q.push(q);
            if kind.is_weight_input(1) {
                if let Some(ValueRef::Const(c)) = n.inputs.get(1) {
                    let dims = graph.constants[*c].dims();
                    g.weights[i] = Some(Arc::new(QWeight::quantize(&g.consts[*c], dims)));
                }
            }
        }
        self.count_subgraph_compile();
        Ok(Box::new(g))
    }
}

/// A graph compiled by the simulator.
struct SimGraph {
    name: String,
    graph: Subgraph,
    node_dims: Vec<Vec<usize>>,
    consts: Vec<Arc<Vec<f32>>>,
    input_q: Vec<QParams>,
    node_q: Vec<QParams>,
    /// Per-tensor parameters of constants used as activations (own range).
    const_q: Vec<QParams>,
    weights: Vec<Option<Arc<QWeight>>>,
    book: Arc<Mutex<ErrorBook>>,
    shadow: bool,
}

impl fmt::Debug for SimGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimGraph")
            .field("backend", &self.name)
            .field("input_shapes", &self.graph.input_shapes)
            .field("nodes", &self.graph.nodes.len())
            .finish()
    }
}

impl SimGraph {
    fn check_inputs(&self, inputs: &[&Tensor]) -> Result<Vec<Vec<f32>>> {
        if inputs.len() != self.graph.input_shapes.len() {
            return Err(Error::bad_input(
                "npu execute",
                format!(
                    "expected {} inputs, got {}",
                    self.graph.input_shapes.len(),
                    inputs.len()
                ),
            ));
        }
        inputs
            .iter()
            .zip(&self.graph.input_shapes)
            .enumerate()
            .map(|(i, (t, s))| {
                if t.dims() != s.as_slice() {
                    return Err(Error::bad_input(
                        "npu execute",
                        format!(
                            "input {i} has shape {:?} but the graph was compiled for {s:?} \
                             (static shapes: compile again for the new shape)",
                            t.dims()
                        ),
                    ));
                }
                host_f32(t)
            })
            .collect()
    }

    fn value_q(&self, r: ValueRef) -> Result<QParams> {
        match r {
            ValueRef::Input(i) => self.input_q.get(i).copied(),
            ValueRef::Node(i) => self.node_q.get(i).copied(),
            ValueRef::Const(i) => self.const_q.get(i).copied(),
        }
        .ok_or_else(|| Error::bad_input("npu compile", "no quantization parameters for this value"))
    }

    fn dims_of(&self, r: ValueRef) -> &[usize] {
        match r {
            ValueRef::Input(i) => &self.graph.input_shapes[i],
            ValueRef::Const(i) => self.graph.constants[i].dims(),
            ValueRef::Node(i) => &self.node_dims[i],
        }
    }

    fn get<'a>(&'a self, r: ValueRef, inputs: &'a [Vec<f32>], vals: &'a [Vec<f32>]) -> &'a [f32] {
        match r {
            ValueRef::Input(i) => &inputs[i],
            ValueRef::Const(i) => &self.consts[i],
            ValueRef::Node(i) => &vals[i],
        }
    }

    /// Every node's value in f32.
    fn run_f32(&self, inputs: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
        let mut vals: Vec<Vec<f32>> = Vec::with_capacity(self.graph.nodes.len());
        for (i, n) in self.graph.nodes.iter().enumerate() {
            let kind = Kind::of(&n.op).ok_or_else(|| Error::bad_input("npu", "unsupported op"))?;
            let args: Vec<(&[f32], &[usize])> = n
                .inputs
                .iter()
                .map(|r| (self.get(*r, inputs, &vals), self.dims_of(*r)))
                .collect();
            let y = exec_f32(&kind, &args, &self.node_dims[i])?;
            vals.push(y);
        }
        Ok(vals)
    }
}

impl CompiledSubgraph for SimGraph {
    fn input_shapes(&self) -> &[Vec<usize>] {
        &self.graph.input_shapes
    }

    fn execute(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let raw = self.check_inputs(inputs)?;
        // Graph inputs enter the NPU as int8.
        let qin: Vec<Vec<f32>> = raw
            .iter()
            .zip(&self.input_q)
            .map(|(x, q)| q.fake_quantize(x))
            .collect();
        let shadow = if self.shadow {
            Some(self.run_f32(&raw)?)
        } else {
            None
        };
        let mut vals: Vec<Vec<f32>> = Vec::with_capacity(self.graph.nodes.len());
        for (i, n) in self.graph.nodes.iter().enumerate() {
            let kind = Kind::of(&n.op).ok_or_else(|| Error::bad_input("npu", "unsupported op"))?;
            let n_act = kind.activation_inputs();
            let mut acts = Vec::with_capacity(n_act);
            for r in n.inputs.iter().take(n_act) {
                let q = self.value_q(*r)?;
                acts.push(ActIn {
                    data: self.get(*r, &qin, &vals),
                    dims: self.dims_of(*r),
                    q,
                });
            }
            let bias = n
                .inputs
                .get(2)
                .filter(|_| kind.is_weight_input(2))
                .map(|r| self.get(*r, &qin, &vals));
            let y = exec_int8(
                &kind,
                &acts,
                self.weights[i].as_deref(),
                bias,
                self.node_q[i],
                &self.node_dims[i],
            )?;
            if let Some(sh) = &shadow {
                let args: Vec<(&[f32], &[usize])> = n
                    .inputs
                    .iter()
                    .map(|r| (self.get(*r, &qin, &vals), self.dims_of(*r)))
                    .collect();
                let local = exec_f32(&kind, &args, &self.node_dims[i])?;
                if let Ok(mut b) = self.book.lock() {
                    b.record(n.op.name(), &y, &local, &sh[i]);
                }
            }
            vals.push(y);
        }
        self.graph
            .outputs
            .iter()
            .map(|r| Tensor::from_vec(self.get(*r, &qin, &vals).to_vec(), self.dims_of(*r)))
            .collect()
    }
}
