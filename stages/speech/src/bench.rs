//! Speech-in benchmark: Silero VAD time per 32 ms window and Whisper time
//! per utterance, against onnxruntime and faster-whisper measured in the
//! same run on the same clip (through `scripts/speech_reference.py
//! --bench-wav`, when its pinned venv is there).
//!
//! The utterances are the speech segments our own VAD finds in the clip;
//! both sides transcribe exactly those sample ranges, with the same thread
//! count (ours: the CPU backend's pool, `RAYON_NUM_THREADS`; faster-whisper:
//! `cpu_threads`). Times are medians of `repeats` runs after one warm-up.

use crate::cards::{SILERO_VAD, SILERO_WEIGHTS, WHISPER_TINY_EN};
use crate::silero::{SileroVad, WINDOW};
use crate::vad::{Segmenter, VadConfig, VadEvent};
use crate::whisper::Transcriber;
use crate::{Error, Result};
use edgeflow_runtime::Device;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// A 16 kHz mono WAV with a few utterances.
    pub clip: PathBuf,
    /// Python of the reference venv (`None`: only our side is measured).
    pub reference_python: Option<PathBuf>,
    /// `scripts/speech_reference.py`.
    pub reference_script: PathBuf,
    /// Timed runs per measurement (after one warm-up).
    pub repeats: usize,
}

impl BenchOptions {
    /// Defaults for a checkout at `repo`: the fixture clip, the venv under
    /// `~/.cache/edgeflow/speech-ref-venv` if it exists, 3 repeats.
    pub fn for_repo(repo: &Path) -> Self {
        let venv = std::env::var_os("HOME")
            .map(PathBuf::from)
            .map(|h| h.join(".cache/edgeflow/speech-ref-venv/bin/python"))
            .filter(|p| p.is_file());
        BenchOptions {
            clip: repo.join("stages/speech/tests/fixtures/speech_mix.wav"),
            reference_python: venv,
            reference_script: repo.join("scripts/speech_reference.py"),
            repeats: 3,
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Threads of the CPU backend's pool.
fn threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Run the benchmark on `dev` (a CPU device) and render a text report.
pub fn bench(o: &BenchOptions, dev: &Device) -> Result<String> {
    let (info, audio) = edgeflow_audio::wav::read_wav(&o.clip)
        .map_err(|e| Error::BadInput(format!("{}: {e}", o.clip.display())))?;
    if info.sample_rate != 16_000 || info.channels != 1 {
        return Err(Error::BadInput(format!(
            "{}: the bench clip must be 16 kHz mono",
            o.clip.display()
        )));
    }
    let repeats = o.repeats.max(1);
    let mut out = String::new();
    let n = threads();

    // VAD: per-window time over the whole clip, and the segments.
    let vb = crate::VarBuilder::open(&[SILERO_VAD.path(SILERO_WEIGHTS)?], dev)?;
    let mut vad = SileroVad::load(&vb, &crate::silero::SileroConfig::default())?;
    let mut per_window = Vec::new();
    let mut segments = Vec::new();
    for run in 0..=repeats {
        vad.reset()?;
        let mut seg = Segmenter::new(VadConfig::default());
        let mut start = 0;
        for w in audio.chunks_exact(WINDOW) {
            let t0 = Instant::now();
            let p = vad.step(w)?;
            if run > 0 {
                per_window.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            match seg.push(p, WINDOW) {
                Some(VadEvent::Start(s)) => start = s as usize,
                Some(VadEvent::End(e)) if run == 0 => segments.push((start, e as usize)),
                _ => {}
            }
        }
        if run == 0 && seg.in_speech() {
            segments.push((start, audio.len()));
        }
    }
    let ours_vad = median(per_window);

    // ASR on each segment.
    let t0 = Instant::now();
    let mut tr = Transcriber::load(&WHISPER_TINY_EN.locate()?, dev)?;
    let load_s = t0.elapsed().as_secs_f64();
    let mut ours = Vec::new();
    for &(a, b) in &segments {
        let mut times = Vec::new();
        let mut text = String::new();
        for run in 0..=repeats {
            let t0 = Instant::now();
            let t = tr.transcribe(&audio[a..b], &mut || false)?;
            if run > 0 {
                times.push(t0.elapsed().as_secs_f64());
            }
            text = t.text;
        }
        ours.push((a, b, median(times), text));
    }

    // The peers, same clip, same segments, same threads.
    let peer: Option<serde_json::Value> =
        match &o.reference_python {
            Some(py) if !segments.is_empty() => {
                let segs = segments
                    .iter()
                    .map(|(a, b)| format!("{a}:{b}"))
                    .collect::<Vec<_>>()
                    .join(",");
                let r = Command::new(py)
                    .arg(&o.reference_script)
                    .arg("--bench-wav")
                    .arg(&o.clip)
                    .args(["--segments", &segs])
                    .args(["--threads", &n.to_string()])
                    .args(["--repeats", &repeats.to_string()])
                    .output()
                    .map_err(|e| Error::io(py, e))?;
                if !r.status.success() {
                    return Err(Error::BadInput(format!(
                        "reference bench failed: {}",
                        String::from_utf8_lossy(&r.stderr)
                    )));
                }
                Some(serde_json::from_slice(&r.stdout).map_err(|e| {
                    Error::BadInput(format!("reference bench printed no JSON: {e}"))
                })?)
            }
            _ => None,
        };

    let _ = writeln!(
        out,
        "speech-in bench ({} threads, clip {})",
        n,
        o.clip.display()
    );
    let ort = peer
        .as_ref()
        .and_then(|p| p["ort_vad_us_per_window"].as_f64());
    let _ = writeln!(
        out,
        "  Silero VAD, per 32 ms window (median): ours {ours_vad:.0} us{}",
        match ort {
            Some(v) => format!(
                ", onnxruntime (1 thread) {v:.0} us, ratio {:.2}x",
                ours_vad / v
            ),
            None => ", onnxruntime not measured (no reference venv)".to_string(),
        }
    );
    let _ = writeln!(
        out,
        "  Whisper tiny.en load: ours {:.2} s{}",
        load_s,
        peer.as_ref()
            .and_then(|p| p["faster_whisper_load_s"].as_f64())
            .map(|v| format!(", faster-whisper {v:.2} s"))
            .unwrap_or_default()
    );
    let mut tot = (0.0, 0.0);
    for (i, (a, b, s, text)) in ours.iter().enumerate() {
        let secs = (b - a) as f64 / 16_000.0;
        let fw = peer
            .as_ref()
            .and_then(|p| p["clips"].get(i))
            .and_then(|c| Some((c["seconds"].as_f64()?, c["text"].as_str()?.to_string())));
        let _ = write!(out, "  ASR {secs:.2} s utterance: ours {s:.3} s");
        match fw {
            Some((f, ftext)) => {
                tot.0 += s;
                tot.1 += f;
                let same = if ftext == *text {
                    "same text"
                } else {
                    "DIFFERENT text"
                };
                let _ = writeln!(
                    out,
                    ", faster-whisper {f:.3} s, ratio {:.2}x, {same}",
                    s / f
                );
            }
            None => {
                let _ = writeln!(out);
            }
        }
        let _ = writeln!(out, "    {text:?}");
    }
    if tot.1 > 0.0 {
        let _ = writeln!(
            out,
            "  ASR total: ours {:.3} s, faster-whisper {:.3} s ({:.2}x)",
            tot.0,
            tot.1,
            tot.0 / tot.1
        );
    }
    Ok(out)
}
