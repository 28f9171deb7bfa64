//! The `vad` stage: Silero VAD speech probabilities per 32 ms window, turned
//! into speech-start / speech-end events with silero-vad's `VADIterator`
//! rules (plus an optional minimum speech duration).

use crate::cards::{SILERO_VAD, SILERO_WEIGHTS};
use crate::silero::{SileroConfig, SileroVad, CONTEXT, SAMPLE_RATE, WINDOW};
use crate::VarBuilder;
use crate::{Error, Result};
use edgeflow_graph::{
    BuildEnv, Epoch, Event, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType,
    Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use std::collections::VecDeque;
use std::time::Instant;

/// Thresholds and durations of the segmenter (silero-vad's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadConfig {
    /// A window with probability `>= threshold` is speech.
    pub threshold: f32,
    /// Speech ends only after windows below this (silero: `threshold - 0.15`).
    pub neg_threshold: f32,
    /// Speech must last this long before it starts (0: start at once, as `VADIterator`).
    pub min_speech_ms: u32,
    /// Silence that ends speech.
    pub min_silence_ms: u32,
    /// Padding added before the start and after the end of speech.
    pub speech_pad_ms: u32,
}

impl Default for VadConfig {
    fn default() -> Self {
        VadConfig {
            threshold: 0.5,
            neg_threshold: 0.35,
            min_speech_ms: 0,
            min_silence_ms: 100,
            speech_pad_ms: 30,
        }
    }
}

/// What the segmenter decided after a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VadEvent {
    /// Speech starts at this sample (padded).
    Start(u64),
    /// Speech ends at this sample (padded, exclusive).
    End(u64),
}

/// Turns per-window probabilities into speech segments. With
/// `min_speech_ms = 0` this is exactly silero-vad's `VADIterator`.
#[derive(Debug, Clone)]
pub struct Segmenter {
    cfg: VadConfig,
    triggered: bool,
    temp_end: u64,
    current: u64,
    /// Candidate start while waiting for `min_speech_ms`: (padded start, first speech sample).
    candidate: Option<(u64, u64)>,
}

impl Segmenter {
    /// A segmenter at sample 0.
    pub fn new(cfg: VadConfig) -> Self {
        Segmenter {
            cfg,
            triggered: false,
            temp_end: 0,
            current: 0,
            candidate: None,
        }
    }

    fn samples(ms: u32) -> u64 {
        SAMPLE_RATE as u64 * ms as u64 / 1000
    }

    /// Whether speech is in progress.
    pub fn in_speech(&self) -> bool {
        self.triggered
    }

    /// Samples seen so far.
    pub fn position(&self) -> u64 {
        self.current
    }

    /// Sample from which audio is being held back while a possible end of
    /// speech is confirmed (`None` when nothing is held).
    pub fn holding_since(&self) -> Option<u64> {
        (self.triggered && self.temp_end > 0).then(|| self.temp_end - WINDOW as u64)
    }

    /// Feed the probability of the next window of `window` samples.
    pub fn push(&mut self, prob: f32, window: usize) -> Option<VadEvent> {
        let w = window as u64;
        self.current += w;
        let pad = Self::samples(self.cfg.speech_pad_ms);
        if prob >= self.cfg.threshold && self.temp_end > 0 {
            self.temp_end = 0;
        }
        if !self.triggered {
            if prob >= self.cfg.threshold {
                let (start, first) = *self
                    .candidate
                    .get_or_insert((self.current.saturating_sub(pad + w), self.current - w));
                if self.current - first >= Self::samples(self.cfg.min_speech_ms) {
                    self.candidate = None;
                    self.triggered = true;
                    return Some(VadEvent::Start(start));
                }
            } else if prob < self.cfg.neg_threshold {
                self.candidate = None;
            }
            return None;
        }
        if prob < self.cfg.neg_threshold {
            if self.temp_end == 0 {
                self.temp_end = self.current;
            }
            if self.current - self.temp_end < Self::samples(self.cfg.min_silence_ms) {
                return None;
            }
            let end = (self.temp_end + pad).saturating_sub(w);
            self.temp_end = 0;
            self.triggered = false;
            return Some(VadEvent::End(end.min(self.current)));
        }
        None
    }

    /// Back to sample 0, no speech.
    pub fn reset(&mut self) {
        *self = Segmenter::new(self.cfg);
    }
}

/// Silero VAD plus the segmenter, over a stream of 16 kHz mono samples of any
/// chunking. Usable without a pipeline.
#[derive(Debug)]
pub struct VadStream {
    model: SileroVad,
    seg: Segmenter,
    pending: Vec<f32>,
    probs: Vec<f32>,
}

impl VadStream {
    /// Wrap a loaded model.
    pub fn new(model: SileroVad, cfg: VadConfig) -> Self {
        VadStream {
            model,
            seg: Segmenter::new(cfg),
            pending: Vec::new(),
            probs: Vec::new(),
        }
    }

    /// The segmenter (position, speech state).
    pub fn segmenter(&self) -> &Segmenter {
        &self.seg
    }

    /// Feed samples; calls `on_window(prob, event, seconds)` for each full
    /// window processed.
    pub fn push(
        &mut self,
        samples: &[f32],
        on_window: &mut dyn FnMut(f32, Option<VadEvent>, f64),
    ) -> Result<()> {
        self.pending.extend_from_slice(samples);
        let mut off = 0;
        while self.pending.len() - off >= WINDOW {
            let t0 = Instant::now();
            let p = self.model.step(&self.pending[off..off + WINDOW])?;
            let dt = t0.elapsed().as_secs_f64();
            off += WINDOW;
            self.probs.push(p);
            let ev = self.seg.push(p, WINDOW);
            on_window(p, ev, dt);
        }
        self.pending.drain(..off);
        Ok(())
    }

    /// Process the last partial window zero-padded (as silero-vad's
    /// `get_speech_timestamps` does), then close open speech at the true end.
    pub fn finish(&mut self, on_window: &mut dyn FnMut(f32, Option<VadEvent>, f64)) -> Result<()> {
        if !self.pending.is_empty() {
            let real = self.pending.len();
            let mut w = std::mem::take(&mut self.pending);
            w.resize(WINDOW, 0.0);
            let t0 = Instant::now();
            let p = self.model.step(&w)?;
            let dt = t0.elapsed().as_secs_f64();
            self.probs.push(p);
            let ev = self.seg.push(p, real);
            on_window(p, ev, dt);
        }
        if self.seg.in_speech() {
            let end = self.seg.position();
            self.seg.reset();
            on_window(f32::NAN, Some(VadEvent::End(end)), 0.0);
        }
        Ok(())
    }

    /// Speech probabilities of every window so far.
    pub fn probs(&self) -> &[f32] {
        &self.probs
    }

    /// New stream: model state, context and segmenter reset.
    pub fn reset(&mut self) -> Result<()> {
        self.model.reset()?;
        self.seg.reset();
        self.pending.clear();
        self.probs.clear();
        Ok(())
    }
}

/// Speech probabilities of a whole 16 kHz clip, one per 512-sample window
/// (the last one zero-padded), as silero-vad computes them.
pub fn clip_probs(model: &mut SileroVad, samples: &[f32]) -> Result<Vec<f32>> {
    model.reset()?;
    let mut out = Vec::with_capacity(samples.len().div_ceil(WINDOW));
    for w in samples.chunks(WINDOW) {
        if w.len() == WINDOW {
            out.push(model.step(w)?);
        } else {
            let mut last = w.to_vec();
            last.resize(WINDOW, 0.0);
            out.push(model.step(&last)?);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- stage

/// Output ports of `vad`.
const OUT_EVENTS: usize = 0;
const OUT_SPEECH: usize = 1;
const OUT_AUDIO: usize = 2;

/// The `vad` stage kind.
#[derive(Debug)]
pub struct VadKind;

fn config_from(p: &Params) -> std::result::Result<VadConfig, StageError> {
    let d = VadConfig::default();
    let threshold: f32 = p.get_or("threshold", d.threshold)?;
    if !(0.0..=1.0).contains(&threshold) {
        return Err(p
            .error("threshold", format!("must be in [0, 1], got {threshold}"))
            .into());
    }
    let neg_threshold: f32 = p.get_or("neg_threshold", (threshold - 0.15).max(0.01))?;
    if !(0.0..=threshold).contains(&neg_threshold) {
        return Err(p
            .error(
                "neg_threshold",
                format!("must be in [0, threshold = {threshold}], got {neg_threshold}"),
            )
            .into());
    }
    let ms = |key: &str, def: u32| -> std::result::Result<u32, StageError> {
        match p.duration(key)? {
            Some(d) if d.as_secs() > 3600 => Err(p.error(key, "must be under an hour").into()),
            Some(d) => Ok(d.as_millis() as u32),
            None => Ok(def),
        }
    };
    Ok(VadConfig {
        threshold,
        neg_threshold,
        min_speech_ms: ms("min_speech_ms", d.min_speech_ms)?,
        min_silence_ms: ms("min_silence_ms", d.min_silence_ms)?,
        speech_pad_ms: ms("speech_pad_ms", d.speech_pad_ms)?,
    })
}

impl StageFactory for VadKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "vad",
            doc: "Silero VAD v6 on 16 kHz mono audio (512-sample windows, LSTM state and 64-sample context carried across chunks); emits SpeechStart / SpeechEnd with silero-vad's VADIterator rules. Records `vad_window_us` per window.",
            params: vec![
                ParamInfo::optional("model", ParamType::InputPath, "Silero weights (safetensors; default: silero_vad_onnx_16k.safetensors in the model cache, see `edgeflow_speech::fetch`)"),
                ParamInfo::new("threshold", ParamType::Float, 0.5, "speech probability at or above which a window is speech"),
                ParamInfo::optional("neg_threshold", ParamType::Float, "probability below which silence counts toward the end (default threshold - 0.15)"),
                ParamInfo::new("min_speech_ms", ParamType::Duration, "0ms", "speech must last this long before SpeechStart (0: at once, as VADIterator)"),
                ParamInfo::new("min_silence_ms", ParamType::Duration, "100ms", "silence that ends speech"),
                ParamInfo::new("speech_pad_ms", ParamType::Duration, "30ms", "padding before the start and after the end of speech"),
            ],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Audio { sample_rate: Some(SAMPLE_RATE), channels: Some(1) }, "16 kHz mono audio")],
                outputs: vec![
                    PortSpec::new("events", PortType::Control, "Event::SpeechStart / Event::SpeechEnd"),
                    PortSpec::new("speech", PortType::Any, "speech only, in order: SpeechStart, the padded speech audio, SpeechEnd (what `asr` takes)"),
                    PortSpec::new("audio", PortType::Audio { sample_rate: Some(SAMPLE_RATE), channels: Some(1) }, "all input audio, passed through"),
                ],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> std::result::Result<Box<dyn Stage>, StageError> {
        let cfg = config_from(p)?;
        let path = match p.path("model", env)? {
            Some(path) => path,
            None => SILERO_VAD.path(SILERO_WEIGHTS)?,
        };
        let dev = env.open_device()?;
        let model = SileroVad::load(&VarBuilder::open(&[&path], &dev)?, &SileroConfig::default())?;
        Ok(Box::new(VadStage {
            stream: VadStream::new(model, cfg),
            history: VecDeque::new(),
            history_start: 0,
            emitted: 0,
            dev,
        }))
    }
}

/// The `vad` stage.
#[derive(Debug)]
pub struct VadStage {
    stream: VadStream,
    /// Recent input samples, `history[0]` being sample `history_start`.
    history: VecDeque<f32>,
    history_start: u64,
    /// Speech audio emitted on `speech` up to this sample.
    emitted: u64,
    dev: edgeflow_runtime::Device,
}

impl VadStage {
    fn slice(&self, from: u64, to: u64) -> Vec<f32> {
        let a = from.max(self.history_start);
        let b = to.min(self.history_start + self.history.len() as u64);
        if b <= a {
            return Vec::new();
        }
        self.history
            .range((a - self.history_start) as usize..(b - self.history_start) as usize)
            .copied()
            .collect()
    }

    fn emit_speech_audio(&mut self, to: u64, ctx: &mut StageCtx) -> StageResult {
        if to > self.emitted {
            let s = self.slice(self.emitted, to);
            self.emitted = to;
            if !s.is_empty() {
                ctx.emit(OUT_SPEECH, Payload::audio(SAMPLE_RATE, 1, s))?;
            }
        }
        Ok(())
    }

    /// Act on the events of the windows just processed.
    fn handle(&mut self, events: Vec<(f64, Option<VadEvent>)>, ctx: &mut StageCtx) -> StageResult {
        for (dt, ev) in events {
            if dt > 0.0 {
                ctx.record("vad_window_us", dt * 1e6);
            }
            match ev {
                Some(VadEvent::Start(s)) => {
                    ctx.emit(OUT_EVENTS, Payload::event(Event::SpeechStart))?;
                    ctx.emit(OUT_SPEECH, Payload::event(Event::SpeechStart))?;
                    self.emitted = s;
                }
                Some(VadEvent::End(e)) => {
                    self.emit_speech_audio(e, ctx)?;
                    ctx.emit(OUT_SPEECH, Payload::event(Event::SpeechEnd))?;
                    ctx.emit(OUT_EVENTS, Payload::event(Event::SpeechEnd))?;
                }
                None => {}
            }
        }
        let seg = self.stream.segmenter();
        if seg.in_speech() {
            let upto = seg.holding_since().unwrap_or(seg.position());
            self.emit_speech_audio(upto, ctx)?;
        }
        // Keep what a future start (pad + window) or a held tail may need.
        let pad = Segmenter::samples(self.stream.seg.cfg.speech_pad_ms);
        let seg = self.stream.segmenter();
        let keep_from = if seg.in_speech() {
            self.emitted
        } else {
            seg.position()
                .saturating_sub(pad + WINDOW as u64 + CONTEXT as u64 + self.min_speech())
        };
        while self.history_start < keep_from && !self.history.is_empty() {
            self.history.pop_front();
            self.history_start += 1;
        }
        Ok(())
    }

    fn min_speech(&self) -> u64 {
        Segmenter::samples(self.stream.seg.cfg.min_speech_ms) + WINDOW as u64
    }
}

fn check_format(a: &edgeflow_graph::AudioChunk) -> Result<()> {
    if a.sample_rate != SAMPLE_RATE || a.channels != 1 {
        return Err(Error::BadInput(format!(
            "vad takes 16000 Hz mono audio, got {} Hz x{}: insert `resample` (to: 16000) / `channel_mix` (channels: 1) before it",
            a.sample_rate, a.channels
        )));
    }
    Ok(())
}

impl Stage for VadStage {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.attach_device(self.dev.stats().clone());
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let Some(a) = input.msg.payload.as_audio() else {
            return Err(StageError::msg(format!(
                "vad takes audio, got {:?}",
                input.msg.payload
            )));
        };
        check_format(a)?;
        self.history.extend(a.samples.iter().copied());
        if ctx.output_count() > OUT_AUDIO {
            ctx.emit(OUT_AUDIO, input.msg.payload.clone())?;
        }
        let mut events = Vec::new();
        self.stream
            .push(&a.samples, &mut |_, ev, dt| events.push((dt, ev)))?;
        self.handle(events, ctx)
    }

    /// The input is one continuous audio stream whatever the turn, so a
    /// cancelled epoch (barge-in on the agent's turn) does not reset the
    /// detector: its LSTM state, context and an utterance in progress carry
    /// on; what was already emitted in that epoch is dropped by the queues.
    fn reset(&mut self, _epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        let mut events = Vec::new();
        self.stream.finish(&mut |_, ev, dt| events.push((dt, ev)))?;
        self.handle(events, ctx)
    }
}
