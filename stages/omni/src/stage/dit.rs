//! The `dit` stage kind: Qwen2.5-Omni's token2wav DiT. Codec tokens in
//! (from `talker`), mel frames out (tensors `[80, frames]`, 10 ms each, for
//! `bigvgan`), synthesised chunk by chunk as the tokens arrive: each chunk
//! integrates the flow-matching ODE over a window of the utterance's codes
//! with left and right context (the DiT attends block-wise, so a window
//! with enough context gives the chunk's frames of the whole-utterance
//! sample), cancellable between ODE steps.

use super::source::{random_notice, Source};
use crate::dit::{self, Config, Dit, SampleOptions, Speaker};
use crate::{Error, Result};
use edgeflow_graph::{
    BuildEnv, Epoch, Event, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType,
    Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult, Timestamp,
};
use edgeflow_nn::{OdeMethod, WeightFormat};
use edgeflow_runtime::{Device, Tensor};
use std::path::Path;
use std::time::{Duration, Instant};

/// Seconds of audio per mel frame (BigVGAN's 240 samples at 24 kHz).
const FRAME_S: f64 = 0.01;

/// The small random configuration (`model: random-small`): the real
/// codec vocabulary, mel bins, repeats and attention blocks on a narrower,
/// shallower transformer and speaker encoder.
pub fn small_config() -> Config {
    Config {
        hidden_size: 256,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        head_dim: 64,
        emb_dim: 128,
        look_ahead_layers: vec![2],
        look_backward_layers: vec![0, 3],
        enc_dim: 64,
        enc_channels: vec![64, 64, 64, 64, 192],
        enc_attention_channels: 32,
        enc_se_channels: 32,
        ..Config::default()
    }
}

/// Load the DiT of `source` on `dev`, its linear layers' weights in
/// `format`.
pub fn load(source: &Source, dev: &Device, format: WeightFormat) -> Result<Dit> {
    let cfg = match source {
        Source::RandomSmall => small_config(),
        Source::RandomReal => Config::default(),
        Source::Dir(dir) => Config::read(&dir.join("config.json"))?,
    };
    let vb = source.var_builder(
        "token2wav.code2wav_dit_model",
        dit::weight_shapes(&cfg),
        1,
        dev,
    )?;
    Dit::load_with_format(&vb, &cfg, format)
}

/// The `weights` param's formats.
fn weight_format(name: &str) -> Option<WeightFormat> {
    Some(match name {
        "stored" => WeightFormat::Stored,
        "f32" => WeightFormat::F32,
        "bf16" => WeightFormat::Bf16,
        _ => return None,
    })
}

/// The speaker: `cond` `[1, enc_emb_dim]` and `ref_mel` `[1, frames,
/// mel_dim]` from a safetensors file, or a seeded random one.
fn speaker(model: &Dit, file: Option<&Path>, seed: u64) -> Result<Speaker> {
    let dev = model.device();
    let cfg = model.config();
    let (cond, ref_mel) = match file {
        Some(path) => {
            let vb = crate::VarBuilder::open(&[path], dev)?;
            (
                vb.get_f32("cond", &[1, cfg.enc_emb_dim])?,
                vb.get_f32_unchecked("ref_mel")?,
            )
        }
        None => (
            dev.rand_normal(&[1, cfg.enc_emb_dim], 0.0, 1.0, seed)?,
            dev.rand_normal(&[1, 300, cfg.mel_dim], -4.0, 1.0, seed + 1)?,
        ),
    };
    model.speaker(&cond, &ref_mel)
}

/// The `dit` stage kind.
#[derive(Debug)]
pub struct DitKind;

fn method(name: &str) -> Option<OdeMethod> {
    Some(match name {
        "rk4" => OdeMethod::Rk4ThreeEighths,
        "rk4-classic" => OdeMethod::Rk4,
        "midpoint" => OdeMethod::Midpoint,
        "euler" => OdeMethod::Euler,
        _ => return None,
    })
}

impl StageFactory for DitKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "dit",
            doc: "Qwen2.5-Omni's token2wav DiT on the edgeflow runtime (device: cpu, gpu or npu): codec tokens in (from `talker`), log-mel frames out (tensors [80, frames], 10 ms each), integrating the flow-matching ODE chunk by chunk with left / right context as tokens arrive, cancellable between ODE steps; the rest on a Flush event (sent on after the last frames) or at end of stream. Without model_dir it runs random weights (says so at start). Records time_to_first_mel_ms, rtf, mel_s and ode_steps.",
            params: vec![
                ParamInfo::new("model", ParamType::String, "random-small", "random-small (a small random configuration) or random-real (the real configuration, random weights): no Qwen2.5-Omni weights are shipped"),
                ParamInfo::optional("model_dir", ParamType::InputPath, "a Qwen2.5-Omni checkpoint folder (config.json, *.safetensors): runs the real DiT"),
                ParamInfo::optional("speaker", ParamType::InputPath, "safetensors with `cond` [1, 192] and `ref_mel` [1, frames, 80] (one voice of Qwen2.5-Omni's spk_dict.pt); default: a seeded random speaker"),
                ParamInfo::new("weights", ParamType::String, "stored", "the linear layers' weights: stored (as the checkpoint has them: bf16 in the released one; random weights are f32), f32, or bf16 (on a CPU with AVX512_BF16: half of f32's memory and its bf16 dot product, about twice the f32 rate, activations rounded to bf16; other CPUs widen bf16 weights to f32 once)"),
                ParamInfo::new("steps", ParamType::Int, 10, "ODE schedule points (upstream's num_steps: steps - 1 solver steps)"),
                ParamInfo::new("method", ParamType::String, "rk4", "solver: rk4 (the 3/8 rule, upstream's), rk4-classic, midpoint or euler"),
                ParamInfo::new("guidance", ParamType::Float, 0.5, "classifier-free guidance scale (0: one conditioned pass per evaluation, half the work)"),
                ParamInfo::new("sway", ParamType::Float, -1.0, "sway coefficient of the schedule (upstream's -1 spends more steps near noise)"),
                ParamInfo::new("chunk_codes", ParamType::Int, 24, "codec tokens (20 ms each) synthesised per chunk"),
                ParamInfo::new("first_chunk_codes", ParamType::Int, 12, "codec tokens of the first chunk (smaller: sooner first audio)"),
                ParamInfo::new("left_codes", ParamType::Int, 24, "codes of context before a chunk"),
                ParamInfo::new("right_codes", ParamType::Int, 12, "codes of context after a chunk (each a 20 ms wait for the talker)"),
                ParamInfo::new("seed", ParamType::Int, 0, "seed of the ODE's initial noise (and of the random speaker)"),
            ],
            ports: Ports {
                // Data and end of utterance share a port each way, so a
                // Flush cannot overtake the last codes or frames.
                inputs: vec![PortSpec::new(
                    "in",
                    PortType::Any,
                    "codec tokens (ids 0..=8192 for Qwen2.5-Omni; talker special tokens removed), then Event::Flush at the end of the utterance (the talker's output)",
                )],
                outputs: vec![PortSpec::new(
                    "out",
                    PortType::Any,
                    "log-mel frames [80, frames], then Event::Flush after the utterance's last frames (what `bigvgan` takes)",
                )],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> std::result::Result<Box<dyn Stage>, StageError> {
        let source = Source::from_params(p, env)?;
        let speaker_file = p.path("speaker", env)?;
        let int = |name: &str, default: usize, lo: usize, hi: usize| {
            let v: usize = p.get_or(name, default)?;
            if !(lo..=hi).contains(&v) {
                return Err(p.error(name, format!("must be in {lo}..={hi}, got {v}")));
            }
            Ok(v)
        };
        let steps = int("steps", 10, 2, 1000)?;
        let chunk = int("chunk_codes", 24, 1, 100_000)?;
        let first = int("first_chunk_codes", 12, 1, 100_000)?;
        let left = int("left_codes", 24, 0, 100_000)?;
        let right = int("right_codes", 12, 0, 100_000)?;
        let seed: u64 = p.get_or("seed", 0u64)?;
        let method_name: String = p.get_or("method", "rk4".to_string())?;
        let method = method(&method_name).ok_or_else(|| {
            p.error(
                "method",
                format!(
                    "unknown solver `{method_name}`: choose rk4, rk4-classic, midpoint or euler"
                ),
            )
        })?;
        let format_name: String = p.get_or("weights", "stored".to_string())?;
        let format = weight_format(&format_name).ok_or_else(|| {
            p.error(
                "weights",
                format!("unknown format `{format_name}`: choose stored, f32 or bf16"),
            )
        })?;
        let guidance: f32 = p.get_or("guidance", 0.5f32)?;
        let sway: f32 = p.get_or("sway", -1.0f32)?;
        if !guidance.is_finite() || guidance < 0.0 || !sway.is_finite() {
            return Err(p
                .error("guidance", "guidance must be finite and >= 0, sway finite")
                .into());
        }
        let opts = SampleOptions {
            num_steps: steps,
            method,
            guidance_scale: guidance,
            sway_coefficient: Some(sway),
        };
        // Reject a schedule the sway bends out of order before any model loads.
        dit::schedule(steps, Some(sway))?;
        let dev = env.open_device()?;
        if let Some(line) = random_notice(&env.stage_id, "token2wav DiT", &source) {
            eprintln!("{line}");
        }
        let model = load(&source, &dev, format)?;
        let spk = speaker(&model, speaker_file.as_deref(), seed)?;
        Ok(Box::new(DitStage {
            model,
            spk,
            opts,
            seed,
            first,
            chunk,
            left,
            right,
            codes: Vec::new(),
            done: 0,
            noise: None,
            utterance: None,
            compute: Duration::ZERO,
            frames: 0,
        }))
    }
}

/// The `dit` stage.
#[derive(Debug)]
struct DitStage {
    model: Dit,
    spk: Speaker,
    opts: SampleOptions,
    seed: u64,
    first: usize,
    chunk: usize,
    left: usize,
    right: usize,
    /// The utterance's codes so far.
    codes: Vec<u32>,
    /// Codes whose frames were sent.
    done: usize,
    /// The utterance's noise, `[1, >= frames, mel_dim]`, grown as needed
    /// (a longer draw with the same seed starts with the shorter one).
    noise: Option<Tensor>,
    utterance: Option<Timestamp>,
    compute: Duration,
    frames: usize,
}

impl DitStage {
    fn chunk_len(&self) -> usize {
        if self.done == 0 {
            self.first
        } else {
            self.chunk
        }
    }

    /// Noise covering the utterance's first `codes` codes.
    fn noise_for(&mut self, codes: usize) -> Result<Tensor> {
        let r = self.model.config().repeats;
        let have = self.noise.as_ref().map_or(0, |n| n.dims()[1]);
        if have < codes * r {
            // Doubling keeps redraws rare for a long utterance.
            let frames = (codes * r).max(2 * have).max(256);
            self.noise = Some(self.model.noise(frames, self.seed)?);
        }
        self.noise
            .clone()
            .ok_or_else(|| Error::BadInput("no noise".into()))
    }

    /// Synthesise every chunk whose right context has arrived (all of them
    /// at the end of the utterance) and send its frames.
    fn run(&mut self, ctx: &mut StageCtx, end: bool) -> StageResult {
        loop {
            let n = self.chunk_len();
            let avail = self.codes.len();
            let ready = self.done + n + self.right <= avail || (end && self.done < avail);
            if !ready {
                break;
            }
            let centre = self.done..(self.done + n).min(avail);
            let started = Instant::now();
            let noise = self.noise_for(avail)?;
            let mel = {
                let c = &*ctx;
                self.model.sample_window(
                    &self.spk,
                    &self.codes,
                    &noise,
                    centre.clone(),
                    self.left,
                    self.right,
                    &self.opts,
                    || c.is_cancelled(),
                )
            };
            let mel = match mel {
                Ok(m) => m,
                Err(Error::Cancelled { .. }) => return Err(StageError::Cancelled),
                Err(e) => return Err(e.into()),
            };
            let dev = self.model.device();
            let d = mel.dims().to_vec();
            let mel = dev.to_host(&dev.reshape(&mel, &d[1..])?)?;
            self.compute += started.elapsed();
            ctx.record("ode_steps", (self.opts.num_steps - 1) as f64);
            if let Some(t) = self.utterance.take() {
                ctx.record("time_to_first_mel_ms", t.elapsed().as_secs_f64() * 1e3);
            }
            self.frames += d[2];
            self.done = centre.end;
            ctx.emit(0, Payload::Tensor(mel))?;
        }
        if end {
            if self.frames > 0 {
                let mel_s = self.frames as f64 * FRAME_S;
                ctx.record("rtf", self.compute.as_secs_f64() / mel_s);
                ctx.record("mel_s", mel_s);
            }
            super::record_precision(ctx, self.model.device());
            self.clear();
        }
        ctx.check()
    }

    fn clear(&mut self) {
        self.codes.clear();
        self.done = 0;
        self.utterance = None;
        self.compute = Duration::ZERO;
        self.frames = 0;
    }
}

impl Stage for DitStage {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.attach_device(self.model.device().stats().clone());
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        match &input.msg.payload {
            Payload::Tokens(t) => {
                if t.is_empty() {
                    return Ok(());
                }
                let max = self.model.config().num_embeds;
                if let Some(&bad) = t.iter().find(|&&c| c as usize > max) {
                    return Err(StageError::msg(format!(
                        "dit `{}`: codec token {bad} is outside the DiT's codebook 0..={max}; remove the talker's special tokens before the DiT",
                        ctx.id()
                    )));
                }
                if self.codes.is_empty() && self.utterance.is_none() {
                    self.utterance = Some(input.msg.timestamp);
                }
                self.codes.extend_from_slice(t);
                self.run(ctx, false)
            }
            Payload::Event(e) if matches!(**e, Event::Flush) => {
                self.run(ctx, true)?;
                ctx.emit(0, Payload::event(Event::Flush))
            }
            Payload::Event(_) => Ok(()),
            other => Err(StageError::msg(format!(
                "dit `{}` got a {} message; it takes codec tokens (from `talker`)",
                ctx.id(),
                other.type_name()
            ))),
        }
    }

    fn reset(&mut self, _epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        self.clear();
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        self.run(ctx, true)
    }
}
