//! The `mic` stage: cpal capture in fixed-size chunks stamped with their
//! capture time.

use super::{
    choose_config, find_device, opt_channels, opt_rate, stream_error, Direction, StreamHealth,
};
use crate::error::{Error, Result};
use cpal::traits::{DeviceTrait, StreamTrait};
use cpal::{FromSample, InputCallbackInfo, Sample, SampleFormat, SizedSample, StreamConfig};
use edgeflow_graph::{
    BuildEnv, Message, ParamInfo, ParamType, Params, Payload, Poll, PortSpec, PortType, Ports,
    Stage, StageCtx, StageFactory, StageInfo, StageResult, Timestamp,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One buffer from the capture callback: capture time of its first frame.
type Captured = (Timestamp, Vec<f32>);

/// The `mic` stage kind.
#[derive(Debug)]
pub struct MicKind;

impl StageFactory for MicKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "mic",
            doc: "Captures from a microphone (cpal input stream) and emits fixed-size chunks stamped with their capture time. Missing or busy devices fail at start with the list of devices that exist. Records `overruns` (buffers dropped because the pipeline fell behind) and `stream_errors` (recoverable device errors).",
            params: vec![
                ParamInfo::optional("device", ParamType::String, "device name (exact, or a unique part of it); default: the system's default input"),
                ParamInfo::optional("sample_rate", ParamType::Int, "capture rate in Hz (default: the device's); the output port declares it when set"),
                ParamInfo::optional("channels", ParamType::Int, "channel count (default: the device's); the output port declares it when set"),
                ParamInfo::new("chunk_ms", ParamType::Float, 10.0, "chunk length in milliseconds (1..=1000)"),
                ParamInfo::optional("seconds", ParamType::Duration, "stop after this much audio (default: run until stopped)"),
            ],
            ports: Ports {
                inputs: vec![],
                outputs: vec![PortSpec::new("out", PortType::AUDIO_ANY, "captured audio")],
            },
            source: true,
        }
    }

    fn ports(&self, p: &Params, _env: &BuildEnv) -> StageResult<Ports> {
        Ok(Ports {
            inputs: vec![],
            outputs: vec![PortSpec::new(
                "out",
                PortType::Audio {
                    sample_rate: opt_rate(p)?,
                    channels: opt_channels(p)?,
                },
                "captured audio",
            )],
        })
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let chunk_ms: f64 = p.get_or("chunk_ms", 10.0)?;
        if !(1.0..=1000.0).contains(&chunk_ms) {
            return Err(p
                .error("chunk_ms", format!("must be in 1..=1000, got {chunk_ms}"))
                .into());
        }
        let seconds = p.duration("seconds")?;
        let device: Option<String> = p.opt("device")?;
        let mic = Mic::open(
            device.as_deref(),
            opt_rate(p)?,
            opt_channels(p)?,
            chunk_ms,
            seconds,
        )?;
        Ok(Box::new(mic))
    }
}

/// The `mic` stage: a running cpal input stream.
pub struct Mic {
    stream: cpal::Stream,
    name: String,
    rate: u32,
    channels: u16,
    chunk_frames: usize,
    limit_frames: Option<u64>,
    rx: Receiver<Captured>,
    overruns: Arc<AtomicU64>,
    errors: Arc<StreamHealth>,
    pending: Vec<f32>,
    /// Absolute frame index of `pending[0]`.
    pending_start: u64,
    /// Capture clock: (absolute frame index, capture time) that frame times
    /// are extrapolated from at the nominal rate.
    anchor: Option<(u64, Timestamp)>,
    /// Capture time of the last chunk emitted (timestamps never go back).
    last_ts: Timestamp,
    /// When the stream was started.
    started: Option<Instant>,
    emitted: u64,
}

impl std::fmt::Debug for Mic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mic")
            .field("device", &self.name)
            .field("rate", &self.rate)
            .field("channels", &self.channels)
            .finish()
    }
}

impl Mic {
    /// Open (but do not start) a capture stream.
    pub fn open(
        device: Option<&str>,
        rate: Option<u32>,
        channels: Option<u16>,
        chunk_ms: f64,
        seconds: Option<Duration>,
    ) -> Result<Mic> {
        let dev = find_device(device, Direction::Input)?;
        let name = dev.to_string();
        let (config, format) = choose_config(&dev, Direction::Input, rate, channels, 10.0)?;
        // About 2 s of buffers at 10 ms each before overruns count.
        let (tx, rx) = sync_channel::<Captured>(256);
        let overruns = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(StreamHealth::default());
        let stream = match format {
            SampleFormat::F32 => build_input::<f32>(&dev, &config, tx, &overruns, &errors),
            SampleFormat::I16 => build_input::<i16>(&dev, &config, tx, &overruns, &errors),
            SampleFormat::I32 => build_input::<i32>(&dev, &config, tx, &overruns, &errors),
            SampleFormat::U16 => build_input::<u16>(&dev, &config, tx, &overruns, &errors),
            SampleFormat::U8 => build_input::<u8>(&dev, &config, tx, &overruns, &errors),
            SampleFormat::I8 => build_input::<i8>(&dev, &config, tx, &overruns, &errors),
            SampleFormat::F64 => build_input::<f64>(&dev, &config, tx, &overruns, &errors),
            other => {
                return Err(Error::Device(format!(
                    "input device \"{name}\" only offers {other} samples, which edgeflow does not convert"
                )))
            }
        }
        .map_err(|e| stream_error(Direction::Input, &name, e))?;
        let rate = config.sample_rate;
        Ok(Mic {
            stream,
            name,
            rate,
            channels: config.channels,
            chunk_frames: ((chunk_ms * rate as f64 / 1000.0).round() as usize).max(1),
            limit_frames: seconds.map(|s| (s.as_secs_f64() * rate as f64).round() as u64),
            rx,
            overruns,
            errors,
            pending: Vec::new(),
            pending_start: 0,
            anchor: None,
            last_ts: Timestamp(0),
            started: None,
            emitted: 0,
        })
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// Capture rate.
    pub fn sample_rate(&self) -> u32 {
        self.rate
    }

    /// Channels.
    pub fn channels(&self) -> u16 {
        self.channels
    }

    fn take(&mut self, (ts, samples): Captured) {
        let end = self.pending_start + (self.pending.len() / self.channels as usize) as u64;
        // Callback times jitter by a period or so; frame counts do not. Keep
        // extrapolating from one anchor and move it only when the device
        // clock and ours disagree by more than RESYNC (an overrun dropped
        // buffers, or the stream stalled).
        let predicted = self.anchor.map(|_| self.time_of(end));
        let resync = match predicted {
            None => true,
            Some(p) => p.0.abs_diff(ts.0) > RESYNC.as_nanos() as u64,
        };
        if resync {
            self.anchor = Some((end, ts));
        }
        self.pending.extend_from_slice(&samples);
    }

    /// Capture time of absolute frame `f`.
    fn time_of(&self, f: u64) -> Timestamp {
        match self.anchor {
            Some((af, ats)) if f >= af => {
                ats.plus(Duration::from_secs_f64((f - af) as f64 / self.rate as f64))
            }
            Some((af, ats)) => Timestamp(
                ats.0
                    .saturating_sub(((af - f) as f64 * 1e9 / self.rate as f64) as u64),
            ),
            None => Timestamp::now(),
        }
    }
}

/// A capture stream silent for this long has died (a PulseAudio monitor
/// source can take a second to start delivering).
const MIC_STALL: Duration = Duration::from_secs(5);

/// How far the extrapolated capture clock may drift from the device's
/// callback times before it is re-anchored.
const RESYNC: Duration = Duration::from_millis(20);

fn build_input<T>(
    dev: &cpal::Device,
    config: &StreamConfig,
    tx: SyncSender<Captured>,
    overruns: &Arc<AtomicU64>,
    errors: &Arc<StreamHealth>,
) -> std::result::Result<cpal::Stream, cpal::Error>
where
    T: SizedSample + Send + 'static,
    f32: FromSample<T>,
{
    let overruns = overruns.clone();
    let errs = errors.clone();
    let health = errors.clone();
    dev.build_input_stream(
        *config,
        move |data: &[T], info: &InputCallbackInfo| {
            health.touch();
            let t = info.timestamp();
            let age = t.callback.saturating_duration_since(t.capture);
            let now = Timestamp::now();
            let captured = Timestamp(now.0.saturating_sub(age.as_nanos() as u64));
            let v: Vec<f32> = data.iter().map(|&s| f32::from_sample(s)).collect();
            if tx.try_send((captured, v)).is_err() {
                overruns.fetch_add(1, Ordering::Relaxed);
            }
        },
        move |e| errs.report(e),
        Some(Duration::from_secs(5)),
    )
}

impl Stage for Mic {
    fn start(&mut self, _ctx: &mut StageCtx) -> StageResult {
        self.stream
            .play()
            .map_err(|e| stream_error(Direction::Input, &self.name, e))?;
        self.started = Some(Instant::now());
        Ok(())
    }

    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        if ctx.should_stop() {
            return Ok(Poll::Done);
        }
        if self.limit_frames.is_some_and(|l| self.emitted >= l) {
            return Ok(Poll::Done);
        }
        self.errors.check(&format!("mic \"{}\"", self.name))?;
        match self.rx.recv_timeout(Duration::from_millis(20)) {
            Ok(c) => {
                self.take(c);
                // Take whatever else is already waiting.
                while let Ok(c) = self.rx.try_recv() {
                    self.take(c);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let since = self.started.unwrap_or_else(Instant::now);
                self.errors
                    .stalled(&format!("mic \"{}\"", self.name), since, MIC_STALL)?;
                return Ok(Poll::Idle);
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::Device(format!(
                    "mic \"{}\": the capture stream ended",
                    self.name
                ))
                .into())
            }
        }
        let ch = self.channels as usize;
        let mut pos = 0;
        while (self.pending.len() - pos) / ch >= self.chunk_frames {
            let mut n = self.chunk_frames;
            if let Some(l) = self.limit_frames {
                n = n.min((l - self.emitted) as usize);
            }
            let first = self.pending_start + (pos / ch) as u64;
            let ts = self.time_of(first).max(Timestamp(self.last_ts.0 + 1));
            self.last_ts = ts;
            let msg = Message {
                epoch: ctx.current_epoch(),
                seq: 0,
                timestamp: ts,
                deadline: None,
                payload: Payload::audio(
                    self.rate,
                    self.channels,
                    self.pending[pos..pos + n * ch].to_vec(),
                ),
            };
            pos += n * ch;
            self.emitted += n as u64;
            ctx.emit_msg(0, msg)?;
            if self.limit_frames.is_some_and(|l| self.emitted >= l) {
                break;
            }
        }
        self.pending.drain(..pos);
        self.pending_start += (pos / ch) as u64;
        ctx.record("overruns", self.overruns.load(Ordering::Relaxed) as f64);
        ctx.record("stream_errors", self.errors.glitches() as f64);
        Ok(Poll::Continue)
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.record("overruns", self.overruns.load(Ordering::Relaxed) as f64);
        Ok(())
    }
}
