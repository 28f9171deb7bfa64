//! # edgeflow-backends
//!
//! Implementations of [`edgeflow_runtime::Backend`]:
//! - [`cpu`]: candle-core / candle-nn kernels (including quantized matmul);
//! - [`gpu`]: wgpu compute shaders (Vulkan / Metal / DX12; lavapipe in CI);
//! - [`npu`]: a delegate interface and an in-tree NPU *simulator*.
//!
//! [`open`] turns a placement ([`DeviceSpec`]) into a [`Device`];
//! [`probe_all`] runs the availability probe on every backend.
//! [`bandwidth`] measures the memory read bandwidth decode is bound by;
//! [`candle_attention`] is attention written directly in candle ops, the
//! reference the fused CPU kernel is tested and benchmarked against.
//!
//! ## Design
//! A backend is available only when a real computation on it matched the
//! CPU ([`edgeflow_runtime::probe`]). Probes run once per process (cached in
//! a `OnceLock`) and are cached on disk keyed by adapter, so `device: auto`
//! costs one probe per machine and driver, not one per stage.
//!
//! Backend instances per placement:
//! - **GPU: one per adapter per process.** A `GpuBackend` owns a wgpu
//!   device, and only the instance that made a buffer can bind it, so two
//!   stages on `gpu:0` with their own instances would read every tensor they
//!   exchange back to the host and upload it again. [`open`] therefore
//!   keeps one `Arc<GpuBackend>` per adapter index for the life of the
//!   process (the probe uses it too); each [`Device`] still has its own
//!   counters. The instance is thread-safe; compiled kernels are shared, and
//!   so is its log of uncaptured wgpu errors: a driver error raised by one
//!   stage's kernel may surface as the error of another stage's next op on
//!   that adapter (it fails loudly either way; a wgpu device has one log).
//! - **NPU simulator: one per placement.** A [`npu::SimNpu`] is a compiled
//!   model as much as a device: its op sites calibrate and freeze int8
//!   ranges, host inputs share one producer tag (so weightless ops of two
//!   stages fed from the host would share one calibration over different
//!   data), [`npu::SimNpu::calibrate`] and [`npu::SimNpu::reset_sites`] act
//!   on every site, and its recompile budget, site limit and error report
//!   would mix the stages. Real NPU runtimes likewise load each model into
//!   its own context, and hand outputs back through host memory; the counted
//!   transfer between two NPU stages is that hand-off.

pub mod bandwidth;
pub mod cpu;
pub mod gpu;
mod memory;
pub mod npu;

pub use cpu::cpu_backend;
pub use edgeflow_runtime::probe::ProbeReport;
use edgeflow_runtime::probe::{probe_backend, ProbeCache};
use edgeflow_runtime::{Backend, Device, DeviceKind, DeviceSpec, Error, Result};
pub use memory::{
    huge_page_policy, keep_freed_memory, release_freed_memory, HugePageAlloc, HugePagePolicy,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Fix the CPU thread count in the environment (`RAYON_NUM_THREADS`, when it
/// is not set already) to the count candle picks by default, so candle stops
/// re-deriving it: without the variable, candle's CPU matmul calls
/// `num_cpus::get_physical()`, which parses `/proc/cpuinfo`, on every call
/// (about half the time of a Silero VAD window). candle's thread count does
/// not change; rayon's pool, which reads the same variable, gets candle's
/// count too (physical cores, where that differs from logical ones).
///
/// Call it first thing in `main`, before any thread starts (it writes the
/// process environment). Returns the thread count.
pub fn pin_cpu_threads() -> usize {
    if let Some(n) = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    let n = candle_core::utils::get_num_threads();
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    n
}

/// Waits until the CPU backend's background thread has moved every weight
/// placed so far onto 2 MB pages (see [`advise_huge_pages`]), at most
/// `timeout`; whether it finished (true at once where nothing is queued).
/// Benchmarks call it before timing, so the one-off copy does not share
/// the cores with what they time.
pub fn wait_for_huge_pages(timeout: std::time::Duration) -> bool {
    cpu::huge_pages::wait_idle(timeout)
}

/// Back `t`'s host or quantized bytes with 2 MB pages where the OS allows
/// (Linux: `MADV_COLLAPSE`, then `MADV_HUGEPAGE`), as the CPU backend does
/// for the weights it places; best effort, errors are ignored. For memory a
/// measurement compares with placed weights (a raw-candle baseline reading
/// the unplaced tensor). Device tensors and tensors under 128 KB are left
/// alone.
pub fn advise_huge_pages(t: &edgeflow_runtime::Tensor) {
    cpu::huge_pages::advise(t);
}

/// Attention written directly in candle ops: `softmax(q k^T * scale) v`
/// with grouped-query heads folded into rows (`q`: `[b, h, s, d]`,
/// `k`/`v`: `[b, hk, t, d]`, `h` a multiple of `hk`); `causal` masks key
/// `j` for query `i` when `j > i + t - s`. The unfused reference the CPU
/// backend's attention kernel is tested against and `edgeflow bench ops`
/// times it against.
pub fn candle_attention(
    q: &candle_core::Tensor,
    k: &candle_core::Tensor,
    v: &candle_core::Tensor,
    scale: f64,
    causal: bool,
) -> Result<candle_core::Tensor> {
    let (b, h, s, d) = q.dims4()?;
    let (_, hk, t, _) = k.dims4()?;
    let rep = h / hk;
    let qg = q.reshape((b, hk, rep * s, d))?;
    let sc = (qg.matmul(&k.t()?)? * scale)?.reshape((b, h, s, t))?;
    let sc = if causal {
        let m: Vec<f32> = (0..s)
            .flat_map(|i| {
                (0..t).map(move |j| {
                    if j > i + t - s {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        sc.broadcast_add(&candle_core::Tensor::from_vec(m, (s, t), q.device())?)?
    } else {
        sc
    };
    let p = candle_nn::ops::softmax_last_dim(&sc)?.reshape((b, hk, rep * s, t))?;
    Ok(p.matmul(v)?.reshape((b, h, s, d))?)
}

/// How many GPU / NPU indices the probe tries beyond the ones that exist.
const MAX_NPU: usize = 1;

/// The process-wide backend of GPU adapter `index`, opened on first use.
/// A failed open is not remembered: the next call tries again.
pub fn gpu_backend(index: usize) -> Result<Arc<gpu::GpuBackend>> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Arc<gpu::GpuBackend>>>> = OnceLock::new();
    // Held while opening, so two stages starting at once open one device.
    let mut gpus = GPUS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(b) = gpus.get(&index) {
        return Ok(b.clone());
    }
    let b = Arc::new(gpu::GpuBackend::new(index)?);
    gpus.insert(index, b.clone());
    Ok(b)
}

fn open_backend(kind: DeviceKind, index: usize) -> Result<Arc<dyn Backend>> {
    match kind {
        DeviceKind::Cpu => Ok(cpu_backend()),
        DeviceKind::Gpu => Ok(gpu_backend(index)?),
        // Not shared: see "Design" in the crate docs.
        DeviceKind::Npu => Ok(Arc::new(npu::SimNpu::new(index)?)),
    }
}

/// Open a device for a placement. `cpu`, `gpu:N` and `npu:N` open that
/// backend (an error says why it is unavailable); `auto` opens the best
/// available one according to [`probe_all`]: a hardware GPU or NPU that
/// passed its probe, else the CPU. Software emulations (lavapipe, the NPU
/// simulator) are never chosen by `auto`: they are correct but slower than
/// the CPU.
///
/// Devices on the same GPU adapter share one backend, so tensors pass
/// between them without transfers; every `npu:N` device gets its own
/// simulator (see "Design" in the crate docs).
pub fn open(spec: DeviceSpec) -> Result<Device> {
    let cpu = cpu_backend();
    let primary = match spec {
        DeviceSpec::Cpu => cpu.clone(),
        DeviceSpec::Gpu(i) => open_backend(DeviceKind::Gpu, i)?,
        DeviceSpec::Npu(i) => open_backend(DeviceKind::Npu, i)?,
        DeviceSpec::Auto => return open(auto_spec()),
    };
    Ok(Device::new(primary, cpu))
}

/// The placement `auto` resolves to on this machine (from the cached probes).
pub fn auto_spec() -> DeviceSpec {
    let reports = probe_all(false);
    let pick = |kind: DeviceKind| {
        reports
            .iter()
            .filter(|r| r.kind == kind && r.available && !r.simulated)
            .min_by(|a, b| a.probe_ms.total_cmp(&b.probe_ms))
            .and_then(|r| r.name.split_once(':'))
            .and_then(|(_, i)| i.parse::<usize>().ok())
    };
    if let Some(i) = pick(DeviceKind::Gpu) {
        DeviceSpec::Gpu(i)
    } else if let Some(i) = pick(DeviceKind::Npu) {
        DeviceSpec::Npu(i)
    } else {
        DeviceSpec::Cpu
    }
}

fn probe_one(
    kind: DeviceKind,
    index: usize,
    cache: &mut ProbeCache,
    refresh: bool,
) -> Option<ProbeReport> {
    let name = match kind {
        DeviceKind::Cpu => "cpu".to_string(),
        DeviceKind::Gpu => format!("gpu:{index}"),
        DeviceKind::Npu => format!("npu:{index}"),
    };
    let backend = match open_backend(kind, index) {
        Ok(b) => b,
        Err(e) => {
            let reason = match e {
                Error::DeviceUnavailable { reason, .. } => reason,
                other => other.to_string(),
            };
            return Some(ProbeReport::unavailable(kind, &name, "-", reason));
        }
    };
    let adapter = backend.adapter();
    if !refresh {
        if let Some(r) = cache.get(&name, &adapter) {
            return Some(r);
        }
    }
    let mut r = probe_backend(backend, cpu_backend());
    // Placement uses the `kind:N` form whatever the backend calls itself.
    r.name = name;
    cache.insert(&r);
    Some(r)
}

/// Probe every backend: the CPU, each GPU adapter wgpu lists (or `gpu:0`
/// when there is none, to say why) and the NPU simulator.
///
/// Runs once per process; `refresh` re-runs the probes (and rewrites the
/// on-disk cache) instead of reusing cached results.
pub fn probe_all(refresh: bool) -> Vec<ProbeReport> {
    static REPORTS: OnceLock<Mutex<Option<Vec<ProbeReport>>>> = OnceLock::new();
    let slot = REPORTS.get_or_init(|| Mutex::new(None));
    let mut guard = match slot.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if !refresh {
        if let Some(r) = guard.as_ref() {
            return r.clone();
        }
    }
    let mut cache = ProbeCache::load();
    let mut out = Vec::new();
    // The CPU probe checks the CPU against itself; it always runs so the
    // report carries a timing, and it is the reference for the others.
    out.extend(probe_one(DeviceKind::Cpu, 0, &mut cache, refresh));
    let gpus = gpu::adapters().len().max(1);
    for i in 0..gpus {
        out.extend(probe_one(DeviceKind::Gpu, i, &mut cache, refresh));
    }
    for i in 0..MAX_NPU {
        out.extend(probe_one(DeviceKind::Npu, i, &mut cache, refresh));
    }
    // Best effort: an unwritable cache directory only costs a re-probe.
    let _ = cache.save();
    *guard = Some(out.clone());
    out
}
