//! VITS as Piper uses it (Kim et al. 2021, "Conditional Variational
//! Autoencoder with Adversarial Learning for End-to-End Text-to-Speech";
//! Piper's `vits/models.py` `SynthesizerTrn.infer`), written against the
//! edgeflow runtime so it runs on any [`Device`] (CPU, GPU, NPU simulator).
//!
//! Inference: the text encoder turns phoneme ids into hidden states and a
//! prior (mean, log-scale) per phoneme; the stochastic duration predictor
//! gives log-durations (noise scaled by `noise_w`); durations
//! `ceil(exp(logw) * length_scale)` expand the prior to frames; a sample
//! (noise scaled by `noise_scale`) goes through the inverse flow; the
//! HiFi-GAN decoder turns the latent frames into audio (`hop` samples per
//! frame).
//!
//! Streaming: [`Vits::stream`] decodes a sentence's frames in chunks, each
//! with enough left/right context (the flow's and the decoder's receptive
//! radius) that the joined audio equals the one-shot output, and hands the
//! first chunk out before computing the rest.
//!
//! Weights are read from safetensors under the PyTorch names
//! (`enc_p.*`, `dp.*`, `flow.*`, `dec.*`) as extracted by
//! [`crate::piper::fetch`].

mod duration;
mod flow;
mod generator;
pub mod layers;
mod spline;
mod text_encoder;

pub use duration::DurationPredictor;
pub use flow::Flow;
pub use generator::Generator;
pub use text_encoder::{Encoded, TextEncoder};

use crate::piper::InferenceScales;
use crate::{Error, Result};
use edgeflow_nn::VarBuilder;
use edgeflow_runtime::{Device, Tensor};
use serde::Deserialize;
use std::time::Instant;

/// Hyper-parameters of a VITS model. The defaults are Piper's "medium"
/// quality (which the "joe" voice uses); none of them are stored in a Piper
/// voice file, and shapes are checked against the weights on load.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct VitsConfig {
    /// Size of the phoneme embedding table.
    pub num_symbols: usize,
    /// Text encoder width.
    pub hidden_channels: usize,
    /// Text encoder feed-forward width.
    pub filter_channels: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Transformer layers.
    pub n_layers: usize,
    /// Feed-forward kernel size.
    pub kernel_size: usize,
    /// Relative attention window.
    pub window_size: usize,
    /// Latent channels.
    pub inter_channels: usize,
    /// Duration predictor width.
    pub dp_filter_channels: usize,
    /// Duration predictor kernel size.
    pub dp_kernel_size: usize,
    /// Duration predictor spline flows (including the one unused at inference).
    pub dp_n_flows: usize,
    /// Spline bins.
    pub dp_num_bins: usize,
    /// Spline tail bound.
    pub dp_tail_bound: f32,
    /// Coupling layers in the flow.
    pub flow_n_flows: usize,
    /// WaveNet kernel size in the flow.
    pub flow_kernel_size: usize,
    /// WaveNet layers per coupling layer.
    pub flow_n_layers: usize,
    /// WaveNet dilation rate.
    pub flow_dilation_rate: usize,
    /// HiFi-GAN residual block kernel sizes.
    pub resblock_kernel_sizes: Vec<usize>,
    /// HiFi-GAN residual block dilations.
    pub resblock_dilation_sizes: Vec<Vec<usize>>,
    /// HiFi-GAN upsampling factors (their product is the hop length).
    pub upsample_rates: Vec<usize>,
    /// HiFi-GAN upsampling kernel sizes.
    pub upsample_kernel_sizes: Vec<usize>,
    /// HiFi-GAN width after `conv_pre`.
    pub upsample_initial_channel: usize,
}

impl Default for VitsConfig {
    fn default() -> Self {
        VitsConfig {
            num_symbols: 256,
            hidden_channels: 192,
            filter_channels: 768,
            n_heads: 2,
            n_layers: 6,
            kernel_size: 3,
            window_size: 4,
            inter_channels: 192,
            dp_filter_channels: 192,
            dp_kernel_size: 3,
            dp_n_flows: 4,
            dp_num_bins: 10,
            dp_tail_bound: 5.0,
            flow_n_flows: 4,
            flow_kernel_size: 5,
            flow_n_layers: 4,
            flow_dilation_rate: 1,
            resblock_kernel_sizes: vec![3, 5, 7],
            resblock_dilation_sizes: vec![vec![1, 2], vec![2, 6], vec![3, 12]],
            upsample_rates: vec![8, 8, 4],
            upsample_kernel_sizes: vec![16, 16, 8],
            upsample_initial_channel: 256,
        }
    }
}

impl VitsConfig {
    /// Audio samples per latent frame.
    pub fn hop_length(&self) -> usize {
        self.upsample_rates.iter().product()
    }
}

/// Synthesis settings for one call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthesisParams {
    /// Noise and length scales.
    pub scales: InferenceScales,
    /// Seed of the duration and prior noise (same seed, same audio).
    pub seed: u64,
}

/// How [`Vits::stream`] cuts a sentence into decoded chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    /// Frames in the first chunk (small: it sets the time to first audio).
    pub first_frames: usize,
    /// Frames in each later chunk.
    pub frames: usize,
}

impl Default for Chunking {
    fn default() -> Self {
        Chunking {
            first_frames: 24,
            frames: 256,
        }
    }
}

impl Chunking {
    /// The chunking for a sentence that starts while `ahead_s` seconds of
    /// audio from earlier sentences of the same utterance are still queued
    /// for playback, given the decoder's recent real-time factor `rtf` and
    /// `frame_s` seconds of audio per latent frame.
    ///
    /// A small first chunk only buys latency when nothing is playing: each
    /// chunk boundary decodes 2 x the receptive radius again. When the
    /// queued audio covers computing a full chunk twice over, the sentence
    /// starts with a full chunk instead (one boundary fewer, same audio).
    pub fn with_audio_ahead(self, ahead_s: f64, rtf: f64, frame_s: f64) -> Chunking {
        let full_chunk_compute_s = self.frames as f64 * frame_s * rtf;
        if rtf.is_finite() && rtf > 0.0 && ahead_s > 2.0 * full_chunk_compute_s {
            Chunking {
                first_frames: self.frames.max(self.first_frames),
                frames: self.frames,
            }
        } else {
            self
        }
    }

    /// Where the chunks of a `t`-frame sentence end: `first_frames`, then
    /// `frames` at a time; a last remainder under half the chunk before it
    /// is folded into that chunk (on its own it would decode the context
    /// twice for a few frames).
    pub fn boundaries(&self, t: usize) -> Vec<usize> {
        let t = t.max(1);
        let mut ends = Vec::new();
        let mut a = 0;
        while a < t {
            let size = if a == 0 {
                self.first_frames
            } else {
                self.frames
            }
            .max(1);
            let mut b = (a + size).min(t);
            if t - b < size.div_ceil(2) {
                b = t;
            }
            ends.push(b);
            a = b;
        }
        ends
    }
}

/// Tracks how much of an utterance's audio is still queued for playback
/// (emitted minus wall time since its first chunk) and the decoder's recent
/// real-time factor, to pick each sentence's [`Chunking`] with
/// [`Chunking::with_audio_ahead`].
#[derive(Debug, Clone, Default)]
pub struct AudioAhead {
    first_chunk: Option<Instant>,
    emitted_s: f64,
    rtf: f64,
}

impl AudioAhead {
    /// A new utterance: nothing queued.
    pub fn reset(&mut self) {
        self.first_chunk = None;
        self.emitted_s = 0.0;
    }

    /// Seconds of emitted audio not yet played (assuming playback began
    /// with the first chunk; a sink that starts later has more queued).
    pub fn ahead_s(&self) -> f64 {
        match self.first_chunk {
            Some(t) => (self.emitted_s - t.elapsed().as_secs_f64()).max(0.0),
            None => 0.0,
        }
    }

    /// The chunking for the next sentence of this utterance.
    pub fn chunking(&self, base: Chunking, frame_s: f64) -> Chunking {
        base.with_audio_ahead(self.ahead_s(), self.rtf, frame_s)
    }

    /// A chunk of `samples` at `rate` Hz was emitted.
    pub fn emitted(&mut self, samples: usize, rate: u32) {
        self.first_chunk.get_or_insert_with(Instant::now);
        self.emitted_s += samples as f64 / f64::from(rate.max(1));
    }

    /// A sentence of `audio_s` seconds took `compute_s` seconds.
    pub fn sentence_done(&mut self, compute_s: f64, audio_s: f64) {
        if audio_s > 0.0 {
            self.rtf = compute_s / audio_s;
        }
    }
}

/// The result of synthesizing one sentence.
#[derive(Debug, Clone, PartialEq)]
pub struct Synthesis {
    /// Mono samples in [-1, 1] at the voice's rate (raw model output).
    pub audio: Vec<f32>,
    /// Frames per phoneme id.
    pub durations: Vec<u32>,
}

/// A VITS voice on a device.
#[derive(Debug)]
pub struct Vits {
    cfg: VitsConfig,
    dev: Device,
    enc: TextEncoder,
    dp: DurationPredictor,
    flow: Flow,
    dec: Generator,
    dec_context: usize,
    flow_context: usize,
}

/// Expanded prior of one sentence, ready to be decoded.
#[derive(Debug, Clone)]
pub struct Prior {
    /// z_p[1, inter, frames].
    pub z_p: Tensor,
    /// Frames per phoneme id.
    pub durations: Vec<u32>,
}

impl Prior {
    /// Number of latent frames.
    pub fn frames(&self) -> usize {
        self.z_p.dims()[2]
    }
}

impl Vits {
    /// Load a VITS model under its PyTorch names (`enc_p.*`, `dp.*`,
    /// `flow.*`, `dec.*`) from `vb` (the voice's safetensors:
    /// `VarBuilder::open(&[path], &dev)`) onto the device it carries.
    pub fn load(vb: &VarBuilder, cfg: &VitsConfig) -> Result<Self> {
        Ok(Vits {
            enc: TextEncoder::load(vb, cfg)?,
            dp: DurationPredictor::load(vb, cfg)?,
            flow: Flow::load(vb, cfg)?,
            dec: Generator::load(vb, cfg)?,
            dec_context: Generator::receptive_radius(cfg) + 2,
            flow_context: Flow::receptive_radius(cfg) + 2,
            dev: vb.device().clone(),
            cfg: cfg.clone(),
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &VitsConfig {
        &self.cfg
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Audio samples per latent frame.
    pub fn hop_length(&self) -> usize {
        self.cfg.hop_length()
    }

    /// Text encoder, durations and the expanded prior sample for one sentence.
    pub fn prior(&self, ids: &[i64], p: &SynthesisParams) -> Result<Prior> {
        if ids.is_empty() {
            return Err(Error::BadInput("no phoneme ids to synthesize".into()));
        }
        // One batch of ops (on the CPU: run on the kernels' worker pool).
        self.dev.batch(|| self.prior_ops(ids, p))
    }

    fn prior_ops(&self, ids: &[i64], p: &SynthesisParams) -> Result<Prior> {
        let dev = &self.dev;
        let enc = self.enc.forward(dev, ids)?;
        let logw = self
            .dp
            .forward(dev, &enc.x, p.scales.noise_w, p.seed.wrapping_mul(2))?;
        let logw = dev.to_host(&logw)?.to_vec_f32()?;
        let durations: Vec<u32> = logw
            .iter()
            .map(|&l| (l.exp() * p.scales.length_scale).ceil().max(0.0) as u32)
            .collect();
        let frames: usize = durations.iter().map(|&d| d as usize).sum();
        let frames = frames.max(1);
        let mut idx = Vec::with_capacity(frames);
        for (i, &d) in durations.iter().enumerate() {
            idx.extend(std::iter::repeat_n(i as i64, d as usize));
        }
        if idx.is_empty() {
            idx.push(0);
        }
        let idx = Tensor::from_i64(idx, &[frames])?;
        let m_p = dev.index_select(&enc.m_p, &idx, 2)?;
        let z_p = if p.scales.noise_scale > 0.0 {
            let logs_p = dev.index_select(&enc.logs_p, &idx, 2)?;
            let c = self.cfg.inter_channels;
            let eps = dev.rand_normal(
                &[1, c, frames],
                0.0,
                f64::from(p.scales.noise_scale),
                p.seed.wrapping_mul(2).wrapping_add(1),
            )?;
            dev.add(&m_p, &dev.mul(&eps, &dev.exp(&logs_p)?)?)?
        } else {
            m_p
        };
        Ok(Prior { z_p, durations })
    }

    fn decode_window(
        &self,
        z: &Tensor,
        z_start: usize,
        from: usize,
        to: usize,
    ) -> Result<Vec<f32>> {
        self.dev
            .batch(|| self.decode_window_ops(z, z_start, from, to))
    }

    fn decode_window_ops(
        &self,
        z: &Tensor,
        z_start: usize,
        from: usize,
        to: usize,
    ) -> Result<Vec<f32>> {
        // z covers frames [z_start, z_start + len); decode [from, to) with context.
        let dev = &self.dev;
        let len = z.dims()[2];
        let lo = from.saturating_sub(self.dec_context).max(z_start);
        let hi = (to + self.dec_context).min(z_start + len);
        let window = dev.narrow(z, 2, lo - z_start, hi - lo)?;
        let audio = self.dec.forward(dev, &window)?;
        let hop = self.hop_length();
        let audio = dev.narrow(&audio, 2, (from - lo) * hop, (to - from) * hop)?;
        Ok(dev.to_host(&audio)?.to_vec_f32()?)
    }

    /// Synthesize one sentence in one pass.
    pub fn synthesize(&self, ids: &[i64], p: &SynthesisParams) -> Result<Synthesis> {
        let prior = self.prior(ids, p)?;
        let z = self.flow.reverse(&self.dev, &prior.z_p)?;
        let audio = self.dec.forward(&self.dev, &z)?;
        Ok(Synthesis {
            audio: self.dev.to_host(&audio)?.to_vec_f32()?,
            durations: prior.durations,
        })
    }

    /// Decode a prepared sentence chunk by chunk, calling `sink` with each
    /// chunk's samples as soon as it is ready; `sink` returns `false` to stop
    /// early (cancellation). The joined chunks equal [`Self::synthesize`]'s
    /// audio up to float rounding.
    pub fn stream(
        &self,
        prior: &Prior,
        chunking: Chunking,
        sink: &mut dyn FnMut(Vec<f32>) -> Result<bool>,
    ) -> Result<()> {
        let dev = &self.dev;
        let t = prior.frames();
        let ends = chunking.boundaries(t);
        let first = ends[0];
        let (cd, cf) = (self.dec_context, self.flow_context);

        // First chunk: the flow over just the window it needs.
        let flow_hi = (first + cd + cf).min(t);
        let z0 = self
            .flow
            .reverse(dev, &dev.narrow(&prior.z_p, 2, 0, flow_hi)?)?;
        if !sink(self.decode_window(&z0, 0, 0, first)?)? || first == t {
            return Ok(());
        }

        // The rest: one flow pass from far enough back to be exact.
        let rest_lo = first.saturating_sub(cd + cf);
        let z_rest = self
            .flow
            .reverse(dev, &dev.narrow(&prior.z_p, 2, rest_lo, t - rest_lo)?)?;
        for w in ends.windows(2) {
            if !sink(self.decode_window(&z_rest, rest_lo, w[0], w[1])?)? {
                return Ok(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Chunking;

    #[test]
    fn chunk_boundaries_cover_the_sentence_without_a_sliver_at_the_end() {
        let c = Chunking {
            first_frames: 24,
            frames: 256,
        };
        assert_eq!(c.boundaries(1), vec![1]);
        assert_eq!(c.boundaries(24), vec![24]);
        // A remainder under half the chunk before it joins that chunk.
        assert_eq!(c.boundaries(35), vec![35]);
        assert_eq!(c.boundaries(36), vec![24, 36]);
        assert_eq!(c.boundaries(290), vec![24, 290]);
        assert_eq!(c.boundaries(407), vec![24, 407]);
        assert_eq!(c.boundaries(408), vec![24, 280, 408]);
        let full = Chunking {
            first_frames: 256,
            frames: 256,
        };
        assert_eq!(full.boundaries(290), vec![290]);
        assert_eq!(full.boundaries(600), vec![256, 600]);
        for t in 1..1000 {
            for c in [
                c,
                full,
                Chunking {
                    first_frames: 1,
                    frames: 1,
                },
            ] {
                let ends = c.boundaries(t);
                assert_eq!(*ends.last().unwrap(), t);
                assert!(ends.windows(2).all(|w| w[0] < w[1]), "{c:?} {t}: {ends:?}");
            }
        }
    }

    #[test]
    fn a_full_first_chunk_only_when_queued_audio_covers_it() {
        let c = Chunking::default();
        let frame_s = 256.0 / 22050.0;
        // 256 frames = 2.97 s of audio; at RTF 0.05 they take 0.149 s.
        assert_eq!(c.with_audio_ahead(0.0, 0.05, frame_s), c);
        assert_eq!(c.with_audio_ahead(0.25, 0.05, frame_s), c);
        assert_eq!(c.with_audio_ahead(0.35, 0.05, frame_s).first_frames, 256);
        // No estimate yet (first sentence): keep the small first chunk.
        assert_eq!(c.with_audio_ahead(10.0, f64::NAN, frame_s), c);
        assert_eq!(c.with_audio_ahead(10.0, 0.0, frame_s), c);
    }
}
