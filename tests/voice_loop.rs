//! The voice loop (`pipelines/voice-loop.yaml`) live, through a real sound
//! server: a question synthesized by our own TTS is played into the
//! PulseAudio null sink `vsink`, whose monitor is the microphone; the loop
//! must transcribe it, answer, and its answer must be heard.
//!
//! The agent speaks into a second null sink loaded for the test
//! (`ef_voice_agent`, chosen with `PULSE_SINK`), whose monitor the test
//! records: with one sink the loop would hear its own voice, and without an
//! echo canceller that voice would interrupt it. (A headset does the same
//! for a person.)
//!
//! Needs the PulseAudio server of `audio/tests/start-pulse.sh` (fails
//! unless `EDGEFLOW_SKIP_LIVE_AUDIO=1`) and the four models (fails naming
//! the fetch commands unless `EDGEFLOW_SKIP_MODEL_TESTS=1`). The latencies
//! are printed, not asserted:
//!
//!     cargo test -p edgeflow --test voice_loop -- --nocapture --test-threads 1

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::voice::{live, models, overlap, voiced_seconds, AgentSink, Recorder, REC_RATE};
use edgeflow::graph::{parse_spec, EdgeSpec, Message, MetricsSnapshot, PipelineSpec, StageSpec};
use edgeflow::{Pipeline, PipelineBuilder, Running};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests share the sinks: one at a time.
static SINK: Mutex<()> = Mutex::new(());

/// The null sink the agent speaks into.
const AGENT_SINK: &str = "ef_voice_agent";

/// `text` spoken by our Piper voice, as a stereo float WAV (paplay maps a
/// mono float WAV to the front-left speaker only). Returns its duration.
fn speak(dir: &Path, name: &str, text: &str) -> (PathBuf, f64) {
    let path = dir.join(name);
    let p = PipelineBuilder::new("say")
        .stage("text", "text", json!({ "text": text }))
        .stage("frontend", "piper_frontend", json!({}))
        .stage("tts", "vits", json!({ "seed": 1 }))
        .stage("stereo", "channel_mix", json!({ "channels": 2 }))
        .stage(
            "out",
            "wav_sink",
            json!({ "path": path.to_str().unwrap(), "format": "f32" }),
        )
        .edge("text.out", "frontend.in")
        .edge("frontend.out", "tts.in")
        .edge("tts.out", "stereo.in")
        .edge("stereo.out", "out.in")
        .build(&edgeflow::registry())
        .unwrap();
    p.run(Some(Duration::from_secs(60))).unwrap();
    let (info, _) = edgeflow_audio::wav::read_wav(&path).unwrap();
    let secs = info.frames as f64 / info.sample_rate as f64;
    (path, secs)
}

fn paplay(path: &Path) -> Child {
    Command::new("paplay")
        .arg("--device=vsink")
        .arg(path)
        .spawn()
        .expect("paplay (pulseaudio-utils) must be installed")
}

/// The shipped voice-loop pipeline plus host taps on the transcript, the
/// answer and its end; `thinker.max_tokens` set.
fn voice_loop(max_tokens: u32) -> Running {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("voice-loop.yaml");
    let yaml = std::fs::read_to_string(&file).unwrap();
    let mut spec: PipelineSpec = parse_spec(&yaml, Some(&file)).unwrap();
    for s in &mut spec.stages {
        if s.id == "thinker" {
            s.params.insert("max_tokens".into(), json!(max_tokens));
        }
    }
    for (id, ty, from) in [
        ("heard", "text", "asr.text"),
        ("said", "text", "thinker.out"),
        ("done", "control", "thinker.done"),
    ] {
        spec.stages.push(StageSpec {
            id: id.into(),
            kind: "host_out".into(),
            device: None,
            threads: None,
            inline: false,
            part: None,
            params: [("type".to_string(), json!(ty))].into_iter().collect(),
        });
        spec.edges.push(EdgeSpec {
            from: from.into(),
            to: format!("{id}.in"),
            capacity: None,
            policy: None,
            max_age: None,
            back_edge: false,
            key: None,
        });
    }
    Pipeline::from_spec(&spec, &edgeflow::registry())
        .unwrap()
        .start()
        .unwrap()
}

fn pull_text(r: &Running, port: &str, timeout: Duration) -> Message {
    match r.pull(port, timeout) {
        Ok(Some(m)) if m.payload.as_text().is_some() => m,
        other => panic!("no `{port}` text within {timeout:?}: {other:?}"),
    }
}

/// The answer of the turn in `epoch`: text pieces until its end (`done`).
fn answer(r: &Running, epoch: u64, timeout: Duration) -> String {
    let until = Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match r.pull("done", left) {
            Ok(Some(m)) if m.epoch == epoch => break,
            Ok(Some(_)) => continue,
            other => panic!("the thinker did not finish the answer of epoch {epoch}: {other:?}"),
        }
    }
    let mut text = String::new();
    while let Ok(Some(m)) = r.pull("said", Duration::from_millis(200)) {
        if m.epoch == epoch {
            text.push_str(m.payload.as_text().unwrap_or(""));
        }
    }
    text
}

fn value(
    m: &MetricsSnapshot,
    stage: &str,
    name: &str,
) -> Option<edgeflow::graph::metrics::ValueSummary> {
    m.stages
        .iter()
        .find(|s| s.id == stage)
        .and_then(|s| s.values.get(name).cloned())
}

/// Wait until `stage` has recorded `name` at least `n` times.
fn wait_value(r: &Running, stage: &str, name: &str, n: u64, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if value(&r.metrics(), stage, name).is_some_and(|v| v.count >= n) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn print_latencies(m: &MetricsSnapshot, what: &str) {
    for (stage, name) in [
        ("turn", "voice_to_voice_ms"),
        ("turn", "handoff_ms"),
        ("turn", "interruption_latency_ms"),
        ("speaker", "playout_latency_ms"),
        ("asr", "asr_ms"),
        ("tts", "time_to_first_audio_ms"),
    ] {
        if let Some(v) = value(m, stage, name) {
            println!(
                "{what}: {stage}.{name}: n={} min={:.0} p50={:.0} max={:.0} ms",
                v.count, v.min, v.p50, v.max
            );
        }
    }
    for c in &m.cancels {
        println!(
            "{what}: cancel of epoch {}: {}/{} stages acknowledged in {:?} ms",
            c.epoch, c.acked, c.stages, c.ack_ms
        );
    }
}

#[test]
fn a_spoken_question_is_transcribed_answered_and_heard() {
    let _g = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if !live("live voice-loop") || !models("voice-loop") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let question = "What is the capital of France?";
    let (wav, secs) = speak(dir.path(), "question.wav", question);
    let sink = AgentSink::load(AGENT_SINK);
    let rec = Recorder::start(AGENT_SINK);
    let running = voice_loop(16);
    // Capture starts late while the sink is idle: let the streams settle.
    std::thread::sleep(Duration::from_millis(1000));
    let mut player = paplay(&wav);
    player.wait().unwrap();

    let heard = pull_text(&running, "heard", Duration::from_secs(20));
    let text = heard.payload.as_text().unwrap_or_default().to_string();
    println!("played ({secs:.2} s): {question:?}; transcribed: {text:?}");
    assert!(
        overlap(question, &text) >= 0.6,
        "transcript {text:?} does not resemble {question:?}"
    );
    let said = answer(&running, heard.epoch, Duration::from_secs(30));
    println!("answered: {said:?}");
    // Qwen2.5-0.5B, greedy: "The capital city of France is Paris."
    assert!(
        said.contains("Paris"),
        "the thinker's answer {said:?} does not name Paris"
    );

    // Let the answer play out (bounded), then look at what the agent sink heard.
    assert!(
        wait_value(
            &running,
            "turn",
            "voice_to_voice_ms",
            1,
            Duration::from_secs(20)
        ),
        "no TTS audio reached the turn stage"
    );
    // Synthesis may run slower than real time on a loaded machine (the
    // speaker then plays the answer in pieces): wait, bounded, until a
    // second of it has been heard.
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until && voiced_seconds(&rec.samples()) < 1.0 {
        std::thread::sleep(Duration::from_millis(200));
    }
    let metrics = running.metrics();
    drop(running);
    let played = rec.stop();
    drop(sink);
    let voiced = voiced_seconds(&played);
    println!(
        "agent sink: {:.2} s recorded, {voiced:.2} s of it voiced",
        played.len() as f64 / REC_RATE as f64
    );
    print_latencies(&metrics, "question");
    assert!(
        voiced >= 0.5,
        "the agent's answer was not heard on the speaker side ({voiced:.2} s voiced)"
    );
    assert!(
        metrics.cancels.is_empty(),
        "nothing should have been cancelled"
    );
}

/// Barge-in: speech over the agent cancels the agent's turn (acknowledged by
/// every stage, speaker flushed) and the interrupting utterance, which
/// belongs to the next epoch, is still transcribed and answered.
#[test]
fn speech_over_the_agent_cancels_its_turn_and_is_heard() {
    let _g = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if !live("live voice-loop") || !models("voice-loop") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let first = "Tell me a long story about a brave little dragon.";
    let second = "Stop please. What is the capital of Italy?";
    let (wav1, _) = speak(dir.path(), "first.wav", first);
    let (wav2, secs2) = speak(dir.path(), "second.wav", second);
    let sink = AgentSink::load(AGENT_SINK);
    let rec = Recorder::start(AGENT_SINK);
    let running = voice_loop(96);
    std::thread::sleep(Duration::from_millis(1000));
    paplay(&wav1).wait().unwrap();

    let heard1 = pull_text(&running, "heard", Duration::from_secs(20));
    println!("first transcript: {:?}", heard1.payload.as_text());
    let agent_epoch = heard1.epoch;
    // The agent is speaking: its first audio reached the speaker side.
    assert!(
        wait_value(
            &running,
            "turn",
            "voice_to_voice_ms",
            1,
            Duration::from_secs(30)
        ),
        "the agent never started speaking"
    );
    // ... and has been heard for a moment.
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until && voiced_seconds(&rec.samples()) < 0.5 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = voiced_seconds(&rec.samples());
    println!("interrupting after {before:.2} s of agent speech ({secs2:.2} s clip)");
    paplay(&wav2).wait().unwrap();

    // The barge-in: the agent's epoch cancelled and acknowledged by every
    // stage. A stage acknowledges from its own thread between messages, so
    // the thinker's and the TTS's acknowledgements mean their loops on the
    // agent's turn have returned; the speaker's, that it dropped the
    // queued answer.
    assert!(
        wait_value(&running, "turn", "barge_ins", 1, Duration::from_secs(10)),
        "speech over the agent did not interrupt it"
    );
    let until = Instant::now() + Duration::from_secs(10);
    let cancel = loop {
        let m = running.metrics();
        match m.cancels.iter().find(|c| c.epoch == agent_epoch) {
            Some(c) if c.ack_ms.is_some() || Instant::now() >= until => break c.clone(),
            None if Instant::now() >= until => {
                panic!("epoch {agent_epoch} was not cancelled: {:?}", m.cancels)
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let metrics = running.metrics();
    print_latencies(&metrics, "barge-in");
    let flushed = value(&metrics, "speaker", "flushed_ms").map_or(0.0, |v| v.max);
    println!("barge-in: speaker flushed {flushed:.0} ms of queued answer");
    assert!(
        cancel.ack_ms.is_some() && cancel.acked >= cancel.stages,
        "the cancel was not acknowledged by every stage: {cancel:?}"
    );
    let ignored = value(&metrics, "turn", "backchannels").map_or(0, |v| v.count);
    assert_eq!(ignored, 0, "the interruption was taken for a backchannel");

    // The new utterance is heard: transcribed in its own epoch and answered.
    let heard2 = match running.pull("heard", Duration::from_secs(20)) {
        Ok(Some(m)) => m,
        other => {
            let asr = value(&running.metrics(), "asr", "asr_ms").map_or(0, |v| v.count);
            panic!(
                "the interrupting utterance was not transcribed ({other:?}; the asr ran {asr} \
                 time(s)): did the cancel of the agent's epoch reset the asr's utterance in \
                 progress, which belongs to the next epoch?"
            )
        }
    };
    let text2 = heard2.payload.as_text().unwrap_or_default().to_string();
    println!("interruption transcript: {text2:?}");
    assert_ne!(
        heard2.epoch, agent_epoch,
        "the new utterance has its own epoch"
    );
    assert!(
        overlap(second, &text2) >= 0.5,
        "interruption transcript {text2:?} does not resemble {second:?}"
    );
    let said2 = answer(&running, heard2.epoch, Duration::from_secs(30));
    println!("answer to the interruption: {said2:?}");
    assert!(!said2.trim().is_empty(), "the new turn was not answered");
    // The new turn's own voice-to-voice latency (printed, not required).
    wait_value(
        &running,
        "turn",
        "voice_to_voice_ms",
        2,
        Duration::from_secs(15),
    );
    print_latencies(&running.metrics(), "after barge-in");
    drop(running);
    let _ = rec.stop();
    drop(sink);
}
