//! The `asr` stage: buffers the audio of an utterance and transcribes it
//! with Whisper at the end of speech.
//!
//! Its input takes audio and speech events in order (the `speech` output of
//! `vad`): audio between `SpeechStart` and `SpeechEnd` is transcribed at
//! `SpeechEnd`. Audio that arrives before any event (a plain audio stream)
//! is buffered and transcribed at end of stream, as are utterances still
//! open then. `Flush` transcribes what is buffered.

use crate::cards::WHISPER_TINY_EN;
use crate::whisper::{Transcriber, WHISPER_SAMPLE_RATE};
use crate::Error;
use edgeflow_graph::{
    BuildEnv, Epoch, Event, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType,
    Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use std::time::Instant;

/// The `asr` stage kind.
#[derive(Debug)]
pub struct AsrKind;

impl StageFactory for AsrKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "asr",
            doc: "Whisper speech recognition (CTranslate2 tiny.en by default), greedy as faster-whisper with beam 1: transcribes each utterance (SpeechStart..SpeechEnd from `vad`, or the whole stream when no events come) and emits its text. Records `asr_ms`, `asr_rtf`, `asr_encode_ms`, `asr_decode_ms`.",
            params: vec![
                ParamInfo::optional("model", ParamType::InputPath, "CTranslate2 Whisper directory (model.bin, config.json, tokenizer.json); default: whisper-tiny-en in the model cache"),
                ParamInfo::new("max_utterance_s", ParamType::Float, 120.0, "utterances longer than this are transcribed in pieces of this length"),
                ParamInfo::new("condition_on_previous_text", ParamType::Bool, true, "prompt each 30 s window with the text of the previous ones"),
                ParamInfo::new("emit_empty", ParamType::Bool, false, "emit an empty text for utterances with no words"),
            ],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Any, "16 kHz mono audio, optionally bracketed by SpeechStart / SpeechEnd events (vad's `speech` output)")],
                outputs: vec![PortSpec::new("text", PortType::Text, "the transcript of each utterance")],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let dir = match p.path("model", env)? {
            Some(d) => d,
            None => WHISPER_TINY_EN.locate()?,
        };
        let max_s: f64 = p.get_or("max_utterance_s", 120.0)?;
        if !(1.0..=3600.0).contains(&max_s) {
            return Err(p
                .error(
                    "max_utterance_s",
                    format!("must be in [1, 3600], got {max_s}"),
                )
                .into());
        }
        let dev = env.open_device()?;
        let mut tr = Transcriber::load(&dir, &dev)?;
        tr.options.condition_on_previous_text = p.get_or("condition_on_previous_text", true)?;
        Ok(Box::new(AsrStage {
            tr,
            buf: Vec::new(),
            seen_events: false,
            in_speech: false,
            utterance_epoch: None,
            max_samples: (max_s * WHISPER_SAMPLE_RATE as f64) as usize,
            emit_empty: p.get_or("emit_empty", false)?,
            dev,
        }))
    }
}

/// The `asr` stage.
#[derive(Debug)]
pub struct AsrStage {
    tr: Transcriber,
    buf: Vec<f32>,
    seen_events: bool,
    in_speech: bool,
    /// Epoch of the utterance being buffered (its SpeechStart's).
    utterance_epoch: Option<Epoch>,
    max_samples: usize,
    emit_empty: bool,
    dev: edgeflow_runtime::Device,
}

impl AsrStage {
    fn transcribe(&mut self, ctx: &mut StageCtx) -> StageResult {
        if self.buf.is_empty() {
            return Ok(());
        }
        let audio = std::mem::take(&mut self.buf);
        let t0 = Instant::now();
        let r = {
            let c = &*ctx;
            self.tr.transcribe(&audio, &mut || c.is_cancelled())
        };
        let t = match r {
            Ok(t) => t,
            Err(Error::Cancelled) => return Err(StageError::Cancelled),
            Err(e) => return Err(e.into()),
        };
        let secs = t0.elapsed().as_secs_f64();
        ctx.record("asr_ms", secs * 1e3);
        ctx.record(
            "asr_rtf",
            secs / (audio.len() as f64 / WHISPER_SAMPLE_RATE as f64),
        );
        ctx.record("asr_encode_ms", t.encode_s * 1e3);
        ctx.record("asr_decode_ms", t.decode_s * 1e3);
        if !t.text.is_empty() || self.emit_empty {
            ctx.emit(0, Payload::text(&t.text))?;
        }
        Ok(())
    }
}

impl Stage for AsrStage {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.attach_device(self.dev.stats().clone());
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        match &input.msg.payload {
            Payload::Audio(a) => {
                if a.sample_rate != WHISPER_SAMPLE_RATE || a.channels != 1 {
                    return Err(StageError::msg(format!(
                        "asr takes 16000 Hz mono audio, got {} Hz x{}: insert `resample` (to: 16000) / `channel_mix` (channels: 1) before it",
                        a.sample_rate, a.channels
                    )));
                }
                if self.in_speech || !self.seen_events {
                    self.buf.extend_from_slice(&a.samples);
                    if self.buf.len() >= self.max_samples {
                        self.transcribe(ctx)?;
                    }
                }
                Ok(())
            }
            Payload::Event(e) => {
                match **e {
                    Event::SpeechStart => {
                        self.seen_events = true;
                        self.in_speech = true;
                        self.utterance_epoch = Some(input.msg.epoch);
                        self.buf.clear();
                    }
                    Event::SpeechEnd => {
                        self.seen_events = true;
                        self.in_speech = false;
                        self.transcribe(ctx)?;
                    }
                    Event::Flush => self.transcribe(ctx)?,
                    _ => {}
                }
                Ok(())
            }
            other => Err(StageError::msg(format!(
                "asr takes audio and speech events, got {other:?}"
            ))),
        }
    }

    fn reset(&mut self, epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        // A barge-in cancels the agent's epoch while the user's new
        // utterance (another epoch) is being buffered: keep that one.
        if self.utterance_epoch.is_none_or(|e| e == epoch) {
            self.buf.clear();
            self.in_speech = false;
            self.utterance_epoch = None;
        }
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        self.transcribe(ctx)
    }
}
