//! pipelines/transcribe.yaml end to end on the fixture clip, with its
//! stdout sink swapped for a host port: one line per VAD segment, equal to
//! faster-whisper's transcript of that segment.

mod common;

use edgeflow_graph::{parse_spec, Pipeline, Registry};
use edgeflow_speech::cards::{SILERO_VAD, WHISPER_TINY_EN};
use std::path::Path;
use std::time::Duration;

fn registry() -> Registry {
    let mut r = Registry::builtin();
    r.set_device_opener(edgeflow_backends::open);
    edgeflow_audio::register(&mut r);
    edgeflow_speech::register(&mut r);
    r
}

#[test]
fn transcribe_yaml_prints_each_utterance() {
    if common::model(&SILERO_VAD).is_none() || common::model(&WHISPER_TINY_EN).is_none() {
        return;
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/transcribe.yaml");
    let yaml = std::fs::read_to_string(&path).expect("transcribe.yaml");
    let mut spec = parse_spec(&yaml, Some(&path)).expect("parse");
    let wav = common::fixtures().join("speech_mix.wav");
    for s in &mut spec.stages {
        if s.id == "in" {
            s.params
                .insert("path".into(), wav.to_string_lossy().into_owned().into());
        }
        if s.id == "out" {
            s.kind = "host_out".into();
            s.params.clear();
            s.params.insert("type".into(), "text".into());
        }
    }
    let running = Pipeline::from_spec(&spec, &registry())
        .expect("valid pipeline")
        .start()
        .expect("start");
    let mut lines = Vec::new();
    while let Some(m) = running.pull("out", Duration::from_secs(120)).expect("pull") {
        lines.push(m.payload.as_text().expect("text").to_string());
    }
    let metrics = running.wait(Some(Duration::from_secs(60))).expect("run");
    let r = common::reference();
    let want: Vec<String> = r["asr"]
        .as_array()
        .expect("asr")
        .iter()
        .filter(|a| {
            a["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("vad_segment"))
        })
        .filter_map(|a| {
            a["text"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(String::from)
        })
        .collect();
    assert_eq!(lines, want);
    let text = format!("{metrics:?}");
    assert!(
        text.contains("vad_window_us"),
        "per-window VAD time is recorded"
    );
    assert!(text.contains("asr_ms"));
}

/// Audio pushed straight into `asr` (no VAD, no events) is transcribed at
/// end of stream; audio at the wrong rate stops the pipeline with a message
/// that says what to insert.
#[test]
fn asr_without_vad_and_at_the_wrong_rate() {
    if common::model(&WHISPER_TINY_EN).is_none() {
        return;
    }
    let yaml = r#"
stages:
  - { id: in, kind: host_in, params: { type: any } }
  - { id: asr, kind: asr, device: cpu }
  - { id: out, kind: host_out, params: { type: text } }
edges:
  - { from: in.out, to: asr.in }
  - { from: asr.text, to: out.in }
"#;
    let r = common::reference();
    let offs: Vec<[usize; 2]> =
        serde_json::from_value(r["sentence_offsets"].clone()).expect("offsets");
    let clip = common::clip();
    let [a, b] = offs[1];

    let mut running = Pipeline::from_yaml(yaml, &registry())
        .expect("valid")
        .start()
        .expect("start");
    for chunk in clip[a..b].chunks(1600) {
        running
            .push(
                "in",
                edgeflow_graph::Payload::audio(16_000, 1, chunk.to_vec()),
            )
            .expect("push");
    }
    running.close_input("in").expect("close");
    let msg = running
        .pull("out", Duration::from_secs(120))
        .expect("pull")
        .expect("one transcript");
    let want = r["asr"]
        .as_array()
        .expect("asr")
        .iter()
        .find(|x| x["name"] == "sentence1")
        .expect("sentence1");
    assert_eq!(msg.payload.as_text(), want["text"].as_str());
    running
        .wait(Some(Duration::from_secs(60)))
        .expect("clean end");

    let running = Pipeline::from_yaml(yaml, &registry())
        .expect("valid")
        .start()
        .expect("start");
    running
        .push(
            "in",
            edgeflow_graph::Payload::audio(44_100, 1, vec![0.0; 4410]),
        )
        .expect("push");
    let err = running
        .wait(Some(Duration::from_secs(60)))
        .expect_err("wrong rate must fail");
    let text = err.to_string();
    assert!(text.contains("resample"), "{text}");
}
