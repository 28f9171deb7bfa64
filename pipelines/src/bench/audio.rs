//! `edgeflow bench audio`: throughput of the signal-processing stages as
//! multiples of real time, and live mic -> speaker latency on the default
//! devices (a PulseAudio null sink in CI).
//!
//! Throughput is audio seconds processed per wall-clock second on one
//! thread, streaming in 10 ms chunks as a live pipeline would (so per-call
//! overheads count). Latency comes from the `passthrough` pipeline: for
//! each chunk, capture time (mic callback) to the predicted moment the
//! speaker plays it (cpal's playback timestamp), so it includes the
//! capture buffering, the engine's hops, the jitter buffer and the device's
//! output buffer.

use super::{Bench, BenchReport, Row};
use anyhow::Context as _;
use edgeflow_audio::{Denoiser, LogMel, StreamResampler};
use edgeflow_graph::{parse_spec, Pipeline};
use std::time::{Duration, Instant};

/// The shipped passthrough pipeline (mic -> gain -> speaker).
const PASSTHROUGH: &str = include_str!("../../passthrough.yaml");

/// Options of `edgeflow bench audio`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct AudioArgs {
    /// Seconds of live mic -> speaker passthrough for the latency figures.
    #[arg(long, default_value_t = 5.0)]
    pub live_seconds: f64,
}

impl Default for AudioArgs {
    fn default() -> Self {
        AudioArgs { live_seconds: 5.0 }
    }
}

/// A test signal: a sine sweep plus noise (deterministic).
fn signal(rate: u32, channels: u16, seconds: f64) -> Vec<f32> {
    let n = (rate as f64 * seconds) as usize;
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = Vec::with_capacity(n * channels as usize);
    for i in 0..n {
        let t = i as f64 / rate as f64;
        let sweep = (2.0 * std::f64::consts::PI * (100.0 * t + 200.0 * t * t)).sin() * 0.3;
        for _ in 0..channels {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let noise = ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 0.02;
            out.push((sweep + noise) as f32);
        }
    }
    out
}

/// Best of `reps` runs of `f`, in seconds.
fn best_of(reps: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn resample_rt(from: u32, to: u32, channels: u16, seconds: f64) -> anyhow::Result<f64> {
    let x = signal(from, channels, seconds);
    let chunk = (from / 100) as usize * channels as usize;
    let mut r = StreamResampler::new(from, to, channels)?;
    let mut out = Vec::new();
    let t = best_of(3, || {
        out.clear();
        for c in x.chunks(chunk) {
            r.process(c, &mut out)?;
        }
        Ok(r.flush(&mut out)?)
    })?;
    Ok(seconds / t)
}

fn mel_rt(seconds: f64) -> anyhow::Result<f64> {
    let x = signal(16_000, 1, seconds);
    let mut mel = LogMel::new();
    let t = best_of(3, || {
        let (v, _) = mel.compute(&x, 160);
        std::hint::black_box(v);
        Ok(())
    })?;
    Ok(seconds / t)
}

fn denoise_rt(rate: u32, seconds: f64) -> anyhow::Result<f64> {
    let x = signal(rate, 1, seconds);
    let chunk = (rate / 100) as usize;
    let mut d = Denoiser::new(rate, 1)?;
    let mut out = Vec::new();
    let t = best_of(2, || {
        out.clear();
        for c in x.chunks(chunk) {
            d.process(c, &mut out)?;
        }
        Ok(d.flush(&mut out)?)
    })?;
    Ok(seconds / t)
}

/// Latency numbers of one passthrough run.
#[derive(Debug, Clone, Copy)]
struct PassthroughLatency {
    /// Chunks measured.
    count: u64,
    /// Median capture-to-playback latency, ms.
    p50_ms: f64,
    /// 99th percentile, ms.
    p99_ms: f64,
    /// Median depth of the speaker's jitter buffer, ms: the part of the
    /// latency the pipeline adds on purpose; the rest is capture and device
    /// buffering in the sound server.
    jitter_buffer_p50_ms: f64,
    /// Speaker underruns during the run.
    underruns: f64,
    /// Mic overruns (dropped capture buffers).
    overruns: f64,
}

/// Run the shipped passthrough pipeline for `seconds` on the default
/// devices, attenuated by 12 dB so a speaker the microphone can hear (a
/// null sink's monitor) does not build up feedback.
fn passthrough_latency(seconds: f64) -> anyhow::Result<PassthroughLatency> {
    let mut spec = parse_spec(PASSTHROUGH, None)?;
    for st in &mut spec.stages {
        match st.id.as_str() {
            "mic" => {
                st.params
                    .insert("seconds".into(), serde_json::json!(seconds));
            }
            "gain" => {
                st.params.insert("db".into(), serde_json::json!(-12.0));
            }
            _ => {}
        }
    }
    let reg = edgeflow_audio::registry();
    let pipeline = Pipeline::from_spec(&spec, &reg)?;
    let m = pipeline.run(Some(Duration::from_secs_f64(seconds + 20.0)))?;
    let stage = |id: &str| m.stages.iter().find(|s| s.id == id);
    let spk = stage("speaker").context("no speaker stage")?;
    let lat = spk
        .values
        .get("playout_latency_ms")
        .context("the speaker measured no latency (nothing played?)")?;
    let value = |s: Option<&edgeflow_graph::metrics::StageSnapshot>, k: &str| {
        s.and_then(|s| s.values.get(k)).map_or(0.0, |v| v.last)
    };
    Ok(PassthroughLatency {
        count: lat.count,
        p50_ms: lat.p50,
        p99_ms: lat.p99,
        jitter_buffer_p50_ms: spk.values.get("buffer_ms").map_or(0.0, |v| v.p50),
        underruns: value(Some(spk), "underruns"),
        overruns: value(stage("mic"), "overruns"),
    })
}

impl Bench for AudioArgs {
    fn name(&self) -> &'static str {
        "audio"
    }

    fn compares(&self) -> &'static str {
        "resampler, mel and denoiser throughput vs real time; mic -> speaker latency"
    }

    fn args(&self) -> Vec<String> {
        if self.live_seconds == AudioArgs::default().live_seconds {
            Vec::new()
        } else {
            vec!["--live-seconds".into(), self.live_seconds.to_string()]
        }
    }

    /// The live part needs an audio server (see `audio/tests/start-pulse.sh`);
    /// without one it is reported as not measured, with the reason.
    fn run(&self) -> anyhow::Result<BenchReport> {
        if !(self.live_seconds > 0.0 && self.live_seconds.is_finite()) {
            anyhow::bail!(
                "--live-seconds {}: give a positive number of seconds",
                self.live_seconds
            );
        }
        eprintln!(
            "measuring resample, mel, denoise and a {} s live passthrough...",
            self.live_seconds
        );
        let mut r = BenchReport::new(
            "edgeflow bench audio (one thread, 10 ms chunks; x = times faster than real time)",
            "real time",
            "",
        );
        let realtime = |label: String, x: f64| Row::new(label, x, "x real time").baseline(1.0);
        for &(from, to, ch) in &[
            (48_000u32, 16_000u32, 1u16),
            (44_100, 16_000, 1),
            (16_000, 48_000, 2),
            (44_100, 48_000, 2),
        ] {
            let x = resample_rt(from, to, ch, 30.0)?;
            r.rows
                .push(realtime(format!("resample {from} -> {to} Hz, {ch} ch"), x));
        }
        let x = mel_rt(30.0)?;
        r.rows
            .push(realtime("mel (Whisper 80 bins, 30 s utterance)".into(), x));
        for rate in [48_000u32, 16_000] {
            let x = denoise_rt(rate, 10.0)?;
            r.rows
                .push(realtime(format!("denoise (RNNoise) {rate} Hz mono"), x));
        }
        let live = format!(
            "mic -> speaker passthrough (pipelines/passthrough.yaml, default devices, {} s)",
            self.live_seconds
        );
        match passthrough_latency(self.live_seconds) {
            Ok(l) => {
                let note = format!(
                    "over {} chunks (jitter buffer p50 {:.1} ms); underruns {}, overruns {}",
                    l.count, l.jitter_buffer_p50_ms, l.underruns, l.overruns
                );
                r.rows.push(
                    Row::new(format!("{live}: capture -> playback p50"), l.p50_ms, "ms").note(note),
                );
                r.rows.push(Row::new(
                    format!("{live}: capture -> playback p99"),
                    l.p99_ms,
                    "ms",
                ));
            }
            Err(e) => r.rows.push(
                Row::new(format!("{live}: capture -> playback"), f64::NAN, "ms")
                    .note(format!("not measured ({e:#})")),
            ),
        }
        Ok(r)
    }
}
