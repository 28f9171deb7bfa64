//! GPU-resident tensors ([`GpuBuffer`]) and moving data between the host
//! and the device.

use super::plan::{host_indices, is_float, u32s};
use super::GpuBackend;
use edgeflow_runtime::{DType, DeviceBuffer, Result, Storage, Tensor};
use std::any::Any;
use std::fmt;
use std::sync::Arc;
use wgpu::util::DeviceExt;

/// A tensor's data resident on the GPU: a storage buffer of `len` f32s.
///
/// It keeps its device and queue, so any `GpuBackend` can read it back, but
/// only the instance that made it binds it to kernels; another instance
/// (even on the same adapter) re-uploads it through the host.
pub struct GpuBuffer {
    pub(super) backend: String,
    pub(super) owner: u64,
    pub(super) device: wgpu::Device,
    pub(super) queue: wgpu::Queue,
    pub(super) buffer: wgpu::Buffer,
    pub(super) len: usize,
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

/// The GPU buffer behind `t`, whichever `GpuBackend` made it.
pub(super) fn any_gpu_buf(t: &Tensor) -> Option<&GpuBuffer> {
    match t.storage() {
        Storage::Device(b) => b.as_any().downcast_ref::<GpuBuffer>(),
        _ => None,
    }
}

impl GpuBackend {
    /// The GPU buffer behind `t`, if this backend instance holds it.
    pub(super) fn gpu_buf<'a>(&self, t: &'a Tensor) -> Option<&'a GpuBuffer> {
        any_gpu_buf(t).filter(|b| b.owner == self.id)
    }

    pub(super) fn alloc(&self, len: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("edgeflow-tensor"),
            size: (len.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    pub(super) fn wrap(&self, buffer: wgpu::Buffer, dims: &[usize]) -> Tensor {
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
    pub(super) fn usable(&self, t: &Tensor) -> bool {
        let float = is_float(t.dtype());
        let here = match t.storage() {
            Storage::Host(_) => true,
            // Another GpuBackend's buffers come through the host.
            Storage::Device(_) => any_gpu_buf(t).is_some(),
            Storage::Quantized(_) => false,
        };
        float && here && t.elem_count() <= self.max_elems()
    }

    /// Host f32 data of `t` as a new GPU buffer.
    pub(super) fn upload_host(&self, t: &Tensor) -> Result<Tensor> {
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
    pub(super) fn upload_indices(&self, t: &Tensor) -> Result<wgpu::Buffer> {
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
}
