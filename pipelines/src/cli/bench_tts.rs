//! `edgeflow bench tts`: our Piper "joe" voice against Piper on onnxruntime,
//! same text, same thread count, in one run.
//!
//! Both sides synthesize sentence by sentence with noise disabled (so both
//! produce the same durations and the same audio length) after one warm-up
//! run; time to first audio is from the call to the first audio chunk
//! (Piper yields whole sentences; ours yields the first decoded chunk of the
//! first sentence). The onnxruntime side runs as a subprocess from the
//! pinned venv of `scripts/piper_reference.py`.

use anyhow::Context;
use edgeflow_piper::piper::cards::VoiceFiles;
use edgeflow_piper::piper::{FrontEnd, InferenceScales, VoiceConfig};
use edgeflow_piper::vits::{AudioAhead, Chunking, SynthesisParams, Vits, VitsConfig};
use edgeflow_runtime::DeviceSpec;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// About ten seconds of speech in three sentences.
const DEFAULT_TEXT: &str = "The quick brown fox jumps over the lazy dog. \
Edge devices can speak, listen, and think, all at the same time. \
This sentence was synthesized by a small voice model running on our own tensor runtime.";

/// Options of `edgeflow bench tts`.
#[derive(Debug, clap::Args)]
pub struct BenchTtsArgs {
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
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

fn venv_python() -> PathBuf {
    if let Some(v) = std::env::var_os("EDGEFLOW_PIPER_VENV").filter(|v| !v.is_empty()) {
        return PathBuf::from(v).join("bin/python");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("edgeflow/piper-ref-venv/bin/python")
}

fn onnxruntime_side(
    repo: &Path,
    text: &str,
    threads: usize,
    runs: usize,
) -> anyhow::Result<(f64, Vec<RunResult>)> {
    let python = venv_python();
    if !python.is_file() {
        anyhow::bail!(
            "{} not found: create the pinned reference venv with scripts/piper_reference_venv.sh",
            python.display()
        );
    }
    let script = repo.join("scripts/piper_reference.py");
    let out = Command::new(&python)
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

fn row(name: &str, load_s: f64, runs: &[RunResult]) -> (String, f64, f64) {
    let rtf = median(runs.iter().map(RunResult::rtf).collect());
    let first = median(runs.iter().map(|r| r.first_audio_ms).collect());
    let audio = median(runs.iter().map(|r| r.audio_s).collect());
    (
        format!("{name:<28} {load_s:>7.2} s {audio:>8.2} s {first:>12.1} ms {rtf:>8.3}"),
        rtf,
        first,
    )
}

/// Run the benchmark and print a table with ratios.
pub fn run(a: BenchTtsArgs) -> anyhow::Result<ExitCode> {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // Before candle's thread pool starts: both engines get the same cores.
        std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    }
    let text = a.text.clone().unwrap_or_else(|| DEFAULT_TEXT.to_string());
    let runs = a.runs.max(1);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let voice = VoiceFiles::in_dir(&edgeflow_piper::PIPER_JOE.locate()?)?;
    let spec: DeviceSpec = a.device.parse()?;

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
    let chunking = Chunking {
        first_frames: a.first_chunk_frames.max(1),
        frames: a.chunk_frames.max(1),
    };
    ours_once(&fe, &vits, &text, rate, chunking)?;
    let mut ours = Vec::with_capacity(runs);
    for i in 0..runs {
        eprintln!("ours: run {}/{runs}", i + 1);
        ours.push(ours_once(&fe, &vits, &text, rate, chunking)?);
    }
    if a.profile_ops > 0 {
        // One more run with every op timed (the timing itself costs a
        // little, so the timed runs above go without it).
        let stats = vits.device().stats();
        stats.profile_ops(true);
        ours_once(&fe, &vits, &text, rate, chunking)?;
        eprint!(
            "{}",
            edgeflow_runtime::render_op_profile(&stats.op_profile(), a.profile_ops)
        );
        stats.profile_ops(false);
    }

    eprintln!("piper-tts on onnxruntime: {runs} runs...");
    let peer = onnxruntime_side(&repo, &text, a.threads, runs);

    println!("edgeflow bench tts: Piper \"joe\" (22050 Hz), {} threads, median of {runs} runs, noise off", a.threads);
    println!("text: {text:?}");
    println!(
        "{:<28} {:>9} {:>10} {:>15} {:>8}",
        "engine", "load", "audio", "first audio", "RTF"
    );
    let (line, our_rtf, our_first) = row(&format!("edgeflow vits ({spec})"), ours_load, &ours);
    println!("{line}");
    match peer {
        Ok((load_s, peer_runs)) => {
            let (line, rtf, first) = row("piper-tts 1.8.0 onnxruntime", load_s, &peer_runs);
            println!("{line}");
            println!(
                "ratio (ours / onnxruntime): RTF {:.2}x, first audio {:.2}x",
                our_rtf / rtf,
                our_first / first
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("no onnxruntime baseline: {e:#}");
            Ok(ExitCode::FAILURE)
        }
    }
}
