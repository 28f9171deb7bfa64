//! The Omni speech path as running stages: thinker states -> `talker` ->
//! `dit` -> `bigvgan`, on the small random configurations, streamed over
//! bounded edges; the audio's length follows the codes; metrics per stage;
//! a cancel mid-utterance is acknowledged by all three and nothing of the
//! cancelled turn arrives after it.

#![allow(clippy::unwrap_used)]

use edgeflow_graph::{Message, Payload, Pipeline, Registry, Running};
use edgeflow_runtime::Tensor;
use std::time::{Duration, Instant};

/// Thinker width of these tests (any width works for random-small).
const E: usize = 64;

fn pipeline(max_codes: usize, steps: usize) -> Pipeline {
    placed(max_codes, steps, ["cpu", "cpu", "cpu"])
}

/// The pipeline with the talker, DiT and vocoder on `devices`.
fn placed(max_codes: usize, steps: usize, devices: [&str; 3]) -> Pipeline {
    built(max_codes, steps, devices, "").unwrap()
}

/// [`placed`] with `dit_params` added to the DiT's params.
fn built(
    max_codes: usize,
    steps: usize,
    devices: [&str; 3],
    dit_params: &str,
) -> edgeflow_graph::Result<Pipeline> {
    let [dt, dd, dv] = devices;
    let mut r = Registry::builtin();
    r.set_device_opener(edgeflow_backends::open);
    edgeflow_omni::register(&mut r);
    let yaml = format!(
        r#"
name: omni-test
stages:
  - {{ id: in, kind: host_in, params: {{ type: tensor }} }}
  - {{ id: talker, kind: talker, device: {dt}, params: {{ embedding_size: {E}, greedy: true, max_codes: {max_codes} }} }}
  - {{ id: dit, kind: dit, device: {dd}, params: {{ steps: {steps}{dit_params}, first_chunk_codes: 6, chunk_codes: 12, left_codes: 12, right_codes: 6 }} }}
  - {{ id: voc, kind: bigvgan, device: {dv}, params: {{ chunk_frames: 24, left_frames: 8, right_frames: 8 }} }}
  - {{ id: codes, kind: host_out, params: {{ type: any }} }}
  - {{ id: out, kind: host_out, params: {{ type: audio }} }}
edges:
  - {{ from: in.out, to: talker.in }}
  - {{ from: talker.out, to: dit.in, capacity: 64 }}
  - {{ from: talker.out, to: codes.in, capacity: 4096 }}
  - {{ from: dit.out, to: voc.in, capacity: 8 }}
  - {{ from: voc.out, to: out.in, capacity: 4096 }}
"#
    );
    Pipeline::from_yaml(&yaml, &r)
}

/// A turn's two state tensors: 8 prompt rows + the 3 TTS text rows, then
/// 5 reply rows.
fn push_turn(running: &Running, seed: u64) {
    let rows = |n: usize, s: u64| {
        let v = edgeflow_runtime::rng::normal_f32(n * E, 0.0, 1.0, s);
        Payload::Tensor(Tensor::from_vec(v, &[1, n, E]).unwrap())
    };
    running.push("in", rows(11, seed)).unwrap();
    running.push("in", rows(5, seed + 1)).unwrap();
}

fn pull(running: &Running, stage: &str, timeout: Duration) -> Option<Message> {
    match running.pull(stage, timeout) {
        Ok(m) => m,
        Err(edgeflow_graph::Error::Timeout(_)) => None,
        Err(e) => panic!("pull from {stage}: {e}"),
    }
}

#[test]
fn states_to_audio_streamed_in_chunks() {
    let mut running = pipeline(30, 3).start().unwrap();
    push_turn(&running, 1);
    running.close_input("in").unwrap();
    let mut audio = Vec::new();
    let mut chunks = 0;
    let mut codes = Vec::new();
    let mut flushes = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        while let Some(m) = pull(&running, "codes", Duration::from_millis(1)) {
            match &m.payload {
                Payload::Tokens(t) => codes.extend_from_slice(t),
                Payload::Event(_) => flushes += 1,
                other => panic!("codes: {other:?}"),
            }
        }
        match running.pull("out", Duration::from_millis(200)) {
            Ok(Some(m)) => {
                let a = m.payload.as_audio().expect("audio");
                assert_eq!(a.sample_rate, 24_000);
                assert!(a.samples.iter().all(|x| x.is_finite() && x.abs() <= 1.0));
                audio.extend_from_slice(&a.samples);
                chunks += 1;
            }
            Ok(None) => break,
            Err(edgeflow_graph::Error::Timeout(_)) => {
                assert!(Instant::now() < deadline, "no end of stream");
            }
            Err(e) => panic!("{e}"),
        }
    }
    let metrics = running.wait(Some(Duration::from_secs(60))).unwrap();
    // Greedy on random weights: up to 30 codes, those inside the DiT's
    // codebook sent on (the rest counted as dropped).
    assert!(
        !codes.is_empty() && codes.len() <= 30,
        "{} codes",
        codes.len()
    );
    assert!(codes.iter().all(|&c| c <= 8192));
    assert_eq!(flushes, 1, "one Flush after the turn's codes");
    // Every code is 2 mel frames of 240 samples: the streamed chunks join
    // to exactly the utterance's length.
    assert_eq!(audio.len(), codes.len() * 2 * 240, "{chunks} chunks");
    assert!(chunks >= 2, "the audio came in one piece: not streamed");
    let summary = metrics.summary();
    eprintln!("{summary}");
    for name in [
        "time_to_first_code_ms",
        "time_to_first_mel_ms",
        "time_to_first_audio_ms",
        "rtf",
    ] {
        assert!(summary.contains(name), "{name} missing from:\n{summary}");
    }
}

#[test]
fn a_cancel_mid_utterance_is_acknowledged_by_all_three() {
    let running = pipeline(1000, 10).start().unwrap();
    let turn = running.current_epoch();
    push_turn(&running, 7);
    // Wait until audio flows: every stage is busy with the turn.
    let first = pull(&running, "out", Duration::from_secs(600)).expect("first audio");
    assert_eq!(first.epoch, turn);
    let report = running.cancel(turn, Duration::from_secs(60)).unwrap();
    eprintln!(
        "cancel acknowledged by {}/{} stages in {:?} ms",
        report.acked, report.stages, report.ack_ms
    );
    assert_eq!(report.acked, report.stages, "every stage acknowledged");
    // Nothing of the cancelled turn after the acknowledgement.
    while let Some(m) = pull(&running, "out", Duration::from_millis(300)) {
        assert_ne!(m.epoch, turn, "audio of the cancelled turn after its ack");
    }
    // The next turn runs.
    let next = running.new_epoch();
    push_turn(&running, 9);
    let m = pull(&running, "out", Duration::from_secs(600)).expect("the next turn speaks");
    assert_eq!(m.epoch, next);
    running.stop();
    let _ = running.wait(Some(Duration::from_secs(60)));
}

/// Run one turn to its end; the metrics summary.
fn run_turn(mut running: Running) -> String {
    push_turn(&running, 3);
    running.close_input("in").unwrap();
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        while pull(&running, "codes", Duration::from_millis(1)).is_some() {}
        match running.pull("out", Duration::from_millis(200)) {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(edgeflow_graph::Error::Timeout(_)) => {
                assert!(Instant::now() < deadline, "no end of stream");
            }
            Err(e) => panic!("{e}"),
        }
    }
    running
        .wait(Some(Duration::from_secs(60)))
        .unwrap()
        .summary()
}

/// The three stages on three devices: the DiT on the GPU backend (wgpu),
/// the vocoder on the int8 NPU simulator, which reports its int8 error
/// against f32; the ops a device lacks fall back to the CPU, counted.
#[test]
fn placed_on_cpu_gpu_and_npu() {
    let summary = run_turn(placed(8, 2, ["cpu", "gpu", "npu"]).start().unwrap());
    eprintln!("{summary}");
    assert!(
        summary.contains("int8_sqnr_db"),
        "no int8 error in:\n{summary}"
    );
    assert!(
        summary.contains("fallback"),
        "no fallback count in:\n{summary}"
    );
}

#[test]
fn wrong_state_width_is_a_clear_error() {
    let mut running = pipeline(10, 2).start().unwrap();
    let v = vec![0.5f32; 11 * 32];
    running
        .push(
            "in",
            Payload::Tensor(Tensor::from_vec(v, &[1, 11, 32]).unwrap()),
        )
        .unwrap();
    running.close_input("in").unwrap();
    let (_, result) = running.finish(Some(Duration::from_secs(60)));
    let err = result.expect_err("a 32-wide state into a 64-wide talker must fail");
    let msg = format!("{err:#}");
    assert!(msg.contains("embedding_size is 64"), "{msg}");
}

/// The DiT with its linear weights in bf16 streams a turn to audio; an
/// unknown weight format is refused at build, naming the choices.
#[test]
fn dit_weights_in_bf16_run_and_an_unknown_format_is_refused() {
    let p = built(8, 2, ["cpu", "cpu", "cpu"], ", weights: bf16").unwrap();
    let summary = run_turn(p.start().unwrap());
    assert!(summary.contains("dit"), "{summary}");
    let err = match built(8, 2, ["cpu", "cpu", "cpu"], ", weights: fp8") {
        Ok(p) => p.start().map(|_| ()).expect_err("fp8 is no format"),
        Err(e) => e,
    };
    let msg = format!("{err:#}");
    assert!(
        msg.contains("unknown format `fp8`") && msg.contains("stored, f32 or bf16"),
        "{msg}"
    );
}
