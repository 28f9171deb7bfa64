//! The compiled kernels: which kernel a dispatch uses and the cache of
//! compiled pipelines.

use super::{kernels, GpuBackend};
use edgeflow_runtime::{BinaryOp, Result, UnaryOp};
use std::sync::Arc;

/// Which compiled kernel a dispatch uses (the pipeline cache key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kernel {
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
    pub(super) fn source(self) -> String {
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
pub(super) struct Pipeline {
    pub(super) pipeline: wgpu::ComputePipeline,
    pub(super) layout: wgpu::BindGroupLayout,
}

impl GpuBackend {
    /// The compiled pipeline for `k`, compiling it on first use.
    pub(super) fn pipeline(&self, k: Kernel) -> Result<Arc<Pipeline>> {
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
}
