//! The `bigvgan` stage kind: Qwen2.5-Omni's BigVGAN vocoder, mel frames
//! (tensors `[80, frames]` from `dit`) in, 24 kHz audio out, vocoded in
//! chunks with left / right context as the frames arrive.

use super::source::{random_notice, sub_config, Source};
use crate::bigvgan::{self, BigVgan, Config, MelStream};
use edgeflow_graph::{
    AudioOut, BuildEnv, Epoch, Event, Input, ParamInfo, ParamType, Params, Payload, PortSpec,
    PortType, Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};

/// Output sample rate of Qwen2.5-Omni's BigVGAN.
pub const SAMPLE_RATE: u32 = 24_000;

/// The small random configuration (`model: random-small`): the real
/// upsampling (240 samples per frame) on fewer channels and blocks.
pub fn small_config() -> Config {
    Config {
        upsample_initial_channel: 128,
        resblock_kernel_sizes: vec![3, 7],
        resblock_dilation_sizes: vec![vec![1, 3, 5], vec![1, 3, 5]],
        ..Config::default()
    }
}

/// The `bigvgan` stage kind.
#[derive(Debug)]
pub struct BigVganKind;

/// Load the vocoder of `source` on `dev`.
pub fn load(source: &Source, dev: &edgeflow_runtime::Device) -> crate::Result<BigVgan> {
    let cfg = match source {
        Source::RandomSmall => small_config(),
        Source::RandomReal => Config::default(),
        Source::Dir(dir) => {
            let path = dir.join("config.json");
            let json = source.config_json()?.unwrap_or_default();
            let v = sub_config(&json, "token2wav_config.bigvgan_config", &path)?;
            let cfg: Config = serde_json::from_value(v.clone())
                .map_err(|e| crate::Error::bad_file(&path, format!("bigvgan_config: {e}")))?;
            cfg.check()
                .map_err(|e| crate::Error::bad_file(&path, format!("bigvgan_config: {e}")))?;
            cfg
        }
    };
    let vb = source.var_builder(
        "token2wav.code2wav_bigvgan_model",
        bigvgan::weight_shapes(&cfg),
        2,
        dev,
    )?;
    BigVgan::load(&vb, &cfg)
}

impl StageFactory for BigVganKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "bigvgan",
            doc: "Qwen2.5-Omni's BigVGAN vocoder on the edgeflow runtime (device: cpu, gpu or npu): log-mel frames in (tensors [80, frames] from `dit`), 24 kHz mono audio out, vocoded in chunks with left / right context as frames arrive; the rest on a Flush event or at end of stream. Without model_dir it runs random weights (says so at start). Records time_to_first_audio_ms, rtf and audio_s.",
            params: vec![
                ParamInfo::new("model", ParamType::String, "random-small", "random-small (a small random configuration) or random-real (the real configuration, random weights): no Qwen2.5-Omni weights are shipped"),
                ParamInfo::optional("model_dir", ParamType::InputPath, "a Qwen2.5-Omni checkpoint folder (config.json, *.safetensors): runs the real vocoder"),
                ParamInfo::new("chunk_frames", ParamType::Int, 24, "mel frames (10 ms each) vocoded per chunk"),
                ParamInfo::optional("left_frames", ParamType::Int, "frames of context before a chunk (default: the receptive field, which makes chunked audio equal one-shot audio; MNN uses 8)"),
                ParamInfo::optional("right_frames", ParamType::Int, "frames of context after a chunk, each a 10 ms wait (default: the receptive field; MNN uses 8)"),
            ],
            ports: Ports {
                inputs: vec![PortSpec::new(
                    "in",
                    PortType::Any,
                    "log-mel frames [80, frames] (or [1, 80, frames]), then Event::Flush at the end of the utterance (the DiT's output): its last frames are vocoded",
                )],
                outputs: vec![PortSpec::new(
                    "out",
                    PortType::Audio {
                        sample_rate: Some(SAMPLE_RATE),
                        channels: Some(1),
                    },
                    "mono audio at 24 kHz",
                )],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let source = Source::from_params(p, env)?;
        let chunk: usize = p.get_or("chunk_frames", 24usize)?;
        if !(1..=100_000).contains(&chunk) {
            return Err(p
                .error(
                    "chunk_frames",
                    format!("must be in 1..=100000, got {chunk}"),
                )
                .into());
        }
        let dev = env.open_device()?;
        if let Some(line) = random_notice(&env.stage_id, "BigVGAN vocoder", &source) {
            eprintln!("{line}");
        }
        let model = load(&source, &dev)?;
        let (l, r) = bigvgan::receptive_field(model.config());
        let left: usize = p.get_or("left_frames", l)?;
        let right: usize = p.get_or("right_frames", r)?;
        for (name, v) in [("left_frames", left), ("right_frames", right)] {
            if v > 10_000 {
                return Err(p
                    .error(name, format!("must be at most 10000, got {v}"))
                    .into());
            }
        }
        let stream = MelStream::new(model.config().mel_dim, chunk, left, right)?;
        Ok(Box::new(BigVganStage {
            model,
            stream,
            out: AudioOut::new(0, SAMPLE_RATE),
        }))
    }
}

/// The `bigvgan` stage.
#[derive(Debug)]
struct BigVganStage {
    model: BigVgan,
    stream: MelStream,
    /// Time to first audio and real-time factor of each utterance.
    out: AudioOut,
}

impl BigVganStage {
    /// Push `mel` (or finish the utterance) and send what is vocoded.
    fn run(&mut self, ctx: &mut StageCtx, mel: Option<&edgeflow_runtime::Tensor>) -> StageResult {
        let (model, stream) = (&self.model, &mut self.stream);
        self.out.stream(ctx, |sink| match mel {
            Some(m) => stream.push(model, m, sink),
            None => stream.finish(model, sink),
        })?;
        if mel.is_none() && self.out.end_utterance(ctx) {
            super::record_precision(ctx, self.model.device());
        }
        ctx.check()
    }
}

impl Stage for BigVganStage {
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
                "bigvgan `{}` got a {} message; it takes mel frames (a tensor [80, frames] from `dit`)",
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
