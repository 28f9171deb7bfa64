//! Live audio through cpal: the `mic` and `speaker` stages.
//!
//! Both run cpal's default host (ALSA on Linux, which also reaches
//! PulseAudio / PipeWire through their ALSA plugins). The device callback
//! never blocks on the pipeline: the microphone callback hands each buffer
//! to the stage thread over a bounded channel (a full channel drops the
//! buffer and counts an overrun), and the speaker callback copies from a
//! jitter buffer that the stage thread fills (an empty buffer plays silence
//! and counts an underrun).

use crate::error::{Error, Result};
use crate::resample::{check_rate, StreamResampler};
use crate::util::mix_channels;
use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
use cpal::{
    BufferSize, FromSample, InputCallbackInfo, OutputCallbackInfo, Sample, SampleFormat,
    SizedSample, StreamConfig, SupportedBufferSize,
};
use edgeflow_graph::{
    BuildEnv, Epoch, Input, Message, ParamInfo, ParamType, Params, Payload, Poll, PortSpec,
    PortType, Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult, Timestamp,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Which way a device is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Capture (microphone).
    Input,
    /// Playback (speaker).
    Output,
}

impl Direction {
    fn word(self) -> &'static str {
        match self {
            Direction::Input => "input",
            Direction::Output => "output",
        }
    }
}

/// One device the host offers: its id (what the `device` param takes,
/// e.g. `pulse` or `hw:CARD=PCH,DEV=0` on ALSA) and its description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEntry {
    /// Host-specific id.
    pub id: String,
    /// Human-readable description.
    pub name: String,
}

impl std::fmt::Display for DeviceEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\"{}\" ({})", self.id, self.name)
    }
}

fn entries(dir: Direction) -> Result<Vec<(DeviceEntry, cpal::Device)>> {
    let host = cpal::default_host();
    let devices: Vec<cpal::Device> = match dir {
        Direction::Input => host.input_devices().map(|d| d.collect()),
        Direction::Output => host.output_devices().map(|d| d.collect()),
    }
    .map_err(|e| Error::Device(format!("cannot list {} devices: {e}", dir.word())))?;
    Ok(devices
        .into_iter()
        .map(|d| {
            let name = d.to_string();
            let id = d
                .id()
                .map(|i| i.id().to_string())
                .unwrap_or_else(|_| name.clone());
            (DeviceEntry { id, name }, d)
        })
        .collect())
}

/// The devices cpal's default host offers for `dir`.
pub fn list_devices(dir: Direction) -> Result<Vec<DeviceEntry>> {
    Ok(entries(dir)?.into_iter().map(|(e, _)| e).collect())
}

fn describe(dir: Direction, list: &[DeviceEntry]) -> String {
    if list.is_empty() {
        format!(
            "there are no {} devices at all (no sound card, and no PulseAudio/PipeWire server reachable: \
             start one, e.g. audio/tests/start-pulse.sh)",
            dir.word()
        )
    } else {
        let l: Vec<String> = list.iter().map(|e| e.to_string()).collect();
        format!("{} devices: {}", dir.word(), l.join(", "))
    }
}

fn available(dir: Direction) -> String {
    match list_devices(dir) {
        Ok(list) => describe(dir, &list),
        Err(e) => e.to_string(),
    }
}

/// Find a device by id or description (exact, case-insensitive; else a
/// unique substring of either), or the default device when `name` is `None`.
pub fn find_device(name: Option<&str>, dir: Direction) -> Result<cpal::Device> {
    let host = cpal::default_host();
    let Some(name) = name else {
        let d = match dir {
            Direction::Input => host.default_input_device(),
            Direction::Output => host.default_output_device(),
        };
        return d.ok_or_else(|| {
            Error::Device(format!(
                "no default {} device; {}; pick one with the `device` param",
                dir.word(),
                available(dir)
            ))
        });
    };
    let all = entries(dir)?;
    let want = name.to_lowercase();
    let exact = |e: &DeviceEntry| e.id.to_lowercase() == want || e.name.to_lowercase() == want;
    let partial = |e: &DeviceEntry| {
        e.id.to_lowercase().contains(&want) || e.name.to_lowercase().contains(&want)
    };
    let hits: Vec<usize> = match all.iter().position(|(e, _)| exact(e)) {
        Some(i) => vec![i],
        None => (0..all.len()).filter(|&i| partial(&all[i].0)).collect(),
    };
    let list: Vec<DeviceEntry> = all.iter().map(|(e, _)| e.clone()).collect();
    if let [only] = hits[..] {
        if let Some((_, d)) = all.into_iter().nth(only) {
            return Ok(d);
        }
    }
    let why = if hits.is_empty() {
        "no"
    } else {
        "more than one"
    };
    Err(Error::Device(format!(
        "{why} {} device matches \"{name}\"; {}; set the `device` param to one of these ids, or leave it out for the default",
        dir.word(),
        describe(dir, &list)
    )))
}

/// Choose a stream config: the device default, with the requested rate and
/// channels when given (checked against what the device supports).
fn choose_config(
    dev: &cpal::Device,
    dir: Direction,
    rate: Option<u32>,
    channels: Option<u16>,
    period_ms: f64,
) -> Result<(StreamConfig, SampleFormat)> {
    let name = dev.to_string();
    let default = match dir {
        Direction::Input => dev.default_input_config(),
        Direction::Output => dev.default_output_config(),
    }
    .map_err(|e| {
        Error::Device(format!(
            "{} device \"{name}\" cannot be opened ({e}); it may be busy or gone; {}",
            dir.word(),
            available(dir)
        ))
    })?;
    let ranges: Vec<cpal::SupportedStreamConfigRange> = match dir {
        Direction::Input => dev.supported_input_configs().map(|c| c.collect()),
        Direction::Output => dev.supported_output_configs().map(|c| c.collect()),
    }
    .map_err(|e| {
        Error::Device(format!(
            "{} device \"{name}\": cannot query its formats: {e}",
            dir.word()
        ))
    })?;
    let rate = rate.unwrap_or(default.sample_rate());
    let channels = channels.unwrap_or(default.channels());
    let fits = |r: &&cpal::SupportedStreamConfigRange| {
        r.channels() == channels && r.min_sample_rate() <= rate && rate <= r.max_sample_rate()
    };
    let pick = ranges
        .iter()
        .filter(fits)
        .find(|r| r.sample_format() == default.sample_format())
        .or_else(|| {
            ranges
                .iter()
                .filter(fits)
                .find(|r| r.sample_format() == SampleFormat::F32)
        })
        .or_else(|| ranges.iter().find(fits));
    let Some(range) = pick else {
        let offered: Vec<String> = ranges
            .iter()
            .map(|r| {
                format!(
                    "{} ch {}-{} Hz {}",
                    r.channels(),
                    r.min_sample_rate(),
                    r.max_sample_rate(),
                    r.sample_format()
                )
            })
            .collect();
        return Err(Error::Device(format!(
            "{} device \"{name}\" cannot do {rate} Hz with {channels} channel(s); it offers: {}; \
             change `sample_rate` / `channels` (or leave them out for the device default) and convert with `resample` / `channel_mix`",
            dir.word(),
            offered.join("; ")
        )));
    };
    let period = ((period_ms * rate as f64 / 1000.0).round() as u32).max(16);
    let buffer_size = match range.buffer_size() {
        SupportedBufferSize::Range { min, max } if (*min..=*max).contains(&period) => {
            BufferSize::Fixed(period)
        }
        _ => BufferSize::Default,
    };
    Ok((
        StreamConfig {
            channels,
            sample_rate: rate,
            buffer_size,
        },
        range.sample_format(),
    ))
}

fn stream_error(dir: Direction, name: &str, e: cpal::Error) -> Error {
    let hint = match e.kind() {
        cpal::ErrorKind::DeviceBusy => {
            "it is in use by another program: close it or pick another device"
        }
        cpal::ErrorKind::DeviceNotAvailable | cpal::ErrorKind::HostUnavailable => {
            "it is not available: is the sound server running?"
        }
        cpal::ErrorKind::PermissionDenied => {
            "access was denied: check permissions (audio group, privacy settings)"
        }
        cpal::ErrorKind::UnsupportedConfig => {
            "it refused the format: try other `sample_rate` / `channels`"
        }
        _ => "check the device",
    };
    Error::Device(format!(
        "cannot open {} device \"{name}\": {e}; {hint}; {}",
        dir.word(),
        available(dir)
    ))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a stream's callbacks report to the stage thread.
#[derive(Debug, Default)]
struct StreamHealth {
    /// An error after which the stream cannot continue.
    fatal: Mutex<Option<String>>,
    /// The latest recoverable error (xrun, backend hiccup), for messages.
    last: Mutex<Option<String>>,
    /// Recoverable errors so far.
    glitches: AtomicU64,
    /// Graph-clock time of the latest data callback (0: none yet).
    last_callback: AtomicU64,
}

impl StreamHealth {
    fn report(&self, e: cpal::Error) {
        match e.kind() {
            cpal::ErrorKind::DeviceNotAvailable
            | cpal::ErrorKind::HostUnavailable
            | cpal::ErrorKind::StreamInvalidated
            | cpal::ErrorKind::PermissionDenied => {
                let mut f = lock(&self.fatal);
                if f.is_none() {
                    *f = Some(e.to_string());
                }
            }
            // Xruns and backend hiccups (the PulseAudio ALSA plugin
            // sometimes reports EIO and carries on): counted; a stream that
            // really died is caught by `stalled`.
            _ => {
                self.glitches.fetch_add(1, Ordering::Relaxed);
                *lock(&self.last) = Some(e.to_string());
            }
        }
    }

    fn touch(&self) {
        self.last_callback
            .store(Timestamp::now().0, Ordering::Relaxed);
    }

    fn glitches(&self) -> u64 {
        self.glitches.load(Ordering::Relaxed)
    }

    fn last_error(&self) -> String {
        lock(&self.last)
            .clone()
            .unwrap_or_else(|| "none reported".into())
    }

    fn check(&self, what: &str) -> Result<()> {
        match lock(&self.fatal).take() {
            Some(e) => Err(Error::Device(format!(
                "{what}: the audio stream failed: {e}"
            ))),
            None => Ok(()),
        }
    }

    /// Error when the device has not called back for `limit` since
    /// `since` (or its last callback, whichever is later).
    fn stalled(&self, what: &str, since: Instant, limit: Duration) -> Result<()> {
        let last = self.last_callback.load(Ordering::Relaxed);
        let quiet = if last == 0 {
            since.elapsed()
        } else {
            Timestamp(last).elapsed().min(since.elapsed())
        };
        if quiet > limit {
            return Err(Error::Device(format!(
                "{what}: the device has not asked for or delivered audio for {:.1} s (last stream error: {}); \
                 is it still connected and the sound server running?",
                quiet.as_secs_f64(),
                self.last_error()
            )));
        }
        Ok(())
    }
}

fn opt_rate(p: &Params) -> StageResult<Option<u32>> {
    let r: Option<u32> = p.opt("sample_rate")?;
    if let Some(r) = r {
        check_rate(r, &format!("stage `{}`: param `sample_rate`", p.stage()))?;
    }
    Ok(r)
}

fn opt_channels(p: &Params) -> StageResult<Option<u16>> {
    let c: Option<u16> = p.opt("channels")?;
    if let Some(c) = c {
        if !(1..=64).contains(&c) {
            return Err(p
                .error("channels", format!("must be in 1..=64, got {c}"))
                .into());
        }
    }
    Ok(c)
}

// ---------------------------------------------------------------- mic

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

/// An output stream that stops calling back for this long has died (a
/// loaded machine can hold a non-real-time audio thread off for a second).
const SPEAKER_STALL: Duration = Duration::from_secs(5);

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

// ---------------------------------------------------------------- speaker

/// Audio waiting to be played, from one message.
#[derive(Debug)]
struct Segment {
    epoch: Epoch,
    /// Capture time of its first sample (for playout latency).
    captured: Timestamp,
    samples: Vec<f32>,
    pos: usize,
}

/// The jitter buffer shared by the speaker stage and its device callback.
#[derive(Debug)]
pub struct PlayoutBuffer {
    segs: VecDeque<Segment>,
    queued: usize,
    channels: usize,
    prefill: usize,
    playing: bool,
    draining: bool,
    underruns: u64,
    flushed: u64,
    /// Capture-to-playback latencies (ms) not yet reported.
    latencies: Vec<f64>,
}

impl PlayoutBuffer {
    /// A buffer for `channels` interleaved channels that starts playing once
    /// `prefill` frames are queued (and again after each underrun).
    pub fn new(channels: u16, prefill: usize) -> Self {
        PlayoutBuffer {
            segs: VecDeque::new(),
            queued: 0,
            channels: channels.max(1) as usize,
            prefill,
            playing: false,
            draining: false,
            underruns: 0,
            flushed: 0,
            latencies: Vec::new(),
        }
    }

    /// Queue `samples` (interleaved, device format) of `epoch`.
    pub fn push(&mut self, epoch: Epoch, captured: Timestamp, samples: Vec<f32>) {
        self.queued += samples.len() / self.channels;
        self.segs.push_back(Segment {
            epoch,
            captured,
            samples,
            pos: 0,
        });
    }

    /// Frames queued.
    pub fn queued_frames(&self) -> usize {
        self.queued
    }

    /// Underruns so far: times the buffer ran dry while playing.
    pub fn underruns(&self) -> u64 {
        self.underruns
    }

    /// Frames discarded by [`Self::flush_epoch`] so far.
    pub fn flushed_frames(&self) -> u64 {
        self.flushed
    }

    /// Drop everything queued for `epoch` (a cancelled turn); returns the
    /// frames dropped. The device callback sees the result at its next call.
    pub fn flush_epoch(&mut self, epoch: Epoch) -> usize {
        let ch = self.channels;
        let mut dropped = 0;
        self.segs.retain(|s| {
            if s.epoch == epoch {
                dropped += (s.samples.len() - s.pos) / ch;
                false
            } else {
                true
            }
        });
        self.queued -= dropped;
        self.flushed += dropped as u64;
        dropped
    }

    /// Play out whatever is queued without waiting for the prefill (end of
    /// stream), and do not count running dry as an underrun.
    pub fn set_draining(&mut self, draining: bool) {
        self.draining = draining;
    }

    /// Take the latencies measured since the last call.
    pub fn take_latencies(&mut self) -> Vec<f64> {
        std::mem::take(&mut self.latencies)
    }

    /// Fill `out` (interleaved) for the device. `now_to_play` is how long
    /// until `out[0]` is heard; `rate` converts frame offsets to time.
    pub fn fill(&mut self, out: &mut [f32], now_to_play: Duration, rate: u32) {
        if !self.playing {
            if self.queued >= self.prefill.max(1) || (self.draining && self.queued > 0) {
                self.playing = true;
            } else {
                out.fill(0.0);
                return;
            }
        }
        let ch = self.channels;
        let mut i = 0;
        while i < out.len() {
            let Some(seg) = self.segs.front_mut() else {
                break;
            };
            if seg.pos == 0 {
                let at = Timestamp::now()
                    .plus(now_to_play)
                    .plus(Duration::from_secs_f64(
                        (i / ch) as f64 / rate.max(1) as f64,
                    ));
                self.latencies
                    .push(at.0.saturating_sub(seg.captured.0) as f64 / 1e6);
            }
            let n = (seg.samples.len() - seg.pos).min(out.len() - i);
            out[i..i + n].copy_from_slice(&seg.samples[seg.pos..seg.pos + n]);
            seg.pos += n;
            i += n;
            self.queued -= n / ch;
            if seg.pos >= seg.samples.len() {
                self.segs.pop_front();
            }
        }
        if i < out.len() {
            out[i..].fill(0.0);
            if !self.draining {
                self.underruns += 1;
            }
            self.playing = false;
        }
    }
}

/// The `speaker` stage kind.
#[derive(Debug)]
pub struct SpeakerKind;

impl StageFactory for SpeakerKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "speaker",
            doc: "Plays audio on a speaker (cpal output stream) through a jitter buffer: playback starts once `buffer_ms` is queued; an empty buffer plays silence and counts an underrun (also between utterances). Input of any rate/channels is converted to the device format. Cancelling an epoch drops its queued audio before the next device callback. Records `underruns`, `buffer_ms`, `playout_latency_ms` (capture time to the predicted moment it is heard), `flushed_ms` and `stream_errors` (recoverable device errors).",
            params: vec![
                ParamInfo::optional("device", ParamType::String, "device name (exact, or a unique part of it); default: the system's default output"),
                ParamInfo::optional("sample_rate", ParamType::Int, "device rate in Hz (default: the device's)"),
                ParamInfo::optional("channels", ParamType::Int, "device channels (default: the device's)"),
                ParamInfo::new("buffer_ms", ParamType::Float, 30.0, "jitter buffer: audio queued before playback (re)starts (0..=2000)"),
                ParamInfo::new("max_buffer_ms", ParamType::Float, 500.0, "queue limit; beyond it the stage blocks (backpressure) (50..=60000)"),
                ParamInfo::new("period_ms", ParamType::Float, 10.0, "device callback period asked for (the device may round it)"),
            ],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::AUDIO_ANY, "audio to play, any rate and channels")],
                outputs: vec![],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let buffer_ms: f64 = p.get_or("buffer_ms", 30.0)?;
        if !(0.0..=2000.0).contains(&buffer_ms) {
            return Err(p
                .error("buffer_ms", format!("must be in 0..=2000, got {buffer_ms}"))
                .into());
        }
        let max_ms: f64 = p.get_or("max_buffer_ms", 500.0)?;
        if !(50.0..=60_000.0).contains(&max_ms) || max_ms < buffer_ms {
            return Err(p
                .error(
                    "max_buffer_ms",
                    format!("must be in 50..=60000 and >= buffer_ms, got {max_ms}"),
                )
                .into());
        }
        let period_ms: f64 = p.get_or("period_ms", 10.0)?;
        if !(1.0..=500.0).contains(&period_ms) {
            return Err(p
                .error("period_ms", format!("must be in 1..=500, got {period_ms}"))
                .into());
        }
        let device: Option<String> = p.opt("device")?;
        let s = Speaker::open(
            device.as_deref(),
            opt_rate(p)?,
            opt_channels(p)?,
            buffer_ms,
            max_ms,
            period_ms,
        )?;
        Ok(Box::new(s))
    }
}

/// The `speaker` stage: a running cpal output stream fed from a
/// [`PlayoutBuffer`].
pub struct Speaker {
    stream: cpal::Stream,
    name: String,
    rate: u32,
    channels: u16,
    max_frames: usize,
    buf: Arc<Mutex<PlayoutBuffer>>,
    /// How far ahead of playback the device callback writes (ns).
    ahead_ns: Arc<AtomicU64>,
    errors: Arc<StreamHealth>,
    resampler: Option<StreamResampler>,
}

impl std::fmt::Debug for Speaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speaker")
            .field("device", &self.name)
            .field("rate", &self.rate)
            .field("channels", &self.channels)
            .finish()
    }
}

impl Speaker {
    /// Open (but do not start) a playback stream.
    pub fn open(
        device: Option<&str>,
        rate: Option<u32>,
        channels: Option<u16>,
        buffer_ms: f64,
        max_buffer_ms: f64,
        period_ms: f64,
    ) -> Result<Speaker> {
        let dev = find_device(device, Direction::Output)?;
        let name = dev.to_string();
        let (config, format) = choose_config(&dev, Direction::Output, rate, channels, period_ms)?;
        let rate = config.sample_rate;
        let prefill = (buffer_ms * rate as f64 / 1000.0).round() as usize;
        let buf = Arc::new(Mutex::new(PlayoutBuffer::new(config.channels, prefill)));
        let ahead_ns = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(StreamHealth::default());
        let stream = match format {
            SampleFormat::F32 => build_output::<f32>(&dev, &config, &buf, &ahead_ns, &errors),
            SampleFormat::I16 => build_output::<i16>(&dev, &config, &buf, &ahead_ns, &errors),
            SampleFormat::I32 => build_output::<i32>(&dev, &config, &buf, &ahead_ns, &errors),
            SampleFormat::U16 => build_output::<u16>(&dev, &config, &buf, &ahead_ns, &errors),
            SampleFormat::U8 => build_output::<u8>(&dev, &config, &buf, &ahead_ns, &errors),
            SampleFormat::I8 => build_output::<i8>(&dev, &config, &buf, &ahead_ns, &errors),
            SampleFormat::F64 => build_output::<f64>(&dev, &config, &buf, &ahead_ns, &errors),
            other => {
                return Err(Error::Device(format!(
                    "output device \"{name}\" only takes {other} samples, which edgeflow does not convert"
                )))
            }
        }
        .map_err(|e| stream_error(Direction::Output, &name, e))?;
        Ok(Speaker {
            stream,
            name,
            rate,
            channels: config.channels,
            max_frames: (max_buffer_ms * rate as f64 / 1000.0).round() as usize,
            buf,
            ahead_ns,
            errors,
            resampler: None,
        })
    }

    /// Device rate.
    pub fn sample_rate(&self) -> u32 {
        self.rate
    }

    /// Device channels.
    pub fn channels(&self) -> u16 {
        self.channels
    }

    fn report(&self, ctx: &StageCtx) {
        let (lat, under, queued, flushed) = {
            let mut b = lock(&self.buf);
            (
                b.take_latencies(),
                b.underruns(),
                b.queued_frames(),
                b.flushed_frames(),
            )
        };
        for l in lat {
            ctx.record("playout_latency_ms", l);
        }
        ctx.record("underruns", under as f64);
        ctx.record("buffer_ms", queued as f64 * 1000.0 / self.rate as f64);
        ctx.record("flushed_ms", flushed as f64 * 1000.0 / self.rate as f64);
        ctx.record("stream_errors", self.errors.glitches() as f64);
    }
}

fn build_output<T>(
    dev: &cpal::Device,
    config: &StreamConfig,
    buf: &Arc<Mutex<PlayoutBuffer>>,
    ahead_ns: &Arc<AtomicU64>,
    errors: &Arc<StreamHealth>,
) -> std::result::Result<cpal::Stream, cpal::Error>
where
    T: SizedSample + FromSample<f32> + Send + 'static,
{
    let buf = buf.clone();
    let ahead = ahead_ns.clone();
    let errs = errors.clone();
    let health = errors.clone();
    let rate = config.sample_rate;
    let mut scratch: Vec<f32> = Vec::new();
    dev.build_output_stream(
        *config,
        move |data: &mut [T], info: &OutputCallbackInfo| {
            health.touch();
            let t = info.timestamp();
            let to_play = t.playback.saturating_duration_since(t.callback);
            ahead.store(to_play.as_nanos() as u64, Ordering::Relaxed);
            if scratch.len() < data.len() {
                scratch.resize(data.len(), 0.0);
            }
            let s = &mut scratch[..data.len()];
            lock(&buf).fill(s, to_play, rate);
            for (d, v) in data.iter_mut().zip(s.iter()) {
                *d = T::from_sample(*v);
            }
        },
        move |e| errs.report(e),
        Some(Duration::from_secs(5)),
    )
}

impl Stage for Speaker {
    fn start(&mut self, _ctx: &mut StageCtx) -> StageResult {
        self.stream
            .play()
            .map_err(|e| stream_error(Direction::Output, &self.name, e))?;
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        self.errors.check(&format!("speaker \"{}\"", self.name))?;
        let Some(a) = input.msg.payload.as_audio() else {
            return Err(StageError::msg(format!(
                "speaker `{}` got a {} message; it takes audio",
                ctx.id(),
                input.msg.payload.type_name()
            )));
        };
        let mixed = mix_channels(&a.samples, a.channels, self.channels);
        // Convert to the device rate; when the input rate changes, the old
        // resampler's tail is played before the new audio.
        let mut samples = Vec::with_capacity(mixed.len());
        let convert = a.sample_rate != self.rate;
        let stale = self
            .resampler
            .as_ref()
            .is_some_and(|r| !convert || r.from_rate() != a.sample_rate);
        if stale {
            if let Some(mut old) = self.resampler.take() {
                old.flush(&mut samples)?;
            }
        }
        if convert {
            let r = match self.resampler.as_mut() {
                Some(r) => r,
                None => self.resampler.insert(StreamResampler::new(
                    a.sample_rate,
                    self.rate,
                    self.channels,
                )?),
            };
            r.process(&mixed, &mut samples)?;
        } else {
            samples.extend_from_slice(&mixed);
        }
        // Backpressure: wait while the queue is over its limit.
        let waiting = Instant::now();
        while lock(&self.buf).queued_frames() > self.max_frames {
            ctx.check()?;
            let what = format!("speaker \"{}\"", self.name);
            self.errors.check(&what)?;
            self.errors.stalled(&what, waiting, SPEAKER_STALL)?;
            ctx.sleep(Duration::from_millis(2));
        }
        lock(&self.buf).push(input.msg.epoch, input.msg.timestamp, samples);
        self.report(ctx);
        Ok(())
    }

    fn reset(&mut self, epoch: Epoch, ctx: &mut StageCtx) -> StageResult {
        lock(&self.buf).flush_epoch(epoch);
        if let Some(r) = self.resampler.as_mut() {
            r.reset();
        }
        self.report(ctx);
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        if let Some(r) = self.resampler.as_mut() {
            let mut tail = Vec::new();
            r.flush(&mut tail)?;
            if !tail.is_empty() {
                lock(&self.buf).push(ctx.epoch(), Timestamp::now(), tail);
            }
        }
        lock(&self.buf).set_draining(true);
        // Let the queue play out (bounded wait), then the device's own
        // buffer, so the last chunk is actually heard before the stream closes.
        // Play out what is queued. Every device callback consumes queued
        // audio, so this ends unless the device stops calling back, which
        // `stalled` turns into an error after SPEAKER_STALL.
        let what = format!("speaker \"{}\"", self.name);
        let draining = Instant::now();
        while lock(&self.buf).queued_frames() > 0 && !ctx.should_stop() {
            self.errors.check(&what)?;
            self.errors.stalled(&what, draining, SPEAKER_STALL)?;
            std::thread::sleep(Duration::from_millis(5));
        }
        let ahead =
            Duration::from_nanos(self.ahead_ns.load(Ordering::Relaxed)).min(Duration::from_secs(1));
        std::thread::sleep(ahead + Duration::from_millis(20));
        self.report(ctx);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn playout_prefill_underrun_and_epoch_flush() {
        let mut b = PlayoutBuffer::new(2, 4);
        let mut out = vec![1.0f32; 8];
        // Below prefill: silence, no underrun.
        b.push(1, Timestamp::now(), vec![0.1; 6]);
        b.fill(&mut out, Duration::ZERO, 48_000);
        assert!(out.iter().all(|&v| v == 0.0));
        assert_eq!(b.underruns(), 0);
        b.push(2, Timestamp::now(), vec![0.2; 4]);
        b.push(1, Timestamp::now(), vec![0.3; 4]);
        // Cancel epoch 1: only epoch 2's two frames remain.
        assert_eq!(b.flush_epoch(1), 5);
        assert_eq!(b.queued_frames(), 2);
        b.push(3, Timestamp::now(), vec![0.4; 4]);
        b.fill(&mut out, Duration::ZERO, 48_000);
        assert_eq!(out, vec![0.2, 0.2, 0.2, 0.2, 0.4, 0.4, 0.4, 0.4]);
        assert_eq!(b.take_latencies().len(), 2);
        // Dry while playing: silence and one underrun.
        b.fill(&mut out, Duration::ZERO, 48_000);
        assert!(out.iter().all(|&v| v == 0.0));
        assert_eq!(b.underruns(), 1);
        // Draining plays a short tail without prefill and without counting.
        b.set_draining(true);
        b.push(4, Timestamp::now(), vec![0.5; 2]);
        b.fill(&mut out, Duration::ZERO, 48_000);
        assert_eq!(&out[..2], &[0.5, 0.5]);
        assert_eq!(b.underruns(), 1);
        assert_eq!(b.flushed_frames(), 5);
    }
}
