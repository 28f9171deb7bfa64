//! NPU backend: the [`NpuDelegate`] interface that vendor NPU stacks plug
//! into, and [`SimNpu`], the in-tree **NPU simulator** (`npu-sim:N`,
//! adapter "edgeflow NPU simulator (int8)").
//!
//! The simulator is not an accelerator: it runs on the host CPU and is
//! slower than the CPU backend. What it provides is the *constraints* of a
//! real NPU — a limited int8 op set, per-output-channel int8 weights,
//! calibrated per-tensor int8 activations, int32 accumulation with
//! fixed-point requantization, static shapes with counted recompiles — so a
//! pipeline placed on `npu` shows, without NPU hardware, which ops fall back,
//! how often it recompiles and how much accuracy int8 costs
//! ([`SimNpu::error_report`]).
//!
//! ## Two ways in
//! - **Eager** (unchanged model code): `Device::new(Arc::new(SimNpu::new(0)?), cpu)`.
//!   Each op the simulator supports is compiled lazily per op site (see
//!   [`SimNpu`] for site identity, calibration and the recompile budget);
//!   the others run on the CPU through the dispatcher's counted fallback.
//! - **Ahead of time** ([`NpuDelegate`]): [`capture`] the ops of unchanged
//!   model code into a [`Subgraph`] (or build one by hand), partition it,
//!   compile it with calibration inputs for its static shapes, execute the
//!   [`CompiledSubgraph`]; [`PartitionedGraph`] does all three for a graph
//!   with unsupported nodes, running those on a CPU backend.
//!
//! ## int8 op set
//! | op | int8 form |
//! |---|---|
//! | `linear`, `conv1d`, `conv2d` | int8 activations × per-channel int8 weights, int32 accumulate + int32 bias, per-channel requantize |
//! | `matmul` | both operands per-tensor int8 activations, int32 accumulate |
//! | `add`, `sub` | rescale both to a common scale (20-bit headroom), int32 add, requantize (TFLite ADD) |
//! | `mul` | int32 product, requantize |
//! | `relu`, `leaky_relu`, `sigmoid`, `tanh`, `gelu`, `gelu_erf`, `silu` | 256-entry lookup table |
//! | `softmax` | dequantize, f32 softmax, requantize to fixed `[0, 1)` (scale 1/256) |
//! | `reshape` | metadata only |
//!
//! Not in the set (CPU fallback): layer/RMS norm, attention, rope,
//! conv-transpose, snake, div/pow/max/min, affine, exp/log/sqrt and the other
//! unary functions, reductions, cumsum, permute/concat/narrow/pad/gather/
//! index-select, cast, random. Real NPUs differ in exactly this table; a
//! vendor delegate reports its own through [`NpuDelegate::supports_node`].
//!
//! ## Activation quantization
//! Per tensor. [`ActivationScheme::Asymmetric`] (default) maps
//! `[min(min, 0), max(max, 0)]` onto `[-128, 127]` with a zero point;
//! [`ActivationScheme::Symmetric`] uses `zero_point = 0`,
//! `scale = max|x| / 127`. Ranges are min/max over the calibration runs.

//!
//! ## Measured error (int8 vs f32)
//! From `cargo test -p edgeflow-backends npu -- --nocapture --test-threads 1`
//! (seeded normal inputs, weights std 0.2-0.3): per op, on data inside the
//! calibrated range, SQNR 36-50 dB and worst element 0.5-3% of the output
//! range (linear 38.4 dB / 1.0%, conv1d 36.3-37.9 dB, conv2d 38.8 dB,
//! matmul 39.5 dB, add 40.0 dB, mul 37.8 dB, LUT activations 41-50 dB,
//! softmax 40.7 dB). On fresh data values past the calibrated range
//! saturate: linear 37.0 dB with a worst element of 5.3% of range. A
//! linear-gelu-linear-add block end to end: about 35 dB. The conformance
//! suite (`cargo test -p edgeflow-backends --test conformance`) bounds every
//! native NPU case at 5% of range; its worst is softmax at 1.7%.

mod capture;
mod delegate;
mod kernels;
mod partition;
mod quant;
mod report;
mod sim;

pub use capture::capture;
pub use delegate::{CompiledSubgraph, Node, NpuDelegate, Partition, Subgraph, ValueRef};
pub use partition::PartitionedGraph;
pub use quant::{ActivationScheme, Multiplier, QParams, QWeight, RangeObserver};
pub use report::{
    ErrorAccum, ErrorStats, NpuCounters, NpuErrorReport, OpErrorReport, EXACT_SQNR_DB,
};
pub use sim::{live_error_reports, NpuBuffer, SimNpu, SimNpuConfig, SIM_ADAPTER};

#[cfg(test)]
mod tests;
