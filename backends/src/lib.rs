//! # edgeflow-backends
//!
//! Implementations of [`edgeflow_runtime::Backend`]:
//! - [`cpu`]: candle-core / candle-nn kernels (including quantized matmul);
//! - [`gpu`]: wgpu compute shaders (Vulkan / Metal / DX12; lavapipe in CI);
//! - [`npu`]: a delegate interface and an in-tree NPU *simulator*.

pub mod cpu;
pub mod gpu;
pub mod npu;
