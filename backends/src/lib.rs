//! # edgeflow-backends
//!
//! Implementations of [`edgeflow_runtime::Backend`]: `cpu`, `gpu`, `npu`.
