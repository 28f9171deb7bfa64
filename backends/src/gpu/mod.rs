//! GPU backend: wgpu compute shaders (Vulkan / Metal / DX12).
//!
//! Data lives on the GPU as [`GpuBuffer`]s of f32 (f16 and bf16 are widened
//! to f32 on upload; a download gives a host f32 tensor). Ops run as WGSL
//! compute kernels submitted without waiting, so the result of one op stays
//! on the GPU as the input of the next; only [`edgeflow_runtime::Backend::download`] (and
//! [`edgeflow_runtime::Backend::synchronize`]) wait for the GPU.
//!
//! Native ops: `MatMul` (batched, broadcast batch dims; register-blocked
//! 64x64 tiles in workgroup memory, or a GEMV kernel for <= 4 rows),
//! `Linear` (f32 weights, optional bias), every `Unary`, `Binary` with NumPy
//! broadcasting, `Affine`, `LeakyRelu`, `Snake`, `Softmax` and `Cumsum`
//! over any dim, `LayerNorm`, `RmsNorm`, `Attention` (grouped-query, additive mask,
//! causal), `Rope`, `Reduce` (sum/mean/max/min over any dim), `IndexSelect`
//! (host integer indices, range-checked), `Conv1d`, `ConvTranspose1d`,
//! `Conv2d` (stride, padding, dilation, groups), and the layout ops
//! `Reshape` (free: shares the buffer), `Permute`, `Narrow`, `Concat`, `Pad`
//! (zeros, reflect, replicate), `Gather` (host integer indices) and `Cast` to
//! f32. Everything else (`ArgMax`, casts to other dtypes, `RandNormal`), and any input this backend cannot hold (quantized weights,
//! integer tensors), makes [`edgeflow_runtime::Backend::supports`] say no, so the
//! [`edgeflow_runtime::Device`] dispatcher runs it on the CPU and counts it.
//!
//! Each kernel is compiled once per backend and cached. Dispatches larger
//! than `max_compute_workgroups_per_dimension` are folded into two
//! dimensions; tensors larger than the adapter's storage-binding limit are
//! not supported (they fall back).
//!
//! Without a GPU, Mesa's software Vulkan driver (lavapipe) provides an
//! adapter: `apt-get install mesa-vulkan-drivers libvulkan1`. `WGPU_BACKEND`
//! restricts which wgpu backends are searched.
//!
//! Speed: lavapipe proves correctness, not speed. On the 2-core build
//! machine (shared, noisy) `cargo test -p edgeflow-backends
//! gpu::tests::timings -- --ignored --nocapture` measured f32 matmul
//! 256^3 and 512^3 at 0.5-1 GFLOP/s against candle's 17-41 GFLOP/s on the
//! CPU, the 1x896x4864 GEMV in 54-150 ms (CPU 2.6-6.6 ms), and about
//! 100-300 us per queued small op. No real GPU was available to measure.

mod adapter;
mod buffer;
mod encode;
mod kernels;
mod op_plans;
mod pipeline;
mod plan;
mod planner;
#[cfg(test)]
mod tests;

pub use adapter::adapters;
use adapter::describe;
use buffer::any_gpu_buf;
pub use buffer::GpuBuffer;
use encode::Buffers;
use pipeline::{Kernel, Pipeline};
use plan::{is_float, Plan};

use edgeflow_runtime::{DType, DeviceKind, Error, Op, Result, Storage, Tensor};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// Distinguishes backend instances: two `GpuBackend`s opened on the same
/// adapter have separate wgpu devices whose buffers cannot be mixed.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The wgpu compute backend. Cheap to share behind an `Arc`; all methods
/// take `&self` and may be called from several threads.
pub struct GpuBackend {
    name: String,
    id: u64,
    info: wgpu::AdapterInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    pipelines: Mutex<HashMap<Kernel, Arc<Pipeline>>>,
    unbound: wgpu::Buffer,
    errors: Arc<Mutex<Vec<String>>>,
}

impl fmt::Debug for GpuBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuBackend")
            .field("name", &self.name)
            .field("adapter", &describe(&self.info))
            .finish()
    }
}

impl edgeflow_runtime::Backend for GpuBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }

    fn adapter(&self) -> String {
        describe(&self.info)
    }

    fn supports(&self, op: &Op, inputs: &[&Tensor]) -> bool {
        self.plan(op, inputs).is_some()
    }

    fn holds(&self, t: &Tensor) -> bool {
        self.gpu_buf(t).is_some()
    }

    /// Copies a float host tensor to the GPU as f32. Tensors the GPU cannot
    /// hold (quantized weights, integer tensors) stay on the host unchanged:
    /// the ops that use them fall back to the CPU, which reads them there.
    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        if self.holds(t) {
            return Ok(t.clone());
        }
        match t.storage() {
            Storage::Host(_) if matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) => {
                self.upload_host(t)
            }
            Storage::Host(_) | Storage::Quantized(_) => Ok(t.clone()),
            Storage::Device(b) => match any_gpu_buf(t) {
                Some(_) => self.upload_host(&self.download(t)?),
                None => Err(self.err(format!(
                    "cannot upload a tensor held by backend `{}`; move it to the host first",
                    b.backend()
                ))),
            },
        }
    }

    /// Reads any [`GpuBuffer`] back (this instance's or another's) as a
    /// host f32 tensor; host tensors are returned as they are.
    fn download(&self, t: &Tensor) -> Result<Tensor> {
        let Some(src) = any_gpu_buf(t) else {
            if t.is_host() {
                return Ok(t.clone());
            }
            return Err(self.err("download: tensor is held by another backend"));
        };
        let data = src.read().map_err(|e| self.err(e))?;
        self.check_errors("download")?;
        Tensor::from_vec(data, t.dims())
    }

    fn execute(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.plan(op, inputs).ok_or_else(|| Error::Unsupported {
            backend: self.name.clone(),
            op: op.name(),
            msg: "not supported on the GPU for these inputs (the Device dispatcher falls back \
                  to the CPU)"
                .into(),
        })?;
        // Float inputs as GPU tensors; integer inputs (indices, already
        // range-checked by the plan) as raw u32 buffers.
        let mut held: Vec<std::result::Result<Tensor, wgpu::Buffer>> = Vec::new();
        for t in inputs {
            held.push(if self.holds(t) {
                Ok((*t).clone())
            } else if is_float(t.dtype()) {
                Ok(self.upload(t)?)
            } else {
                Err(self.upload_indices(t)?)
            });
        }
        let mut bufs: Vec<&wgpu::Buffer> = Vec::with_capacity(held.len());
        for h in &held {
            bufs.push(match h {
                Ok(t) => {
                    &self
                        .gpu_buf(t)
                        .ok_or_else(|| self.err("internal: input not on the GPU after upload"))?
                        .buffer
                }
                Err(b) => b,
            });
        }
        match plan {
            Plan::Alias(dims) => match held.first().map(|h| h.as_ref().map(|t| t.storage())) {
                Some(Ok(Storage::Device(b))) => {
                    Ok(Tensor::from_device(b.clone(), &dims, DType::F32))
                }
                _ => Err(self.err("internal: alias of a tensor not on the GPU")),
            },
            Plan::Compute {
                dims,
                tmp,
                dispatches,
            } => {
                let n: usize = dims.iter().product();
                let out = self.alloc(n);
                let tmp: Vec<wgpu::Buffer> = tmp.iter().map(|&n| self.alloc(n)).collect();
                let bufs = Buffers {
                    inputs: &bufs,
                    tmp: &tmp,
                    out: &out,
                };
                let mut enc = self
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some(op.name()),
                    });
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some(op.name()),
                        timestamp_writes: None,
                    });
                    for d in &dispatches {
                        self.encode(&mut pass, d, &bufs)?;
                    }
                }
                self.queue.submit([enc.finish()]);
                self.check_errors(op.name())?;
                Ok(self.wrap(out, &dims))
            }
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.err(format!("waiting for the GPU: {e}")))?;
        self.check_errors("synchronize")
    }
}
