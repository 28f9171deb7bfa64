//! Streaming sample-rate conversion (rubato's windowed-sinc resampler) and
//! the `resample` stage.
//!
//! [`StreamResampler`] takes interleaved chunks of any size and always feeds
//! rubato whole fixed-size blocks, carrying the remainder to the next call.
//! So the output does not depend on how the input was cut: a stream fed in
//! many odd-size chunks comes out sample-for-sample the same as a one-shot
//! conversion of the whole signal (the unit tests check exactly that). The
//! filter delay is trimmed at the start and pumped out at the end, so output
//! sample `k` lines up with time `k / to` of the input and the total length
//! is `ceil(input_frames * to / from)`.

use crate::error::{Error, Result};
use edgeflow_graph::{
    BuildEnv, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType, Ports, Stage,
    StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{
    Async, FixedAsync, Indexing, Resampler, SincInterpolationParameters, SincInterpolationType,
    WindowFunction,
};

/// Lowest sample rate accepted anywhere in this crate.
pub const MIN_RATE: u32 = 1_000;
/// Highest sample rate accepted anywhere in this crate.
pub const MAX_RATE: u32 = 768_000;

/// Input frames per rubato call: small enough to keep the buffering delay
/// low (5 ms at 48 kHz), large enough that per-call overhead is negligible.
const BLOCK_FRAMES: usize = 256;

/// Length of the windowed-sinc filter (taps, a multiple of 8).
const SINC_LEN: usize = 128;

/// Output frames to discard so output frame `k` sits at input time `k / to`.
/// rubato's `output_delay()` is `floor(SINC_LEN / 2 * ratio)`, but the
/// filter's centre actually lands one output frame earlier (its first
/// output is computed at input index `1 - SINC_LEN`); measured against an
/// analytic sine, `SINC_LEN / 2 * ratio - 1` rounded leaves at most half an
/// output frame of constant offset, where rubato's value leaves up to one.
fn trim_frames(ratio: f64) -> usize {
    (SINC_LEN as f64 / 2.0 * ratio - 1.0).round().max(0.0) as usize
}

/// Check that `rate` is a sample rate audio stages can work with.
pub fn check_rate(rate: u32, what: &str) -> Result<()> {
    if !(MIN_RATE..=MAX_RATE).contains(&rate) {
        return Err(Error::Format(format!(
            "{what}: sample rate {rate} Hz is outside the supported range {MIN_RATE}..={MAX_RATE} Hz; \
             use a real audio rate such as 16000, 44100 or 48000"
        )));
    }
    Ok(())
}

/// A streaming resampler for interleaved f32 audio.
pub struct StreamResampler {
    from: u32,
    to: u32,
    channels: usize,
    /// `None` when `from == to` (samples pass through untouched).
    inner: Option<Async<f32>>,
    /// Input frames not yet handed to rubato (interleaved).
    pending: Vec<f32>,
    /// Output scratch, sized for one rubato call.
    scratch: Vec<f32>,
    /// Output frames still to discard (the filter's startup delay).
    delay_left: usize,
    frames_in: u64,
    frames_out: u64,
}

impl std::fmt::Debug for StreamResampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamResampler")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("channels", &self.channels)
            .finish()
    }
}

impl StreamResampler {
    /// A resampler from `from` Hz to `to` Hz for `channels` interleaved channels.
    pub fn new(from: u32, to: u32, channels: u16) -> Result<Self> {
        check_rate(from, "resample input")?;
        check_rate(to, "resample output")?;
        if channels == 0 {
            return Err(Error::Format("resample: audio with 0 channels".into()));
        }
        let ch = channels as usize;
        let inner = if from == to {
            None
        } else {
            let params = SincInterpolationParameters {
                sinc_len: SINC_LEN,
                f_cutoff: None,
                oversampling_factor: 256,
                interpolation: SincInterpolationType::Linear,
                window: WindowFunction::BlackmanHarris2,
            };
            let r = Async::<f32>::new_sinc(
                to as f64 / from as f64,
                1.0,
                &params,
                BLOCK_FRAMES,
                ch,
                FixedAsync::Input,
            )
            .map_err(|e| Error::Resample(format!("{from} Hz -> {to} Hz: {e}")))?;
            Some(r)
        };
        let mut s = StreamResampler {
            from,
            to,
            channels: ch,
            inner,
            pending: Vec::new(),
            scratch: Vec::new(),
            delay_left: 0,
            frames_in: 0,
            frames_out: 0,
        };
        s.reset();
        Ok(s)
    }

    /// Input rate.
    pub fn from_rate(&self) -> u32 {
        self.from
    }

    /// Output rate.
    pub fn to_rate(&self) -> u32 {
        self.to
    }

    /// Channel count.
    pub fn channels(&self) -> u16 {
        self.channels as u16
    }

    /// Forget all buffered input and filter state (start of a new stream).
    pub fn reset(&mut self) {
        self.pending.clear();
        self.frames_in = 0;
        self.frames_out = 0;
        if let Some(r) = &mut self.inner {
            r.reset();
            self.delay_left = trim_frames(self.to as f64 / self.from as f64);
            self.scratch = vec![0.0; r.output_frames_max() * self.channels];
        }
    }

    /// Resample `input` (interleaved, any number of whole frames) and append
    /// the output produced so far to `out`.
    pub fn process(&mut self, input: &[f32], out: &mut Vec<f32>) -> Result<()> {
        if !input.len().is_multiple_of(self.channels) {
            return Err(Error::Format(format!(
                "resample: {} samples is not a whole number of {}-channel frames",
                input.len(),
                self.channels
            )));
        }
        self.frames_in += (input.len() / self.channels) as u64;
        if self.inner.is_none() {
            out.extend_from_slice(input);
            self.frames_out = self.frames_in;
            return Ok(());
        }
        self.pending.extend_from_slice(input);
        let mut start = 0;
        loop {
            let need = self.next_input_frames();
            if (self.pending.len() - start) / self.channels < need {
                break;
            }
            let end = start + need * self.channels;
            let used = self.run_block(start, end, None, out)?;
            start += used * self.channels;
        }
        self.pending.drain(..start);
        Ok(())
    }

    /// End of stream: push out everything still inside the filter, so the
    /// total output is exactly `ceil(input_frames * to / from)` frames, then
    /// reset for a new stream.
    pub fn flush(&mut self, out: &mut Vec<f32>) -> Result<()> {
        if self.inner.is_none() {
            self.reset();
            return Ok(());
        }
        let expected =
            (self.frames_in as u128 * self.to as u128).div_ceil(self.from as u128) as u64;
        let target_len =
            out.len() + (expected.saturating_sub(self.frames_out) as usize) * self.channels;
        // The last partial block, zero-padded to a whole block.
        let need = self.next_input_frames();
        let have = self.pending.len() / self.channels;
        self.pending.resize(need * self.channels, 0.0);
        self.run_block(0, need * self.channels, Some(have), out)?;
        // Then silence until the delayed tail has come out.
        let mut guard = 0;
        while self.frames_out < expected {
            self.pending.clear();
            self.pending.resize(need * self.channels, 0.0);
            self.run_block(0, need * self.channels, Some(0), out)?;
            guard += 1;
            if guard > 1_000 {
                return Err(Error::Resample("flush did not converge".into()));
            }
        }
        out.truncate(target_len);
        self.reset();
        Ok(())
    }

    /// Frames of input buffered inside this resampler (not yet converted).
    pub fn pending_frames(&self) -> usize {
        self.pending.len() / self.channels
    }

    fn next_input_frames(&self) -> usize {
        self.inner.as_ref().map_or(1, |r| r.input_frames_next())
    }

    /// One rubato call on `pending[start..end]`; returns input frames used.
    fn run_block(
        &mut self,
        start: usize,
        end: usize,
        partial: Option<usize>,
        out: &mut Vec<f32>,
    ) -> Result<usize> {
        let ch = self.channels;
        let Some(r) = self.inner.as_mut() else {
            return Ok(0);
        };
        let frames = (end - start) / ch;
        let out_frames = r.output_frames_next();
        if self.scratch.len() < out_frames * ch {
            self.scratch.resize(out_frames * ch, 0.0);
        }
        let inp = InterleavedSlice::new(&self.pending[start..end], ch, frames)
            .map_err(|e| Error::Resample(format!("input buffer: {e}")))?;
        let mut outp =
            InterleavedSlice::new_mut(&mut self.scratch[..out_frames * ch], ch, out_frames)
                .map_err(|e| Error::Resample(format!("output buffer: {e}")))?;
        let indexing = partial.map(|p| Indexing::new().partial_len(p));
        let (n_in, n_out) = r
            .process_into_buffer(&inp, &mut outp, indexing.as_ref())
            .map_err(|e| Error::Resample(e.to_string()))?;
        let skip = self.delay_left.min(n_out);
        self.delay_left -= skip;
        out.extend_from_slice(&self.scratch[skip * ch..n_out * ch]);
        self.frames_out += (n_out - skip) as u64;
        Ok(n_in)
    }
}

/// Resample a whole clip in one go (same filter as the streaming path).
pub fn resample_all(input: &[f32], from: u32, to: u32, channels: u16) -> Result<Vec<f32>> {
    let mut r = StreamResampler::new(from, to, channels)?;
    let mut out =
        Vec::with_capacity((input.len() as u64 * to as u64 / from.max(1) as u64) as usize + 16);
    r.process(input, &mut out)?;
    r.flush(&mut out)?;
    Ok(out)
}

// ---------------------------------------------------------------- stage

/// The `resample` stage kind.
#[derive(Debug)]
pub struct ResampleKind;

impl ResampleKind {
    fn port_types(p: &Params) -> StageResult<(Option<u32>, u32)> {
        let to: u32 = p.get("to")?;
        check_rate(to, &format!("stage `{}`: param `to`", p.stage()))?;
        let from: Option<u32> = p.opt("from")?;
        if let Some(f) = from {
            check_rate(f, &format!("stage `{}`: param `from`", p.stage()))?;
        }
        Ok((from, to))
    }
}

impl StageFactory for ResampleKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "resample",
            doc: "Streaming sample-rate conversion (windowed sinc, rubato): any rate pair, any chunk sizes, no clicks or gaps at chunk boundaries. Output length is ceil(in * to / from); the filter delay (64 input frames) is compensated to within half an output frame.",
            params: vec![
                ParamInfo::required("to", ParamType::Int, "output sample rate in Hz (1000..=768000)"),
                ParamInfo::optional("from", ParamType::Int, "expected input rate; when set, the input port declares it and other rates are an error (default: take each chunk's rate)"),
            ],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::AUDIO_ANY, "audio at any rate")],
                outputs: vec![PortSpec::new("out", PortType::AUDIO_ANY, "audio at `to` Hz, same channels")],
            },
            source: false,
        }
    }

    fn ports(&self, p: &Params, _env: &BuildEnv) -> StageResult<Ports> {
        let (from, to) = Self::port_types(p)?;
        Ok(Ports {
            inputs: vec![PortSpec::new(
                "in",
                PortType::Audio {
                    sample_rate: from,
                    channels: None,
                },
                "audio to convert",
            )],
            outputs: vec![PortSpec::new(
                "out",
                PortType::audio_at(to),
                "audio at `to` Hz, same channels",
            )],
        })
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let (from, to) = Self::port_types(p)?;
        Ok(Box::new(ResampleStage {
            from,
            to,
            inner: None,
            out: Vec::new(),
        }))
    }
}

/// The `resample` stage: a [`StreamResampler`] rebuilt whenever the input
/// format changes (after flushing the old one).
#[derive(Debug)]
pub struct ResampleStage {
    from: Option<u32>,
    to: u32,
    inner: Option<StreamResampler>,
    out: Vec<f32>,
}

impl ResampleStage {
    fn emit(&mut self, ctx: &mut StageCtx, channels: u16) -> StageResult {
        if !self.out.is_empty() {
            let samples = std::mem::take(&mut self.out);
            ctx.emit(0, Payload::audio(self.to, channels, samples))?;
        }
        Ok(())
    }
}

impl Stage for ResampleStage {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let Some(a) = input.msg.payload.as_audio() else {
            return Err(StageError::msg(format!(
                "resample `{}` got a {} message; it takes audio",
                ctx.id(),
                input.msg.payload.type_name()
            )));
        };
        if let Some(f) = self.from {
            if a.sample_rate != f {
                return Err(Error::Format(format!(
                    "resample `{}`: got {} Hz audio but `from` says {f} Hz; remove `from` or fix the producer",
                    ctx.id(),
                    a.sample_rate
                ))
                .into());
            }
        }
        if a.sample_rate == self.to && self.inner.is_none() {
            // Already at the target rate: share the payload, copy nothing.
            return ctx.emit_msg(0, input.msg);
        }
        let same = self
            .inner
            .as_ref()
            .is_some_and(|r| r.from_rate() == a.sample_rate && r.channels() == a.channels);
        if !same {
            if let Some(mut old) = self.inner.take() {
                old.flush(&mut self.out)?;
                let ch = old.channels();
                self.emit(ctx, ch)?;
            }
            self.inner = Some(StreamResampler::new(a.sample_rate, self.to, a.channels)?);
        }
        if let Some(r) = self.inner.as_mut() {
            r.process(&a.samples, &mut self.out)?;
            let ch = r.channels();
            self.emit(ctx, ch)?;
        }
        Ok(())
    }

    fn reset(&mut self, _epoch: edgeflow_graph::Epoch, _ctx: &mut StageCtx) -> StageResult {
        if let Some(r) = self.inner.as_mut() {
            r.reset();
        }
        self.out.clear();
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        if let Some(mut r) = self.inner.take() {
            r.flush(&mut self.out)?;
            self.emit(ctx, r.channels())?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sine(rate: u32, freq: f64, frames: usize, channels: u16) -> Vec<f32> {
        let mut v = Vec::with_capacity(frames * channels as usize);
        for i in 0..frames {
            let s = (2.0 * std::f64::consts::PI * freq * i as f64 / rate as f64).sin() * 0.5;
            for c in 0..channels {
                // Second channel at half level so channel mix-ups show.
                v.push((s / (1.0 + c as f64)) as f32);
            }
        }
        v
    }

    /// Odd chunk sizes, 1 to 997 frames, cycling.
    fn chunked(r: &mut StreamResampler, x: &[f32], ch: usize) -> Vec<f32> {
        let sizes = [1usize, 7, 13, 160, 997, 3, 511, 29, 2, 255, 257];
        let mut out = Vec::new();
        let mut pos = 0;
        let mut k = 0;
        while pos < x.len() {
            let n = (sizes[k % sizes.len()] * ch).min(x.len() - pos);
            r.process(&x[pos..pos + n], &mut out).unwrap();
            pos += n;
            k += 1;
        }
        r.flush(&mut out).unwrap();
        out
    }

    #[test]
    fn chunked_stream_equals_one_shot_and_analytic_sine() {
        for &(from, to, ch) in &[
            (44_100u32, 16_000u32, 1u16),
            (16_000, 48_000, 2),
            (48_000, 44_100, 1),
            (22_050, 16_000, 2),
        ] {
            let frames = from as usize; // one second
            let x = sine(from, 440.0, frames, ch);
            let one_shot = resample_all(&x, from, to, ch).unwrap();
            let mut r = StreamResampler::new(from, to, ch).unwrap();
            let streamed = chunked(&mut r, &x, ch as usize);
            let expected_frames = (frames as u64 * to as u64).div_ceil(from as u64) as usize;
            assert_eq!(
                streamed.len(),
                expected_frames * ch as usize,
                "{from}->{to}"
            );
            // Chunking must not change a single sample: the stream feeds
            // rubato identical blocks whatever the chunk sizes.
            assert_eq!(
                streamed, one_shot,
                "{from}->{to}: chunked differs from one-shot"
            );
            // Against the analytic sine at the output rate, away from the
            // clip edges (the filter sees silence beyond them). rubato's
            // delay compensation is whole output frames, so a constant
            // sub-frame offset remains: fit it (at most half a frame),
            // then require 2e-3 absolute on a 0.5 amplitude sine (-48 dB);
            // a click or a one-sample gap would be ~0.02-0.5.
            let edge = (to / 50) as usize; // 20 ms
            let mut best = (0.0f64, f32::MAX);
            for k in -150..=150 {
                let shift = k as f64 / 100.0;
                let mut worst = 0f32;
                for i in edge..expected_frames - edge {
                    let t = (i as f64 + shift) / to as f64;
                    let s = (2.0 * std::f64::consts::PI * 440.0 * t).sin() * 0.5;
                    for c in 0..ch as usize {
                        let want = (s / (1.0 + c as f64)) as f32;
                        worst = worst.max((streamed[i * ch as usize + c] - want).abs());
                    }
                }
                if worst < best.1 {
                    best = (shift, worst);
                }
            }
            let (shift, worst) = best;
            assert!(
                shift.abs() <= 0.51,
                "{from}->{to}: misaligned by {shift} frames"
            );
            assert!(
                worst < 2e-3,
                "{from}->{to}: max error {worst} vs analytic sine (shift {shift})"
            );
        }
    }

    #[test]
    fn same_rate_passes_through() {
        let x = sine(16_000, 300.0, 1000, 1);
        let y = resample_all(&x, 16_000, 16_000, 1).unwrap();
        assert_eq!(x, y);
    }

    #[test]
    fn impossible_rates_are_rejected_with_advice() {
        let e = StreamResampler::new(0, 16_000, 1).unwrap_err().to_string();
        assert!(e.contains("0 Hz") && e.contains("16000"), "{e}");
        assert!(StreamResampler::new(16_000, 10_000_000, 1).is_err());
        assert!(StreamResampler::new(16_000, 8_000, 0).is_err());
    }

    #[test]
    fn reset_starts_a_fresh_stream() {
        let x = sine(48_000, 1000.0, 4800, 1);
        let mut r = StreamResampler::new(48_000, 16_000, 1).unwrap();
        let mut junk = Vec::new();
        r.process(&x[..1234], &mut junk).unwrap();
        r.reset();
        let a = chunked(&mut r, &x, 1);
        assert_eq!(a, resample_all(&x, 48_000, 16_000, 1).unwrap());
    }
}
