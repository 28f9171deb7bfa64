//! Audio stages inside real pipelines (no sound card needed): file to file
//! conversion, features, and the bad-input paths (clear errors, nothing
//! half-written).

#![allow(clippy::unwrap_used)]

use edgeflow_audio::wav::{read_wav, write_wav, WavEncoding};
use edgeflow_graph::{Payload, Pipeline};
use std::path::Path;
use std::time::Duration;

fn sine(rate: u32, channels: u16, freq: f64, seconds: f64) -> Vec<f32> {
    let n = (rate as f64 * seconds) as usize;
    (0..n)
        .flat_map(|i| {
            let v =
                ((2.0 * std::f64::consts::PI * freq * i as f64 / rate as f64).sin() * 0.5) as f32;
            std::iter::repeat_n(v, channels as usize)
        })
        .collect()
}

fn run(yaml: &str) -> edgeflow_graph::Result<edgeflow_graph::MetricsSnapshot> {
    Pipeline::from_yaml(yaml, &edgeflow_audio::registry())?.run(Some(Duration::from_secs(60)))
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn wav_to_wav_through_resample_gain_and_channel_mix() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.wav");
    let dst = dir.path().join("out.wav");
    write_wav(
        &src,
        44_100,
        2,
        WavEncoding::Pcm16,
        &sine(44_100, 2, 1000.0, 1.0),
    )
    .unwrap();
    let yaml = format!(
        r#"
stages:
  - {{ id: src, kind: wav_source, params: {{ path: "{}", chunk_ms: 7.3 }} }}
  - {{ id: rs, kind: resample, params: {{ to: 16000 }} }}
  - {{ id: mix, kind: channel_mix, params: {{ channels: 1 }} }}
  - {{ id: g, kind: gain, params: {{ db: -6.0206 }} }}
  - {{ id: dst, kind: wav_sink, params: {{ path: "{}", format: f32 }} }}
edges:
  - {{ from: src.out, to: rs.in }}
  - {{ from: rs.out, to: mix.in }}
  - {{ from: mix.out, to: g.in }}
  - {{ from: g.out, to: dst.in }}
"#,
        src.display(),
        dst.display()
    );
    run(&yaml).unwrap();
    let (info, y) = read_wav(&dst).unwrap();
    assert_eq!(
        (info.sample_rate, info.channels, info.frames),
        (16_000, 1, 16_000)
    );
    // Compare with the analytic 1 kHz sine at half level, away from the
    // edges; 16-bit input quantisation and the sub-frame resampler offset
    // (<= half a frame, ~0.05 at 1 kHz) bound the error.
    let want = sine(16_000, 1, 1000.0, 1.0);
    let worst = (320..15_680)
        .map(|i| (y[i] - 0.5 * want[i]).abs())
        .fold(0f32, f32::max);
    assert!(worst < 0.06, "max error {worst}");
    assert_eq!(files_in(dir.path()), vec!["in.wav", "out.wav"]);
}

#[test]
fn mel_features_from_a_wav_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("speech.wav");
    write_wav(
        &src,
        48_000,
        1,
        WavEncoding::Pcm16,
        &sine(48_000, 1, 440.0, 2.0),
    )
    .unwrap();
    let yaml = format!(
        r#"
stages:
  - {{ id: src, kind: wav_source, params: {{ path: "{}" }} }}
  - {{ id: rs, kind: resample, params: {{ to: 16000 }} }}
  - {{ id: mel, kind: mel }}
  - {{ id: out, kind: host_out, params: {{ type: tensor }} }}
edges:
  - {{ from: src.out, to: rs.in }}
  - {{ from: rs.out, to: mel.in }}
  - {{ from: mel.out, to: out.in }}
"#,
        src.display()
    );
    let running = Pipeline::from_yaml(&yaml, &edgeflow_audio::registry())
        .unwrap()
        .start()
        .unwrap();
    let m = running
        .pull("out", Duration::from_secs(30))
        .unwrap()
        .unwrap();
    let Payload::Tensor(t) = &m.payload else {
        panic!("{:?}", m.payload)
    };
    // 2 s at 16 kHz + 160 samples of padding -> 201 frames.
    assert_eq!(t.dims(), &[80, 201]);
    let v = t.to_vec_f32().unwrap();
    // 440 Hz lies in mel bin ~10; it must dominate bin 60 everywhere.
    for f in 10..190 {
        assert!(v[10 * 201 + f] > v[60 * 201 + f] + 1.0, "frame {f}");
    }
    assert!(running
        .pull("out", Duration::from_secs(5))
        .unwrap()
        .is_none());
    running.wait(Some(Duration::from_secs(5))).unwrap();
}

#[test]
fn denoise_and_chunker_in_a_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.wav");
    write_wav(
        &src,
        16_000,
        1,
        WavEncoding::Pcm16,
        &sine(16_000, 1, 300.0, 1.0),
    )
    .unwrap();
    let yaml = format!(
        r#"
stages:
  - {{ id: src, kind: wav_source, params: {{ path: "{}", chunk_ms: 13 }} }}
  - {{ id: dn, kind: denoise }}
  - {{ id: ch, kind: chunker, params: {{ frames: 512, left_context: 64 }} }}
  - {{ id: out, kind: host_out, params: {{ type: audio }} }}
edges:
  - {{ from: src.out, to: dn.in }}
  - {{ from: dn.out, to: ch.in }}
  - {{ from: ch.out, to: out.in }}
"#,
        src.display()
    );
    let running = Pipeline::from_yaml(&yaml, &edgeflow_audio::registry())
        .unwrap()
        .start()
        .unwrap();
    let mut chunks = 0;
    while let Some(m) = running.pull("out", Duration::from_secs(30)).unwrap() {
        let a = m.payload.as_audio().unwrap();
        assert_eq!((a.sample_rate, a.channels, a.frames()), (16_000, 1, 576));
        chunks += 1;
    }
    // 16000 frames out of denoise (same length as in) / 512 -> 32 chunks.
    assert_eq!(chunks, 32);
    running.wait(Some(Duration::from_secs(5))).unwrap();
}

#[test]
fn rate_mismatch_is_rejected_and_names_resample() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.wav");
    write_wav(
        &src,
        44_100,
        1,
        WavEncoding::Pcm16,
        &sine(44_100, 1, 440.0, 0.1),
    )
    .unwrap();
    let yaml = format!(
        r#"
stages:
  - {{ id: src, kind: wav_source, params: {{ path: "{}" }} }}
  - {{ id: mel, kind: mel }}
  - {{ id: out, kind: host_out, params: {{ type: tensor }} }}
edges:
  - {{ from: src.out, to: mel.in }}
  - {{ from: mel.out, to: out.in }}
"#,
        src.display()
    );
    let e = Pipeline::from_yaml(&yaml, &edgeflow_audio::registry())
        .unwrap_err()
        .to_string();
    assert!(e.contains("44100") && e.contains("resample"), "{e}");
}

#[test]
fn impossible_rates_are_rejected_at_validation() {
    for to in ["0", "5", "100000000"] {
        let yaml = format!(
            r#"
stages:
  - {{ id: in, kind: host_in, params: {{ type: audio }} }}
  - {{ id: rs, kind: resample, params: {{ to: {to} }} }}
  - {{ id: out, kind: host_out, params: {{ type: audio }} }}
edges:
  - {{ from: in.out, to: rs.in }}
  - {{ from: rs.out, to: out.in }}
"#
        );
        let e = Pipeline::from_yaml(&yaml, &edgeflow_audio::registry())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rs") && e.contains("sample rate") && e.contains("16000"),
            "{e}"
        );
    }
}

#[test]
fn bad_wav_inputs_fail_clearly_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.wav");
    write_wav(
        &good,
        16_000,
        1,
        WavEncoding::Pcm16,
        &sine(16_000, 1, 440.0, 1.0),
    )
    .unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cut.wav");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let junk = dir.path().join("junk.wav");
    std::fs::write(&junk, b"RIFF\x10\x00\x00\x00WAVEjunkjunkjunk").unwrap();
    let missing = dir.path().join("missing.wav");
    let out = dir.path().join("out.wav");
    for (input, expect) in [
        (&cut, "truncated"),
        (&junk, "junk.wav"),
        (&missing, "no such file"),
    ] {
        let yaml = format!(
            r#"
stages:
  - {{ id: src, kind: wav_source, params: {{ path: "{}" }} }}
  - {{ id: dst, kind: wav_sink, params: {{ path: "{}" }} }}
edges:
  - {{ from: src.out, to: dst.in }}
"#,
            input.display(),
            out.display()
        );
        let e = run(&yaml).unwrap_err().to_string();
        assert!(e.contains(expect) && e.contains("src"), "{input:?}: {e}");
    }
    assert!(!out.exists());
    assert_eq!(
        files_in(dir.path()),
        vec!["cut.wav", "good.wav", "junk.wav"]
    );
}

#[test]
fn a_sink_that_fails_mid_stream_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let yaml = format!(
        r#"
stages:
  - {{ id: in, kind: host_in, params: {{ type: audio }} }}
  - {{ id: dst, kind: wav_sink, params: {{ path: "{}" }} }}
edges:
  - {{ from: in.out, to: dst.in }}
"#,
        out.display()
    );
    let running = Pipeline::from_yaml(&yaml, &edgeflow_audio::registry())
        .unwrap()
        .start()
        .unwrap();
    running
        .push("in", Payload::audio(16_000, 1, vec![0.1; 1600]))
        .unwrap();
    // A different rate mid-stream: a WAV file cannot hold both.
    running
        .push("in", Payload::audio(48_000, 1, vec![0.1; 4800]))
        .unwrap();
    let e = running
        .wait(Some(Duration::from_secs(10)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("dst") && e.contains("48000") && e.contains("resample"),
        "{e}"
    );
    assert!(
        files_in(dir.path()).is_empty(),
        "left behind: {:?}",
        files_in(dir.path())
    );
}

#[test]
fn sink_into_a_missing_folder_fails_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("no/such/dir/out.wav");
    let yaml = format!(
        r#"
stages:
  - {{ id: in, kind: host_in, params: {{ type: audio }} }}
  - {{ id: dst, kind: wav_sink, params: {{ path: "{}" }} }}
edges:
  - {{ from: in.out, to: dst.in }}
"#,
        out.display()
    );
    let e = Pipeline::from_yaml(&yaml, &edgeflow_audio::registry())
        .unwrap()
        .start()
        .unwrap_err()
        .to_string();
    assert!(e.contains("dst") && e.contains("does not exist"), "{e}");
}

#[test]
fn realtime_wav_source_emits_the_same_audio() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.wav");
    let x = sine(8_000, 1, 200.0, 0.25);
    write_wav(&src, 8_000, 1, WavEncoding::Float32, &x).unwrap();
    let yaml = format!(
        r#"
stages:
  - {{ id: src, kind: wav_source, params: {{ path: "{}", chunk_ms: 20, realtime: true }} }}
  - {{ id: out, kind: host_out, params: {{ type: audio }} }}
edges:
  - {{ from: src.out, to: out.in }}
"#,
        src.display()
    );
    let running = Pipeline::from_yaml(&yaml, &edgeflow_audio::registry())
        .unwrap()
        .start()
        .unwrap();
    let mut got = Vec::new();
    let mut chunks = 0;
    while let Some(m) = running.pull("out", Duration::from_secs(10)).unwrap() {
        got.extend_from_slice(&m.payload.as_audio().unwrap().samples);
        chunks += 1;
    }
    running.wait(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(chunks, 13, "0.25 s in 20 ms chunks (the last one short)");
    assert_eq!(got, x);
}

#[test]
fn mel_emits_an_utterance_on_flush() {
    let yaml = r#"
stages:
  - { id: audio, kind: host_in, params: { type: audio } }
  - { id: ctl, kind: host_in, params: { type: control } }
  - { id: mel, kind: mel, params: { padding: 0 } }
  - { id: out, kind: host_out, params: { type: tensor } }
edges:
  - { from: audio.out, to: mel.in }
  - { from: ctl.out, to: mel.flush }
  - { from: mel.out, to: out.in }
"#;
    let mut running = Pipeline::from_yaml(yaml, &edgeflow_audio::registry())
        .unwrap()
        .start()
        .unwrap();
    for _ in 0..5 {
        running
            .push(
                "audio",
                Payload::audio(16_000, 1, sine(16_000, 1, 300.0, 0.1)),
            )
            .unwrap();
    }
    // The flush travels on its own edge; give the audio a head start so
    // it normally lands after all five chunks (the check below holds
    // either way).
    std::thread::sleep(Duration::from_millis(200));
    running
        .push("ctl", Payload::event(edgeflow_graph::Event::Flush))
        .unwrap();
    let first = running
        .pull("out", Duration::from_secs(10))
        .unwrap()
        .unwrap();
    let Payload::Tensor(t) = &first.payload else {
        panic!("{:?}", first.payload)
    };
    assert_eq!(t.dims()[0], 80);
    let mut frames = t.dims()[1];
    running.close_input("audio").unwrap();
    running.close_input("ctl").unwrap();
    while let Some(m) = running.pull("out", Duration::from_secs(10)).unwrap() {
        let Payload::Tensor(t) = &m.payload else {
            panic!("{:?}", m.payload)
        };
        frames += t.dims()[1];
    }
    // 0.5 s, no padding: 8000 / 160 = 50 frames in all (chunks are whole
    // hops, so a split utterance loses none).
    assert_eq!(frames, 50);
    running.wait(Some(Duration::from_secs(5))).unwrap();
}
