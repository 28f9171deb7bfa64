//! Live audio through a real sound server: a PulseAudio null sink `vsink`
//! whose monitor is the default source (start it with
//! `audio/tests/start-pulse.sh`). What is played into the sink comes back
//! on the microphone, and what the speaker plays is heard on the monitor.
//!
//! These tests fail (they do not skip) when no PulseAudio server is
//! reachable, unless `EDGEFLOW_SKIP_LIVE_AUDIO=1` is set. They share one
//! sink, so they run one at a time.

#![allow(clippy::unwrap_used)]

use edgeflow_graph::{Override, Payload, Pipeline};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

static SINK: Mutex<()> = Mutex::new(());

/// True when the live tests should run; panics with instructions when they
/// should but cannot.
fn live() -> bool {
    if std::env::var("EDGEFLOW_SKIP_LIVE_AUDIO").is_ok_and(|v| v == "1") {
        eprintln!("live audio test skipped: EDGEFLOW_SKIP_LIVE_AUDIO=1");
        return false;
    }
    let how = "start one with `export XDG_RUNTIME_DIR=$(mktemp -d); audio/tests/start-pulse.sh`, \
               or set EDGEFLOW_SKIP_LIVE_AUDIO=1 to skip the live audio tests";
    let info = Command::new("pactl").arg("info").output();
    match info {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "no PulseAudio server is reachable (pactl info: {}); {how}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("cannot run pactl ({e}): install pulseaudio-utils; {how}"),
    }
    let sinks = Command::new("pactl")
        .args(["list", "short", "sinks"])
        .output()
        .expect("pactl list");
    assert!(
        String::from_utf8_lossy(&sinks.stdout).contains("vsink"),
        "the PulseAudio server has no sink `vsink`; {how}"
    );
    true
}

fn registry() -> edgeflow_graph::Registry {
    edgeflow_audio::registry()
}

/// A float WAV with the same sine on `channels` channels. (paplay maps a
/// mono float WAV to the front-left speaker only, from its channel mask, so
/// tones played into the sink are written as stereo.)
fn tone_wav(
    dir: &Path,
    name: &str,
    rate: u32,
    channels: u16,
    freq: f64,
    amp: f64,
    seconds: f64,
) -> PathBuf {
    let n = (rate as f64 * seconds) as usize;
    let x: Vec<f32> = (0..n)
        .flat_map(|i| {
            let v =
                ((2.0 * std::f64::consts::PI * freq * i as f64 / rate as f64).sin() * amp) as f32;
            std::iter::repeat_n(v, channels as usize)
        })
        .collect();
    let path = dir.join(name);
    let enc = edgeflow_audio::wav::WavEncoding::Float32;
    edgeflow_audio::wav::write_wav(&path, rate, channels, enc, &x).expect("write tone");
    path
}

fn paplay(path: &Path) -> Child {
    Command::new("paplay")
        .arg("--device=vsink")
        .arg(path)
        .spawn()
        .expect("paplay (pulseaudio-utils) must be installed")
}

/// The steady part of a tone in `x`: from 0.4 s after it first exceeds
/// `thresh` (streams settle in the sound server first), `len` samples
/// (None if it is not there).
fn steady(x: &[f32], rate: u32, thresh: f32, len: usize) -> Option<&[f32]> {
    let onset = x.iter().position(|v| v.abs() > thresh)?;
    let start = onset + rate as usize * 2 / 5;
    x.get(start..start + len)
}

/// Frequency from interpolated rising zero crossings.
fn frequency(x: &[f32], rate: u32) -> f64 {
    let mut first = None;
    let mut last = 0.0;
    let mut count = 0usize;
    for i in 1..x.len() {
        if x[i - 1] < 0.0 && x[i] >= 0.0 {
            let t = (i - 1) as f64 + (-x[i - 1] / (x[i] - x[i - 1])) as f64;
            if first.is_none() {
                first = Some(t);
            } else {
                count += 1;
            }
            last = t;
        }
    }
    match first {
        Some(f) if count > 0 => count as f64 * rate as f64 / (last - f),
        _ => 0.0,
    }
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / x.len().max(1) as f64).sqrt()
}

/// Expect a sine of `freq` Hz and peak `amp` in `x`: over ten 50 ms
/// windows of the steady part, the median frequency within 2 Hz (zero
/// crossings, interpolated; the null sink is sample-exact) and the median
/// level within 1 dB (PulseAudio mixes at unity gain; 16-bit sink
/// quantisation and resampling change it by far less). Medians, because on
/// a loaded machine the sound server itself (not real-time here) can drop a
/// period now and then; more than a few bad windows still fail.
fn assert_tone(x: &[f32], rate: u32, freq: f64, amp: f64, what: &str) {
    let win = rate as usize / 20;
    let w = steady(x, rate, (amp * 0.3) as f32, win * 10).unwrap_or_else(|| {
        panic!(
            "{what}: no {freq} Hz tone found (got {} samples, peak {})",
            x.len(),
            x.iter().fold(0f32, |m, v| m.max(v.abs()))
        )
    });
    let want = amp / std::f64::consts::SQRT_2;
    let mut freqs: Vec<f64> = w.chunks(win).map(|c| frequency(c, rate)).collect();
    let mut dbs: Vec<f64> = w
        .chunks(win)
        .map(|c| 20.0 * (rms(c) / want).log10())
        .collect();
    let bad = freqs
        .iter()
        .zip(&dbs)
        .filter(|(f, d)| (**f - freq).abs() >= 2.0 || d.abs() >= 1.0)
        .count();
    freqs.sort_by(f64::total_cmp);
    dbs.sort_by(f64::total_cmp);
    let (f, db) = (freqs[freqs.len() / 2], dbs[dbs.len() / 2]);
    assert!(
        (f - freq).abs() < 2.0,
        "{what}: frequency {f:.2} Hz, expected {freq} (per window: {freqs:.1?})"
    );
    assert!(
        db.abs() < 1.0,
        "{what}: level {db:+.2} dB off (per window: {dbs:.2?})"
    );
    assert!(
        bad <= 3,
        "{what}: {bad} of 10 windows glitched: {freqs:.1?} Hz, {dbs:.2?} dB"
    );
}

#[test]
fn mic_hears_a_tone_played_into_the_sink() {
    let _g = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if !live() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let wav = tone_wav(dir.path(), "a440.wav", 48_000, 2, 440.0, 0.5, 2.5);
    let yaml = r#"
stages:
  - { id: mic, kind: mic, params: { sample_rate: 48000, channels: 2, chunk_ms: 10, seconds: 3.5 } }
  - { id: out, kind: host_out, params: { type: audio } }
edges:
  - { from: mic.out, to: out.in, capacity: 512 }
"#;
    let running = Pipeline::from_yaml(yaml, &registry())
        .unwrap()
        .start()
        .unwrap();
    // Capture starts late while the sink is idle: let it settle first.
    std::thread::sleep(Duration::from_millis(500));
    let mut player = paplay(&wav);
    let mut samples = Vec::new();
    let mut last_ts = None;
    let mut chunks = 0;
    while let Some(m) = running.pull("out", Duration::from_secs(10)).unwrap() {
        let Payload::Audio(a) = &m.payload else {
            panic!("mic emitted {:?}", m.payload)
        };
        assert_eq!((a.sample_rate, a.channels), (48_000, 2));
        assert_eq!(a.frames(), 480, "fixed-size chunks");
        if let Some(prev) = last_ts {
            assert!(m.timestamp > prev, "capture timestamps must increase");
        }
        last_ts = Some(m.timestamp);
        samples.extend_from_slice(&a.samples);
        chunks += 1;
    }
    let _ = player.wait();
    running.wait(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(chunks, 350, "3.5 s of 10 ms chunks");
    for c in 0..2 {
        let ch: Vec<f32> = samples.iter().skip(c).step_by(2).copied().collect();
        assert_tone(&ch, 48_000, 440.0, 0.5, &format!("mic channel {c}"));
    }
}

#[test]
fn speaker_output_is_heard_on_the_monitor() {
    let _g = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if !live() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 16 kHz mono: the speaker converts to the device's 48 kHz stereo.
    let wav = tone_wav(dir.path(), "a660.wav", 16_000, 1, 660.0, 0.25, 1.5);
    let mut rec = Command::new("parec")
        .args([
            "--device=vsink.monitor",
            "--format=float32le",
            "--rate=48000",
            "--channels=1",
            "--latency-msec=20",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("parec (pulseaudio-utils) must be installed");
    let mut out = rec.stdout.take().expect("parec stdout");
    let reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    std::thread::sleep(Duration::from_millis(500));
    let yaml = format!(
        r#"
stages:
  - {{ id: wav, kind: wav_source, params: {{ path: "{}", chunk_ms: 20 }} }}
  - {{ id: speaker, kind: speaker, params: {{ buffer_ms: 40 }} }}
edges:
  - {{ from: wav.out, to: speaker.in }}
"#,
        wav.display()
    );
    let metrics = Pipeline::from_yaml(&yaml, &registry())
        .unwrap()
        .run(Some(Duration::from_secs(20)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _ = rec.kill();
    let _ = rec.wait();
    let bytes = reader.join().unwrap();
    let heard: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let spk = metrics.stages.iter().find(|s| s.id == "speaker").unwrap();
    let underruns = spk.values.get("underruns").map_or(-1.0, |v| v.last);
    assert_tone(
        &heard,
        48_000,
        660.0,
        0.25,
        &format!("monitor (speaker underruns: {underruns})"),
    );
    assert_eq!(spk.processed, 75, "1.5 s in 20 ms chunks");
    assert!(
        spk.values.contains_key("underruns"),
        "underruns are reported: {:?}",
        spk.values.keys()
    );
    assert!(spk.values["playout_latency_ms"].count > 0);
}

#[test]
fn passthrough_pipeline_runs_and_measures_latency() {
    let _g = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if !live() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let wav = tone_wav(dir.path(), "a330.wav", 48_000, 2, 330.0, 0.3, 3.0);
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipelines/passthrough.yaml");
    // The monitor hears the speaker: attenuate so the loop dies away.
    let overrides: Vec<Override> = ["mic.seconds=2.5", "gain.db=-12"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let pipeline = Pipeline::from_file(&file, &registry(), &overrides).unwrap();
    let running = pipeline.start().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut player = paplay(&wav);
    let metrics = running.wait(Some(Duration::from_secs(20))).unwrap();
    let _ = player.kill();
    let _ = player.wait();
    let mic = metrics.stages.iter().find(|s| s.id == "mic").unwrap();
    let spk = metrics.stages.iter().find(|s| s.id == "speaker").unwrap();
    assert!(mic.processed > 0);
    assert_eq!(spk.processed, 250, "every chunk reached the speaker");
    let lat = &spk.values["playout_latency_ms"];
    assert!(lat.count > 0 && lat.p50 > 0.0, "latency measured: {lat:?}");
    eprintln!(
        "passthrough latency on the null sink: p50 {:.1} ms, p99 {:.1} ms ({} chunks), underruns {}",
        lat.p50, lat.p99, lat.count, spk.values["underruns"].last
    );
}

#[test]
fn cancel_flushes_the_speaker_buffer() {
    let _g = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if !live() {
        return;
    }
    let yaml = r#"
stages:
  - { id: in, kind: host_in, params: { type: audio } }
  - { id: speaker, kind: speaker, params: { sample_rate: 48000, buffer_ms: 20, max_buffer_ms: 2000 } }
edges:
  - { from: in.out, to: speaker.in, capacity: 64 }
"#;
    let running = Pipeline::from_yaml(yaml, &registry())
        .unwrap()
        .start()
        .unwrap();
    let epoch = running.current_epoch();
    // 1.5 s of audio queued at once; the device plays it in real time.
    for _ in 0..15 {
        running
            .push("in", Payload::audio(48_000, 2, vec![0.1; 9_600]))
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let report = running.cancel(epoch, Duration::from_secs(5)).unwrap();
    assert_eq!(report.acked, report.stages);
    let m = running.metrics();
    let spk = m.stages.iter().find(|s| s.id == "speaker").unwrap();
    let flushed = spk.values["flushed_ms"].last;
    // Most of the 1.5 s was still queued when the turn was cancelled.
    assert!(flushed > 500.0, "flushed only {flushed} ms");
    assert!(
        spk.values["buffer_ms"].last < 1.0,
        "buffer not empty after cancel"
    );
    running.stop();
}

#[test]
fn record_pipeline_writes_the_file_only_when_complete() {
    let _g = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if !live() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let wav = tone_wav(dir.path(), "a550.wav", 48_000, 2, 550.0, 0.4, 3.0);
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipelines/record.yaml");
    let target = dir.path().join("take.wav");
    let set = |s: String| -> Override { s.parse().unwrap() };
    let overrides = vec![
        set("mic.seconds=2.5".into()),
        set("mic.sample_rate=48000".into()),
        set(format!("wav.path={}", target.display())),
    ];
    let running = Pipeline::from_file(&file, &registry(), &overrides)
        .unwrap()
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut player = paplay(&wav);
    running.wait(Some(Duration::from_secs(20))).unwrap();
    let _ = player.wait();
    let (info, x) = edgeflow_audio::wav::read_wav(&target).unwrap();
    assert_eq!(info.sample_rate, 48_000);
    assert_eq!(info.frames, 120_000);
    let mono: Vec<f32> = x.iter().step_by(info.channels as usize).copied().collect();
    assert_tone(&mono, 48_000, 550.0, 0.4, "recording");

    // Stopped before the end: nothing is left in the folder.
    let target2 = dir.path().join("stopped.wav");
    let overrides = vec![
        set("mic.seconds=30".into()),
        set(format!("wav.path={}", target2.display())),
    ];
    let running = Pipeline::from_file(&file, &registry(), &overrides)
        .unwrap()
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        running.wait(Some(Duration::from_millis(200))).is_err(),
        "timed out run"
    );
    assert!(
        !target2.exists(),
        "a stopped recording must not leave a file"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.contains("stopped"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

#[test]
fn missing_device_lists_the_devices_that_exist() {
    let _g = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if !live() {
        return;
    }
    let cases = [
        (
            "input",
            "stages:\n  - { id: a, kind: mic, params: { device: no-such-card } }\n  - { id: b, kind: host_out, params: { type: audio } }\nedges:\n  - { from: a.out, to: b.in }\n",
        ),
        (
            "output",
            "stages:\n  - { id: a, kind: host_in, params: { type: audio } }\n  - { id: b, kind: speaker, params: { device: no-such-card } }\nedges:\n  - { from: a.out, to: b.in }\n",
        ),
    ];
    for (word, yaml) in cases {
        let err = Pipeline::from_yaml(yaml, &registry())
            .unwrap()
            .start()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no-such-card") && err.contains(&format!("{word} devices:")),
            "{err}"
        );
        assert!(
            err.contains("\"default\"") || err.contains("\"pulse\""),
            "lists real devices: {err}"
        );
    }
}
