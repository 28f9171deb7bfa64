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

mod kernels;
#[cfg(test)]
mod tests;

use edgeflow_runtime::{
    BinaryOp, DType, DeviceBuffer, DeviceKind, Error, Op, PadMode, ReduceOp, Result, Storage,
    Tensor, UnaryOp,
};
use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use wgpu::util::DeviceExt;

/// What to install when no adapter is found.
const INSTALL_HINT: &str = "no GPU adapter found by wgpu (Vulkan, Metal or DX12). \
     Install a GPU driver, or on Linux without a GPU Mesa's software Vulkan driver: \
     `apt-get install mesa-vulkan-drivers libvulkan1`";

/// The wgpu backends to search: `WGPU_BACKEND` (e.g. `vulkan`, `metal`,
/// `dx12`) when set, else every compiled-in backend.
fn backends() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all())
}

/// A wgpu instance over `backends`.
fn instance(backends: wgpu::Backends) -> wgpu::Instance {
    quiet_wayland_probe();
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

/// Mesa's Vulkan device-select layer asks the Wayland compositor which GPU
/// drives the display. Without a session (`XDG_RUNTIME_DIR` unset, as on a
/// server or over ssh) libwayland prints "error: XDG_RUNTIME_DIR is invalid
/// or not set in the environment." on stderr, once per Vulkan instance,
/// then fails. In exactly that case, point `WAYLAND_DISPLAY` at an absolute
/// socket path that does not exist: the connection fails the same way, but
/// silently, and the layer orders the adapters as before. A reachable
/// session (a valid runtime dir, or `WAYLAND_DISPLAY` / `WAYLAND_SOCKET`
/// set) is left alone.
fn quiet_wayland_probe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR")
            .is_some_and(|d| std::path::Path::new(&d).is_absolute());
        let session = std::env::var_os("WAYLAND_DISPLAY").is_some()
            || std::env::var_os("WAYLAND_SOCKET").is_some();
        if cfg!(target_os = "linux") && !runtime_dir && !session {
            std::env::set_var("WAYLAND_DISPLAY", "/nonexistent/edgeflow-no-wayland-session");
        }
    });
}

/// One line per adapter: `name (backend, device type)`.
fn describe(info: &wgpu::AdapterInfo) -> String {
    format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type)
}

/// Lists the GPU adapters wgpu can see, in the order `gpu:N` indexes them.
///
/// Empty when there is none (no driver installed); see [`GpuBackend::new`]
/// for what to install. `WGPU_BACKEND` restricts the search.
pub fn adapters() -> Vec<String> {
    let b = backends();
    pollster::block_on(instance(b).enumerate_adapters(b))
        .iter()
        .map(|a| describe(&a.get_info()))
        .collect()
}

/// Distinguishes backend instances: two `GpuBackend`s opened on the same
/// adapter have separate wgpu devices whose buffers cannot be mixed.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A tensor's data resident on the GPU: a storage buffer of `len` f32s.
///
/// It keeps its device and queue, so any `GpuBackend` can read it back, but
/// only the instance that made it binds it to kernels; another instance
/// (even on the same adapter) re-uploads it through the host.
pub struct GpuBuffer {
    backend: String,
    owner: u64,
    device: wgpu::Device,
    queue: wgpu::Queue,
    buffer: wgpu::Buffer,
    len: usize,
}

impl GpuBuffer {
    /// Number of f32 elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The underlying wgpu buffer (at least 4 bytes even when empty).
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Copies the data back to the host, waiting for queued work.
    pub fn read(&self) -> std::result::Result<Vec<f32>, String> {
        let size = (self.len * 4) as u64;
        if size == 0 {
            return Ok(Vec::new());
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("edgeflow-readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("edgeflow-readback"),
            });
        enc.copy_buffer_to_buffer(&self.buffer, 0, &staging, 0, size);
        self.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| format!("waiting for the GPU: {e}"))?;
        rx.recv()
            .map_err(|_| "readback callback dropped".to_string())?
            .map_err(|e| format!("mapping the readback buffer: {e}"))?;
        let data: Vec<f32> = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| format!("reading the readback buffer: {e}"))?;
            bytemuck::cast_slice::<u8, f32>(&view).to_vec()
        };
        staging.unmap();
        Ok(data)
    }
}

impl fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuBuffer")
            .field("backend", &self.backend)
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceBuffer for GpuBuffer {
    fn backend(&self) -> &str {
        &self.backend
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn size_bytes(&self) -> usize {
        self.len * 4
    }
}

/// Which compiled kernel a dispatch uses (the pipeline cache key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kernel {
    Unary(UnaryOp),
    Affine,
    LeakyRelu,
    Binary(BinaryOp),
    Snake,
    Copy,
    MatMul,
    Gemv,
    Softmax,
    LayerNorm,
    RmsNorm,
    Conv1d,
    AttnSoftmax,
    Rope,
    Reduce,
    IndexSelect,
    ConvTranspose1d,
    Conv2d,
    Cumsum,
    Pad,
    Gather,
}

impl Kernel {
    fn source(self) -> String {
        match self {
            Kernel::Unary(u) => kernels::unary_src(kernels::unary_expr(u)),
            Kernel::Affine => kernels::unary_src(kernels::AFFINE_EXPR),
            Kernel::LeakyRelu => kernels::unary_src(kernels::LEAKY_RELU_EXPR),
            Kernel::Binary(b) => kernels::binary_src(kernels::binary_expr(b)),
            Kernel::Snake => kernels::binary_src(kernels::SNAKE_EXPR),
            Kernel::Copy => kernels::copy_src(),
            Kernel::MatMul => kernels::matmul_src(),
            Kernel::Gemv => kernels::gemv_src(),
            Kernel::Softmax => kernels::softmax_src(),
            Kernel::LayerNorm => kernels::layer_norm_src(),
            Kernel::RmsNorm => kernels::rms_norm_src(),
            Kernel::Conv1d => kernels::conv1d_src(),
            Kernel::AttnSoftmax => kernels::attn_softmax_src(),
            Kernel::Rope => kernels::rope_src(),
            Kernel::Reduce => kernels::reduce_src(),
            Kernel::IndexSelect => kernels::index_select_src(),
            Kernel::ConvTranspose1d => kernels::conv_transpose1d_src(),
            Kernel::Conv2d => kernels::conv2d_src(),
            Kernel::Cumsum => kernels::cumsum_src(),
            Kernel::Pad => kernels::pad_src(),
            Kernel::Gather => kernels::gather_src(),
        }
    }
}

/// A compiled kernel.
#[derive(Debug)]
struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

/// A buffer a dispatch binds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    /// Op input `i`.
    In(usize),
    /// Scratch buffer `i` of the plan.
    Tmp(usize),
    /// The op's output.
    Out,
    /// A 4-byte placeholder for an absent optional input.
    Unbound,
}

/// One kernel launch: its parameters (binding 0), the buffers it reads
/// (bindings 1..), the buffer it writes (the last binding), and how many
/// workgroups it needs.
#[derive(Debug)]
struct Dispatch {
    kernel: Kernel,
    params: Vec<u32>,
    inputs: Vec<Slot>,
    out: Slot,
    workgroups: u64,
}

/// How an op runs on this backend.
#[derive(Debug)]
enum Plan {
    /// The result shares input 0's buffer under new dims (reshape, cast to f32).
    Alias(Vec<usize>),
    /// Dispatches, in order, into a fresh zero-initialised output of `dims`,
    /// using zero-initialised scratch buffers of `tmp` elements each.
    Compute {
        dims: Vec<usize>,
        tmp: Vec<usize>,
        dispatches: Vec<Dispatch>,
    },
}

impl Plan {
    /// A plan without scratch buffers.
    fn simple(dims: Vec<usize>, dispatches: Vec<Dispatch>) -> Plan {
        Plan::Compute {
            dims,
            tmp: Vec::new(),
            dispatches,
        }
    }
}

/// A dispatch writing the op's output.
fn dispatch(kernel: Kernel, params: Vec<u32>, inputs: Vec<Slot>, workgroups: u64) -> Dispatch {
    Dispatch {
        kernel,
        params,
        inputs,
        out: Slot::Out,
        workgroups,
    }
}

/// `Slot::In(i)` when the op has an `i`-th input, else `Slot::Unbound`.
fn optional(inputs: &[&Tensor], i: usize) -> Slot {
    if i < inputs.len() {
        Slot::In(i)
    } else {
        Slot::Unbound
    }
}

/// The GPU buffer behind `t`, whichever `GpuBackend` made it.
fn any_gpu_buf(t: &Tensor) -> Option<&GpuBuffer> {
    match t.storage() {
        Storage::Device(b) => b.as_any().downcast_ref::<GpuBuffer>(),
        _ => None,
    }
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// The values of an integer host tensor in row-major order (`None`
/// otherwise or if one is negative).
fn host_indices(t: &Tensor) -> Option<Vec<usize>> {
    if !matches!(t.dtype(), DType::I64 | DType::I32 | DType::U8) {
        return None;
    }
    let c = t.as_candle()?.to_dtype(candle_core::DType::I64).ok()?;
    let v = c.flatten_all().ok()?.to_vec1::<i64>().ok()?;
    v.into_iter().map(|i| usize::try_from(i).ok()).collect()
}

/// Row-major contiguous strides.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// NumPy broadcast of two shapes, with the strides each input uses in the
/// output's index space (0 along broadcast dims). `None` if incompatible.
fn broadcast(a: &[usize], b: &[usize]) -> Option<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let r = a.len().max(b.len());
    let pa: Vec<usize> = std::iter::repeat_n(1, r - a.len())
        .chain(a.iter().copied())
        .collect();
    let pb: Vec<usize> = std::iter::repeat_n(1, r - b.len())
        .chain(b.iter().copied())
        .collect();
    let (sa, sb) = (strides(&pa), strides(&pb));
    let mut out = Vec::with_capacity(r);
    let mut ea = Vec::with_capacity(r);
    let mut eb = Vec::with_capacity(r);
    for i in 0..r {
        let d = if pa[i] == pb[i] || pb[i] == 1 {
            pa[i]
        } else if pa[i] == 1 {
            pb[i]
        } else {
            return None;
        };
        out.push(d);
        ea.push(if pa[i] == d { sa[i] } else { 0 });
        eb.push(if pb[i] == d { sb[i] } else { 0 });
    }
    Some((out, ea, eb))
}

/// Converts sizes to u32 kernel parameters; `None` if any does not fit.
fn u32s(v: impl IntoIterator<Item = usize>) -> Option<Vec<u32>> {
    v.into_iter().map(|x| u32::try_from(x).ok()).collect()
}

/// Workgroups for `n` elements at 256 threads each.
fn groups_for(n: usize) -> u64 {
    (n as u64).div_ceil(u64::from(kernels::WG))
}

/// A strided-copy dispatch of input `input` over the index space `dims`.
fn copy_dispatch(
    input: usize,
    dims: &[usize],
    in_off: usize,
    istr: &[usize],
    out_off: usize,
    ostr: &[usize],
) -> Option<Dispatch> {
    let n: usize = dims.iter().product();
    let mut p = vec![n, dims.len(), in_off, out_off];
    p.extend_from_slice(dims);
    p.extend_from_slice(istr);
    p.extend_from_slice(ostr);
    Some(dispatch(
        Kernel::Copy,
        u32s(p)?,
        vec![Slot::In(input)],
        groups_for(n),
    ))
}

fn f32_bits(v: f64) -> u32 {
    (v as f32).to_bits()
}

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

impl GpuBackend {
    /// Opens adapter `adapter_index` (as listed by [`adapters`]).
    ///
    /// Fails with [`Error::DeviceUnavailable`] when there is no such adapter
    /// (the reason says what to install) or the device cannot be opened.
    pub fn new(adapter_index: usize) -> Result<GpuBackend> {
        Self::open(backends(), adapter_index)
    }

    fn open(search: wgpu::Backends, adapter_index: usize) -> Result<GpuBackend> {
        let name = format!("gpu:{adapter_index}");
        let unavailable = |reason: String| Error::DeviceUnavailable {
            device: name.clone(),
            reason,
        };
        let mut list = pollster::block_on(instance(search).enumerate_adapters(search));
        if list.is_empty() {
            return Err(unavailable(INSTALL_HINT.to_string()));
        }
        if adapter_index >= list.len() {
            let names: Vec<String> = list.iter().map(|a| describe(&a.get_info())).collect();
            return Err(unavailable(format!(
                "only {} adapter(s) found: {}",
                list.len(),
                names.join("; ")
            )));
        }
        let adapter = list.swap_remove(adapter_index);
        let info = adapter.get_info();
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("edgeflow"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| unavailable(format!("{}: cannot open device: {e}", describe(&info))))?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let unbound = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("edgeflow-unbound-slot"),
            size: 4,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Ok(GpuBackend {
            name,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            info,
            device,
            queue,
            limits,
            pipelines: Mutex::default(),
            unbound,
            errors,
        })
    }

    /// The adapter's limits this backend's device was opened with.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    fn err(&self, msg: impl Into<String>) -> Error {
        Error::Backend {
            backend: self.name.clone(),
            msg: msg.into(),
        }
    }

    /// Turns any error wgpu reported since the last check into an `Err`.
    fn check_errors(&self, what: &str) -> Result<()> {
        let mut v = self
            .errors
            .lock()
            .map_err(|_| self.err("error log poisoned"))?;
        if v.is_empty() {
            return Ok(());
        }
        let msg = v.join("; ");
        v.clear();
        Err(self.err(format!("{what}: {msg}")))
    }

    /// Largest tensor (in f32 elements) a kernel can bind.
    fn max_elems(&self) -> usize {
        let bytes = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        usize::try_from(bytes / 4)
            .unwrap_or(usize::MAX)
            .min(u32::MAX as usize)
    }

    /// The compiled pipeline for `k`, compiling it on first use.
    fn pipeline(&self, k: Kernel) -> Result<Arc<Pipeline>> {
        let mut cache = self
            .pipelines
            .lock()
            .map_err(|_| self.err("pipeline cache poisoned"))?;
        if let Some(p) = cache.get(&k) {
            return Ok(p.clone());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("edgeflow-kernel"),
                source: wgpu::ShaderSource::Wgsl(k.source().into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("edgeflow-kernel"),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(self.err(format!("compiling kernel {k:?}: {e}")));
        }
        let layout = pipeline.get_bind_group_layout(0);
        let p = Arc::new(Pipeline { pipeline, layout });
        cache.insert(k, p.clone());
        Ok(p)
    }

    /// The GPU buffer behind `t`, if this backend instance holds it.
    fn gpu_buf<'a>(&self, t: &'a Tensor) -> Option<&'a GpuBuffer> {
        any_gpu_buf(t).filter(|b| b.owner == self.id)
    }

    fn alloc(&self, len: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("edgeflow-tensor"),
            size: (len.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    fn wrap(&self, buffer: wgpu::Buffer, dims: &[usize]) -> Tensor {
        let len = dims.iter().product();
        Tensor::from_device(
            Arc::new(GpuBuffer {
                backend: self.name.clone(),
                owner: self.id,
                device: self.device.clone(),
                queue: self.queue.clone(),
                buffer,
                len,
            }),
            dims,
            DType::F32,
        )
    }

    /// Whether `t` is a float tensor this backend holds or can upload.
    fn usable(&self, t: &Tensor) -> bool {
        let float = is_float(t.dtype());
        let here = match t.storage() {
            Storage::Host(_) => true,
            // Another GpuBackend's buffers come through the host.
            Storage::Device(_) => any_gpu_buf(t).is_some(),
            Storage::Quantized(_) => false,
        };
        float && here && t.elem_count() <= self.max_elems()
    }

    /// How `op` runs here, or `None` when it does not (the dispatcher falls back).
    fn plan(&self, op: &Op, inputs: &[&Tensor]) -> Option<Plan> {
        // Index inputs (input 1) are checked by their op's own plan.
        let is_index =
            |i: usize| i == 1 && matches!(op, Op::IndexSelect { .. } | Op::Gather { .. });
        if !inputs
            .iter()
            .enumerate()
            .all(|(i, t)| is_index(i) || self.usable(t))
        {
            return None;
        }
        let dims = |i: usize| inputs.get(i).map(|t| t.dims());
        let plan = match op {
            Op::Unary(u) => unary_plan(Kernel::Unary(*u), inputs, 0.0, 0.0)?,
            Op::Affine { mul, add } => unary_plan(Kernel::Affine, inputs, *mul, *add)?,
            Op::LeakyRelu { slope } => unary_plan(Kernel::LeakyRelu, inputs, *slope, 0.0)?,
            Op::Binary(b) => {
                let [a, bb] = inputs else { return None };
                binary_plan(Kernel::Binary(*b), a.dims(), bb.dims())?
            }
            Op::Snake => {
                let [x, alpha] = inputs else { return None };
                let &[_, c, _] = x.dims() else { return None };
                if alpha.elem_count() != c {
                    return None;
                }
                binary_plan(Kernel::Snake, x.dims(), &[c, 1])?
            }
            Op::MatMul => {
                let [a, b] = inputs else { return None };
                matmul_plan(a.dims(), b.dims())?
            }
            Op::Linear => linear_plan(inputs)?,
            Op::Softmax { dim } => {
                let [x] = inputs else { return None };
                let xd = x.dims();
                if *dim >= xd.len() || xd[*dim] == 0 {
                    return None;
                }
                let inner: usize = xd[dim + 1..].iter().product();
                let rows = x.elem_count() / xd[*dim];
                let p = u32s([rows, xd[*dim], inner])?;
                let d = dispatch(Kernel::Softmax, p, vec![Slot::In(0)], rows as u64);
                Plan::simple(xd.to_vec(), vec![d])
            }
            Op::Cumsum { dim } => {
                let [x] = inputs else { return None };
                let xd = x.dims();
                if *dim >= xd.len() || xd[*dim] == 0 {
                    return None;
                }
                let inner: usize = xd[dim + 1..].iter().product();
                let lines = x.elem_count() / xd[*dim];
                let p = u32s([lines, xd[*dim], inner])?;
                let d = dispatch(Kernel::Cumsum, p, vec![Slot::In(0)], groups_for(lines));
                Plan::simple(xd.to_vec(), vec![d])
            }
            Op::LayerNorm { eps } => {
                let x = dims(0)?;
                let d = *x.last()?;
                let ok = |i: usize| inputs.get(i).is_none_or(|t| t.elem_count() == d);
                if !(2..=3).contains(&inputs.len()) || !ok(1) || !ok(2) {
                    return None;
                }
                let has_beta = u32::from(inputs.len() == 3);
                row_plan(
                    Kernel::LayerNorm,
                    x,
                    vec![f32_bits(*eps), has_beta],
                    vec![Slot::In(0), Slot::In(1), optional(inputs, 2)],
                )?
            }
            Op::RmsNorm { eps } => {
                let x = dims(0)?;
                let d = *x.last()?;
                if inputs.len() != 2 || inputs[1].elem_count() != d {
                    return None;
                }
                row_plan(
                    Kernel::RmsNorm,
                    x,
                    vec![f32_bits(*eps)],
                    vec![Slot::In(0), Slot::In(1)],
                )?
            }
            Op::Conv1d {
                stride,
                padding,
                dilation,
                groups,
            } => conv1d_plan(inputs, *stride, *padding, *dilation, *groups)?,
            Op::Reshape { shape } => {
                if inputs.len() != 1 || shape.iter().product::<usize>() != inputs[0].elem_count() {
                    return None;
                }
                Plan::Alias(shape.clone())
            }
            Op::Cast { dtype: DType::F32 } if inputs.len() == 1 => {
                Plan::Alias(inputs[0].dims().to_vec())
            }
            Op::Permute { dims: perm } => {
                let x = dims(0)?;
                if inputs.len() != 1 || perm.len() != x.len() {
                    return None;
                }
                let mut seen = vec![false; x.len()];
                for &d in perm {
                    if d >= x.len() || std::mem::replace(&mut seen[d], true) {
                        return None;
                    }
                }
                let s = strides(x);
                let out: Vec<usize> = perm.iter().map(|&d| x[d]).collect();
                let istr: Vec<usize> = perm.iter().map(|&d| s[d]).collect();
                let d = copy_dispatch(0, &out, 0, &istr, 0, &strides(&out))?;
                Plan::simple(out, vec![d])
            }
            Op::Narrow { dim, start, len } => {
                let x = dims(0)?;
                if inputs.len() != 1 || *dim >= x.len() || start.checked_add(*len)? > x[*dim] {
                    return None;
                }
                let s = strides(x);
                let mut out = x.to_vec();
                out[*dim] = *len;
                let d = copy_dispatch(0, &out, start * s[*dim], &s, 0, &strides(&out))?;
                Plan::simple(out, vec![d])
            }
            Op::Concat { dim } => {
                let first = dims(0)?;
                if *dim >= first.len() {
                    return None;
                }
                let mut out = first.to_vec();
                out[*dim] = 0;
                for t in inputs {
                    let d = t.dims();
                    if d.len() != first.len() || (0..d.len()).any(|i| i != *dim && d[i] != first[i])
                    {
                        return None;
                    }
                    out[*dim] += d[*dim];
                }
                let ostr = strides(&out);
                let mut at = 0;
                let mut ds = Vec::with_capacity(inputs.len());
                for (i, t) in inputs.iter().enumerate() {
                    let d = t.dims();
                    if t.elem_count() > 0 {
                        ds.push(copy_dispatch(i, d, 0, &strides(d), at * ostr[*dim], &ostr)?);
                    }
                    at += d[*dim];
                }
                Plan::simple(out, ds)
            }
            Op::Pad {
                dim,
                before,
                after,
                mode: PadMode::Zeros,
            } => {
                let x = dims(0)?;
                if inputs.len() != 1 || *dim >= x.len() {
                    return None;
                }
                let mut out = x.to_vec();
                out[*dim] = x[*dim].checked_add(*before)?.checked_add(*after)?;
                let ostr = strides(&out);
                let d = copy_dispatch(0, x, 0, &strides(x), before * ostr[*dim], &ostr)?;
                Plan::simple(out, vec![d])
            }
            Op::Pad {
                dim,
                before,
                after,
                mode,
            } => {
                let [x] = inputs else { return None };
                let xd = x.dims();
                let n = *xd.get(*dim)?;
                let code = match mode {
                    PadMode::Reflect if *before < n && *after < n => 0,
                    PadMode::Replicate if n > 0 => 1,
                    _ => return None,
                };
                let inner: usize = xd[dim + 1..].iter().product();
                let mut out = xd.to_vec();
                out[*dim] = n.checked_add(*before)?.checked_add(*after)?;
                let total: usize = out.iter().product();
                let p = u32s([total, out[*dim], n, inner, *before, code])?;
                let d = dispatch(Kernel::Pad, p, vec![Slot::In(0)], groups_for(total));
                Plan::simple(out, vec![d])
            }
            Op::Gather { dim } => {
                let [x, idx] = inputs else { return None };
                let (xd, id) = (x.dims(), idx.dims());
                if *dim >= xd.len()
                    || id.len() != xd.len()
                    || (0..xd.len()).any(|d| d != *dim && id[d] != xd[d])
                {
                    return None;
                }
                if host_indices(idx)?.iter().any(|&i| i >= xd[*dim]) {
                    return None;
                }
                let n = idx.elem_count();
                let mut p = vec![n, xd.len(), *dim];
                p.extend_from_slice(id);
                p.extend(strides(xd));
                let ins = vec![Slot::In(0), Slot::In(1)];
                let d = dispatch(Kernel::Gather, u32s(p)?, ins, groups_for(n));
                Plan::simple(id.to_vec(), vec![d])
            }
            Op::Attention { scale, causal } => attention_plan(inputs, *scale, *causal)?,
            Op::Rope { interleaved } => {
                let [x, cos, sin] = inputs else { return None };
                let &[_, _, s, d] = x.dims() else { return None };
                if d % 2 != 0 || cos.dims() != [s, d / 2] || sin.dims() != [s, d / 2] {
                    return None;
                }
                let n = x.elem_count();
                let p = u32s([n, s, d, usize::from(*interleaved)])?;
                let ins = vec![Slot::In(0), Slot::In(1), Slot::In(2)];
                let d = dispatch(Kernel::Rope, p, ins, groups_for(n));
                Plan::simple(x.dims().to_vec(), vec![d])
            }
            Op::Reduce { op, dim, keepdim } => {
                let code = match op {
                    ReduceOp::Sum => 0,
                    ReduceOp::Mean => 1,
                    ReduceOp::Max => 2,
                    ReduceOp::Min => 3,
                    ReduceOp::ArgMax => return None,
                };
                let [x] = inputs else { return None };
                let xd = x.dims();
                if *dim >= xd.len() || xd[*dim] == 0 {
                    return None;
                }
                let inner: usize = xd[dim + 1..].iter().product();
                let mut out = xd.to_vec();
                if *keepdim {
                    out[*dim] = 1;
                } else {
                    out.remove(*dim);
                }
                let n: usize = out.iter().product();
                let p = u32s([n, xd[*dim], inner, code])?;
                let d = dispatch(Kernel::Reduce, p, vec![Slot::In(0)], groups_for(n));
                Plan::simple(out, vec![d])
            }
            Op::IndexSelect { dim } => {
                let [x, idx] = inputs else { return None };
                let xd = x.dims();
                if *dim >= xd.len() {
                    return None;
                }
                if idx.rank() != 1 {
                    return None;
                }
                let v = host_indices(idx)?;
                if v.iter().any(|&i| i >= xd[*dim]) {
                    return None;
                }
                let inner: usize = xd[dim + 1..].iter().product();
                let mut out = xd.to_vec();
                out[*dim] = v.len();
                let n: usize = out.iter().product();
                let p = u32s([n, xd[*dim], inner.max(1), v.len()])?;
                let ins = vec![Slot::In(0), Slot::In(1)];
                let d = dispatch(Kernel::IndexSelect, p, ins, groups_for(n));
                Plan::simple(out, vec![d])
            }
            Op::ConvTranspose1d {
                stride,
                padding,
                output_padding,
                dilation,
                groups,
            } => conv_transpose1d_plan(
                inputs,
                *stride,
                *padding,
                *output_padding,
                *dilation,
                *groups,
            )?,
            Op::Conv2d {
                stride,
                padding,
                dilation,
                groups,
            } => conv2d_plan(inputs, *stride, *padding, *dilation, *groups)?,
            _ => return None,
        };
        if let Plan::Compute { dims, tmp, .. } = &plan {
            let max = self.max_elems();
            if dims.iter().product::<usize>() > max || tmp.iter().any(|&n| n > max) {
                return None;
            }
        }
        Some(plan)
    }

    /// Host f32 data of `t` as a new GPU buffer.
    fn upload_host(&self, t: &Tensor) -> Result<Tensor> {
        let data = t.to_vec_f32()?;
        if data.len() > self.max_elems() {
            return Err(self.err(format!(
                "tensor of {} elements exceeds the adapter's storage buffer limit",
                data.len()
            )));
        }
        let contents: &[u8] = if data.is_empty() {
            &[0u8; 4]
        } else {
            bytemuck::cast_slice(&data)
        };
        let buffer = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("edgeflow-tensor"),
                contents,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            });
        self.check_errors("upload")?;
        Ok(self.wrap(buffer, t.dims()))
    }

    /// Integer indices (validated by the plan) as a u32 GPU buffer.
    fn upload_indices(&self, t: &Tensor) -> Result<wgpu::Buffer> {
        let idx = host_indices(t).ok_or_else(|| self.err("indices must be a 1-D host tensor"))?;
        let data = u32s(idx).ok_or_else(|| self.err("index does not fit in u32"))?;
        let contents: &[u8] = if data.is_empty() {
            &[0u8; 4]
        } else {
            bytemuck::cast_slice(&data)
        };
        let buffer = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("edgeflow-indices"),
                contents,
                usage: wgpu::BufferUsages::STORAGE,
            });
        self.check_errors("upload indices")?;
        Ok(buffer)
    }

    /// Records one dispatch into `pass`.
    fn encode(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        d: &Dispatch,
        bufs: &Buffers<'_>,
    ) -> Result<()> {
        if d.workgroups == 0 {
            return Ok(());
        }
        let pipe = self.pipeline(d.kernel)?;
        let params = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("edgeflow-params"),
                contents: bytemuck::cast_slice(&d.params),
                usage: wgpu::BufferUsages::STORAGE,
            });
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: params.as_entire_binding(),
        }];
        for (i, slot) in d.inputs.iter().chain([&d.out]).enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: bufs.get(*slot, &self.unbound)?.as_entire_binding(),
            });
        }
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("edgeflow-bind"),
            layout: &pipe.layout,
            entries: &entries,
        });
        let max = u64::from(self.limits.max_compute_workgroups_per_dimension.max(1));
        let x = d.workgroups.min(max);
        let y = d.workgroups.div_ceil(x);
        if y > max {
            return Err(self.err(format!(
                "{} workgroups exceed the adapter's dispatch limit",
                d.workgroups
            )));
        }
        pass.set_pipeline(&pipe.pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(x as u32, y as u32, 1);
        Ok(())
    }
}

/// The buffers of one op's execution, by [`Slot`].
struct Buffers<'a> {
    inputs: &'a [&'a wgpu::Buffer],
    tmp: &'a [wgpu::Buffer],
    out: &'a wgpu::Buffer,
}

impl Buffers<'_> {
    fn get<'b>(&'b self, slot: Slot, unbound: &'b wgpu::Buffer) -> Result<&'b wgpu::Buffer> {
        let found = match slot {
            Slot::In(i) => self.inputs.get(i).copied(),
            Slot::Tmp(i) => self.tmp.get(i),
            Slot::Out => Some(self.out),
            Slot::Unbound => Some(unbound),
        };
        found.ok_or_else(|| Error::Backend {
            backend: "gpu".into(),
            msg: format!("internal: no buffer for {slot:?}"),
        })
    }
}

fn unary_plan(kernel: Kernel, inputs: &[&Tensor], c0: f64, c1: f64) -> Option<Plan> {
    let [x] = inputs else { return None };
    let n = x.elem_count();
    let params = vec![u32::try_from(n).ok()?, f32_bits(c0), f32_bits(c1)];
    Some(Plan::simple(
        x.dims().to_vec(),
        vec![dispatch(kernel, params, vec![Slot::In(0)], groups_for(n))],
    ))
}

fn binary_plan(kernel: Kernel, a: &[usize], b: &[usize]) -> Option<Plan> {
    let (out, sa, sb) = broadcast(a, b)?;
    let n: usize = out.iter().product();
    let mut p = vec![n, out.len()];
    p.extend_from_slice(&out);
    p.extend_from_slice(&sa);
    p.extend_from_slice(&sb);
    let d = dispatch(
        kernel,
        u32s(p)?,
        vec![Slot::In(0), Slot::In(1)],
        groups_for(n),
    );
    Some(Plan::simple(out, vec![d]))
}

/// Matmul dispatch (see [`kernels::matmul_src`] for the params): the GEMV
/// kernel for few rows, the register-blocked tiled kernel otherwise.
#[allow(clippy::too_many_arguments)]
fn matmul_dispatch(
    m: usize,
    n: usize,
    k: usize,
    a_rs_cs: (usize, usize),
    b_rs_cs: (usize, usize),
    batch: (&[usize], &[usize], &[usize]),
    operands: [Slot; 3],
) -> Option<Dispatch> {
    let tile = kernels::TILE as usize;
    let (tn, tm) = (n.div_ceil(tile), m.div_ceil(tile));
    let nb: usize = batch.0.iter().product();
    let mut p = vec![
        m,
        n,
        k,
        tn,
        tm,
        nb,
        a_rs_cs.0,
        a_rs_cs.1,
        b_rs_cs.0,
        b_rs_cs.1,
        usize::from(operands[2] != Slot::Unbound),
        batch.0.len(),
    ];
    p.extend_from_slice(batch.0);
    p.extend_from_slice(batch.1);
    p.extend_from_slice(batch.2);
    let (kernel, workgroups) = if m <= kernels::GEMV_MAX_ROWS {
        (Kernel::Gemv, (m as u64) * (n as u64) * (nb as u64))
    } else {
        (Kernel::MatMul, (tn as u64) * (tm as u64) * (nb as u64))
    };
    Some(dispatch(kernel, u32s(p)?, operands.to_vec(), workgroups))
}

fn matmul_plan(a: &[usize], b: &[usize]) -> Option<Plan> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
    let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
    if k != k2 {
        return None;
    }
    let (ba, bb) = (&a[..a.len() - 2], &b[..b.len() - 2]);
    let (bdims, mut sa, mut sb) = broadcast(ba, bb)?;
    // Batch strides in elements of whole matrices.
    sa.iter_mut().for_each(|s| *s *= m * k);
    sb.iter_mut().for_each(|s| *s *= k * n);
    let operands = [Slot::In(0), Slot::In(1), Slot::Unbound];
    let d = matmul_dispatch(m, n, k, (k, 1), (n, 1), (&bdims, &sa, &sb), operands)?;
    let mut out = bdims;
    out.extend([m, n]);
    Some(Plan::simple(out, vec![d]))
}

fn linear_plan(inputs: &[&Tensor]) -> Option<Plan> {
    if !(2..=3).contains(&inputs.len()) {
        return None;
    }
    let x = inputs[0].dims();
    let &[n, k] = inputs[1].dims() else {
        return None;
    };
    if x.last() != Some(&k) || inputs.get(2).is_some_and(|b| b.elem_count() != n) {
        return None;
    }
    let m: usize = x[..x.len() - 1].iter().product();
    let operands = [Slot::In(0), Slot::In(1), optional(inputs, 2)];
    let d = matmul_dispatch(m, n, k, (k, 1), (1, k), (&[], &[], &[]), operands)?;
    let mut out = x[..x.len() - 1].to_vec();
    out.push(n);
    Some(Plan::simple(out, vec![d]))
}

fn row_plan(kernel: Kernel, x: &[usize], extra: Vec<u32>, inputs: Vec<Slot>) -> Option<Plan> {
    let cols = *x.last()?;
    let rows: usize = x[..x.len() - 1].iter().product();
    if cols == 0 {
        return None;
    }
    let mut params = u32s([rows, cols])?;
    params.extend(extra);
    Some(Plan::simple(
        x.to_vec(),
        vec![dispatch(kernel, params, inputs, rows as u64)],
    ))
}

fn conv1d_plan(
    inputs: &[&Tensor],
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
) -> Option<Plan> {
    if !(2..=3).contains(&inputs.len()) || stride == 0 || dilation == 0 || groups == 0 {
        return None;
    }
    let &[b, c_in, l] = inputs[0].dims() else {
        return None;
    };
    let &[c_out, cin_g, k] = inputs[1].dims() else {
        return None;
    };
    if c_in % groups != 0 || c_out % groups != 0 || cin_g != c_in / groups || k == 0 {
        return None;
    }
    if inputs.get(2).is_some_and(|t| t.elem_count() != c_out) {
        return None;
    }
    let span = dilation.checked_mul(k - 1)?.checked_add(1)?;
    let padded = l.checked_add(padding.checked_mul(2)?)?;
    if padded < span {
        return None;
    }
    let l_out = (padded - span) / stride + 1;
    let n = b * c_out * l_out;
    // The kernel computes positions in i32.
    if padded.checked_add(stride.checked_mul(l_out)?)? > i32::MAX as usize {
        return None;
    }
    let bias = optional(inputs, 2);
    let p = u32s([
        n,
        c_in,
        l,
        c_out,
        k,
        l_out,
        stride,
        padding,
        dilation,
        groups,
        usize::from(bias != Slot::Unbound),
    ])?;
    let d = dispatch(
        Kernel::Conv1d,
        p,
        vec![Slot::In(0), Slot::In(1), bias],
        groups_for(n),
    );
    Some(Plan::simple(vec![b, c_out, l_out], vec![d]))
}

/// Scaled dot-product attention as three dispatches: scores = q k^T
/// (query heads grouped over their kv head), masked softmax in place, then
/// probabilities @ v. The scores live in one scratch buffer.
fn attention_plan(inputs: &[&Tensor], scale: f64, causal: bool) -> Option<Plan> {
    if !(3..=4).contains(&inputs.len()) {
        return None;
    }
    let &[b, h, s, d] = inputs[0].dims() else {
        return None;
    };
    let &[kb, hk, t, kd] = inputs[1].dims() else {
        return None;
    };
    let &[vb, vh, vt, dv] = inputs[2].dims() else {
        return None;
    };
    if kb != b || vb != b || kd != d || vh != hk || vt != t || hk == 0 || h % hk != 0 {
        return None;
    }
    if causal && s > t {
        return None;
    }
    let rep = h / hk;
    // Mask strides in the [b, h, s, t] index space.
    let (has_mask, ms) = match inputs.get(3) {
        Some(m) => {
            let (out, ms, _) = broadcast(m.dims(), &[b, h, s, t])?;
            if out != [b, h, s, t] {
                return None;
            }
            (1, ms)
        }
        None => (0, vec![0; 4]),
    };
    let rows = b * h * s;
    let bdims = [b, hk, rep];
    let qk = matmul_dispatch(
        s,
        t,
        d,
        (d, 1),
        (1, d),
        (
            &bdims,
            &[h * s * d, rep * s * d, s * d],
            &[hk * t * d, t * d, 0],
        ),
        [Slot::In(0), Slot::In(1), Slot::Unbound],
    )?;
    let qk = Dispatch {
        out: Slot::Tmp(0),
        ..qk
    };
    let mut p = u32s([rows, t])?;
    p.push(f32_bits(scale));
    p.extend(u32s([
        usize::from(causal),
        s,
        t.saturating_sub(s),
        has_mask,
        h,
        ms[0],
        ms[1],
        ms[2],
        ms[3],
    ])?);
    let mask = if has_mask == 1 {
        Slot::In(3)
    } else {
        Slot::Unbound
    };
    let sm = Dispatch {
        kernel: Kernel::AttnSoftmax,
        params: p,
        inputs: vec![mask],
        out: Slot::Tmp(0),
        workgroups: rows as u64,
    };
    let pv = matmul_dispatch(
        s,
        dv,
        t,
        (t, 1),
        (dv, 1),
        (
            &bdims,
            &[h * s * t, rep * s * t, s * t],
            &[hk * t * dv, t * dv, 0],
        ),
        [Slot::Tmp(0), Slot::In(2), Slot::Unbound],
    )?;
    Some(Plan::Compute {
        dims: vec![b, h, s, dv],
        tmp: vec![rows * t],
        dispatches: vec![qk, sm, pv],
    })
}

fn conv_transpose1d_plan(
    inputs: &[&Tensor],
    stride: usize,
    padding: usize,
    output_padding: usize,
    dilation: usize,
    groups: usize,
) -> Option<Plan> {
    if !(2..=3).contains(&inputs.len()) || stride == 0 || dilation == 0 || groups == 0 {
        return None;
    }
    let &[b, c_in, l] = inputs[0].dims() else {
        return None;
    };
    let &[wc_in, cout_g, k] = inputs[1].dims() else {
        return None;
    };
    if wc_in != c_in
        || c_in % groups != 0
        || k == 0
        || l == 0
        || output_padding >= stride.max(dilation)
    {
        return None;
    }
    let c_out = cout_g * groups;
    if inputs.get(2).is_some_and(|t| t.elem_count() != c_out) {
        return None;
    }
    let full = (l - 1)
        .checked_mul(stride)?
        .checked_add(dilation.checked_mul(k - 1)?)?
        .checked_add(output_padding)?
        .checked_add(1)?;
    let l_out = full.checked_sub(padding.checked_mul(2)?)?;
    if l_out == 0 || full.checked_add(padding)? > i32::MAX as usize {
        return None;
    }
    let n = b * c_out * l_out;
    let bias = optional(inputs, 2);
    let p = u32s([
        n,
        c_in,
        l,
        c_out,
        k,
        l_out,
        stride,
        padding,
        dilation,
        groups,
        usize::from(bias != Slot::Unbound),
    ])?;
    let d = dispatch(
        Kernel::ConvTranspose1d,
        p,
        vec![Slot::In(0), Slot::In(1), bias],
        groups_for(n),
    );
    Some(Plan::simple(vec![b, c_out, l_out], vec![d]))
}

fn conv2d_plan(
    inputs: &[&Tensor],
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
) -> Option<Plan> {
    if !(2..=3).contains(&inputs.len()) || stride == 0 || dilation == 0 || groups == 0 {
        return None;
    }
    let &[b, c_in, h, w] = inputs[0].dims() else {
        return None;
    };
    let &[c_out, cin_g, kh, kw] = inputs[1].dims() else {
        return None;
    };
    if c_in % groups != 0 || c_out % groups != 0 || cin_g != c_in / groups || kh == 0 || kw == 0 {
        return None;
    }
    if inputs.get(2).is_some_and(|t| t.elem_count() != c_out) {
        return None;
    }
    let out_len = |len: usize, k: usize| -> Option<usize> {
        let span = dilation.checked_mul(k - 1)?.checked_add(1)?;
        let padded = len.checked_add(padding.checked_mul(2)?)?;
        if padded < span || padded > i32::MAX as usize / 2 {
            return None;
        }
        Some((padded - span) / stride + 1)
    };
    let (oh, ow) = (out_len(h, kh)?, out_len(w, kw)?);
    let n = b * c_out * oh * ow;
    let bias = optional(inputs, 2);
    let p = u32s([
        n,
        c_in,
        h,
        w,
        c_out,
        kh,
        kw,
        oh,
        ow,
        stride,
        padding,
        dilation,
        groups,
        usize::from(bias != Slot::Unbound),
    ])?;
    let d = dispatch(
        Kernel::Conv2d,
        p,
        vec![Slot::In(0), Slot::In(1), bias],
        groups_for(n),
    );
    Some(Plan::simple(vec![b, c_out, oh, ow], vec![d]))
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
