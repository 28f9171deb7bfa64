//! Silero VAD on our runtime against silero_vad.onnx under onnxruntime
//! (scripts/speech_reference.py), on the committed fixture clip.

mod common;

use edgeflow_runtime::DeviceSpec;
use edgeflow_speech::cards::{SILERO_VAD, SILERO_WEIGHTS};
use edgeflow_speech::silero::{SileroConfig, SileroVad, WINDOW};
use edgeflow_speech::vad::{clip_probs, Segmenter, VadConfig, VadEvent, VadStream};

/// Tolerance on speech probabilities (issue 6).
const PROB_TOL: f32 = 1e-3;

fn load_file(file: &str) -> Option<SileroVad> {
    let dir = common::model(&SILERO_VAD)?;
    let dev = edgeflow_backends::open(DeviceSpec::Cpu).expect("cpu");
    let vb = edgeflow_speech::VarBuilder::open(&[dir.join(file)], &dev).expect("open");
    Some(SileroVad::load(&vb, &SileroConfig::default()).expect("load"))
}

fn load() -> Option<SileroVad> {
    load_file(SILERO_WEIGHTS)
}

fn ref_probs(r: &serde_json::Value) -> Vec<f32> {
    probs_of(r, "probs")
}

fn probs_of(r: &serde_json::Value, key: &str) -> Vec<f32> {
    r["vad"][key]
        .as_array()
        .expect("probs")
        .iter()
        .map(|v| v.as_f64().expect("prob") as f32)
        .collect()
}

fn segments(probs: &[f32], total: u64) -> Vec<[u64; 2]> {
    let mut seg = Segmenter::new(VadConfig::default());
    let mut out = Vec::new();
    let mut start = 0;
    for &p in probs {
        match seg.push(p, WINDOW) {
            Some(VadEvent::Start(s)) => start = s,
            Some(VadEvent::End(e)) => out.push([start, e]),
            None => {}
        }
    }
    if seg.in_speech() {
        out.push([start, total]);
    }
    out
}

fn max_diff(got: &[f32], want: &[f32]) -> (f32, usize) {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold(
            (0f32, 0),
            |(m, mi), (i, d)| if d > m { (d, i) } else { (m, mi) },
        )
}

/// The wheel's safetensors checkpoint against a float64 numpy
/// implementation of silero-vad's tinygrad model (no onnx export of this
/// checkpoint exists in the wheel).
#[test]
fn safetensors_checkpoint_matches_numpy_reference() {
    let Some(mut vad) = load_file("silero_vad_16k.safetensors") else {
        return;
    };
    let want = probs_of(&common::reference(), "probs_safetensors_numpy");
    let got = clip_probs(&mut vad, &common::clip()).expect("probs");
    let (worst, at) = max_diff(&got, &want);
    eprintln!("safetensors checkpoint: max |p - p_numpy| = {worst:.2e} at window {at}");
    assert!(
        worst <= PROB_TOL,
        "window {at}: {} vs {}",
        got[at],
        want[at]
    );
}

#[test]
fn probabilities_match_onnxruntime() {
    let Some(mut vad) = load() else { return };
    let r = common::reference();
    let want = ref_probs(&r);
    let clip = common::clip();
    let got = clip_probs(&mut vad, &clip).expect("probs");
    assert_eq!(got.len(), want.len());
    let (worst, at) = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold(
            (0f32, 0),
            |(m, mi), (i, d)| if d > m { (d, i) } else { (m, mi) },
        );
    eprintln!(
        "max |p - p_onnx| = {worst:.2e} at window {at} of {}",
        got.len()
    );
    assert!(
        worst <= PROB_TOL,
        "window {at}: {} vs {}",
        got[at],
        want[at]
    );
}

#[test]
fn segments_match_vad_iterator() {
    let r = common::reference();
    let total = r["samples"].as_u64().expect("samples");
    let want: Vec<[u64; 2]> =
        serde_json::from_value(r["vad"]["segments"].clone()).expect("segments");
    assert_eq!(segments(&ref_probs(&r), total), want);
}

#[test]
fn streaming_in_odd_chunks_gives_the_same_probabilities() {
    let Some(vad) = load() else { return };
    let clip = common::clip();
    let mut s = VadStream::new(vad, VadConfig::default());
    let mut events = Vec::new();
    for chunk in clip.chunks(777) {
        s.push(chunk, &mut |_, e, _| events.extend(e))
            .expect("push");
    }
    s.finish(&mut |_, e, _| events.extend(e)).expect("finish");
    let want = ref_probs(&common::reference());
    assert_eq!(s.probs().len(), want.len());
    for (a, b) in s.probs().iter().zip(&want) {
        assert!((a - b).abs() <= PROB_TOL);
    }
    let starts = events
        .iter()
        .filter(|e| matches!(e, VadEvent::Start(_)))
        .count();
    let ends = events
        .iter()
        .filter(|e| matches!(e, VadEvent::End(_)))
        .count();
    assert_eq!((starts, ends), (3, 3), "{events:?}");
}

#[test]
fn min_speech_drops_short_blips() {
    // 1 window of speech between silences: no segment with 100 ms minimum.
    let mut probs = vec![0.0f32; 10];
    probs.push(0.9);
    probs.extend(vec![0.0f32; 10]);
    let cfg = VadConfig {
        min_speech_ms: 100,
        ..VadConfig::default()
    };
    let mut seg = Segmenter::new(cfg);
    assert!(probs.iter().all(|&p| seg.push(p, WINDOW).is_none()));
    // Four windows (128 ms) of speech do start, padded from the first one.
    let mut seg = Segmenter::new(cfg);
    let ev: Vec<_> = [0.0, 0.9, 0.9, 0.9, 0.9, 0.0]
        .iter()
        .filter_map(|&p| seg.push(p, WINDOW))
        .collect();
    assert_eq!(ev, vec![VadEvent::Start(512 - 480)]);
}
