//! Adapter discovery and device setup: which wgpu backends are searched,
//! the adapters they list, opening one (and its limits and error log).

use super::{GpuBackend, NEXT_ID};
use edgeflow_runtime::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// What to install when no adapter is found.
pub(super) const INSTALL_HINT: &str = "no GPU adapter found by wgpu (Vulkan, Metal or DX12). \
     Install a GPU driver, or on Linux without a GPU Mesa's software Vulkan driver: \
     `apt-get install mesa-vulkan-drivers libvulkan1`";

/// The wgpu backends to search: `WGPU_BACKEND` (e.g. `vulkan`, `metal`,
/// `dx12`) when set, else every compiled-in backend.
pub(super) fn backends() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all())
}

/// A wgpu instance over `backends`.
pub(super) fn instance(backends: wgpu::Backends) -> wgpu::Instance {
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
            std::env::set_var(
                "WAYLAND_DISPLAY",
                "/nonexistent/edgeflow-no-wayland-session",
            );
        }
    });
}

/// One line per adapter: `name (backend, device type)`.
pub(super) fn describe(info: &wgpu::AdapterInfo) -> String {
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

impl GpuBackend {
    /// Opens adapter `adapter_index` (as listed by [`adapters`]).
    ///
    /// Fails with [`Error::DeviceUnavailable`] when there is no such adapter
    /// (the reason says what to install) or the device cannot be opened.
    pub fn new(adapter_index: usize) -> Result<GpuBackend> {
        Self::open(backends(), adapter_index)
    }

    pub(super) fn open(search: wgpu::Backends, adapter_index: usize) -> Result<GpuBackend> {
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

    pub(super) fn err(&self, msg: impl Into<String>) -> Error {
        Error::Backend {
            backend: self.name.clone(),
            msg: msg.into(),
        }
    }

    /// Turns any error wgpu reported since the last check into an `Err`.
    pub(super) fn check_errors(&self, what: &str) -> Result<()> {
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
    pub(super) fn max_elems(&self) -> usize {
        let bytes = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        usize::try_from(bytes / 4)
            .unwrap_or(usize::MAX)
            .min(u32::MAX as usize)
    }
}
