//! Live audio through cpal: the `mic` and `speaker` stages.
//!
//! Both run cpal's default host (ALSA on Linux, which also reaches
//! PulseAudio / PipeWire through their ALSA plugins). The device callback
//! never blocks on the pipeline: the microphone callback hands each buffer
//! to the stage thread over a bounded channel (a full channel drops the
//! buffer and counts an overrun), and the speaker callback copies from a
//! jitter buffer that the stage thread fills (an empty buffer plays silence
//! and counts an underrun).
//!
//! This file holds what both share (device listing and selection, stream
//! configuration, stream health); `mic.rs` and `speaker.rs` hold the stages.

mod mic;
mod speaker;

pub use mic::{Mic, MicKind};
pub use speaker::{PlayoutBuffer, Speaker, SpeakerKind};

use crate::error::{Error, Result};
use crate::resample::check_rate;
use cpal::traits::{DeviceTrait, HostTrait};
use cpal::{BufferSize, SampleFormat, StreamConfig, SupportedBufferSize};
use edgeflow_graph::{Params, StageResult, Timestamp};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
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
