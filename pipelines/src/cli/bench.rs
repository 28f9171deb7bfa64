//! `edgeflow bench ...`.

use std::process::ExitCode;

// Declared here rather than in cli/mod.rs: the TTS bench belongs to the
// bench command.
#[path = "bench_control.rs"]
mod bench_control;
#[path = "bench_tts.rs"]
mod bench_tts;

/// Benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Dataflow engine: 17-stage chain latency, throughput, 4 MB tensor hops,
    /// against a raw crossbeam-channel baseline.
    Dataflow,
    /// Tensor ops on the CPU backend: GEMM, decode GEMV (f32, Q8_0, Q4_1,
    /// Q4_0), prefill-shaped quantized matmul, conv1d and attention vs raw
    /// candle and the measured memory bandwidth.
    Ops(super::bench_ops::BenchOpsArgs),
    /// Audio: resampler, mel and denoise throughput as multiples of real
    /// time; mic -> speaker latency p50/p99 on the default devices.
    Audio,
    /// Speech in: Silero VAD time per 32 ms window vs onnxruntime, Whisper
    /// tiny.en time per utterance vs faster-whisper (same clip, segments and
    /// threads; the peers run from scripts/speech_reference.py's venv).
    Speech,
    /// Text to speech: the Piper "joe" voice on our runtime vs Piper on
    /// onnxruntime (RTF and time to first audio, same text and threads; the
    /// peer runs from scripts/piper_reference.py's venv).
    Tts(bench_tts::BenchTtsArgs),
    /// Thinker: SmolLM2-135M-Instruct (Q4_1 GGUF) prefill and decode
    /// tokens/s and decode's weight bandwidth (128-token prompt, 64 tokens,
    /// median of 3).
    Thinker(ThinkerArgs),
    /// Robot control: zenoh round trip through the raw API vs through
    /// zenoh_pub/zenoh_sub (ratio), and the controller's wake-up jitter and
    /// missed periods at 100 Hz, idle and beside a compute load.
    Control(bench_control::BenchControlArgs),
}

/// `edgeflow bench thinker` options.
#[derive(Debug, clap::Args)]
pub struct ThinkerArgs {
    /// After the timed runs, time every op of one more decode and print the
    /// N costliest (op, input shapes) rows (0: off).
    #[arg(long, default_value_t = 0)]
    pub profile_ops: usize,
}

/// Run a benchmark.
pub fn run(b: BenchCommand) -> anyhow::Result<ExitCode> {
    match b {
        BenchCommand::Ops(a) => super::bench_ops::run(a),
        BenchCommand::Tts(a) => bench_tts::run(a),
        BenchCommand::Control(a) => bench_control::run(a),
        BenchCommand::Thinker(a) => {
            eprintln!("measuring SmolLM2 prefill and decode...");
            let o = edgeflow_llm::BenchOptions {
                profile_ops: a.profile_ops,
                ..Default::default()
            };
            print!("{}", edgeflow_llm::bench(&o)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Audio => {
            eprintln!("measuring resample, mel, denoise and a 5 s live passthrough...");
            print!("{}", edgeflow_audio::bench::run_bench()?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Speech => {
            let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let o = edgeflow_speech::bench::BenchOptions::for_repo(&repo);
            eprintln!("measuring Silero VAD and Whisper tiny.en (and the peers)...");
            print!("{}", edgeflow_speech::bench::bench(&o)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Dataflow => {
            let o = edgeflow_graph::bench::DataflowBenchOptions::default();
            eprintln!("measuring the raw baseline and the engine (about 10 s)...");
            let r = edgeflow_graph::bench::run_dataflow_bench(&o)?;
            print!("{}", r.render());
            Ok(ExitCode::SUCCESS)
        }
    }
}
