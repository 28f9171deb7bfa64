//! [`capture`]: record the ops that eager model code issues on a [`Device`]
//! into a [`Subgraph`], the form an [`super::NpuDelegate`] partitions and
//! compiles ahead of time.
//!
//! Model code is written once against the `Device` op API and runs eagerly
//! everywhere. To deploy a stage's graph on an NPU the way ExecuTorch or a
//! vendor SDK does (partition, compile for static shapes, execute), the
//! graph is captured by running that same code once on a recording device:
//! each op runs on the CPU (so the code sees real values and shapes) and is
//! appended as a [`Node`]; tensors the code passes in from outside (weights,
//! masks, tables) become constants, the capture's arguments become graph
//! inputs, and what the code returns becomes the graph's outputs.
//!
//! The recording device presents itself as an NPU placement whose tensors
//! live off the host, so code takes the same paths it takes on a real
//! accelerator: host-side shortcuts (such as the CPU's in-place KV cache)
//! see no host tensor and go through ops instead. What the code computes on
//! the host after reading a value back (`Device::to_host`) is not an op and
//! is not captured: such values enter the graph as constants, exactly as a
//! tracing compiler (`torch.export`, ExecuTorch) freezes Python-side logic.

use super::delegate::{Node, Subgraph, ValueRef};
use edgeflow_runtime::{
    Backend, Device, DeviceBuffer, DeviceKind, Error, Op, Result, Storage, Tensor,
};
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Name of the recording backend (its buffers report it).
const NAME: &str = "capture";

/// A value of the captured graph: its eager host value and its id.
#[derive(Debug)]
struct Value {
    host: Tensor,
    id: usize,
}

impl DeviceBuffer for Value {
    fn backend(&self) -> &str {
        NAME
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn size_bytes(&self) -> usize {
        self.host.size_bytes()
    }
}

/// Identity of a host tensor passed in from outside, so a weight used by
/// several ops becomes one constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum HostKey {
    Candle(edgeflow_runtime::candle_core::TensorId),
    Quantized(usize),
}

fn host_key(t: &Tensor) -> Option<HostKey> {
    match t.storage() {
        Storage::Host(c) => Some(HostKey::Candle(c.id())),
        Storage::Quantized(q) => Some(HostKey::Quantized(Arc::as_ptr(q) as *const () as usize)),
        Storage::Device(_) => None,
    }
}

#[derive(Debug, Default)]
struct State {
    refs: HashMap<usize, ValueRef>,
    uploaded: HashMap<HostKey, Tensor>,
    constants: Vec<Tensor>,
    nodes: Vec<Node>,
    next: usize,
}

/// The recording backend behind [`capture`].
#[derive(Debug)]
struct Recorder {
    cpu: Arc<dyn Backend>,
    state: Mutex<State>,
}

impl Recorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A recorder tensor standing for `v`, with eager value `host`.
    fn wrap(st: &mut State, host: Tensor, v: ValueRef) -> Tensor {
        let id = st.next;
        st.next += 1;
        st.refs.insert(id, v);
        let (dims, dtype) = (host.dims().to_vec(), host.dtype());
        Tensor::from_device(Arc::new(Value { host, id }), &dims, dtype)
    }

    fn value(t: &Tensor) -> Option<&Value> {
        match t.storage() {
            Storage::Device(b) => b.as_any().downcast_ref::<Value>(),
            _ => None,
        }
    }

    /// The graph value of `t`: its node, input or constant; a host tensor
    /// becomes a constant (once per tensor).
    fn reference(&self, st: &mut State, t: &Tensor) -> Result<(ValueRef, Tensor)> {
        if let Some(v) = Self::value(t) {
            let r = st.refs.get(&v.id).copied().ok_or_else(|| {
                Error::bad_input(
                    "capture",
                    "a tensor of another capture was passed to this one",
                )
            })?;
            return Ok((r, v.host.clone()));
        }
        if !t.is_host() {
            return Err(Error::bad_input(
                "capture",
                format!(
                    "a tensor on another device ({:?}) was passed in; bring weights to the host first",
                    t.dims()
                ),
            ));
        }
        let placed = self.constant(st, t);
        let r = Self::value(&placed)
            .and_then(|v| st.refs.get(&v.id).copied())
            .ok_or_else(|| Error::bad_input("capture", "constant lost"))?;
        Ok((r, t.clone()))
    }

    fn constant(&self, st: &mut State, t: &Tensor) -> Tensor {
        if let Some(k) = host_key(t) {
            if let Some(p) = st.uploaded.get(&k) {
                return p.clone();
            }
        }
        st.constants.push(t.clone());
        let r = ValueRef::Const(st.constants.len() - 1);
        let placed = Self::wrap(st, t.clone(), r);
        if let Some(k) = host_key(t) {
            st.uploaded.insert(k, placed.clone());
        }
        placed
    }
}

impl Backend for Recorder {
    fn name(&self) -> &str {
        NAME
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Npu
    }

    fn adapter(&self) -> String {
        "graph capture (records ops, runs them on the CPU)".into()
    }

    fn is_simulated(&self) -> bool {
        true
    }

    fn supports(&self, op: &Op, _inputs: &[&Tensor]) -> bool {
        // A fused SwiGLU or resampled snake is recorded as the ops it is
        // made of (narrow, silu, multiply; pads, convolutions, snake),
        // which the NPU delegates lower.
        !matches!(op, Op::SwiGlu | Op::ResampledSnake(_))
    }

    fn holds(&self, t: &Tensor) -> bool {
        Self::value(t).is_some()
    }

    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        let mut st = self.lock();
        Ok(self.constant(&mut st, t))
    }

    fn download(&self, t: &Tensor) -> Result<Tensor> {
        Self::value(t).map(|v| v.host.clone()).ok_or_else(|| {
            Error::bad_input(
                "capture",
                format!(
                    "a tensor on another device ({:?}) was passed in; bring it to the host first",
                    t.dims()
                ),
            )
        })
    }

    fn execute(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
        let mut st = self.lock();
        let mut refs = Vec::with_capacity(inputs.len());
        let mut hosts = Vec::with_capacity(inputs.len());
        for t in inputs {
            let (r, h) = self.reference(&mut st, t)?;
            refs.push(r);
            hosts.push(h);
        }
        let args: Vec<&Tensor> = hosts.iter().collect();
        let out = self.cpu.execute(op, &args)?;
        st.nodes.push(Node {
            op: op.clone(),
            inputs: refs,
        });
        let r = ValueRef::Node(st.nodes.len() - 1);
        Ok(Self::wrap(&mut st, out, r))
    }
}

/// Run `f` once on a recording device and return the graph of the ops it
/// issued: `inputs` (host tensors) are the graph's inputs, in order, with
/// their shapes as its static shapes; host tensors `f` uses (weights) are
/// its constants; the tensors `f` returns are its outputs. See the module
/// docs for what is and is not captured.
pub fn capture(
    inputs: &[Tensor],
    f: impl FnOnce(&Device, &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Subgraph> {
    let cpu = crate::cpu::cpu_backend();
    let rec = Arc::new(Recorder {
        cpu: cpu.clone(),
        state: Mutex::new(State::default()),
    });
    let dev = Device::new(rec.clone(), cpu);
    let mut args = Vec::with_capacity(inputs.len());
    {
        let mut st = rec.lock();
        for (i, t) in inputs.iter().enumerate() {
            if !t.is_host() {
                return Err(Error::bad_input(
                    "capture",
                    format!("input {i} is not a host tensor; download it first"),
                ));
            }
            args.push(Recorder::wrap(&mut st, t.clone(), ValueRef::Input(i)));
        }
    }
    let outs = f(&dev, &args)?;
    let mut st = rec.lock();
    let mut outputs = Vec::with_capacity(outs.len());
    for t in &outs {
        outputs.push(rec.reference(&mut st, t)?.0);
    }
    Ok(Subgraph {
        input_shapes: inputs.iter().map(|t| t.dims().to_vec()).collect(),
        constants: std::mem::take(&mut st.constants),
        nodes: std::mem::take(&mut st.nodes),
        outputs,
    })
}
