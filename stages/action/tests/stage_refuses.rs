//! The `action_head` stage refuses a privileged diagnostic head (it reads
//! the simulator's true state, which no robot reports) and an ensemble
//! member that is missing or does not fit.

use edgeflow_action::config::{Config, Normalizer};
use edgeflow_action::stage::ActionHeadKind;
use edgeflow_action::train::TrainNet;
use edgeflow_graph::{BuildEnv, DeviceOpener, Params, StageFactory};
use edgeflow_runtime::DeviceSpec;

/// A small head with keypoints on a 2 x 2 grid.
fn small() -> Config {
    Config {
        feature_dim: 24,
        vision_grid: 2,
        horizon: 8,
        d_model: 32,
        n_layers: 1,
        n_heads: 4,
        mlp_dim: 48,
        max_prefix: 4,
        ..Config::default()
    }
}

fn build(path: &std::path::Path) -> Result<(), String> {
    build_ensemble(path, &[])
}

fn build_ensemble(path: &std::path::Path, more: &[&str]) -> Result<(), String> {
    let mut values = std::collections::BTreeMap::new();
    values.insert(
        "model".to_string(),
        serde_json::Value::String(path.display().to_string()),
    );
    if !more.is_empty() {
        values.insert("ensemble".to_string(), serde_json::json!(more));
    }
    let env = BuildEnv {
        stage_id: "head".into(),
        device: DeviceSpec::Cpu,
        threads: 1,
        base_dir: path.parent().expect("dir").to_path_buf(),
        device_opener: Some(DeviceOpener::new(edgeflow_backends::open)),
    };
    ActionHeadKind
        .build(&Params::new("head", values), &env)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn a_privileged_head_is_refused_with_what_to_do_and_a_vision_head_builds() {
    let dir = tempfile::tempdir().expect("tmp");
    let small = Config {
        vision_grid: 1,
        keypoints: 0,
        ..small()
    };
    let privileged = Config {
        privileged: true,
        state_dim: 16,
        vision_norm: false,
        ..small.clone()
    };
    for (name, cfg) in [("seeing", &small), ("privileged", &privileged)] {
        let net = TrainNet::init(cfg, 0).expect("init");
        net.save(
            &Normalizer::identity(cfg),
            &dir.path().join(format!("{name}.safetensors")),
        )
        .expect("save");
    }
    build(&dir.path().join("seeing.safetensors")).expect("a vision head builds");
    let e = build(&dir.path().join("privileged.safetensors")).expect_err("refused");
    assert!(e.contains("privileged") && e.contains("eval policy"), "{e}");
}

#[test]
fn an_ensemble_builds_from_relative_paths_and_refuses_a_missing_or_foreign_member() {
    let dir = tempfile::tempdir().expect("tmp");
    let small = small();
    let long = Config {
        horizon: 12,
        ..small.clone()
    };
    for (name, cfg, seed) in [("a", &small, 0), ("b", &small, 1), ("long", &long, 2)] {
        TrainNet::init(cfg, seed)
            .expect("init")
            .save(
                &Normalizer::identity(cfg),
                &dir.path().join(format!("{name}.safetensors")),
            )
            .expect("save");
    }
    let a = dir.path().join("a.safetensors");
    // Relative to the pipeline's folder, as `model` is.
    build_ensemble(&a, &["b.safetensors"]).expect("two heads build");
    let e = build_ensemble(&a, &["missing.safetensors"]).expect_err("missing");
    assert!(
        e.contains("ensemble") && e.contains("missing.safetensors"),
        "{e}"
    );
    let e = build_ensemble(&a, &["long.safetensors"]).expect_err("another horizon");
    assert!(e.contains("cannot join") && e.contains("horizon"), "{e}");
}
