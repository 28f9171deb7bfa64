//! # edgeflow-runtime
//!
//! The bottom layer of edgeflow: [`Tensor`], [`DType`], the [`Op`] set, the
//! [`Backend`] trait that the CPU, GPU and NPU backends implement, the
//! [`Device`] dispatcher that model code runs ops through (with counted CPU
//! fallback), weight readers, and memory accounting.
//!
//! ## Design
//! Models are written once as sequences of [`Device::run`] calls (or the
//! typed helpers on [`Device`]). Every op is a value, so the dispatcher can
//! decide per op whether the placed backend runs it or the CPU does, count
//! the fallback and the bytes moved, and the conformance suite can run every
//! op on every backend against an f64 reference.
//!
//! ## At a glance
//! - Open a device with `edgeflow_backends::open(DeviceSpec)` (`cpu`,
//!   `gpu:N`, `npu:N`, `auto`); run ops with the typed helpers
//!   ([`Device::linear`], [`Device::conv1d`], [`Device::attention`],
//!   [`Device::softmax`], [`Device::add`], [`Device::unary`],
//!   [`Device::narrow`], [`Device::concat`]...) or [`Device::run`].
//! - Load weights with [`weights::open`] (safetensors, GGUF, ONNX,
//!   CTranslate2) or a [`weights::WeightStore`], which places them on the
//!   device and counts their resident bytes in [`Device::stats`].
//! - [`rng`] is the one seeded normal generator every backend uses.
//! - [`probe`] holds the availability probe and its on-disk cache.

mod backend;
mod device;
mod dtype;
mod error;
mod op;
mod ops_api;
pub mod probe;
pub mod rng;
mod tensor;
pub mod weights;

pub use backend::{Backend, DeviceKind, PrecisionError};
pub use device::{
    render_op_profile, Device, DeviceSpec, DeviceStats, DeviceStatsSnapshot, OpProfileRow,
};
pub use dtype::DType;
pub use error::{Error, Result};
pub use op::{BinaryOp, Op, PadMode, ReduceOp, SnakeResampling, UnaryOp};
pub use ops_api::{ConvCfg, ConvTransposeCfg, KvCache, Polyphase};
pub use tensor::{DeviceBuffer, Storage, Tensor};

/// Re-exported so backends and models use the same candle version.
pub use candle_core;
