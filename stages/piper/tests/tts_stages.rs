//! The `piper_frontend` and `vits` stages in a pipeline, on each device:
//! text in, streamed audio out, metrics recorded. GPU (lavapipe in CI) and
//! the NPU simulator are checked on a short sentence against the CPU.

mod common;

use edgeflow_graph::{Payload, Pipeline, Registry};
use edgeflow_piper::piper::{FrontEnd, InferenceScales, VoiceConfig};
use edgeflow_piper::vits::{Chunking, SynthesisParams, Vits, VitsConfig};
use edgeflow_runtime::DeviceSpec;
use std::time::Duration;

fn registry() -> Registry {
    let mut r = Registry::builtin();
    r.set_device_opener(edgeflow_backends::open);
    edgeflow_piper::register(&mut r);
    r
}

/// Run text -> piper_frontend -> vits(device) -> host_out; returns the
/// audio chunks and the vits stage's recorded metric names.
fn speak(text: &str, device: &str) -> (Vec<Vec<f32>>, Vec<String>) {
    let yaml = format!(
        r#"
name: tts-test
stages:
  - {{ id: in, kind: host_in, params: {{ type: text }} }}
  - {{ id: frontend, kind: piper_frontend }}
  - {{ id: tts, kind: vits, device: {device}, params: {{ noise_scale: 0.0, noise_w: 0.0, first_chunk_frames: 8, chunk_frames: 32 }} }}
  - {{ id: out, kind: host_out, params: {{ type: audio }} }}
edges:
  - {{ from: in.out, to: frontend.in }}
  - {{ from: frontend.out, to: tts.in }}
  - {{ from: tts.out, to: out.in }}
"#
    );
    let mut running = Pipeline::from_yaml(&yaml, &registry())
        .expect("valid pipeline")
        .start()
        .expect("start");
    running.push("in", Payload::text(text)).expect("push");
    running.close_input("in").expect("close");
    let mut chunks = Vec::new();
    while let Some(m) = running.pull("out", Duration::from_secs(600)).expect("pull") {
        let a = m.payload.as_audio().expect("audio");
        assert_eq!((a.sample_rate, a.channels), (22050, 1));
        chunks.push(a.samples.clone());
    }
    let metrics = running.wait(Some(Duration::from_secs(60))).expect("finish");
    let tts = metrics
        .stages
        .iter()
        .find(|s| s.id == "tts")
        .expect("tts metrics");
    (chunks, tts.values.keys().cloned().collect())
}

#[test]
fn cpu_pipeline_streams_audio_and_records_metrics() {
    if common::voice().is_none() {
        return;
    }
    let (chunks, metrics) = speak("Hello there. How are you?", "cpu");
    assert!(chunks.len() >= 4, "{} chunks", chunks.len());
    assert_eq!(chunks[0].len(), 8 * 256);
    for m in ["time_to_first_audio_ms", "rtf", "audio_s"] {
        assert!(metrics.iter().any(|k| k == m), "missing {m} in {metrics:?}");
    }
    // Noise disabled: the pipeline's audio is the model's, sentence by sentence.
    let refs = common::reference();
    let (hello, _) = speak(&refs[0].text, "cpu");
    let got: Vec<f32> = hello.concat();
    let want = common::reference_audio(&refs[0].sentences[0]);
    assert!(common::snr_db(&want, &got) > 60.0);
}

fn compare_device(device: &str, min_snr_db: f64) {
    if common::voice().is_none() {
        return;
    }
    let text = "Hi.";
    let (cpu, _) = speak(text, "cpu");
    let (dev, _) = speak(text, device);
    let (cpu, dev) = (cpu.concat(), dev.concat());
    assert_eq!(cpu.len(), dev.len(), "same durations on {device}");
    let snr = common::snr_db(&cpu, &dev);
    eprintln!(
        "{device}: SNR against the CPU (f32) {snr:.1} dB over {} samples",
        cpu.len()
    );
    assert!(snr > min_snr_db, "{device}: SNR {snr:.1} dB");
}

/// The GPU computes in f32 like the CPU: only summation order differs.
#[test]
fn gpu_matches_cpu() {
    compare_device("gpu", 50.0);
}

/// Magnitude-spectrogram agreement required of the int8 NPU simulator
/// (measured 16.9 dB on "Hi.").
const MIN_NPU_SPECTRAL_SNR_DB: f64 = 10.0;

/// The NPU simulator computes in int8 (per-channel weights, calibrated
/// activations). Its error against f32 is reported for the two halves:
/// the durations it predicts, and the audio it decodes from the CPU's
/// prior (same frames, so the waveforms line up).
#[test]
fn npu_simulator_error_is_reported() {
    let Some(voice) = common::voice() else { return };
    let vc = VoiceConfig::read(&voice.config).expect("voice config");
    let ids = FrontEnd::new(vc.clone(), true)
        .sentences("Hi.")
        .expect("front end")
        .remove(0)
        .ids;
    let cfg = VitsConfig {
        num_symbols: vc.num_symbols,
        ..VitsConfig::default()
    };
    let load = |spec| {
        let dev = edgeflow_backends::open(spec).expect("device");
        Vits::load(
            &edgeflow_piper::VarBuilder::open(&[&voice.weights], &dev).expect("open"),
            &cfg,
        )
        .expect("load")
    };
    let (cpu, npu) = (load(DeviceSpec::Cpu), load(DeviceSpec::Npu(0)));
    let p = SynthesisParams {
        scales: InferenceScales {
            noise_scale: 0.0,
            length_scale: 1.0,
            noise_w: 0.0,
        },
        seed: 0,
    };
    let prior = cpu.prior(&ids, &p).expect("cpu prior");
    let npu_prior = npu.prior(&ids, &p).expect("npu prior");
    let off: u32 = prior
        .durations
        .iter()
        .zip(&npu_prior.durations)
        .map(|(a, b)| a.abs_diff(*b))
        .sum();
    let decode = |v: &Vits| {
        let mut out = Vec::new();
        v.stream(&prior, Chunking::default(), &mut |c| {
            out.extend(c);
            Ok(true)
        })
        .expect("decode");
        out
    };
    let (a, b) = (decode(&cpu), decode(&npu));
    let snr = common::snr_db(&a, &b);
    let spec = common::spectral_snr_db(&a, &b);
    eprintln!(
        "npu simulator vs f32: durations {} vs {} frames ({off} frames off in total); \
         decoded audio: waveform SNR {snr:.1} dB, magnitude-spectrogram SNR {spec:.1} dB; {:?}",
        prior.frames(),
        npu_prior.frames(),
        npu.device().stats().snapshot()
    );
    assert_eq!(a.len(), b.len());
    // int8 moves the vocoder's phase, so the waveform SNR is near 0 dB;
    // the spectra must still agree.
    assert!(
        spec > MIN_NPU_SPECTRAL_SNR_DB,
        "npu spectral SNR {spec:.1} dB"
    );
}
