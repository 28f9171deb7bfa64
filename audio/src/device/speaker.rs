//! The `speaker` stage: cpal playback through a jitter buffer
//! ([`PlayoutBuffer`]); underruns counted, a cancel flushes its epoch.

use super::{
    choose_config, find_device, lock, opt_channels, opt_rate, stream_error, Direction, StreamHealth,
};
use crate::error::{Error, Result};
use crate::resample::StreamResampler;
use crate::util::mix_channels;
use cpal::traits::{DeviceTrait, StreamTrait};
use cpal::{FromSample, OutputCallbackInfo, SampleFormat, SizedSample, StreamConfig};
use edgeflow_graph::{
    BuildEnv, Epoch, Input, ParamInfo, ParamType, Params, PortSpec, PortType, Ports, Stage,
    StageCtx, StageError, StageFactory, StageInfo, StageResult, Timestamp,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An output stream that stops calling back for this long has died (a
/// loaded machine can hold a non-real-time audio thread off for a second).
const SPEAKER_STALL: Duration = Duration::from_secs(5);

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
