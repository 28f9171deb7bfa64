//! `edgeflow bench tts`: our Piper "joe" voice against Piper on onnxruntime,
//! same text, same thread count, in one run.
//!
//! Both sides synthesize sentence by sentence with noise disabled (so both
//! produce the same durations and the same audio length) after one warm-up
//! run; time to first audio is from the call to the first audio chunk
//! (Piper yields whole sentences; ours yields the first decoded chunk of the
//! first sentence). The onnxruntime side runs `scripts/piper_reference.py`
//! as a subprocess from the pinned Piper peer venv (`scripts/peer_envs.sh
//! piper`).

use super::{median, repo_root, Bench, BenchReport, Peer, Row};
use anyhow::Context;
use edgeflow_piper::piper::cards::VoiceFiles;
use edgeflow_piper::piper::{FrontEnd, InferenceScales, VoiceConfig};
use edgeflow_piper::vits::{AudioAhead, Chunking, SynthesisParams, Vits, VitsConfig};
use edgeflow_runtime::DeviceSpec;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// About ten seconds of speech in three sentences.
const DEFAULT_TEXT: &str = "The quick brown fox jumps over the lazy dog. \
Edge devices can speak, listen, and think, all at the same time. \
This sentence was synthesized by a small voice model running on our own tensor runtime.";

/// Options of `edgeflow bench tts`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TtsArgs {
    /// Text to synthesize (default: about 10 s of speech in three sentences).
    #[arg(long)]
    pub text: Option<String>,
    /// Threads for both engines (rayon for ours, intra-op for onnxruntime).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Timed runs per engine (after one warm-up); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Device for our side: cpu, gpu or npu.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Latent frames in a sentence's first chunk (the vits stage's `first_chunk_frames`).
    #[arg(long, default_value_t = Chunking::default().first_frames)]
    pub first_chunk_frames: usize,
    /// Latent frames in each later chunk (the vits stage's `chunk_frames`).
    #[arg(long, default_value_t = Chunking::default().frames)]
    pub chunk_frames: usize,
    /// After the timed runs, time every op of one more run and print the
    /// N costliest (op, input shapes) rows (0: off).
    #[arg(long, default_value_t = 0)]
    pub profile_ops: usize,
}

#[derive(Debug, Clone, Copy)]
struct RunResult {
    first_audio_ms: f64,
    total_s: f64,
    audio_s: f64,
}

impl RunResult {
    fn rtf(&self) -> f64 {
        self.total_s / self.audio_s.max(1e-9)
    }
}

fn noise_free() -> SynthesisParams {
    SynthesisParams {
        scales: InferenceScales {
            noise_scale: 0.0,
            length_scale: 1.0,
            noise_w: 0.0,
        },
        seed: 0,
    }
}

fn ours_once(
    fe: &FrontEnd,
    vits: &Vits,
    text: &str,
    rate: u32,
    chunking: Chunking,
) -> anyhow::Result<RunResult> {
    let start = Instant::now();
    let mut first: Option<f64> = None;
    let mut samples = 0usize;
    // As the vits stage: a later sentence that starts while enough audio is
    // queued skips the small first chunk.
    let mut ahead = AudioAhead::default();
    let frame_s = vits.hop_length() as f64 / f64::from(rate);
    fe.for_each_sentence(text, &mut |s| {
        let sentence_start = Instant::now();
        let mut sentence_samples = 0usize;
        let prior = vits.prior(&s.ids, &noise_free())?;
        vits.stream(&prior, ahead.chunking(chunking, frame_s), &mut |chunk| {
            first.get_or_insert_with(|| start.elapsed().as_secs_f64() * 1000.0);
            ahead.emitted(chunk.len(), rate);
            sentence_samples += chunk.len();
            Ok(true)
        })?;
        samples += sentence_samples;
        ahead.sentence_done(
            sentence_start.elapsed().as_secs_f64(),
            sentence_samples as f64 / f64::from(rate),
        );
        Ok(true)
    })?;
    Ok(RunResult {
        first_audio_ms: first.unwrap_or(f64::NAN),
        total_s: start.elapsed().as_secs_f64(),
        audio_s: samples as f64 / f64::from(rate),
    })
}

fn onnxruntime_side(
    repo: &Path,
    text: &str,
    threads: usize,
    runs: usize,
    python: &Path,
) -> anyhow::Result<(f64, Vec<RunResult>)> {
    let script = repo.join("scripts/piper_reference.py");
    let out = Command::new(python)
        .arg(&script)
        .args(["bench", "--text", text])
        .args([
            "--threads",
            &threads.to_string(),
            "--runs",
            &runs.to_string(),
        ])
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .context("parsing the reference script's JSON output")?;
    let load_s = v["load_s"].as_f64().unwrap_or(f64::NAN);
    let runs = v["runs"]
        .as_array()
        .context("no `runs` in the reference output")?
        .iter()
        .map(|r| RunResult {
            first_audio_ms: r["first_audio_ms"].as_f64().unwrap_or(f64::NAN),
            total_s: r["total_s"].as_f64().unwrap_or(f64::NAN),
            audio_s: r["audio_s"].as_f64().unwrap_or(f64::NAN),
        })
        .collect();
    Ok((load_s, runs))
}

/// Medians of a side's runs: (RTF, first audio ms, audio s).
fn medians(runs: &[RunResult]) -> (f64, f64, f64) {
    (
        median(runs.iter().map(RunResult::rtf).collect()),
        median(runs.iter().map(|r| r.first_audio_ms).collect()),
        median(runs.iter().map(|r| r.audio_s).collect()),
    )
}

impl Default for TtsArgs {
    fn default() -> Self {
        TtsArgs {
            text: None,
            threads: 2,
            runs: 3,
            device: "cpu".into(),
            first_chunk_frames: Chunking::default().first_frames,
            chunk_frames: Chunking::default().frames,
            profile_ops: 0,
        }
    }
}

impl Bench for TtsArgs {
    fn name(&self) -> &'static str {
        "tts"
    }

    fn compares(&self) -> &'static str {
        "Piper \"joe\" on our runtime vs Piper on onnxruntime (RTF, first audio; same text, threads)"
    }

    fn args(&self) -> Vec<String> {
        let d = TtsArgs::default();
        let mut a = Vec::new();
        if let Some(t) = &self.text {
            a.extend(["--text".into(), t.clone()]);
        }
        let mut num = |flag: &str, v: usize, def: usize| {
            if v != def {
                a.extend([flag.to_string(), v.to_string()]);
            }
        };
        num("--threads", self.threads, d.threads);
        num("--runs", self.runs, d.runs);
        num(
            "--first-chunk-frames",
            self.first_chunk_frames,
            d.first_chunk_frames,
        );
        num("--chunk-frames", self.chunk_frames, d.chunk_frames);
        num("--profile-ops", self.profile_ops, d.profile_ops);
        if self.device != d.device {
            a.extend(["--device".into(), self.device.clone()]);
        }
        a
    }

    fn run(&self) -> anyhow::Result<BenchReport> {
        if std::env::var_os("RAYON_NUM_THREADS").is_none() {
            // Before candle's thread pool starts: both engines get the same cores.
            std::env::set_var("RAYON_NUM_THREADS", self.threads.to_string());
        }
        let text = self
            .text
            .clone()
            .unwrap_or_else(|| DEFAULT_TEXT.to_string());
        let runs = self.runs.max(1);
        let voice = VoiceFiles::in_dir(&edgeflow_piper::PIPER_JOE.locate()?)?;
        let spec: DeviceSpec = self.device.parse()?;

        eprintln!("ours: loading the voice on {spec}...");
        let t0 = Instant::now();
        let vc = VoiceConfig::read(&voice.config)?;
        let rate = vc.sample_rate;
        let cfg = VitsConfig {
            num_symbols: vc.num_symbols,
            ..VitsConfig::default()
        };
        let dev = edgeflow_backends::open(spec)?;
        let vits = Vits::load(
            &edgeflow_piper::VarBuilder::open(&[&voice.weights], &dev)?,
            &cfg,
        )?;
        let fe = FrontEnd::new(vc, true);
        let ours_load = t0.elapsed().as_secs_f64();
        // Timed once the weights' background move to 2 MB pages is over.
        super::settle_huge_pages();
        let chunking = Chunking {
            first_frames: self.first_chunk_frames.max(1),
            frames: self.chunk_frames.max(1),
        };
        ours_once(&fe, &vits, &text, rate, chunking)?;
        let mut ours = Vec::with_capacity(runs);
        for i in 0..runs {
            eprintln!("ours: run {}/{runs}", i + 1);
            ours.push(ours_once(&fe, &vits, &text, rate, chunking)?);
        }
        if self.profile_ops > 0 {
            let ops = super::op_profile(vits.device(), self.profile_ops, || {
                ours_once(&fe, &vits, &text, rate, chunking).map(drop)
            })?;
            eprint!("{ops}");
        }

        let python = Peer::Piper.find();
        let peer = match &python {
            Some(py) => {
                eprintln!("piper-tts on onnxruntime: {runs} runs...");
                Some(onnxruntime_side(
                    &repo_root(),
                    &text,
                    self.threads,
                    runs,
                    py,
                )?)
            }
            None => None,
        };

        let mut r = BenchReport::new(
            format!(
                "edgeflow bench tts: Piper \"joe\" ({rate} Hz), {} threads, median of {runs} runs, noise off",
                self.threads
            ),
            "piper-tts 1.8.0 onnxruntime",
            "ours / onnxruntime",
        );
        r.context.push(format!("text: {text:?}"));
        let (rtf, first, audio) = medians(&ours);
        let ours_name = format!("edgeflow vits ({spec})");
        match &peer {
            Some((peer_load, peer_runs)) => {
                let (p_rtf, p_first, p_audio) = medians(peer_runs);
                r.rows.push(
                    Row::new(format!("{ours_name}: RTF"), rtf, "")
                        .baseline(p_rtf)
                        .ratio(rtf / p_rtf),
                );
                r.rows.push(
                    Row::new(format!("{ours_name}: first audio"), first, "ms")
                        .baseline(p_first)
                        .ratio(first / p_first),
                );
                r.rows.push(
                    Row::new(format!("{ours_name}: load"), ours_load, "s").baseline(*peer_load),
                );
                r.rows.push(
                    Row::new(format!("{ours_name}: audio length"), audio, "s").baseline(p_audio),
                );
            }
            None => {
                r.rows.push(Row::new(format!("{ours_name}: RTF"), rtf, ""));
                r.rows
                    .push(Row::new(format!("{ours_name}: first audio"), first, "ms"));
                r.rows
                    .push(Row::new(format!("{ours_name}: load"), ours_load, "s"));
                r.rows
                    .push(Row::new(format!("{ours_name}: audio length"), audio, "s"));
                r.peer_missing("piper-tts on onnxruntime", Peer::Piper.missing());
            }
        }
        r.notes.push(
            "RTF = synthesis time / audio length (lower is faster); ratio = ours / onnxruntime (below 1: ours faster)"
                .into(),
        );
        Ok(r)
    }
}
