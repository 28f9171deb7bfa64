//! Shared helpers for the tests that need the Piper "joe" voice.

#![allow(dead_code)]

use edgeflow_piper::piper::cards::VoiceFiles;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The cached voice, `None` when EDGEFLOW_SKIP_MODEL_TESTS=1 and it is not
/// cached; otherwise a missing voice fails the test with what to run.
pub(crate) fn voice() -> Option<VoiceFiles> {
    match edgeflow_piper::PIPER_JOE.locate() {
        Ok(dir) => Some(VoiceFiles::in_dir(&dir).expect("voice files")),
        Err(e) => {
            if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
                eprintln!("skipped (EDGEFLOW_SKIP_MODEL_TESTS=1): {e}");
                None
            } else {
                panic!(
                    "the Piper voice is not cached: run `edgeflow models fetch piper-joe` ({e})"
                );
            }
        }
    }
}

/// One reference sentence.
#[derive(Debug, Deserialize)]
pub(crate) struct RefSentence {
    pub phonemes: Vec<String>,
    pub ids: Vec<i64>,
    pub durations: Vec<u32>,
    pub audio: String,
    pub samples: usize,
}

/// One reference text.
#[derive(Debug, Deserialize)]
pub(crate) struct RefCase {
    pub text: String,
    pub sentences: Vec<RefSentence>,
}

#[derive(Debug, Deserialize)]
struct Reference {
    cases: Vec<RefCase>,
}

pub(crate) fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/piper_joe")
}

/// The reference cases written by scripts/piper_reference.py.
pub(crate) fn reference() -> Vec<RefCase> {
    let path = fixtures_dir().join("reference.json");
    let text = std::fs::read_to_string(&path).expect("read reference.json");
    serde_json::from_str::<Reference>(&text)
        .expect("parse reference.json")
        .cases
}

/// The reference waveform of a sentence, as f32 in [-1, 1].
pub(crate) fn reference_audio(s: &RefSentence) -> Vec<f32> {
    let bytes = std::fs::read(fixtures_dir().join(&s.audio)).expect("read audio fixture");
    bytes
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32767.0)
        .collect()
}

/// Signal-to-noise ratio of `got` against `want`, in dB.
pub(crate) fn snr_db(want: &[f32], got: &[f32]) -> f64 {
    let n = want.len().min(got.len());
    let sig: f64 = want[..n].iter().map(|&x| (x as f64).powi(2)).sum();
    let err: f64 = want[..n]
        .iter()
        .zip(&got[..n])
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    10.0 * (sig / err.max(1e-20)).log10()
}

/// Magnitude spectrogram (Hann window, naive DFT; test-sized inputs only).
pub(crate) fn magnitudes(x: &[f32], n: usize, hop: usize) -> Vec<Vec<f64>> {
    let win: Vec<f64> = (0..n)
        .map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n as f64).cos())
        .collect();
    let mut frames = Vec::new();
    let mut start = 0;
    while start + n <= x.len() {
        let f: Vec<f64> = (0..=n / 2)
            .map(|k| {
                let (mut re, mut im) = (0.0, 0.0);
                for (i, w) in win.iter().enumerate() {
                    let a = -2.0 * std::f64::consts::PI * (k * i) as f64 / n as f64;
                    let v = x[start + i] as f64 * w;
                    re += v * a.cos();
                    im += v * a.sin();
                }
                (re * re + im * im).sqrt()
            })
            .collect();
        frames.push(f);
        start += hop;
    }
    frames
}

/// SNR of magnitude spectrograms in dB: how close the spectra are,
/// ignoring phase (the fair measure for a quantized vocoder).
pub(crate) fn spectral_snr_db(want: &[f32], got: &[f32]) -> f64 {
    let (a, b) = (magnitudes(want, 512, 256), magnitudes(got, 512, 256));
    let (mut sig, mut err) = (0.0f64, 0.0f64);
    for (fa, fb) in a.iter().zip(&b) {
        for (x, y) in fa.iter().zip(fb) {
            sig += x * x;
            err += (x - y) * (x - y);
        }
    }
    10.0 * (sig / err.max(1e-20)).log10()
}
