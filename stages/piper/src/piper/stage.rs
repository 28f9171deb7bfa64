//! The TTS stage kinds.
//!
//! Two stages rather than one, so the front end phonemizes the next sentence
//! (an espeak-ng call) while the model speaks the current one:
//!
//! - `piper_frontend`: text -> one `tokens` message (phoneme ids) per sentence;
//! - `vits`: tokens -> audio, streamed in chunks; records
//!   `time_to_first_audio_ms` (from the text's capture time to the first
//!   chunk of each utterance), `rtf` (compute time / audio time per
//!   sentence) and `audio_s`.
//!
//! ```yaml
//! stages:
//!   - { id: text, kind: text, params: { text: "Hello there." } }
//!   - { id: frontend, kind: piper_frontend }
//!   - { id: tts, kind: vits, device: cpu }
//!   - { id: out, kind: wav_sink, params: { path: hello.wav } }
//! edges:
//!   - { from: text.out, to: frontend.in }
//!   - { from: frontend.out, to: tts.in }
//!   - { from: tts.out, to: out.in }
//! ```

use super::cards::{self, VoiceFiles};
use super::config::{InferenceScales, VoiceConfig};
use super::phonemize::FrontEnd;
use crate::vits::{AudioAhead, Chunking, SynthesisParams, Vits, VitsConfig};
use edgeflow_graph::{
    BuildEnv, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType, Ports, Registry,
    Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult, Timestamp,
};
use std::sync::Arc;
use std::time::Instant;

/// Register `piper_frontend` and `vits`.
pub fn register(r: &mut Registry) {
    r.register(FrontEndKind);
    r.register(VitsKind);
}

fn voice_params() -> Vec<ParamInfo> {
    vec![
        ParamInfo::new(
            "voice",
            ParamType::String,
            "piper-joe",
            "voice in the model cache (`edgeflow models fetch NAME`)",
        ),
        ParamInfo::optional(
            "model_dir",
            ParamType::InputPath,
            "folder with model.safetensors and <voice>.onnx.json, instead of the cached voice",
        ),
    ]
}

/// The voice files named by `voice` / `model_dir`.
fn voice_files(p: &Params, env: &BuildEnv) -> Result<VoiceFiles, StageError> {
    if let Some(dir) = p.path("model_dir", env)? {
        return VoiceFiles::in_dir(&dir).map_err(StageError::from);
    }
    let name: String = p.get_or("voice", "piper-joe".to_string())?;
    let Some(voice) = cards::CARDS.iter().find(|c| c.name == name) else {
        let known: Vec<&str> = cards::CARDS.iter().map(|v| v.name).collect();
        return Err(p
            .error(
                "voice",
                format!("unknown voice `{name}`; known: {}", known.join(", ")),
            )
            .into());
    };
    Ok(VoiceFiles::in_dir(&voice.locate()?)?)
}

// ---------------------------------------------------------------- piper_frontend

struct FrontEndKind;

impl StageFactory for FrontEndKind {
    fn info(&self) -> StageInfo {
        let mut params = voice_params();
        params.push(ParamInfo::new(
            "normalize",
            ParamType::Bool,
            true,
            "expand numbers, currency, ordinals, years, times and abbreviations before phonemizing",
        ));
        StageInfo {
            kind: "piper_frontend",
            doc: "Piper's text front end: normalizes English text, splits it into sentences, phonemizes with the espeak-ng program (the voice's espeak voice) and maps phonemes to the voice's ids. Emits one tokens message per sentence.",
            params,
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Text, "text to speak")],
                outputs: vec![PortSpec::new(
                    "out",
                    PortType::Tokens,
                    "phoneme ids of one sentence (with BOS / padding / EOS)",
                )],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let files = voice_files(p, env)?;
        let config = VoiceConfig::read(&files.config)?;
        let fe = FrontEnd::new(config, p.get_or("normalize", true)?);
        Ok(Box::new(FrontEndStage { fe }))
    }
}

struct FrontEndStage {
    fe: FrontEnd,
}

impl Stage for FrontEndStage {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let Some(text) = input.msg.payload.as_text() else {
            return Err(StageError::msg(format!(
                "piper_frontend `{}` got a {} message; it takes text",
                ctx.id(),
                input.msg.payload.type_name()
            )));
        };
        let started = Instant::now();
        let mut first = true;
        let mut failed = None;
        self.fe.for_each_sentence(text, &mut |s| {
            if first {
                // Time until the first sentence can be synthesized.
                ctx.record("phonemize_ms", started.elapsed().as_secs_f64() * 1000.0);
                first = false;
            }
            let ids: Vec<u32> = s.ids.iter().map(|&i| i as u32).collect();
            match ctx
                .check()
                .and_then(|()| ctx.emit(0, Payload::Tokens(Arc::from(ids))))
            {
                Ok(()) => Ok(true),
                Err(e) => {
                    failed = Some(e);
                    Ok(false)
                }
            }
        })?;
        failed.map_or(Ok(()), Err)
    }
}

// ---------------------------------------------------------------- vits

struct VitsKind;

impl VitsKind {
    fn rate(p: &Params, env: &BuildEnv) -> Option<u32> {
        let files = voice_files(p, env).ok()?;
        VoiceConfig::read(&files.config).ok().map(|c| c.sample_rate)
    }
}

impl StageFactory for VitsKind {
    fn info(&self) -> StageInfo {
        let mut params = voice_params();
        params.extend([
            ParamInfo::optional("noise_scale", ParamType::Float, "prior noise (default: the voice's, 0.667 for joe); 0 is deterministic"),
            ParamInfo::optional("length_scale", ParamType::Float, "phoneme length multiplier, > 1 is slower (default: the voice's)"),
            ParamInfo::optional("noise_w", ParamType::Float, "duration noise (default: the voice's, 0.8 for joe)"),
            ParamInfo::new("seed", ParamType::Int, 0, "seed of the noise; the n-th sentence uses seed + n"),
            ParamInfo::new("first_chunk_frames", ParamType::Int, 24, "latent frames (256 samples each) in an utterance's first audio chunk: smaller starts sooner (a later sentence that starts while enough audio is queued takes a full chunk first)"),
            ParamInfo::new("chunk_frames", ParamType::Int, 256, "latent frames in each later chunk: larger recomputes less context (2 x 15 frames per chunk boundary), smaller reacts to a cancel sooner; a last remainder under half a chunk joins the chunk before it"),
        ]);
        StageInfo {
            kind: "vits",
            doc: "Piper VITS voice on the edgeflow runtime (device: cpu, gpu or npu): phoneme ids of a sentence in, mono audio out, streamed in chunks whose joined audio equals the one-shot output. Records time_to_first_audio_ms, rtf and audio_s.",
            params,
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Tokens, "phoneme ids of one sentence")],
                outputs: vec![PortSpec::new("out", PortType::AUDIO_ANY, "mono audio at the voice's rate")],
            },
            source: false,
        }
    }

    fn ports(&self, p: &Params, env: &BuildEnv) -> Result<Ports, StageError> {
        let mut ports = self.info().ports;
        if let Some(rate) = Self::rate(p, env) {
            ports.outputs[0].ty = PortType::Audio {
                sample_rate: Some(rate),
                channels: Some(1),
            };
        }
        Ok(ports)
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let files = voice_files(p, env)?;
        let vc = VoiceConfig::read(&files.config)?;
        let d = vc.scales;
        let scales = InferenceScales {
            noise_scale: p.get_or("noise_scale", d.noise_scale)?,
            length_scale: p.get_or("length_scale", d.length_scale)?,
            noise_w: p.get_or("noise_w", d.noise_w)?,
        };
        for (k, v, lo, hi) in [
            ("noise_scale", scales.noise_scale, 0.0, 2.0),
            ("length_scale", scales.length_scale, 0.1, 10.0),
            ("noise_w", scales.noise_w, 0.0, 2.0),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err(p
                    .error(k, format!("must be in {lo}..={hi}, got {v}"))
                    .into());
            }
        }
        let chunking = Chunking {
            first_frames: p.get_or("first_chunk_frames", 24usize)?,
            frames: p.get_or("chunk_frames", 256usize)?,
        };
        if chunking.first_frames == 0 || chunking.frames == 0 {
            return Err(p
                .error("chunk_frames", "chunk sizes must be at least 1 frame")
                .into());
        }
        let dev = env.open_device()?;
        let cfg = VitsConfig {
            num_symbols: vc.num_symbols,
            ..VitsConfig::default()
        };
        let vits = Vits::load(&crate::VarBuilder::open(&[&files.weights], &dev)?, &cfg)?;
        Ok(Box::new(VitsStage {
            vits,
            rate: vc.sample_rate,
            scales,
            seed: p.get_or("seed", 0u64)?,
            chunking,
            ahead: AudioAhead::default(),
            sentence: 0,
            utterance: None,
        }))
    }
}

struct VitsStage {
    vits: Vits,
    rate: u32,
    scales: InferenceScales,
    seed: u64,
    chunking: Chunking,
    /// Audio of the utterance in progress still queued downstream: a
    /// sentence that starts while enough is queued skips the small first chunk.
    ahead: AudioAhead,
    sentence: u64,
    /// (epoch, capture time) of the utterance in progress, to time its first audio.
    utterance: Option<(u64, Timestamp)>,
}

impl Stage for VitsStage {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.attach_device(self.vits.device().stats().clone());
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let Payload::Tokens(ids) = &input.msg.payload else {
            return Err(StageError::msg(format!(
                "vits `{}` got a {} message; it takes tokens (phoneme ids from piper_frontend)",
                ctx.id(),
                input.msg.payload.type_name()
            )));
        };
        let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let key = (input.msg.epoch, input.msg.timestamp);
        let new_utterance = self.utterance != Some(key);
        self.utterance = Some(key);
        if new_utterance {
            self.ahead.reset();
        }
        let chunking = self.ahead.chunking(
            self.chunking,
            self.vits.hop_length() as f64 / f64::from(self.rate),
        );
        let params = SynthesisParams {
            scales: self.scales,
            seed: self.seed.wrapping_add(self.sentence),
        };
        self.sentence += 1;

        let started = Instant::now();
        let prior = self.vits.prior(&ids, &params)?;
        let mut samples = 0usize;
        let mut first = new_utterance;
        let mut failed: Option<StageError> = None;
        let rate = self.rate;
        let ahead = &mut self.ahead;
        self.vits.stream(&prior, chunking, &mut |chunk| {
            if ctx.is_cancelled() {
                return Ok(false);
            }
            samples += chunk.len();
            ahead.emitted(chunk.len(), rate);
            if first {
                first = false;
                ctx.record(
                    "time_to_first_audio_ms",
                    input.msg.timestamp.elapsed().as_secs_f64() * 1000.0,
                );
            }
            match ctx.emit(0, Payload::audio(rate, 1, chunk)) {
                Ok(()) => Ok(true),
                Err(e) => {
                    failed = Some(e);
                    Ok(false)
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        ctx.check()?;
        let audio_s = samples as f64 / f64::from(rate);
        self.ahead
            .sentence_done(started.elapsed().as_secs_f64(), audio_s);
        if audio_s > 0.0 {
            ctx.record("rtf", started.elapsed().as_secs_f64() / audio_s);
            ctx.record("audio_s", audio_s);
        }
        Ok(())
    }

    fn reset(&mut self, _epoch: u64, _ctx: &mut StageCtx) -> StageResult {
        self.utterance = None;
        Ok(())
    }
}
