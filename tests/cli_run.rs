//! `edgeflow run` end to end: exit codes, overrides, metrics, timeouts.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn edgeflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("failed to start the edgeflow binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write_yaml(dir: &tempfile::TempDir, name: &str, body: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn finite_pipeline_exits_zero_with_summary() {
    let out = edgeflow(&[
        "run",
        "pipelines/hello.yaml",
        "--set",
        "tick.count=3",
        "--set",
        "tick.rate_hz=100",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    assert!(stdout.contains("Tick { index: 2"), "{stdout}");
    assert!(text(&out.stderr).contains("pipeline `hello`"));
}

#[test]
fn metrics_out_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.json");
    // A text source (not a timer, which skips ticks on a loaded machine).
    let p = write_yaml(
        &dir,
        "four.yaml",
        "name: four\nstages:\n  - { id: t, kind: text, params: { whole: false, text: \"a\\nb\\nc\\nd\" } }\n  - { id: o, kind: stdout }\nedges:\n  - { from: t.out, to: o.in }\n",
    );
    let out = edgeflow(&[
        "run",
        p.to_str().unwrap(),
        "--quiet",
        "--metrics-out",
        m.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&m).unwrap()).unwrap();
    assert_eq!(v["pipeline"], "four");
    assert_eq!(v["stages"][1]["processed"], 4);
    assert_eq!(v["edges"][0]["sent"], 4);
    assert_eq!(v["edges"][0]["delivered"], 4);
    assert!(v["stages"][1]["processing"]["p99_us"].as_f64().unwrap() > 0.0);
    assert!(
        text(&out.stderr).is_empty(),
        "--quiet printed: {}",
        text(&out.stderr)
    );
}

#[test]
fn timeout_stops_an_endless_pipeline_with_124() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_yaml(
        &dir,
        "endless.yaml",
        "stages:\n  - { id: t, kind: timer, params: { rate_hz: 50 } }\n  - { id: n, kind: discard }\nedges:\n  - { from: t.out, to: n.in }\n",
    );
    let out = edgeflow(&["run", p.to_str().unwrap(), "--timeout", "0.3"]);
    assert_eq!(
        out.status.code(),
        Some(124),
        "stderr: {}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("--timeout"));
}

#[test]
fn bad_set_is_a_clear_error() {
    for (arg, needle) in [
        ("tick", "STAGE.PARAM=VALUE"),
        ("nosuch.count=3", "no stage `nosuch`"),
        ("tick.nosuch=3", "unknown param `nosuch`"),
        ("tick.rate_hz=fast", "rate_hz"),
    ] {
        let out = edgeflow(&["run", "pipelines/hello.yaml", "--set", arg]);
        assert!(!out.status.success(), "{arg} was accepted");
        let err = text(&out.stderr);
        assert!(err.contains(needle), "{arg}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn missing_pipeline_file_names_it() {
    let out = edgeflow(&["run", "no/such/pipeline.yaml"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("no/such/pipeline.yaml"), "{err}");
    assert!(!err.contains("panicked"));
}

#[test]
fn text_source_reads_stdin_when_empty() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_yaml(
        &dir,
        "echo.yaml",
        "stages:\n  - { id: t, kind: text, params: { whole: false } }\n  - { id: o, kind: stdout }\nedges:\n  - { from: t.out, to: o.in }\n",
    );
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(["run", p.to_str().unwrap(), "--quiet"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"one\ntwo\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "one\ntwo\n");
}

/// Paths given with `--set` are relative to the current directory; paths in
/// the file are relative to the file.
#[test]
fn set_paths_are_relative_to_the_current_directory() {
    let pipeline_dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    // 100 ms of 16-bit mono silence at 16 kHz.
    let n: u32 = 1600;
    let mut wav = Vec::new();
    wav.extend_from_slice(b"RIFF");
    wav.extend_from_slice(&(36 + 2 * n).to_le_bytes());
    wav.extend_from_slice(b"WAVEfmt ");
    wav.extend_from_slice(&16u32.to_le_bytes());
    wav.extend_from_slice(&1u16.to_le_bytes());
    wav.extend_from_slice(&1u16.to_le_bytes());
    wav.extend_from_slice(&16000u32.to_le_bytes());
    wav.extend_from_slice(&32000u32.to_le_bytes());
    wav.extend_from_slice(&2u16.to_le_bytes());
    wav.extend_from_slice(&16u16.to_le_bytes());
    wav.extend_from_slice(b"data");
    wav.extend_from_slice(&(2 * n).to_le_bytes());
    wav.resize(wav.len() + 2 * n as usize, 0);
    std::fs::write(cwd.path().join("in.wav"), &wav).unwrap();
    let p = write_yaml(
        &pipeline_dir,
        "copy.yaml",
        "stages:\n  - { id: src, kind: wav_source, params: { path: nowhere.wav } }\n  - { id: dst, kind: wav_sink, params: { path: nowhere-out.wav } }\nedges:\n  - { from: src.out, to: dst.in }\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(["run", p.to_str().unwrap(), "--quiet"])
        .args(["--set", "src.path=in.wav", "--set", "dst.path=out.wav"])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(cwd.path().join("out.wav").exists());
    assert!(!pipeline_dir.path().join("out.wav").exists());
}

/// `pipelines/transcribe.yaml` runs as shipped, on its default clip, and
/// prints the words spoken in it.
#[test]
fn transcribe_yaml_runs_as_shipped() {
    if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("skipped: EDGEFLOW_SKIP_MODEL_TESTS=1");
        return;
    }
    let out = edgeflow(&["run", "pipelines/transcribe.yaml", "--quiet"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    // Whisper tiny.en's transcript of the clip (faster-whisper's too).
    assert_eq!(
        lines,
        ["The quick brown fox jump over the lazy dog."],
        "{stdout}"
    );
}

/// Long text on stdin streams through as sentences, however long: 1 MB in,
/// every sentence out, in order, none longer than the limit.
#[test]
fn text_source_streams_long_stdin_as_sentences() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_yaml(
        &dir,
        "long.yaml",
        "stages:\n  - { id: t, kind: text }\n  - { id: o, kind: stdout }\nedges:\n  - { from: t.out, to: o.in, capacity: 2 }\n",
    );
    let sentences = 40_000;
    let mut input = String::new();
    for i in 0..sentences {
        input.push_str(&format!("Sentence number {i} is here."));
        input.push(if i % 10 == 9 { '\n' } else { ' ' });
    }
    // One run-on "sentence" of 5,000 words without punctuation.
    let words: Vec<String> = (0..5000).map(|i| format!("w{i}")).collect();
    input.push_str(&words.join(" "));
    assert!(input.len() > 1_000_000, "{}", input.len());
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(["run", p.to_str().unwrap(), "--quiet"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    for (i, l) in lines.iter().take(sentences).enumerate() {
        assert_eq!(*l, format!("Sentence number {i} is here."));
    }
    let tail = &lines[sentences.min(lines.len())..];
    assert!(
        tail.len() >= 5,
        "the run-on text is cut: {} pieces",
        tail.len()
    );
    for l in tail {
        assert!(l.chars().count() <= 1000, "{} chars", l.chars().count());
    }
    // Cut at word boundaries: every word arrives whole, in order.
    let got: Vec<&str> = tail.iter().flat_map(|l| l.split(' ')).collect();
    assert_eq!(got, words);
}

/// `--set STAGE.threads|inline` are accepted by `run` and `run --help` says so.
#[test]
fn run_takes_placement_overrides() {
    let out = edgeflow(&[
        "run",
        "pipelines/hello.yaml",
        "--set",
        "tick.count=2",
        "--set",
        "tick.rate_hz=100",
        "--set",
        "show.inline=true",
        "--set",
        "show.threads=2",
        "--set",
        "show.device=cpu",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 2);
    let out = edgeflow(&["run", "pipelines/hello.yaml", "--set", "show.device=banana"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("bad device `banana`"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = edgeflow(&["run", "--help"]);
    let help = text(&out.stdout);
    for needle in ["STAGE.device=", "STAGE.threads=", "STAGE.inline="] {
        assert!(help.contains(needle), "{needle} in {help}");
    }
}
