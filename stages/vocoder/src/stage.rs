//! The `vocoder` stage kind: mel frames in (tensors `[80, frames]`, as the
//! `mel` stage emits with `features: hifigan`), audio out, vocoded in
//! chunks of `chunk_frames` with `context_frames` of context on each side,
//! each chunk sent as soon as its right context has arrived.
//!
//! ```yaml
//! stages:
//!   - { id: src, kind: wav_source, params: { path: speech.wav } }
//!   - { id: rs, kind: resample, params: { to: 22050 } }
//!   - { id: mel, kind: mel, params: { features: hifigan } }
//!   - { id: voc, kind: vocoder, device: cpu, params: { model: hifigan-universal } }
//!   - { id: out, kind: wav_sink, params: { path: out.wav } }
//! ```

use crate::cards;
use crate::hifigan::{Config, HifiGan, MelStream};
use edgeflow_graph::{
    BuildEnv, Epoch, Event, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType,
    Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult, Timestamp,
};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The `vocoder` stage kind.
#[derive(Debug)]
pub struct VocoderKind;

/// The model folder `model` / `model_dir` name.
fn model_dir(p: &Params, env: &BuildEnv) -> Result<PathBuf, StageError> {
    if let Some(dir) = p.path("model_dir", env)? {
        return Ok(dir);
    }
    let name: String = p.get_or("model", "hifigan-universal".to_string())?;
    let card = match cards::find(&name) {
        Ok(c) => c,
        Err(e) => return Err(p.error("model", e.to_string()).into()),
    };
    Ok(card.locate()?)
}

impl StageFactory for VocoderKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "vocoder",
            doc: "HiFi-GAN V1 vocoder on the edgeflow runtime (device: cpu, gpu or npu): log-mel frames in (tensors [80, frames] from `mel` with features: hifigan), mono audio out, vocoded in chunks with context on each side so the joined audio equals one-shot vocoding; the rest at end of stream or on a flush event. Records time_to_first_audio_ms, rtf and audio_s.",
            params: vec![
                ParamInfo::new("model", ParamType::String, "hifigan-universal", "vocoder in the model cache (`edgeflow models fetch NAME`): hifigan-universal or hifigan-lj"),
                ParamInfo::optional("model_dir", ParamType::InputPath, "folder with config.json and model.safetensors, instead of the cached model"),
                ParamInfo::new("chunk_frames", ParamType::Int, 32, "mel frames (256 samples each) vocoded per chunk: smaller starts sooner and reacts to a cancel sooner, larger recomputes less context"),
                ParamInfo::optional("context_frames", ParamType::Int, "mel frames of context on each side of a chunk (default: the model's receptive radius, 15 for V1, which makes chunked audio equal one-shot audio; less is cheaper but audible at chunk edges)"),
            ],
            ports: Ports {
                inputs: vec![
                    PortSpec::new("in", PortType::Tensor, "log-mel frames [80, frames] (or [1, 80, frames])"),
                    PortSpec::optional("flush", PortType::Control, "a Flush event ends the utterance: its last frames are vocoded"),
                ],
                outputs: vec![PortSpec::new("out", PortType::AUDIO_ANY, "mono audio at the model's rate")],
            },
            source: false,
        }
    }

    fn ports(&self, p: &Params, env: &BuildEnv) -> Result<Ports, StageError> {
        let mut ports = self.info().ports;
        let rate = model_dir(p, env)
            .ok()
            .and_then(|d| Config::read(&d.join(cards::CONFIG_FILE)).ok())
            .map_or(22_050, |c| c.sampling_rate);
        ports.outputs[0].ty = PortType::Audio {
            sample_rate: Some(rate),
            channels: Some(1),
        };
        Ok(ports)
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let dir = model_dir(p, env)?;
        let chunk: usize = p.get_or("chunk_frames", 32usize)?;
        if !(1..=100_000).contains(&chunk) {
            return Err(p
                .error(
                    "chunk_frames",
                    format!("must be in 1..=100000, got {chunk}"),
                )
                .into());
        }
        let cfg = Config::read(&dir.join(cards::CONFIG_FILE))?;
        let radius = HifiGan::receptive_radius(&cfg);
        let context: usize = p.get_or("context_frames", radius)?;
        if context > 10_000 {
            return Err(p
                .error(
                    "context_frames",
                    format!("must be at most 10000, got {context}"),
                )
                .into());
        }
        let dev = env.open_device()?;
        let model = HifiGan::from_dir(&dir, &dev)?;
        let stream = MelStream::new(cfg.num_mels, chunk, context, context)?;
        Ok(Box::new(VocoderStage {
            rate: cfg.sampling_rate,
            model,
            stream,
            utterance: None,
            compute: Duration::ZERO,
            samples: 0,
        }))
    }
}

/// The `vocoder` stage.
#[derive(Debug)]
struct VocoderStage {
    model: HifiGan,
    rate: u32,
    stream: MelStream,
    /// Capture time of the utterance's first mel frames, until its first audio.
    utterance: Option<Timestamp>,
    compute: Duration,
    samples: usize,
}

impl VocoderStage {
    /// Run `f` on the stream and send what it vocodes.
    fn run(&mut self, ctx: &mut StageCtx, mel: Option<&edgeflow_runtime::Tensor>) -> StageResult {
        let started = Instant::now();
        let rate = self.rate;
        let mut failed: Option<StageError> = None;
        let mut samples = 0usize;
        let utterance = &mut self.utterance;
        let mut sink = |chunk: Vec<f32>| -> crate::Result<bool> {
            if ctx.is_cancelled() {
                return Ok(false);
            }
            if let Some(t) = utterance.take() {
                ctx.record("time_to_first_audio_ms", t.elapsed().as_secs_f64() * 1000.0);
            }
            samples += chunk.len();
            match ctx.emit(0, Payload::audio(rate, 1, chunk)) {
                Ok(()) => Ok(true),
                Err(e) => {
                    failed = Some(e);
                    Ok(false)
                }
            }
        };
        match mel {
            Some(m) => self.stream.push(&self.model, m, &mut sink)?,
            None => self.stream.finish(&self.model, &mut sink)?,
        }
        if let Some(e) = failed {
            return Err(e);
        }
        self.compute += started.elapsed();
        self.samples += samples;
        if mel.is_none() && self.samples > 0 {
            let audio_s = self.samples as f64 / f64::from(rate);
            ctx.record("rtf", self.compute.as_secs_f64() / audio_s);
            ctx.record("audio_s", audio_s);
            self.compute = Duration::ZERO;
            self.samples = 0;
        }
        ctx.check()
    }
}

impl Stage for VocoderStage {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.attach_device(self.model.device().stats().clone());
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        match &input.msg.payload {
            Payload::Tensor(t) => {
                if self.stream.received() == 0 && self.utterance.is_none() {
                    self.utterance = Some(input.msg.timestamp);
                }
                self.run(ctx, Some(t))
            }
            Payload::Event(e) if matches!(**e, Event::Flush) => self.run(ctx, None),
            Payload::Event(_) => Ok(()),
            other => Err(StageError::msg(format!(
                "vocoder `{}` got a {} message; it takes mel frames (a tensor [80, frames] from \
                 `mel` with features: hifigan)",
                ctx.id(),
                other.type_name()
            ))),
        }
    }

    fn reset(&mut self, _epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        self.stream.reset();
        self.utterance = None;
        self.compute = Duration::ZERO;
        self.samples = 0;
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        self.run(ctx, None)
    }
}
