//! The HiFi-GAN log-mel front end (jik876/hifi-gan `meldataset.mel_spectrogram`,
//! the features its vocoders were trained on) and the `mel` stage's
//! `features: hifigan` mode.
//!
//! Defaults are HiFi-GAN V1's: 22 050 Hz mono, `n_fft` 1024, hop 256,
//! window 1024 (periodic Hann), reflect padding of `(n_fft - hop) / 2` on
//! each side and uncentred frames, magnitude `sqrt(re^2 + im^2 + 1e-9)`, 80
//! Slaney mel filters (librosa's, 0-8 kHz), `ln(max(x, 1e-5))`. `n`
//! samples give `n / hop` frames. Unlike Whisper's features there is no
//! normalisation over the utterance, so frames stream: [`HifiganMelStream`]
//! emits each frame as soon as its window is in, and the last few (whose
//! windows reflect at the end) when the stream ends.

use crate::error::Error;
use crate::mel::mel_filters_range;
use edgeflow_graph::{Epoch, Event, Input, Payload, Stage, StageCtx, StageError, StageResult};
use edgeflow_runtime::Tensor;
use rustfft::num_complex::Complex32;
use rustfft::{Fft, FftPlanner};
use std::sync::Arc;

/// Settings of the HiFi-GAN mel front end (upstream `config.json` names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HifiganMelConfig {
    /// Sample rate of the audio.
    pub sampling_rate: u32,
    /// FFT size.
    pub n_fft: usize,
    /// Hop between frames.
    pub hop_size: usize,
    /// Hann window length (centred in the FFT frame when shorter).
    pub win_size: usize,
    /// Mel bins.
    pub num_mels: usize,
    /// Lowest filter frequency.
    pub fmin: f64,
    /// Highest filter frequency.
    pub fmax: f64,
}

impl Default for HifiganMelConfig {
    fn default() -> Self {
        HifiganMelConfig {
            sampling_rate: 22_050,
            n_fft: 1024,
            hop_size: 256,
            win_size: 1024,
            num_mels: 80,
            fmin: 0.0,
            fmax: 8000.0,
        }
    }
}

/// Computes HiFi-GAN log-mel frames.
pub struct HifiganMel {
    cfg: HifiganMelConfig,
    filters: Vec<f32>,
    window: Vec<f32>,
    fft: Arc<dyn Fft<f32>>,
    scratch: Vec<Complex32>,
    buf: Vec<Complex32>,
    mag: Vec<f32>,
}

impl std::fmt::Debug for HifiganMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HifiganMel")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl HifiganMel {
    /// A front end with these settings; checks them.
    pub fn new(cfg: HifiganMelConfig) -> crate::Result<Self> {
        let ok = cfg.n_fft >= 2
            && cfg.n_fft <= 1 << 16
            && (1..=cfg.n_fft).contains(&cfg.hop_size)
            && (1..=cfg.n_fft).contains(&cfg.win_size)
            && (1..=512).contains(&cfg.num_mels)
            && cfg.fmin >= 0.0
            && cfg.fmin < cfg.fmax
            && cfg.fmax <= f64::from(cfg.sampling_rate) / 2.0;
        if !ok {
            return Err(Error::Format(format!(
                "HiFi-GAN mel settings {cfg:?} are inconsistent: need hop and window in 1..=n_fft, \
                 1..=512 mel bins and 0 <= fmin < fmax <= sampling_rate / 2"
            )));
        }
        let fft = FftPlanner::<f32>::new().plan_fft_forward(cfg.n_fft);
        // torch.hann_window(win) (periodic), zero-padded to n_fft, centred.
        let left = (cfg.n_fft - cfg.win_size) / 2;
        let mut window = vec![0f32; cfg.n_fft];
        for (n, w) in window[left..left + cfg.win_size].iter_mut().enumerate() {
            *w = (0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / cfg.win_size as f64).cos())
                as f32;
        }
        Ok(HifiganMel {
            filters: mel_filters_range(
                cfg.sampling_rate,
                cfg.n_fft,
                cfg.num_mels,
                cfg.fmin,
                cfg.fmax,
            ),
            window,
            scratch: vec![Complex32::default(); fft.get_inplace_scratch_len()],
            buf: vec![Complex32::default(); cfg.n_fft],
            mag: vec![0.0; cfg.n_fft / 2 + 1],
            fft,
            cfg,
        })
    }

    /// The settings.
    pub fn config(&self) -> &HifiganMelConfig {
        &self.cfg
    }

    /// Reflect padding on each side, `(n_fft - hop) / 2`.
    pub fn pad(&self) -> usize {
        (self.cfg.n_fft - self.cfg.hop_size) / 2
    }

    /// Frames of `n` samples (`n / hop` for the defaults).
    pub fn frames_for(&self, n: usize) -> usize {
        let padded = n + 2 * self.pad();
        if n == 0 || padded < self.cfg.n_fft {
            0
        } else {
            (padded - self.cfg.n_fft) / self.cfg.hop_size + 1
        }
    }

    /// Frames of `samples` in one go: `(values, frames)`, values row-major
    /// `[num_mels, frames]`.
    pub fn compute(&mut self, samples: &[f32]) -> (Vec<f32>, usize) {
        let frames = self.frames_for(samples.len());
        let mut out = vec![0f32; self.cfg.num_mels * frames];
        for t in 0..frames {
            let start = (t * self.cfg.hop_size) as isize - self.pad() as isize;
            let n = samples.len();
            self.frame(
                |i| samples[reflect(start + i as isize, n)],
                t,
                frames,
                &mut out,
            );
        }
        (out, frames)
    }

    /// One frame into column `t` of `out` (`[num_mels, frames]`), sample
    /// `i` of its window from `x(i)`.
    fn frame(&mut self, x: impl Fn(usize) -> f32, t: usize, frames: usize, out: &mut [f32]) {
        for (j, (b, &w)) in self.buf.iter_mut().zip(&self.window).enumerate() {
            *b = Complex32::new(x(j) * w, 0.0);
        }
        self.fft
            .process_with_scratch(&mut self.buf, &mut self.scratch);
        let n_bins = self.cfg.n_fft / 2 + 1;
        for (m, b) in self.mag.iter_mut().zip(&self.buf) {
            *m = (b.norm_sqr() + 1e-9).sqrt();
        }
        for m in 0..self.cfg.num_mels {
            let row = &self.filters[m * n_bins..(m + 1) * n_bins];
            let e: f32 = row.iter().zip(&self.mag).map(|(w, p)| w * p).sum();
            out[m * frames + t] = e.max(1e-5).ln();
        }
    }
}

/// numpy / torch `reflect` padding index (edge sample not repeated).
fn reflect(i: isize, n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let mut k = i.rem_euclid(period);
    if k >= n as isize {
        k = period - k;
    }
    k as usize
}

/// [`HifiganMel`] over audio that arrives in pieces: the same frames as
/// [`HifiganMel::compute`] of the whole signal, each as soon as it can be
/// computed.
#[derive(Debug)]
pub struct HifiganMelStream {
    mel: HifiganMel,
    /// Samples kept, from absolute index `base`.
    samples: Vec<f32>,
    base: usize,
    /// Frames emitted.
    next: usize,
}

impl HifiganMelStream {
    /// A stream over `mel`.
    pub fn new(mel: HifiganMel) -> Self {
        HifiganMelStream {
            mel,
            samples: Vec::new(),
            base: 0,
            next: 0,
        }
    }

    /// The front end.
    pub fn mel(&self) -> &HifiganMel {
        &self.mel
    }

    /// Add samples; returns the frames they complete (`[num_mels, frames]`
    /// row-major, and `frames`).
    pub fn push(&mut self, samples: &[f32]) -> (Vec<f32>, usize) {
        self.samples.extend_from_slice(samples);
        let received = self.base + self.samples.len();
        let (hop, n_fft, pad) = (self.mel.cfg.hop_size, self.mel.cfg.n_fft, self.mel.pad());
        // Frame t's window ends at sample t * hop + n_fft - pad; the left
        // reflection needs samples up to `pad`.
        let mut end = self.next;
        while end * hop + n_fft - pad <= received && received > pad {
            end += 1;
        }
        self.frames_upto(end, None)
    }

    /// The frames left, the signal's end reflected; then start over.
    pub fn finish(&mut self) -> (Vec<f32>, usize) {
        let total = self.base + self.samples.len();
        let end = self.mel.frames_for(total);
        let out = self.frames_upto(end, Some(total));
        self.reset();
        out
    }

    /// Forget everything.
    pub fn reset(&mut self) {
        self.samples.clear();
        self.base = 0;
        self.next = 0;
    }

    fn frames_upto(&mut self, end: usize, total: Option<usize>) -> (Vec<f32>, usize) {
        let frames = end.saturating_sub(self.next);
        let n_mels = self.mel.cfg.num_mels;
        let mut out = vec![0f32; n_mels * frames];
        let (hop, pad) = (self.mel.cfg.hop_size, self.mel.pad());
        for (j, t) in (self.next..end).enumerate() {
            let start = (t * hop) as isize - pad as isize;
            let (samples, base) = (&self.samples, self.base);
            let get = |i: usize| {
                let abs = start + i as isize;
                let idx = match total {
                    // Before the end is known only the left edge reflects.
                    None if abs < 0 => abs.unsigned_abs(),
                    Some(n) if abs < 0 || abs as usize >= n => reflect(abs, n),
                    _ => abs as usize,
                };
                samples[idx - base]
            };
            self.mel.frame(get, j, frames, &mut out);
        }
        self.next = end;
        // Keep what later frames can read: from the next window's start,
        // and the first `pad + 1` samples while the left edge reflects.
        let keep = (self.next * hop).saturating_sub(pad);
        if keep > 2 * pad && keep > self.base {
            self.samples.drain(..keep - self.base);
            self.base = keep;
        }
        (out, frames)
    }
}

/// The `mel` stage with `features: hifigan`: frames `[num_mels, frames]`
/// as they become computable, the rest at end of stream or on a flush.
#[derive(Debug)]
pub struct HifiganMelStage {
    stream: HifiganMelStream,
}

impl HifiganMelStage {
    /// A stage over `mel`.
    pub fn new(mel: HifiganMel) -> Self {
        HifiganMelStage {
            stream: HifiganMelStream::new(mel),
        }
    }

    fn emit(&self, (values, frames): (Vec<f32>, usize), ctx: &mut StageCtx) -> StageResult {
        if frames == 0 {
            return Ok(());
        }
        let n = self.stream.mel().config().num_mels;
        let t =
            Tensor::from_vec(values, &[n, frames]).map_err(|e| StageError::msg(e.to_string()))?;
        ctx.emit(0, Payload::Tensor(t))
    }
}

impl Stage for HifiganMelStage {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        match &input.msg.payload {
            Payload::Audio(a) => {
                let rate = self.stream.mel().config().sampling_rate;
                if a.sample_rate != rate || a.channels != 1 {
                    return Err(Error::Format(format!(
                        "mel `{}`: got {} Hz x{} audio; HiFi-GAN features need {rate} Hz mono: \
                         insert `resample` (to: {rate}) and `channel_mix` (channels: 1) before it",
                        ctx.id(),
                        a.sample_rate,
                        a.channels
                    ))
                    .into());
                }
                let out = self.stream.push(&a.samples);
                self.emit(out, ctx)
            }
            Payload::Event(e) if matches!(**e, Event::Flush) => {
                let out = self.stream.finish();
                self.emit(out, ctx)
            }
            _ => Ok(()),
        }
    }

    fn reset(&mut self, _epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        self.stream.reset();
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        let out = self.stream.finish();
        self.emit(out, ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signal(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let t = i as f32 / 22_050.0;
                0.5 * (2.0 * std::f32::consts::PI * (200.0 + 900.0 * t) * t).sin()
                    + 0.05 * ((i * 7919 % 101) as f32 / 50.0 - 1.0)
            })
            .collect()
    }

    #[test]
    fn frame_count_is_samples_over_hop() {
        let mel = HifiganMel::new(HifiganMelConfig::default()).expect("mel");
        for n in [256, 1000, 22_050, 25_600] {
            assert_eq!(mel.frames_for(n), n / 256, "{n}");
        }
        assert_eq!(mel.frames_for(0), 0);
    }

    #[test]
    fn streaming_gives_the_one_shot_frames_for_any_cut() {
        let x = signal(9_000);
        let mut mel = HifiganMel::new(HifiganMelConfig::default()).expect("mel");
        let (want, frames) = mel.compute(&x);
        assert_eq!(frames, 9_000 / 256);
        for cut in [1usize, 100, 256, 777, 4_000] {
            let mut s =
                HifiganMelStream::new(HifiganMel::new(HifiganMelConfig::default()).expect("mel"));
            let mut cols: Vec<Vec<f32>> = Vec::new();
            let mut take = |(v, f): (Vec<f32>, usize)| {
                for t in 0..f {
                    cols.push((0..80).map(|m| v[m * f + t]).collect());
                }
            };
            for c in x.chunks(cut) {
                take(s.push(c));
            }
            take(s.finish());
            assert_eq!(cols.len(), frames, "cut {cut}");
            for (t, col) in cols.iter().enumerate() {
                for (m, &v) in col.iter().enumerate() {
                    // Same arithmetic, same order: identical.
                    assert_eq!(v, want[m * frames + t], "cut {cut} frame {t} bin {m}");
                }
            }
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad = HifiganMelConfig {
            fmax: 20_000.0,
            ..HifiganMelConfig::default()
        };
        let e = HifiganMel::new(bad).expect_err("fmax above Nyquist");
        assert!(e.to_string().contains("fmax"), "{e}");
    }
}
