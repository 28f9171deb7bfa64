//! The [`Backend`] trait that CPU, GPU and NPU implement.

use crate::{Op, Result, Tensor};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Kind of compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// Host CPU (candle kernels).
    Cpu,
    /// GPU through wgpu compute shaders.
    Gpu,
    /// NPU through a delegate (in-tree: the simulator).
    Npu,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
            DeviceKind::Npu => "npu",
        })
    }
}

/// A compute backend. Implementations live in the `edgeflow-backends` crate.
///
/// Contract:
/// - [`Backend::supports`] is exact: when it says yes, `execute` must give a
///   result within the op's documented tolerance, never an approximation of
///   a different op. When it says no, the [`crate::Device`] dispatcher moves
///   the inputs to the host, runs the op on the CPU backend and counts it.
/// - `execute` receives inputs already resident on this backend (the
///   dispatcher calls [`Backend::upload`] first).
pub trait Backend: Send + Sync + fmt::Debug {
    /// Short unique name, e.g. `cpu`, `gpu:0`, `npu-sim:0`.
    fn name(&self) -> &str;
    /// Which kind of device this is.
    fn kind(&self) -> DeviceKind;
    /// Human-readable adapter description (e.g. `llvmpipe (Vulkan)`).
    fn adapter(&self) -> String {
        self.name().to_string()
    }
    /// True for a software emulation of its kind (a GPU driver running on the
    /// CPU such as lavapipe, the NPU simulator): correct but not faster than
    /// the CPU backend, so `device: auto` never picks it.
    fn is_simulated(&self) -> bool {
        let a = self.adapter().to_ascii_lowercase();
        [
            "llvmpipe",
            "lavapipe",
            "swiftshader",
            "simulat",
            "devicetype::cpu",
            ", cpu)",
        ]
        .iter()
        .any(|s| a.contains(s))
    }
    /// Whether this backend runs `op` on these inputs natively.
    fn supports(&self, op: &Op, inputs: &[&Tensor]) -> bool;
    /// Whether `t` already lives on this backend.
    fn holds(&self, t: &Tensor) -> bool;
    /// Move a host tensor onto this backend (identity for the CPU).
    fn upload(&self, t: &Tensor) -> Result<Tensor>;
    /// Move a tensor of this backend to the host.
    fn download(&self, t: &Tensor) -> Result<Tensor>;
    /// Run one op on resident inputs.
    fn execute(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor>;
    /// Wait for queued work to finish (no-op for synchronous backends).
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    /// Called by [`crate::Device::place`] for a tensor this backend already
    /// holds (weights placed at load time): a chance to lay it out for the
    /// repeated reads weights get. Returns the tensor to use from then on:
    /// the same one, or the same values in a layout this backend's kernels
    /// read faster (which it then [`holds`](Backend::holds), runs every op
    /// on and [`download`](Backend::download)s back). The CPU backend asks
    /// the OS to back large weights with huge pages and packs block-quantized matrices
    /// into its kernels' tiles. The default returns `t` as it is.
    fn make_resident(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }
    /// Loading is over: a [`crate::weights::WeightStore`] that placed
    /// weights here was dropped, so the copies loading made on the way
    /// (file reads, stacked and repacked matrices) are free. The CPU
    /// backend hands the free memory back to the OS (glibc `malloc_trim`):
    /// the edgeflow binary keeps freed memory for reuse, which after a load
    /// would keep hundreds of MB of dead copies resident; and it starts
    /// moving the placed weights onto huge pages, which it holds back while
    /// a load runs. The default does nothing.
    fn release_load_memory(&self) {}
    /// Run `f`, which issues many ops in a row (a model's forward pass),
    /// where this backend issues them cheapest. The CPU backend runs it on
    /// one of its worker threads, so each op's parallel split joins on a
    /// worker instead of putting the calling thread to sleep and waking it
    /// once per op. The default calls `f` on the calling thread.
    fn run_batch(&self, f: &mut (dyn FnMut() + Send)) {
        f()
    }
    /// For a backend that computes in reduced precision and measures what
    /// that costs (the NPU simulator's int8 against its f32 shadow): the
    /// error of every op it has run so far. `None` for backends that
    /// compute in f32 or do not measure.
    fn precision_error(&self) -> Option<PrecisionError> {
        None
    }
}

/// What reduced precision cost on a backend ([`Backend::precision_error`]),
/// every op run so far taken together, each against its f32 value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrecisionError {
    /// Output elements compared.
    pub elements: u64,
    /// Signal-to-quantization-noise ratio in dB (higher is better; int8 is
    /// typically 30-45 dB per op).
    pub sqnr_db: f64,
    /// Largest error as a fraction of the output's range.
    pub max_err_over_range: f64,
}
