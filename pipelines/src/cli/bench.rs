//! `edgeflow bench ...`: the command line of the benches in `crate::bench`.

use crate::bench::{self, Bench};
use std::process::ExitCode;

/// Benchmarks.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum BenchCommand {
    /// Dataflow engine: 17-stage chain latency, throughput, 4 MB tensor hops,
    /// against a raw crossbeam-channel baseline.
    Dataflow(bench::dataflow::DataflowArgs),
    /// Tensor ops on the CPU backend: GEMM, decode GEMV (f32, Q8_0, Q4_1,
    /// Q4_0), prefill-shaped quantized matmul, conv1d and attention vs raw
    /// candle and the measured memory bandwidth.
    Ops(bench::ops::OpsArgs),
    /// Audio: resampler, mel and denoise throughput as multiples of real
    /// time; mic -> speaker latency p50/p99 on the default devices.
    Audio(bench::audio::AudioArgs),
    /// Speech in: Silero VAD time per 32 ms window vs onnxruntime, Whisper
    /// tiny.en time per utterance vs faster-whisper (same clip, segments and
    /// threads; the peers run from the venv of `scripts/peer_envs.sh speech`).
    Speech(bench::speech::SpeechArgs),
    /// Text to speech: the Piper "joe" voice on our runtime vs Piper on
    /// onnxruntime (RTF and time to first audio, same text and threads; the
    /// peer runs from the venv of `scripts/peer_envs.sh piper`).
    Tts(bench::tts::TtsArgs),
    /// Thinker: SmolLM2-135M-Instruct (Q4_1 GGUF) prefill and decode
    /// tokens/s and decode's weight bandwidth (128-token prompt, 64 tokens,
    /// median of 3) vs llama.cpp on the same GGUF (`scripts/peer_envs.sh
    /// llama.cpp`).
    Thinker(bench::thinker::ThinkerArgs),
    /// Vision encoder: DINOv2 ViT-S/14 forward time per image vs onnxruntime
    /// on the same ONNX (same sizes and threads; the peer runs from the venv
    /// of `scripts/peer_envs.sh vision`).
    Vision(bench::vision::VisionArgs),
    /// Robot control: zenoh round trip through zenoh_pub/zenoh_sub vs the
    /// raw zenoh API, and the controller's wake-up jitter and missed periods
    /// at 100 Hz vs a bare sleep loop, idle and beside a compute load.
    Control(bench::control::ControlArgs),
    /// Omni speech synthesis: Qwen2.5-Omni's token2wav (DiT sampler and
    /// BigVGAN) at its real configuration with random weights, time to
    /// first audio of a streamed start, and HiFi-GAN universal (real
    /// weights), vs PyTorch on the CPU with the same threads (the peer runs
    /// from the venv of `scripts/peer_envs.sh omni`).
    Omni(bench::omni::OmniArgs),
    /// Every bench above; with --markdown, also write BENCHMARKS.md (the
    /// machine, the date and commit, every table with its command).
    All(bench::all::AllArgs),
}

/// Run a benchmark and print its table.
pub(super) fn run(b: BenchCommand) -> anyhow::Result<ExitCode> {
    let report = match &b {
        BenchCommand::All(a) => return bench::all::run(a.clone()),
        BenchCommand::Dataflow(a) => a.run()?,
        BenchCommand::Ops(a) => a.run()?,
        BenchCommand::Audio(a) => a.run()?,
        BenchCommand::Speech(a) => a.run()?,
        BenchCommand::Tts(a) => a.run()?,
        BenchCommand::Thinker(a) => a.run()?,
        BenchCommand::Vision(a) => a.run()?,
        BenchCommand::Control(a) if a.is_helper() => {
            a.run_helper()?;
            return Ok(ExitCode::SUCCESS);
        }
        BenchCommand::Control(a) => a.run()?,
        BenchCommand::Omni(a) => a.run()?,
    };
    print!("{}", report.render_text());
    // `bench tts` exists to compare with onnxruntime: without the peer it
    // fails (the other benches' peers are extras to their own figures).
    if matches!(b, BenchCommand::Tts(_)) && !report.missing.is_empty() {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
