//! The Omni speech path's stage kinds: `talker` (thinker hidden states in,
//! codec tokens out), `dit` (codec tokens in, mel frames out) and
//! `bigvgan` (mel frames in, 24 kHz audio out), each placed on its own
//! device by the pipeline file and streamed chunk by chunk over bounded
//! edges.
//!
//! Without a checkpoint (`model_dir`), each runs seeded random weights at a
//! small configuration (`model: random-small`, the default) or at
//! Qwen2.5-Omni's real one (`model: random-real`), and says so in one line
//! at start: no Qwen2.5-Omni weights can be had offline. With `model_dir`
//! pointing at a Qwen2.5-Omni checkpoint folder they run the real model.
//!
//! Placed on `npu` (the int8 NPU simulator), each records its int8 error
//! against f32 after every utterance (`int8_sqnr_db`,
//! `int8_err_over_range`); the ops the NPU lacks run on the CPU, counted in
//! the device's fallback figures.

pub mod bigvgan;
pub mod dit;
pub mod source;
pub mod talker;

pub use bigvgan::BigVganKind;
pub use dit::DitKind;
pub use source::Source;
pub use talker::TalkerKind;

/// Record what reduced precision cost on the stage's device (the NPU
/// simulator's int8 error against f32, every op so far): `int8_sqnr_db`
/// and `int8_err_over_range`. Nothing on f32 devices.
pub(crate) fn record_precision(ctx: &edgeflow_graph::StageCtx, dev: &edgeflow_runtime::Device) {
    if let Some(e) = dev.precision_error() {
        ctx.record("int8_sqnr_db", e.sqnr_db);
        ctx.record("int8_err_over_range", e.max_err_over_range);
    }
}
