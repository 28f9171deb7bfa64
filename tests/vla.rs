//! The vision-language-action tools end to end through the CLI: the
//! expert's recording is deterministic, and `edgeflow eval policy` runs the
//! shipped checkpoint in closed loop (DINOv2 and MiniLM from the model
//! cache, the head from pipelines/data) in every execution mode and delay,
//! writing its figures and plot.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::Path;
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn edgeflow(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "edgeflow {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn sim_record_writes_the_same_episodes_for_the_same_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for d in [&a, &b] {
        let args = ["sim", "record", "--episodes", "2", "--seed", "7", "--out"];
        let out = edgeflow(&[&args[..], &[d.to_str().unwrap()]].concat());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("\"summary\":true"), "{text}");
    }
    for ep in ["episode_000007", "episode_000008"] {
        for f in ["actions.f32", "state.f32", "frames.u8", "meta.json"] {
            let x = std::fs::read(a.join(ep).join(f)).unwrap();
            let y = std::fs::read(b.join(ep).join(f)).unwrap();
            assert!(!x.is_empty());
            assert!(x == y, "{ep}/{f} differs between two recordings");
        }
    }
    let e = Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(["sim", "record", "--execute", "20", "--out"])
        .arg(dir.path().join("c"))
        .output()
        .unwrap();
    assert!(!e.status.success());
    assert!(String::from_utf8_lossy(&e.stderr).contains("--execute"));
}

/// Needs the encoders in the model cache (`edgeflow models fetch
/// dinov2-vits14 minilm-l6`; the README's test command fetches them).
#[test]
fn eval_policy_runs_every_mode_and_delay_and_writes_its_figures() {
    let dir = tempfile::tempdir().unwrap();
    let (json, png) = (dir.path().join("eval.json"), dir.path().join("eval.png"));
    let out = edgeflow(&[
        "eval",
        "policy",
        "--episodes",
        "2",
        "--modes",
        "sync,async,rtc",
        "--delays",
        "0,4",
        "--wrong-instruction",
        "--episode-seconds",
        "8",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "3 modes x 2 delays");
    for r in runs {
        assert_eq!(r["episodes"], 2);
        let jump = r["boundary"]["jump_mm"].as_f64().unwrap();
        assert!(jump.is_finite() && jump >= 0.0, "{r}");
    }
    // The figures name the CPU and the expert's result on the same seeds.
    assert!(v["expert"][0].as_u64().is_some());
    assert!(v["cpu"].as_str().is_some_and(|c| !c.is_empty()));
    assert_eq!(v["wrong_instruction"]["episodes"], 2);
    let png = std::fs::read(&png).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG file");
    let side = |o: usize| u32::from_be_bytes([png[o], png[o + 1], png[o + 2], png[o + 3]]);
    assert!(
        side(16) >= 200 && side(20) >= 100,
        "{} x {}",
        side(16),
        side(20)
    );
}

/// The shipped head drives the pusher from the camera and the instruction
/// (DINOv2 and MiniLM from the model cache) and solves held-out episodes:
/// 37 of seeds 100000..100049 on the Intel Xeon it was trained on, 31 on
/// an AVX2-only AMD EPYC (Zen 3), the expert all. A single episode's
/// outcome flips with float noise: on that EPYC, scaling the head's
/// condition tokens by 1 ± 1e-6 moved seeds 100000..100009 from 3 solved
/// to 6-7 (three noise seeds), and the encoders there match their
/// references to 2e-5. So the test reads a rate over 50 episodes, not 10:
/// at least half. A head that has stopped reading the scene (the
/// transformer heads before it: 0-2 of 10) fails it.
#[test]
fn the_shipped_head_solves_held_out_episodes_from_the_camera() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("eval.json");
    edgeflow(&[
        "eval",
        "policy",
        "--episodes",
        "50",
        "--modes",
        "sync",
        "--delays",
        "0",
        "--json",
        json.to_str().unwrap(),
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let solved = v["runs"][0]["successes"].as_u64().unwrap();
    assert!(solved >= 25, "the shipped head solved {solved} of 50: {v}");
}

/// DAgger's round trip through the CLI: the shipped head drives an episode
/// while the expert labels every step, and `train policy` fine-tunes the
/// head on it (`--init`). Needs the encoders in the model cache.
#[test]
fn sim_record_with_a_policy_labels_its_episodes_and_train_fine_tunes_on_them() {
    let dir = tempfile::tempdir().unwrap();
    let eps = dir.path().join("dagger");
    let head = "pipelines/data/vla-policy.safetensors";
    let args = [
        "sim",
        "record",
        "--episodes",
        "1",
        "--seed",
        "11",
        "--episode-seconds",
        "4",
        "--policy",
        head,
    ];
    let out = edgeflow(&[&args[..], &["--out", eps.to_str().unwrap()]].concat());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"labelled_by\":\"expert\""), "{text}");
    let ep = eps.join("episode_000011");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ep.join("meta.json")).unwrap()).unwrap();
    let steps = meta["steps"].as_u64().unwrap();
    assert!(steps > 0);
    assert_eq!(meta["labels"]["shape"], serde_json::json!([steps, 16, 2]));
    let labels = std::fs::read(ep.join("labels.f32")).unwrap();
    assert_eq!(labels.len() as u64, steps * 16 * 2 * 4);
    // The labels are the expert's plans, not the commands the policy sent.
    let actions = std::fs::read(ep.join("actions.f32")).unwrap();
    let first = |b: &[u8], stride: usize| -> Vec<[u8; 8]> {
        b.chunks(stride)
            .map(|r| r[..8].try_into().unwrap())
            .collect()
    };
    assert_ne!(first(&labels, 128), first(&actions, 8));

    let tuned = dir.path().join("tuned.safetensors");
    let out = edgeflow(&[
        "train",
        "policy",
        "--episodes",
        eps.to_str().unwrap(),
        "--init",
        head,
        "--steps",
        "3",
        "--batch",
        "4",
        "--frame-stride",
        "100",
        "--out",
        tuned.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("trained 3 steps"), "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("fine-tuning"));
    // A head of another horizon cannot take these labels.
    let e = Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args([&args[..], &["--horizon", "8", "--out"]].concat())
        .arg(dir.path().join("h8"))
        .current_dir(repo())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&e.stderr);
    assert!(!e.status.success() && err.contains("--horizon 16"), "{err}");
    // The refused recording leaves no episode behind.
    assert!(!dir.path().join("h8").join("episode_000011").exists());
}
