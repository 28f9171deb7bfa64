//! The Omni speech path end to end: `edgeflow run pipelines/omni-speech.yaml`
//! as shipped (Qwen2.5-0.5B thinker with its hidden states -> codec talker
//! on the CPU -> token2wav DiT on the GPU backend -> BigVGAN on the int8
//! NPU simulator -> WAV), and `edgeflow bench omni` at a tiny size. No
//! timed assertions: what runs, what it says, what it writes.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::Path;
use std::process::{Command, Output};

fn edgeflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .unwrap()
}

#[test]
fn omni_speech_answers_and_speaks_across_three_devices() {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("omni.wav");
    let metrics = dir.path().join("metrics.json");
    let out = edgeflow(&[
        "run",
        "pipelines/omni-speech.yaml",
        "--set",
        &format!("out.path={}", wav.display()),
        "--set",
        "talker.max_codes=40",
        "--metrics-out",
        metrics.to_str().unwrap(),
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The thinker is real: it answers.
    assert!(stdout.contains("Paris"), "{stdout}");
    // Each Omni stage says in one line that it runs random weights.
    for stage in ["talker", "dit", "voc"] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("{stage}: ")) && l.contains("random-initialised")),
            "no random-weights line for {stage}:\n{stderr}"
        );
    }
    // Speech: 24 kHz mono, whole codes (2 mel frames of 240 samples each).
    let r = hound::WavReader::open(&wav).unwrap();
    assert_eq!(r.spec().sample_rate, 24_000);
    assert_eq!(r.spec().channels, 1);
    let n = r.len() as usize;
    assert!(
        n > 0 && n.is_multiple_of(480) && n <= 40 * 480,
        "{n} samples"
    );
    // Per-stage figures: first code / mel / audio, real-time factors, the
    // NPU's int8 error, the counted CPU fallbacks of the GPU and NPU.
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
    let text = m.to_string();
    for name in [
        "time_to_first_code_ms",
        "time_to_first_mel_ms",
        "time_to_first_audio_ms",
        "rtf",
        "int8_sqnr_db",
        "fallback",
    ] {
        assert!(
            text.contains(name),
            "{name} missing from the metrics:\n{text}"
        );
    }
}

#[test]
fn bench_omni_runs_token2wav_at_the_real_configuration() {
    let out = edgeflow(&[
        "bench",
        "omni",
        "--codes",
        "4",
        "--steps",
        "2",
        "--first-chunk",
        "2",
        "--right",
        "2",
        "--hifigan-frames",
        "16",
        "--runs",
        "1",
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("edgeflow bench omni"), "{stdout}");
    for row in [
        "HiFi-GAN V1 universal, 16 frames",
        "token2wav DiT, 4 codes, 2 steps",
        "token2wav BigVGAN, 8 frames",
        "time to first audio",
        "449 M parameters",
        // Timed once the weights' move to 2 MB pages is over.
        "HiFi-GAN universal loaded, ",
        "2 MB pages",
    ] {
        assert!(stdout.contains(row), "no `{row}` in:\n{stdout}");
    }
}

#[test]
fn a_folder_that_is_not_a_checkpoint_is_refused_naming_the_param() {
    // A folder that exists but holds no checkpoint.
    let dir = format!("voc.model_dir={}/data", env!("CARGO_MANIFEST_DIR"));
    let out = edgeflow(&["run", "pipelines/omni-speech.yaml", "--set", &dir]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`voc`") && err.contains("model_dir") && err.contains("config.json"),
        "{err}"
    );
    let out = edgeflow(&[
        "run",
        "pipelines/omni-speech.yaml",
        "--set",
        "dit.model=gpt",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown model `gpt`"), "{err}");
}
