//! The voice loop split across two hosts (`pipelines/voice-split.yaml`):
//! the `ears` part (mic, VAD, Whisper, turn, sentences, Piper, speaker) in
//! one network namespace, the `brain` part (the thinker) in another, joined
//! by a veth pair: real IP between them, no multicast. A question spoken
//! into the microphone (the PulseAudio null sink `vsink`, as in
//! tests/voice_loop.rs) is transcribed on one host, answered on the other
//! and heard on the agent's own sink; then the brain's process is killed:
//! the ears part reports the part gone within a second and keeps running
//! (`--on-part-lost wait`, the default); the brain restarts, rejoins, and a
//! second question is answered aloud. Last, the ears part is killed and the
//! brain, started with `--on-part-lost stop`, ends.
//!
//! Needs root and network namespaces (as CI has), the PulseAudio server of
//! `audio/tests/start-pulse.sh` (skipped with `EDGEFLOW_SKIP_LIVE_AUDIO=1`)
//! and the four models (skipped with `EDGEFLOW_SKIP_MODEL_TESTS=1`):
//!
//!     cargo test -p edgeflow --test voice_split -- --nocapture
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

mod common;

use common::voice::{live, models, overlap, AgentSink, Recorder};
use common::{repo, Hosts, Proc};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Network namespaces of this file: `evsa<n>` / `evsb<n>` on 10.232.<n>.0/24
/// (tests/parts.rs uses `efa<n>` / `efb<n>` on 10.231).
const NS_PREFIX: &str = "evs";
const NET: u8 = 232;

/// The null sink the agent speaks into (tests/voice_loop.rs has its own).
const AGENT_SINK: &str = "ef_split_agent";

/// One scenario at a time: they share the sinks and two cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// `text` spoken by our Piper voice, as a stereo float WAV.
fn speak(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let p = edgeflow::PipelineBuilder::new("say")
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
    path
}

fn split_file(dir: &Path, h: &Hosts) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("pipelines/voice-split.yaml")).unwrap();
    let text = text
        .replace(
            r#"ears: { listen: ["tcp/127.0.0.1:7451"] }"#,
            &format!(r#"ears: {{ listen: ["tcp/{}:7451"] }}"#, h.ip_a),
        )
        .replace(
            r#"brain: { connect: ["tcp/127.0.0.1:7451"] }"#,
            &format!(
                r#"brain: {{ connect: ["tcp/{}:7451"], listen: ["tcp/{}:0"] }}"#,
                h.ip_a, h.ip_b
            ),
        )
        .replace(
            "\nedges:\n",
            "\n  - { id: heard, kind: stdout, part: ears }\n  \
             - { id: said, kind: stdout, part: ears }\nedges:\n",
        );
    assert!(
        text.contains(&h.ip_a) && text.contains("id: heard"),
        "the parts or edges section moved"
    );
    let text = format!(
        "{}\n  - {{ from: asr.text, to: heard.in }}\n  - {{ from: sentences.out, to: said.in }}\n",
        text.trim_end()
    );
    let f = dir.join("voice-split.yaml");
    std::fs::write(&f, text).unwrap();
    f
}

/// Play `wav` into the microphone and follow the turn on the ears part's
/// stdout and the agent's sink: the first line printed after it is the
/// transcript (nothing else prints before the thinker has a question), the
/// next ones the answer's sentences. Returns (transcript, answer, seconds
/// of the answer heard), once the answer has played out.
fn ask(ears: &mut Proc, rec: &Recorder, wav: &Path, what: &str) -> (String, String, f64) {
    let voiced_before = rec.voiced();
    let t0 = Instant::now();
    let status = Command::new("paplay")
        .arg("--device=vsink")
        .arg(wav)
        .status()
        .expect("paplay (pulseaudio-utils) must be installed");
    assert!(status.success(), "paplay {wav:?}");
    let until = Instant::now() + Duration::from_secs(60);
    while ears.out_lines_after(t0).is_empty() {
        assert!(
            Instant::now() < until,
            "{what}: no transcript within 60 s of speaking"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The answer: its sentences, and at least a second of it heard
    // (synthesis may run slower than real time on a loaded machine).
    let until = Instant::now() + Duration::from_secs(120);
    while ears.out_lines_after(t0).len() < 2 || rec.voiced() - voiced_before < 1.0 {
        if Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Played out: nothing new printed or heard for 3 s (bounded).
    let until = Instant::now() + Duration::from_secs(60);
    let mut last = (ears.out_lines_after(t0).len(), rec.voiced(), Instant::now());
    while Instant::now() < until && last.2.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(250));
        let now = (ears.out_lines_after(t0).len(), rec.voiced());
        if now.0 != last.0 || now.1 > last.1 + 0.05 {
            last = (now.0, now.1, Instant::now());
        }
    }
    let lines: Vec<String> = ears
        .out_lines_after(t0)
        .into_iter()
        .map(|(_, l)| l)
        .collect();
    let heard = rec.voiced() - voiced_before;
    let answer = lines[1..].join(" ");
    (lines[0].clone(), answer, heard)
}

#[test]
fn voice_loop_split_across_two_hosts_answers_loses_its_brain_and_answers_again() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !live("split voice-loop") || !models("split voice-loop") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let q1 = "What is the capital of France?";
    let q2 = "What is the capital of Italy?";
    let (wav1, wav2) = (
        speak(dir.path(), "q1.wav", q1),
        speak(dir.path(), "q2.wav", q2),
    );
    let hosts = Hosts::new(NS_PREFIX, NET);
    let file = split_file(dir.path(), &hosts);
    let f = file.to_str().unwrap();
    let sink = AgentSink::load(AGENT_SINK);
    let rec = Recorder::start(AGENT_SINK);
    // Host A: the ears part (it listens); host B: the brain (it connects).
    let mut ears = Proc::spawn(hosts.cmd(
        &hosts.a,
        &["run", f, "--part", "ears", "--quiet", "--timeout", "900"],
    ));
    let brain_cmd = |on_lost: &str| {
        hosts.cmd(
            &hosts.b,
            &[
                "run",
                f,
                "--part",
                "brain",
                "--quiet",
                "--set",
                "thinker.max_tokens=24",
                "--on-part-lost",
                on_lost,
            ],
        )
    };
    let mut brain = Proc::spawn(brain_cmd("wait"));
    assert!(
        ears.wait_line("part `brain` is here", Duration::from_secs(180))
            .is_some(),
        "the ears part sees the brain across the veth"
    );
    // Capture starts late while the sink is idle: let the streams settle.
    std::thread::sleep(Duration::from_millis(1500));

    let (heard, said, voiced) = ask(&mut ears, &rec, &wav1, "first question");
    println!("first: transcribed {heard:?}; answered {said:?}; {voiced:.2} s heard");
    assert!(
        overlap(q1, &heard) >= 0.6,
        "transcript {heard:?} does not resemble {q1:?}"
    );
    assert!(!said.trim().is_empty(), "the brain answered nothing");
    assert!(
        voiced >= 0.5,
        "the answer was not heard on the speaker side ({voiced:.2} s voiced)"
    );

    // Kill the brain: the ears part must notice within a second (the link
    // lease), say which part is gone, and keep running (wait policy).
    brain.child.kill().unwrap();
    let t_kill = Instant::now();
    let _ = brain.child.wait();
    let seen = ears
        .wait_line_after("part `brain` is gone", Some(t_kill), Duration::from_secs(5))
        .expect("the ears part reports the lost part");
    let detect = seen.saturating_duration_since(t_kill);
    println!(
        "lost brain detected after {:.0} ms",
        detect.as_secs_f64() * 1e3
    );
    assert!(detect < Duration::from_secs(1), "detected after {detect:?}");
    assert!(
        ears.wait_line_after(
            "is gone (liveliness token removed)",
            Some(t_kill),
            Duration::from_secs(5)
        )
        .is_some(),
        "the edges from the brain report their producer gone"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        ears.child.try_wait().unwrap().is_none(),
        "the ears part waits for its brain instead of ending (--on-part-lost wait)"
    );

    let t_restart = Instant::now();
    // This time it stops when the ears part is gone (`--on-part-lost stop`).
    brain = Proc::spawn(brain_cmd("stop"));
    let back = ears
        .wait_line_after(
            "part `brain` is here",
            Some(t_restart),
            Duration::from_secs(180),
        )
        .expect("the restarted brain rejoins");
    println!(
        "brain back after {:.1} s (model load included)",
        back.saturating_duration_since(t_restart).as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(1));

    let (heard, said, voiced) = ask(&mut ears, &rec, &wav2, "second question");
    println!("second: transcribed {heard:?}; answered {said:?}; {voiced:.2} s heard");
    assert!(
        overlap(q2, &heard) >= 0.6,
        "transcript {heard:?} does not resemble {q2:?}"
    );
    assert!(
        !said.trim().is_empty(),
        "the restarted brain answered nothing"
    );
    assert!(
        voiced >= 0.5,
        "the second answer was not heard ({voiced:.2} s voiced)"
    );
    assert!(
        ears.child.try_wait().unwrap().is_none(),
        "the ears part ran throughout"
    );
    // The other policy: the brain (`--on-part-lost stop`) reports the ears
    // part gone and ends (its question stream ends, so it ends by itself,
    // exit 0; had it not, it would be stopped after 2 s, exit 1).
    ears.child.kill().unwrap();
    let t_kill = Instant::now();
    let _ = ears.child.wait();
    let seen = brain
        .wait_line_after("part `ears` is gone", Some(t_kill), Duration::from_secs(5))
        .expect("the brain reports the lost part");
    println!(
        "lost ears detected by the brain after {:.0} ms",
        seen.saturating_duration_since(t_kill).as_secs_f64() * 1e3
    );
    let (code, _) = brain.finish(Duration::from_secs(30));
    let took = t_kill.elapsed();
    println!(
        "the brain exited ({code:?}) {:.1} s after the ears part was killed",
        took.as_secs_f64()
    );
    assert!(
        matches!(code, Some(0 | 1)),
        "--on-part-lost stop ends the part: {code:?}"
    );
    assert!(took < Duration::from_secs(15), "stopped after {took:?}");
    drop(ears);
    drop(rec);
    drop(sink);
}
