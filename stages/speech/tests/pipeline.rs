//! pipelines/transcribe.yaml end to end on the fixture clip, with its
//! stdout sink swapped for a host port: one line per VAD segment, equal to
//! faster-whisper's transcript of that segment.

mod common;

use edgeflow_graph::{parse_spec, Pipeline, Registry};
use edgeflow_speech::fetch::{SILERO_VAD, WHISPER_TINY_EN};
use std::path::Path;
use std::time::Duration;

fn registry() -> Registry {
    let mut r = Registry::builtin();
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
