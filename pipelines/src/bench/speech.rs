//! `edgeflow bench speech`: Silero VAD time per 32 ms window and Whisper
//! time per utterance, against onnxruntime and faster-whisper measured in
//! the same run on the same clip (through `scripts/speech_reference.py
//! --bench-wav`, from the speech peer venv of `scripts/peer_envs.sh
//! speech`).
//!
//! The utterances are the speech segments our own VAD finds in the clip;
//! both sides transcribe exactly those sample ranges, with the same thread
//! count (ours: the CPU backend's pool, `RAYON_NUM_THREADS`; faster-whisper:
//! `cpu_threads`). Times are medians of `--repeats` runs after one warm-up.

use super::{median, pool_threads, repo_root, Bench, BenchReport, Peer, Row};
use anyhow::Context as _;
use edgeflow_runtime::DeviceSpec;
use edgeflow_speech::cards::{SILERO_VAD, SILERO_WEIGHTS, WHISPER_TINY_EN};
use edgeflow_speech::silero::{SileroVad, WINDOW};
use edgeflow_speech::vad::{Segmenter, VadConfig, VadEvent};
use edgeflow_speech::whisper::Transcriber;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

/// Options of `edgeflow bench speech`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SpeechArgs {
    /// A 16 kHz mono WAV with a few utterances (default: the speech
    /// crate's test fixture).
    #[arg(long)]
    pub clip: Option<PathBuf>,
    /// Timed runs per measurement (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
}

impl Default for SpeechArgs {
    fn default() -> Self {
        SpeechArgs {
            clip: None,
            repeats: 3,
        }
    }
}

impl SpeechArgs {
    fn clip(&self) -> PathBuf {
        self.clip
            .clone()
            .unwrap_or_else(|| repo_root().join("stages/speech/tests/fixtures/speech_mix.wav"))
    }
}

impl Bench for SpeechArgs {
    fn name(&self) -> &'static str {
        "speech"
    }

    fn compares(&self) -> &'static str {
        "Silero VAD vs onnxruntime, Whisper tiny.en vs faster-whisper (same clip, segments, threads)"
    }

    fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(c) = &self.clip {
            a.extend(["--clip".into(), c.display().to_string()]);
        }
        if self.repeats != SpeechArgs::default().repeats {
            a.extend(["--repeats".into(), self.repeats.to_string()]);
        }
        a
    }

    fn run(&self) -> anyhow::Result<BenchReport> {
        eprintln!("measuring Silero VAD and Whisper tiny.en (and the peers)...");
        let clip = self.clip();
        let (info, audio) =
            edgeflow_audio::wav::read_wav(&clip).with_context(|| clip.display().to_string())?;
        if info.sample_rate != 16_000 || info.channels != 1 {
            anyhow::bail!("{}: the bench clip must be 16 kHz mono", clip.display());
        }
        let dev = edgeflow_backends::open(DeviceSpec::Cpu)?;
        let repeats = self.repeats.max(1);
        let n = pool_threads();

        // VAD: per-window time over the whole clip, and the segments.
        let vb = edgeflow_speech::VarBuilder::open(&[SILERO_VAD.path(SILERO_WEIGHTS)?], &dev)?;
        let mut vad = SileroVad::load(&vb, &Default::default())?;
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
        let mut tr = Transcriber::load(&WHISPER_TINY_EN.locate()?, &dev)?;
        let load_s = t0.elapsed().as_secs_f64();
        // Timed once the weights' background move to 2 MB pages is over.
        super::settle_huge_pages();
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
        let python = Peer::Speech.find();
        let peer: Option<serde_json::Value> = match &python {
            Some(py) if !segments.is_empty() => {
                let script = repo_root().join("scripts/speech_reference.py");
                let segs = segments
                    .iter()
                    .map(|(a, b)| format!("{a}:{b}"))
                    .collect::<Vec<_>>()
                    .join(",");
                let r = Command::new(py)
                    .arg(&script)
                    .arg("--bench-wav")
                    .arg(&clip)
                    .args(["--segments", &segs])
                    .args(["--threads", &n.to_string()])
                    .args(["--repeats", &repeats.to_string()])
                    .output()
                    .with_context(|| format!("running {}", py.display()))?;
                if !r.status.success() {
                    anyhow::bail!(
                        "reference bench failed: {}",
                        String::from_utf8_lossy(&r.stderr)
                    );
                }
                Some(
                    serde_json::from_slice(&r.stdout)
                        .context("the reference bench printed no JSON")?,
                )
            }
            _ => None,
        };

        let mut rep = BenchReport::new(
            format!(
                "edgeflow bench speech: speech in, {n} threads, clip {}",
                clip.display()
            ),
            "peer",
            "ours / peer",
        );
        rep.context.push(format!(
            "medians of {repeats} runs after one warm-up; ASR on the {} segments our VAD finds",
            segments.len()
        ));
        let ort = peer
            .as_ref()
            .and_then(|p| p["ort_vad_us_per_window"].as_f64());
        let vad_label = "Silero VAD, per 32 ms window (median)";
        match ort {
            Some(v) => rep.rows.push(
                Row::new(vad_label, ours_vad, "us")
                    .baseline(v)
                    .ratio(ours_vad / v)
                    .note("onnxruntime (1 thread)"),
            ),
            None => rep.rows.push(Row::new(vad_label, ours_vad, "us")),
        }
        let fw_load = peer
            .as_ref()
            .and_then(|p| p["faster_whisper_load_s"].as_f64());
        let mut load = Row::new("Whisper tiny.en load", load_s, "s");
        if let Some(v) = fw_load {
            load = load.baseline(v).note("faster-whisper");
        }
        rep.rows.push(load);
        let mut tot = (0.0, 0.0);
        for (i, (a, b, s, text)) in ours.iter().enumerate() {
            let secs = (b - a) as f64 / 16_000.0;
            let fw = peer
                .as_ref()
                .and_then(|p| p["clips"].get(i))
                .and_then(|c| Some((c["seconds"].as_f64()?, c["text"].as_str()?.to_string())));
            let label = format!("ASR {secs:.2} s utterance");
            let row = match fw {
                Some((f, ftext)) => {
                    tot.0 += s;
                    tot.1 += f;
                    let same = if ftext == *text {
                        "same text"
                    } else {
                        "DIFFERENT text"
                    };
                    Row::new(label, *s, "s")
                        .baseline(f)
                        .ratio(s / f)
                        .note(format!("faster-whisper, {same}: {text:?}"))
                }
                None => Row::new(label, *s, "s").note(format!("{text:?}")),
            };
            rep.rows.push(row);
        }
        if tot.1 > 0.0 {
            rep.rows.push(
                Row::new("ASR total", tot.0, "s")
                    .baseline(tot.1)
                    .ratio(tot.0 / tot.1)
                    .note("faster-whisper"),
            );
        }
        if python.is_none() {
            rep.peer_missing(
                "onnxruntime VAD / faster-whisper ASR",
                Peer::Speech.missing(),
            );
        }
        rep.notes
            .push("ratio = our time / the peer's time (below 1: ours faster)".into());
        Ok(rep)
    }
}
