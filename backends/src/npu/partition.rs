//! [`PartitionedGraph`]: a captured graph split between an [`NpuDelegate`]
//! and the CPU — the delegate's partitions compiled for static shapes, every
//! other node run by a CPU backend.

use super::delegate::{CompiledSubgraph, Node, NpuDelegate, Partition, Subgraph, ValueRef};
use edgeflow_runtime::{Backend, Error, Result, Tensor};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

enum Segment {
    /// A compiled partition: its inputs (outer values) and the outer nodes
    /// its outputs stand for.
    Npu {
        compiled: Box<dyn CompiledSubgraph>,
        inputs: Vec<ValueRef>,
        outputs: Vec<usize>,
    },
    /// One node on the CPU.
    Cpu(usize),
}

/// A graph whose supported parts run on an NPU delegate and the rest on a
/// CPU backend, the way a stage's graph is deployed on a real NPU.
pub struct PartitionedGraph {
    graph: Subgraph,
    segments: Vec<Segment>,
    cpu: Arc<dyn Backend>,
    npu_nodes: usize,
}

impl fmt::Debug for PartitionedGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartitionedGraph")
            .field("nodes", &self.graph.nodes.len())
            .field("npu_nodes", &self.npu_nodes)
            .field("partitions", &self.partitions())
            .field("cpu", &self.cpu.name())
            .finish()
    }
}

/// Run every node of `graph` on `cpu` (f32); the value of each node.
fn run_on_cpu(graph: &Subgraph, cpu: &dyn Backend, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let mut vals: Vec<Tensor> = Vec::with_capacity(graph.nodes.len());
    for (i, n) in graph.nodes.iter().enumerate() {
        let args = gather(graph, &n.inputs, inputs, |j| vals.get(j).cloned(), i)?;
        let refs: Vec<&Tensor> = args.iter().collect();
        vals.push(cpu.execute(&n.op, &refs)?);
    }
    Ok(vals)
}

fn gather(
    graph: &Subgraph,
    refs: &[ValueRef],
    inputs: &[&Tensor],
    node: impl Fn(usize) -> Option<Tensor>,
    at: usize,
) -> Result<Vec<Tensor>> {
    refs.iter()
        .map(|r| {
            match r {
                ValueRef::Input(i) => inputs.get(*i).map(|t| (*t).clone()),
                ValueRef::Const(i) => graph.constants.get(*i).cloned(),
                ValueRef::Node(j) => node(*j),
            }
            .ok_or_else(|| {
                Error::bad_input(
                    "partitioned graph",
                    format!("node {at}: input {r:?} is not available"),
                )
            })
        })
        .collect()
}

impl PartitionedGraph {
    /// Partition `graph` with `delegate`, compile each partition for the
    /// static shapes of `calibration` (sets of graph inputs; the first fixes
    /// the shapes, all are used for ranges), and keep the rest for `cpu`.
    /// Partitions must be runs of consecutive nodes (the default
    /// [`NpuDelegate::partition`] gives that).
    pub fn build(
        graph: &Subgraph,
        delegate: &dyn NpuDelegate,
        cpu: Arc<dyn Backend>,
        calibration: &[Vec<Tensor>],
    ) -> Result<PartitionedGraph> {
        let first = calibration.first().ok_or_else(|| {
            Error::bad_input(
                "partitioned graph",
                "at least one calibration sample is needed",
            )
        })?;
        let mut graph = graph.clone();
        graph.input_shapes = first.iter().map(|t| t.dims().to_vec()).collect();
        // Every node's value on every calibration sample, in f32 on the CPU.
        let runs: Vec<Vec<Tensor>> = calibration
            .iter()
            .map(|s| run_on_cpu(&graph, cpu.as_ref(), &s.iter().collect::<Vec<_>>()))
            .collect::<Result<_>>()?;
        let dims_of = |r: ValueRef| -> Vec<usize> {
            match r {
                ValueRef::Input(i) => graph.input_shapes[i].clone(),
                ValueRef::Const(i) => graph.constants[i].dims().to_vec(),
                ValueRef::Node(j) => runs[0][j].dims().to_vec(),
            }
        };
        let parts = delegate.partition(&graph);
        let mut owner: HashMap<usize, usize> = HashMap::new();
        for (p, part) in parts.iter().enumerate() {
            let contiguous = part.nodes.windows(2).all(|w| w[1] == w[0] + 1);
            if !contiguous || part.nodes.is_empty() {
                return Err(Error::bad_input(
                    "partitioned graph",
                    format!(
                        "partition {p} {:?} is not a run of consecutive nodes",
                        part.nodes
                    ),
                ));
            }
            for &n in &part.nodes {
                owner.insert(n, p);
            }
        }
        let mut segments = Vec::new();
        let mut npu_nodes = 0;
        let mut i = 0;
        while i < graph.nodes.len() {
            let Some(&p) = owner.get(&i) else {
                segments.push(Segment::Cpu(i));
                i += 1;
                continue;
            };
            let part = &parts[p];
            let (sub, inputs, outputs) = extract(&graph, part, &dims_of)?;
            let calib: Vec<Vec<Tensor>> = runs
                .iter()
                .zip(calibration)
                .map(|(vals, sample)| {
                    let ins: Vec<&Tensor> = sample.iter().collect();
                    gather(&graph, &inputs, &ins, |j| vals.get(j).cloned(), i)
                })
                .collect::<Result<_>>()?;
            let compiled = delegate.compile(&sub, &calib)?;
            npu_nodes += part.nodes.len();
            i += part.nodes.len();
            segments.push(Segment::Npu {
                compiled,
                inputs,
                outputs,
            });
        }
        Ok(PartitionedGraph {
            graph,
            segments,
            cpu,
            npu_nodes,
        })
    }

    /// Nodes run by the delegate.
    pub fn npu_nodes(&self) -> usize {
        self.npu_nodes
    }

    /// Nodes run on the CPU.
    pub fn cpu_nodes(&self) -> usize {
        self.graph.nodes.len() - self.npu_nodes
    }

    /// Number of compiled partitions.
    pub fn partitions(&self) -> usize {
        self.segments
            .iter()
            .filter(|s| matches!(s, Segment::Npu { .. }))
            .count()
    }

    /// Run on host inputs of the compiled shapes; returns host tensors, one
    /// per [`Subgraph::outputs`].
    pub fn execute(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let mut vals: Vec<Option<Tensor>> = vec![None; self.graph.nodes.len()];
        for seg in &self.segments {
            match seg {
                Segment::Cpu(n) => {
                    let node = &self.graph.nodes[*n];
                    let args = gather(&self.graph, &node.inputs, inputs, |j| vals[j].clone(), *n)?;
                    let refs: Vec<&Tensor> = args.iter().collect();
                    vals[*n] = Some(self.cpu.execute(&node.op, &refs)?);
                }
                Segment::Npu {
                    compiled,
                    inputs: ins,
                    outputs,
                } => {
                    let args = gather(&self.graph, ins, inputs, |j| vals[j].clone(), usize::MAX)?;
                    let refs: Vec<&Tensor> = args.iter().collect();
                    let outs = compiled.execute(&refs)?;
                    for (node, t) in outputs.iter().zip(outs) {
                        vals[*node] = Some(t);
                    }
                }
            }
        }
        gather(
            &self.graph,
            &self.graph.outputs,
            inputs,
            |j| vals[j].clone(),
            usize::MAX,
        )
    }
}

/// The partition as a standalone subgraph: outside values it reads become its
/// inputs (returned, as outer refs), constants are copied, and the values
/// read outside it (or returned by the graph) become its outputs (returned,
/// as outer node indices).
fn extract(
    graph: &Subgraph,
    part: &Partition,
    dims_of: &dyn Fn(ValueRef) -> Vec<usize>,
) -> Result<(Subgraph, Vec<ValueRef>, Vec<usize>)> {
    let local: HashMap<usize, usize> = part
        .nodes
        .iter()
        .enumerate()
        .map(|(l, &n)| (n, l))
        .collect();
    let mut sub = Subgraph::default();
    let mut outer_inputs: Vec<ValueRef> = Vec::new();
    let mut consts: HashMap<usize, usize> = HashMap::new();
    for &n in &part.nodes {
        let node = graph
            .nodes
            .get(n)
            .ok_or_else(|| Error::bad_input("partition", format!("no node {n}")))?;
        let mut ins = Vec::with_capacity(node.inputs.len());
        for r in &node.inputs {
            ins.push(match r {
                ValueRef::Node(j) if local.contains_key(j) => ValueRef::Node(local[j]),
                ValueRef::Const(c) => {
                    let next = sub.constants.len();
                    let id = *consts.entry(*c).or_insert(next);
                    if id == next {
                        let t = graph.constants.get(*c).ok_or_else(|| {
                            Error::bad_input("partition", format!("no constant {c}"))
                        })?;
                        sub.constants.push(t.clone());
                    }
                    ValueRef::Const(id)
                }
                outer => {
                    let pos = match outer_inputs.iter().position(|o| o == outer) {
                        Some(p) => p,
                        None => {
                            outer_inputs.push(*outer);
                            sub.input_shapes.push(dims_of(*outer));
                            outer_inputs.len() - 1
                        }
                    };
                    ValueRef::Input(pos)
                }
            });
        }
        sub.nodes.push(Node {
            op: node.op.clone(),
            inputs: ins,
        });
    }
    let used_outside = |n: usize| {
        graph.outputs.contains(&ValueRef::Node(n))
            || graph.nodes.iter().enumerate().any(|(m, node)| {
                !local.contains_key(&m) && node.inputs.contains(&ValueRef::Node(n))
            })
    };
    let outputs: Vec<usize> = part
        .nodes
        .iter()
        .copied()
        .filter(|&n| used_outside(n))
        .collect();
    sub.outputs = outputs.iter().map(|n| ValueRef::Node(local[n])).collect();
    Ok((sub, outer_inputs, outputs))
}
