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
    AudioOut, BuildEnv, Epoch, Event, Input, ParamInfo, ParamType, Params, Payload, PortSpec,
    PortType, Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use std::path::PathBuf;

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
            model,
            stream,
            out: AudioOut::new(0, cfg.sampling_rate),
        }))
    }
}

/// The `vocoder` stage.
#[derive(Debug)]
struct VocoderStage {
    model: HifiGan,
    stream: MelStream,
    /// Time to first audio and real-time factor of each utterance.
    out: AudioOut,
}

impl VocoderStage {
    /// Push `mel` (or finish the utterance) and send what is vocoded.
    fn run(&mut self, ctx: &mut StageCtx, mel: Option<&edgeflow_runtime::Tensor>) -> StageResult {
        let (model, stream) = (&self.model, &mut self.stream);
        self.out.stream(ctx, |sink| match mel {
            Some(m) => stream.push(model, m, sink),
            None => stream.finish(model, sink),
        })?;
        if mel.is_none() {
            self.out.end_utterance(ctx);
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
                if self.stream.received() == 0 {
                    self.out.start_utterance(input.msg.timestamp);
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
        self.out.reset();
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        self.run(ctx, None)
    }
}
