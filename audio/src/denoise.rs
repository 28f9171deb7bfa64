//! RNNoise noise suppression (the `nnnoiseless` crate, with RNNoise's own
//! weights) and the `denoise` stage.
//!
//! RNNoise works on 48 kHz mono frames of 480 samples. [`Denoiser`] keeps
//! one RNNoise state per channel and, for other rates, resamples to 48 kHz
//! on the way in and back to the input rate on the way out, so the stage's
//! output has the same rate, channels and (after `finish`) length as its
//! input. Latency: one 10 ms frame plus the two resampler filters.

use crate::error::Result;
use crate::resample::StreamResampler;
use edgeflow_graph::{
    BuildEnv, Epoch, Input, Params, Payload, PortSpec, PortType, Ports, Stage, StageCtx,
    StageError, StageFactory, StageInfo, StageResult,
};
use nnnoiseless::DenoiseState;

/// The rate RNNoise runs at.
pub const DENOISE_RATE: u32 = 48_000;
/// RNNoise frame, samples per channel.
pub const FRAME: usize = DenoiseState::FRAME_SIZE;

/// Streaming multi-channel RNNoise with resampling around it.
pub struct Denoiser {
    rate: u32,
    channels: usize,
    states: Vec<Box<DenoiseState<'static>>>,
    up: StreamResampler,
    down: StreamResampler,
    /// 48 kHz interleaved samples waiting for a whole frame.
    pending: Vec<f32>,
    frame_in: Vec<f32>,
    frame_out: Vec<f32>,
    denoised: Vec<f32>,
    up_buf: Vec<f32>,
    frames_in: u64,
    frames_out: u64,
    /// Mean voice probability of the last frames (RNNoise's VAD output).
    last_vad: f32,
}

impl std::fmt::Debug for Denoiser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Denoiser")
            .field("rate", &self.rate)
            .field("channels", &self.channels)
            .finish()
    }
}

impl Denoiser {
    /// A denoiser for `channels` interleaved channels at `rate` Hz.
    pub fn new(rate: u32, channels: u16) -> Result<Self> {
        Ok(Denoiser {
            rate,
            channels: channels as usize,
            states: (0..channels).map(|_| DenoiseState::new()).collect(),
            up: StreamResampler::new(rate, DENOISE_RATE, channels)?,
            down: StreamResampler::new(DENOISE_RATE, rate, channels)?,
            pending: Vec::new(),
            frame_in: vec![0.0; FRAME],
            frame_out: vec![0.0; FRAME],
            denoised: Vec::new(),
            up_buf: Vec::new(),
            frames_in: 0,
            frames_out: 0,
            last_vad: 0.0,
        })
    }

    /// Input rate.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Channel count.
    pub fn channels(&self) -> u16 {
        self.channels as u16
    }

    /// RNNoise's voice probability for the last frame (mean over channels).
    pub fn voice_probability(&self) -> f32 {
        self.last_vad
    }

    /// Denoise `input` (interleaved at the input rate); appends what is ready.
    pub fn process(&mut self, input: &[f32], out: &mut Vec<f32>) -> Result<()> {
        self.frames_in += (input.len() / self.channels.max(1)) as u64;
        self.up_buf.clear();
        self.up.process(input, &mut self.up_buf)?;
        self.pending.extend_from_slice(&self.up_buf);
        self.run_frames();
        self.drain_down(out)
    }

    /// End of stream: pad the last frame, flush both resamplers; the total
    /// output then has exactly as many frames as the input. Resets.
    pub fn flush(&mut self, out: &mut Vec<f32>) -> Result<()> {
        self.up_buf.clear();
        self.up.flush(&mut self.up_buf)?;
        self.pending.extend_from_slice(&self.up_buf);
        let whole = FRAME * self.channels;
        if !self.pending.len().is_multiple_of(whole) {
            let n = self.pending.len().div_ceil(whole) * whole;
            self.pending.resize(n, 0.0);
        }
        self.run_frames();
        let want = self.frames_in.saturating_sub(self.frames_out) as usize;
        let start = out.len();
        self.drain_down(out)?;
        self.down.flush(out)?;
        let produced = (out.len() - start) / self.channels;
        out.truncate(start + want.min(produced) * self.channels);
        self.reset();
        Ok(())
    }

    /// Forget all state (new stream).
    pub fn reset(&mut self) {
        self.states = (0..self.channels).map(|_| DenoiseState::new()).collect();
        self.up.reset();
        self.down.reset();
        self.pending.clear();
        self.denoised.clear();
        self.frames_in = 0;
        self.frames_out = 0;
    }

    fn run_frames(&mut self) {
        let ch = self.channels;
        let whole = FRAME * ch;
        let mut pos = 0;
        while self.pending.len() - pos >= whole {
            let block = &self.pending[pos..pos + whole];
            let start = self.denoised.len();
            self.denoised.resize(start + whole, 0.0);
            let mut vad = 0.0;
            for c in 0..ch {
                // RNNoise expects 16-bit sample values as floats.
                for (i, v) in self.frame_in.iter_mut().enumerate() {
                    *v = block[i * ch + c] * 32768.0;
                }
                vad += self.states[c].process_frame(&mut self.frame_out, &self.frame_in);
                for (i, v) in self.frame_out.iter().enumerate() {
                    self.denoised[start + i * ch + c] = v / 32768.0;
                }
            }
            self.last_vad = vad / ch as f32;
            pos += whole;
        }
        self.pending.drain(..pos);
    }

    fn drain_down(&mut self, out: &mut Vec<f32>) -> Result<()> {
        if self.denoised.is_empty() {
            return Ok(());
        }
        let start = out.len();
        self.down.process(&self.denoised, out)?;
        self.denoised.clear();
        self.frames_out += ((out.len() - start) / self.channels) as u64;
        Ok(())
    }
}

// ---------------------------------------------------------------- stage

/// The `denoise` stage kind.
#[derive(Debug)]
pub struct DenoiseKind;

impl StageFactory for DenoiseKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "denoise",
            doc: "RNNoise noise suppression (nnnoiseless, real RNNoise weights) per channel at 48 kHz, resampling around it for other rates; output has the input's rate and channels. Records `voice_prob` (RNNoise's VAD).",
            params: vec![],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::AUDIO_ANY, "noisy audio, any rate")],
                outputs: vec![PortSpec::new("out", PortType::AUDIO_ANY, "denoised audio, same rate and channels")],
            },
            source: false,
        }
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        Ok(Box::new(DenoiseStage {
            inner: None,
            out: Vec::new(),
        }))
    }
}

/// The `denoise` stage.
#[derive(Debug)]
pub struct DenoiseStage {
    inner: Option<Denoiser>,
    out: Vec<f32>,
}

impl DenoiseStage {
    fn emit(&mut self, ctx: &mut StageCtx, rate: u32, channels: u16) -> StageResult {
        if self.out.is_empty() {
            return Ok(());
        }
        let samples = std::mem::take(&mut self.out);
        ctx.emit(0, Payload::audio(rate, channels, samples))
    }
}

impl Stage for DenoiseStage {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let Some(a) = input.msg.payload.as_audio() else {
            return Err(StageError::msg(format!(
                "denoise `{}` got a {} message; it takes audio",
                ctx.id(),
                input.msg.payload.type_name()
            )));
        };
        let same = self
            .inner
            .as_ref()
            .is_some_and(|d| d.rate() == a.sample_rate && d.channels() == a.channels);
        if !same {
            if let Some(mut old) = self.inner.take() {
                old.flush(&mut self.out)?;
                self.emit(ctx, old.rate(), old.channels())?;
            }
            self.inner = Some(Denoiser::new(a.sample_rate, a.channels)?);
        }
        if let Some(d) = self.inner.as_mut() {
            d.process(&a.samples, &mut self.out)?;
            ctx.record("voice_prob", d.voice_probability() as f64);
            let (r, c) = (d.rate(), d.channels());
            self.emit(ctx, r, c)?;
        }
        Ok(())
    }

    fn reset(&mut self, _epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        if let Some(d) = self.inner.as_mut() {
            d.reset();
        }
        self.out.clear();
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        if let Some(mut d) = self.inner.take() {
            d.flush(&mut self.out)?;
            self.emit(ctx, d.rate(), d.channels())?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rms(x: &[f32]) -> f32 {
        (x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32).sqrt()
    }

    /// Deterministic white noise (xorshift), uniform in [-a, a].
    fn noise(n: usize, a: f32, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0) * a
            })
            .collect()
    }

    #[test]
    fn suppresses_stationary_noise_at_48k_and_16k() {
        for &(rate, ch) in &[(48_000u32, 1u16), (16_000, 1), (44_100, 1)] {
            let n = rate as usize * 3 * ch as usize; // 3 s
            let x = noise(n, 0.03, 7 + rate as u64);
            let mut d = Denoiser::new(rate, ch).unwrap();
            let mut y = Vec::new();
            for c in x.chunks(333 * ch as usize) {
                d.process(c, &mut y).unwrap();
            }
            d.flush(&mut y).unwrap();
            assert_eq!(y.len(), x.len(), "{rate} Hz: output length");
            // Compare the last second (RNNoise adapts over the first one).
            let (rin, rout) = (rms(&x[n * 2 / 3..]), rms(&y[n * 2 / 3..]));
            // RNNoise removes most of stationary white noise: expect at
            // least 10 dB of reduction (it typically gives 20+ dB).
            assert!(rout < rin * 0.316, "{rate} Hz: rms {rin} -> {rout}");
        }
    }

    #[test]
    fn channels_are_denoised_independently() {
        // Stereo at 48 kHz: noise on the left, silence on the right.
        let frames = 48_000 * 3;
        let left = noise(frames, 0.03, 11);
        let mut x = vec![0f32; frames * 2];
        for (i, v) in left.iter().enumerate() {
            x[2 * i] = *v;
        }
        let mut d = Denoiser::new(48_000, 2).unwrap();
        let mut y = Vec::new();
        d.process(&x, &mut y).unwrap();
        d.flush(&mut y).unwrap();
        assert_eq!(y.len(), x.len());
        let tail = |v: &[f32], c: usize| -> Vec<f32> {
            v.iter()
                .skip(frames * 4 / 3 + c)
                .step_by(2)
                .copied()
                .collect()
        };
        assert!(
            rms(&tail(&y, 1)) < 1e-4,
            "right channel picked up {}",
            rms(&tail(&y, 1))
        );
        assert!(
            rms(&tail(&y, 0)) < 0.316 * rms(&tail(&x, 0)),
            "left not denoised"
        );
    }
}
