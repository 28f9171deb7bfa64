//! Whisper-compatible log-mel spectrogram and the `mel` stage.
//!
//! Identical to the reference front end of OpenAI Whisper and
//! faster-whisper's `FeatureExtractor`: 16 kHz mono, `n_fft` 400 (25 ms)
//! with a periodic Hann window, hop 160 (10 ms), centred frames with
//! reflect padding, power spectrum, 80 Slaney-normalised mel filters
//! (0-8 kHz), `log10(max(x, 1e-10))`, clamp to `max - 8`, then
//! `(x + 4) / 4`. The last STFT frame is dropped, as Whisper does, so `n`
//! samples give `n / 160` frames. The clamp uses the maximum over the whole
//! input, so the features of an utterance depend on all of it: the stage
//! therefore computes them per utterance (end of stream, a `flush` event, or
//! `max_s` of audio).

use crate::error::Error;
use edgeflow_graph::{
    BuildEnv, Epoch, Event, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType,
    Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use edgeflow_runtime::Tensor;
use rustfft::num_complex::Complex32;
use rustfft::{Fft, FftPlanner};
use std::sync::Arc;

/// Sample rate Whisper features are defined at.
pub const SAMPLE_RATE: u32 = 16_000;
/// FFT size (25 ms).
pub const N_FFT: usize = 400;
/// Hop (10 ms).
pub const HOP: usize = 160;
/// Mel bins.
pub const N_MELS: usize = 80;

/// Slaney-style mel filterbank, `n_mels x (n_fft/2 + 1)`, row-major,
/// computed exactly as librosa / Whisper / faster-whisper do (f64, then f32).
pub fn mel_filters(sample_rate: u32, n_fft: usize, n_mels: usize) -> Vec<f32> {
    mel_filters_range(
        sample_rate,
        n_fft,
        n_mels,
        0.0,
        f64::from(sample_rate) / 2.0,
    )
}

/// [`mel_filters`] between `fmin` and `fmax` Hz (librosa's
/// `filters.mel(sr, n_fft, n_mels, fmin, fmax)`, Slaney scale and norm).
pub fn mel_filters_range(
    sample_rate: u32,
    n_fft: usize,
    n_mels: usize,
    fmin: f64,
    fmax: f64,
) -> Vec<f32> {
    let n_bins = n_fft / 2 + 1;
    let fft_freqs: Vec<f64> = (0..n_bins)
        .map(|k| k as f64 * sample_rate as f64 / n_fft as f64)
        .collect();
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    let hz_to_mel = |f: f64| {
        if f >= min_log_hz {
            min_log_mel + (f / min_log_hz).ln() / logstep
        } else {
            f / f_sp
        }
    };
    let min_mel = hz_to_mel(fmin);
    let max_mel = hz_to_mel(fmax);
    let freqs: Vec<f64> = (0..n_mels + 2)
        .map(|i| {
            let m = min_mel + (max_mel - min_mel) * i as f64 / (n_mels + 1) as f64;
            if m >= min_log_mel {
                min_log_hz * (logstep * (m - min_log_mel)).exp()
            } else {
                f_sp * m
            }
        })
        .collect();
    let mut w = vec![0f32; n_mels * n_bins];
    for m in 0..n_mels {
        let enorm = 2.0 / (freqs[m + 2] - freqs[m]);
        for (k, &f) in fft_freqs.iter().enumerate() {
            let lower = (f - freqs[m]) / (freqs[m + 1] - freqs[m]);
            let upper = (freqs[m + 2] - f) / (freqs[m + 2] - freqs[m + 1]);
            w[m * n_bins + k] = (lower.min(upper).max(0.0) * enorm) as f32;
        }
    }
    w
}

/// Computes Whisper log-mel features.
pub struct LogMel {
    filters: Vec<f32>,
    window: Vec<f32>,
    fft: Arc<dyn Fft<f32>>,
    scratch: Vec<Complex32>,
    buf: Vec<Complex32>,
    power: Vec<f32>,
}

impl std::fmt::Debug for LogMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMel").field("n_mels", &N_MELS).finish()
    }
}

impl Default for LogMel {
    fn default() -> Self {
        Self::new()
    }
}

impl LogMel {
    /// The Whisper front end (80 bins).
    pub fn new() -> Self {
        let fft = FftPlanner::<f32>::new().plan_fft_forward(N_FFT);
        let window = (0..N_FFT)
            .map(|n| {
                (0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos()) as f32
            })
            .collect();
        LogMel {
            filters: mel_filters(SAMPLE_RATE, N_FFT, N_MELS),
            window,
            scratch: vec![Complex32::default(); fft.get_inplace_scratch_len()],
            buf: vec![Complex32::default(); N_FFT],
            power: vec![0.0; N_FFT / 2 + 1],
            fft,
        }
    }

    /// Frames produced for `n` samples (after padding).
    pub fn frames_for(n: usize) -> usize {
        n / HOP
    }

    /// Features of `samples` (16 kHz mono) followed by `padding` zeros, as
    /// faster-whisper's `FeatureExtractor(waveform, padding)`. Returns
    /// `(values, frames)`, values row-major `[N_MELS, frames]`.
    pub fn compute(&mut self, samples: &[f32], padding: usize) -> (Vec<f32>, usize) {
        let n = samples.len() + padding;
        let frames = Self::frames_for(n);
        let mut out = vec![0f32; N_MELS * frames];
        if frames == 0 {
            return (out, 0);
        }
        let get = |i: usize| if i < samples.len() { samples[i] } else { 0.0 };
        let half = (N_FFT / 2) as isize;
        let n_bins = N_FFT / 2 + 1;
        let mut max = f32::NEG_INFINITY;
        for t in 0..frames {
            let start = (t * HOP) as isize - half;
            for j in 0..N_FFT {
                let idx = reflect(start + j as isize, n);
                self.buf[j] = Complex32::new(get(idx) * self.window[j], 0.0);
            }
            self.fft
                .process_with_scratch(&mut self.buf, &mut self.scratch);
            for k in 0..n_bins {
                self.power[k] = self.buf[k].norm_sqr();
            }
            for m in 0..N_MELS {
                let row = &self.filters[m * n_bins..(m + 1) * n_bins];
                let e: f32 = row.iter().zip(&self.power).map(|(w, p)| w * p).sum();
                let l = e.max(1e-10).log10();
                max = max.max(l);
                out[m * frames + t] = l;
            }
        }
        let floor = max - 8.0;
        for v in &mut out {
            *v = (v.max(floor) + 4.0) / 4.0;
        }
        (out, frames)
    }
}

/// numpy's `reflect` padding index (edge sample not repeated), for any
/// amount of padding.
fn reflect(i: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let mut k = i.rem_euclid(period);
    if k >= n as isize {
        k = period - k;
    }
    k as usize
}

// ---------------------------------------------------------------- stage

/// The `mel` stage kind.
#[derive(Debug)]
pub struct MelKind;

impl StageFactory for MelKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "mel",
            doc: "Whisper-compatible log-mel features (16 kHz mono, 25 ms / 10 ms, 80 Slaney mel bins, log10 clamped to max-8, (x+4)/4), one tensor [80, frames] per utterance: at end of stream, on a flush event, or every `max_s` seconds.",
            params: vec![
                ParamInfo::new("padding", ParamType::Int, 160, "zero samples appended to each utterance before the STFT (faster-whisper uses 160)"),
                ParamInfo::new("max_s", ParamType::Float, 30.0, "emit features every this many seconds of audio (Whisper's 30 s window)"),
                ParamInfo::new("features", ParamType::String, "whisper", "`whisper` (16 kHz, the above) or `hifigan`: HiFi-GAN V1's vocoder features (22050 Hz mono, n_fft 1024, hop 256, 80 Slaney bins 0-8 kHz, ln of the magnitude), streamed as frames [80, frames] as soon as each is computable, the last at end of stream or on a flush"),
            ],
            ports: Ports {
                inputs: vec![
                    PortSpec::new(
                        "in",
                        PortType::Audio { sample_rate: Some(SAMPLE_RATE), channels: Some(1) },
                        "16 kHz mono audio",
                    ),
                    PortSpec::optional("flush", PortType::Control, "a Flush event ends the utterance"),
                ],
                outputs: vec![PortSpec::new("out", PortType::Tensor, "f32 tensor [80, frames]")],
            },
            source: false,
        }
    }

    fn ports(&self, p: &Params, _env: &BuildEnv) -> StageResult<Ports> {
        let mut ports = self.info().ports;
        if features(p)? == Features::Hifigan {
            let rate = crate::mel_hifigan::HifiganMelConfig::default().sampling_rate;
            ports.inputs[0] = PortSpec::new(
                "in",
                PortType::Audio {
                    sample_rate: Some(rate),
                    channels: Some(1),
                },
                "22050 Hz mono audio",
            );
        }
        Ok(ports)
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        if features(p)? == Features::Hifigan {
            let cfg = crate::mel_hifigan::HifiganMelConfig::default();
            let mel = crate::mel_hifigan::HifiganMel::new(cfg)?;
            return Ok(Box::new(crate::mel_hifigan::HifiganMelStage::new(mel)));
        }
        let padding: usize = p.get_or("padding", HOP)?;
        let max_s: f64 = p.get_or("max_s", 30.0)?;
        if !(0.1..=600.0).contains(&max_s) {
            return Err(p
                .error(
                    "max_s",
                    format!("must be in 0.1..=600 seconds, got {max_s}"),
                )
                .into());
        }
        Ok(Box::new(MelStage {
            mel: LogMel::new(),
            padding,
            max_samples: (max_s * SAMPLE_RATE as f64) as usize,
            audio: Vec::new(),
        }))
    }
}

/// Which features the `mel` stage computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Features {
    Whisper,
    Hifigan,
}

fn features(p: &Params) -> StageResult<Features> {
    let f: String = p.get_or("features", "whisper".to_string())?;
    match f.as_str() {
        "whisper" => Ok(Features::Whisper),
        "hifigan" => Ok(Features::Hifigan),
        other => Err(p
            .error(
                "features",
                format!("must be `whisper` or `hifigan`, got `{other}`"),
            )
            .into()),
    }
}

/// The `mel` stage.
#[derive(Debug)]
pub struct MelStage {
    mel: LogMel,
    padding: usize,
    max_samples: usize,
    audio: Vec<f32>,
}

impl MelStage {
    fn emit(&mut self, upto: usize, ctx: &mut StageCtx) -> StageResult {
        if upto == 0 {
            return Ok(());
        }
        let (values, frames) = self.mel.compute(&self.audio[..upto], self.padding);
        self.audio.drain(..upto);
        let t = Tensor::from_vec(values, &[N_MELS, frames])
            .map_err(|e| StageError::msg(e.to_string()))?;
        ctx.emit(0, Payload::Tensor(t))
    }
}

impl Stage for MelStage {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        match &input.msg.payload {
            Payload::Audio(a) => {
                if a.sample_rate != SAMPLE_RATE || a.channels != 1 {
                    return Err(Error::Format(format!(
                        "mel `{}`: got {} Hz x{} audio; Whisper features need 16000 Hz mono: insert \
                         `resample` (to: 16000) and `channel_mix` (channels: 1) before it",
                        ctx.id(),
                        a.sample_rate,
                        a.channels
                    ))
                    .into());
                }
                self.audio.extend_from_slice(&a.samples);
                while self.audio.len() >= self.max_samples {
                    self.emit(self.max_samples, ctx)?;
                }
                Ok(())
            }
            Payload::Event(e) if matches!(**e, Event::Flush) => self.emit(self.audio.len(), ctx),
            _ => Ok(()),
        }
    }

    fn reset(&mut self, _epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        self.audio.clear();
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        self.emit(self.audio.len(), ctx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::Path;

    fn read_f32(path: &Path) -> Vec<f32> {
        let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Fixtures made by `tests/fixtures/make_mel_fixtures.py` with
    /// faster-whisper 1.2.1's `FeatureExtractor` (numpy 2.1.3).
    ///
    /// Tolerance: 2e-3 absolute on the normalised features (whose range is
    /// about 2.0, one unit = 4 in log10 power). numpy computes the STFT in
    /// single precision with a different FFT algorithm and summation order;
    /// those rounding differences are ~1e-6 relative in power, far below
    /// this, except in bins near the `max - 8` floor where log10 of a tiny
    /// power amplifies them, hence the margin.
    #[test]
    fn matches_faster_whisper_reference() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut mel = LogMel::new();
        for name in ["mel_chirp", "mel_quiet_short"] {
            let audio = read_f32(&dir.join(format!("{name}.in.f32")));
            let reference = read_f32(&dir.join(format!("{name}.mel.f32")));
            let (got, frames) = mel.compute(&audio, 160);
            assert_eq!(frames, (audio.len() + 160) / HOP, "{name}");
            assert_eq!(got.len(), reference.len(), "{name}: shape");
            let worst = got
                .iter()
                .zip(&reference)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 2e-3, "{name}: max abs difference {worst}");
        }
    }

    #[test]
    fn filterbank_matches_reference() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let reference = read_f32(&dir.join("mel_filters_80.f32"));
        let ours = mel_filters(16_000, 400, 80);
        assert_eq!(ours.len(), reference.len());
        let worst = ours
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        // Both computed in f64 and rounded to f32: only last-bit differences.
        assert!(worst < 1e-6, "filterbank max abs difference {worst}");
    }

    #[test]
    fn reflect_matches_numpy() {
        // np.pad(np.arange(4), 5, mode="reflect")
        let got: Vec<usize> = (-5..9).map(|i| reflect(i, 4)).collect();
        assert_eq!(got, vec![1, 2, 3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1, 2]);
    }

    #[test]
    fn short_and_empty_inputs() {
        let mut mel = LogMel::new();
        assert_eq!(mel.compute(&[], 0).1, 0);
        let (v, f) = mel.compute(&[0.1; 50], 160);
        assert_eq!(f, 1);
        assert!(v.iter().all(|x| x.is_finite()));
    }
}
