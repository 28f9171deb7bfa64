//! The training twin (candle, autograd) and the runtime head compute the
//! same function on the same weights; sampling freezes the RTC prefix and
//! stops on cancel.

use edgeflow_action::config::{Arch, Config, Normalizer, Prediction};
use edgeflow_action::model::ActionHead;
use edgeflow_action::policy::{Observation, Policy, RtcMode};
use edgeflow_action::rng::Rng;
use edgeflow_action::train::TrainNet;
use edgeflow_action::Error;
use edgeflow_nn::VarBuilder;
use edgeflow_runtime::{Device, DeviceSpec, Tensor};

fn cpu() -> Device {
    edgeflow_backends::open(DeviceSpec::Cpu).expect("cpu")
}

fn small() -> Config {
    Config {
        feature_dim: 24,
        vision_grid: 2,
        vision_stack: 1,
        horizon: 8,
        d_model: 32,
        n_layers: 2,
        n_heads: 4,
        mlp_dim: 48,
        max_prefix: 4,
        ..Config::default()
    }
}

/// A net with every weight random at std 0.3 (the default init makes the
/// output tiny, which would make the comparison weak).
fn random_net(cfg: &Config, seed: u64) -> TrainNet {
    let net = TrainNet::init(cfg, seed).expect("init");
    let mut rng = Rng::new(seed + 100);
    for v in net.vars() {
        let dims = v.dims().to_vec();
        let n: usize = dims.iter().product();
        let data: Vec<f32> = rng.normals(n).into_iter().map(|x| 0.3 * x).collect();
        let t = candle_core::Tensor::from_vec(data, dims.as_slice(), &candle_core::Device::Cpu)
            .expect("t");
        v.set(&t).expect("set");
    }
    net
}

fn norm(cfg: &Config) -> Normalizer {
    Normalizer {
        state_mean: vec![0.01; cfg.state_dim],
        state_std: vec![0.2; cfg.state_dim],
        action_mean: vec![0.0, 0.01],
        action_std: vec![0.05, 0.04],
        vision_mean: vec![0.1; cfg.feature_dim],
        vision_std: vec![0.9; cfg.feature_dim],
        text_mean: vec![-0.1; cfg.feature_dim],
        text_std: vec![1.1; cfg.feature_dim],
    }
}

#[test]
fn runtime_head_matches_the_training_twin_on_the_same_weights() {
    // With spatial-softmax keypoints (the default) and with patch tokens,
    // each prediction, with and without the condition on every action token.
    twins_agree(small());
    twins_agree(Config {
        keypoint_relative_scale: 0.0,
        ..small()
    });
    twins_agree(Config {
        keypoints: 0,
        ..small()
    });
    twins_agree(Config {
        prediction: Prediction::Sample,
        ..small()
    });
    twins_agree(Config {
        condition_actions: true,
        ..small()
    });
    twins_agree(Config {
        condition_actions: true,
        keypoints: 0,
        ..small()
    });
    // The MLP body, on keypoints and on the true state's layout.
    twins_agree(Config {
        arch: Arch::Mlp,
        ..small()
    });
    // Keypoint tokens that carry the patches under them, in both bodies.
    twins_agree(Config {
        keypoint_features: true,
        ..small()
    });
    twins_agree(Config {
        arch: Arch::Mlp,
        keypoint_features: true,
        prediction: Prediction::Sample,
        ..small()
    });
    // The first keypoints' angle read-outs, in both bodies, with and
    // without the relative positions and the patch features.
    twins_agree(Config {
        keypoint_angles: 2,
        ..small()
    });
    // The scene through the keypoints alone: the CLS slot reads zeros.
    twins_agree(Config {
        arch: Arch::Mlp,
        keypoint_angles: 2,
        cls_token: false,
        prediction: Prediction::Sample,
        ..small()
    });
    twins_agree(Config {
        arch: Arch::Mlp,
        keypoint_angles: 1,
        keypoint_relative_scale: 0.0,
        keypoint_features: true,
        prediction: Prediction::Sample,
        ..small()
    });
    twins_agree(Config {
        arch: Arch::Mlp,
        keypoints: 0,
        privileged: true,
        state_dim: 14,
        prediction: Prediction::Sample,
        ..small()
    });
}

fn twins_agree(cfg: Config) {
    let net = random_net(&cfg, 3);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("head.safetensors");
    net.save(&norm(&cfg), &path).expect("save");
    assert_eq!(Config::from_checkpoint(&path).expect("cfg"), cfg);

    let dev = cpu();
    let head =
        ActionHead::load(&VarBuilder::open(&[&path], &dev).expect("vb"), &cfg).expect("load");
    assert_eq!(head.normalizer(), &norm(&cfg));

    let b = 3;
    let (h, ad) = (cfg.horizon, cfg.action_dim);
    let mut rng = Rng::new(9);
    let vision = rng.normals(b * cfg.vision_tokens() * cfg.feature_dim);
    let text = rng.normals(b * cfg.feature_dim);
    let state = rng.normals(b * cfg.state_dim);
    let origin = rng.normals(b * 2);
    let x = rng.normals(b * h * ad);
    // Per-token times, some frozen (t = 1) as in real-time chunking.
    let times: Vec<f32> = (0..b * h)
        .map(|i| if i % h < 2 { 1.0 } else { rng.uniform() })
        .collect();
    let (temb, tdims) = cfg.time_input(&times);

    let rt = |v: &[f32], d: &[usize]| Tensor::from_slice(v, d).expect("rt");
    let cond = head
        .condition(
            &dev,
            &rt(&vision, &[b, cfg.vision_tokens(), cfg.feature_dim]),
            &rt(&text, &[b, 1, cfg.feature_dim]),
            &rt(&state, &[b, 1, cfg.state_dim]),
            &origin,
        )
        .expect("cond");
    let got = head
        .forward(&dev, &cond, &rt(&x, &[b, h, ad]), &rt(&temb, &tdims))
        .expect("v")
        .to_vec_f32()
        .expect("host");
    // The sampler's velocity from that output: the output itself, or
    // (x1_hat - x) / (1 - t) from a predicted clean chunk; 0 on frozen
    // tokens either way.
    let vel = head
        .velocity(&dev, &cond, &rt(&x, &[b, h, ad]), &times)
        .expect("velocity")
        .to_vec_f32()
        .expect("host");
    for (i, v) in vel.iter().enumerate() {
        let t = times[i / ad];
        let want = match (t >= 1.0, cfg.prediction) {
            (true, _) => 0.0,
            (false, Prediction::Velocity) => got[i],
            (false, Prediction::Sample) => (got[i] - x[i]) / (1.0 - t).max(1e-3),
        };
        assert!(
            (v - want).abs() <= 1e-5 * want.abs().max(1.0),
            "velocity {i} at t {t}: {v} vs {want}"
        );
    }

    let ct = |v: &[f32], d: &[usize]| net.tensor(v.to_vec(), d).expect("ct");
    let c2 = net
        .condition(
            &ct(&vision, &[b, cfg.vision_tokens(), cfg.feature_dim]),
            &ct(&text, &[b, 1, cfg.feature_dim]),
            &ct(&state, &[b, 1, cfg.state_dim]),
            &ct(&origin, &[b, 1, 2]),
        )
        .expect("cond");
    let want: Vec<f32> = net
        .forward(&c2, &ct(&x, &[b, h, ad]), &ct(&temb, &tdims))
        .expect("v")
        .flatten_all()
        .expect("flat")
        .to_vec1()
        .expect("vec");

    // The keypoints themselves (same softmax, host vs candle).
    let kv = rt(&vision, &[b, cfg.vision_tokens(), cfg.feature_dim]);
    let kp = head.keypoints(&dev, &kv).expect("kp");
    if cfg.keypoints > 0 {
        let want_kp: Vec<f32> = net
            .keypoints(&ct(&vision, &[b, cfg.vision_tokens(), cfg.feature_dim]))
            .expect("kp")
            .flatten_all()
            .expect("flat")
            .to_vec1()
            .expect("vec");
        assert_eq!(kp.len(), b * cfg.keypoints * 2);
        let e = kp
            .iter()
            .zip(&want_kp)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        // Coordinates in [-1, 1]: rounding only.
        assert!(e < 1e-5, "keypoints differ by {e}");
        assert!(kp.iter().all(|v| v.abs() <= 1.0));
    } else {
        assert!(kp.is_empty());
    }

    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(&want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    // Same f32 math in a different order (fused attention and layer norm
    // kernels vs candle's composed ops): differences are rounding, ~1e-6 of
    // the output's scale; 1e-4 relative leaves room and still catches any
    // wrong name, transpose or missing term (those are O(1)).
    assert!(scale > 0.1, "outputs too small to compare: {scale}");
    assert!(
        err <= 1e-4 * scale,
        "max |runtime - twin| = {err:e} at scale {scale}"
    );
}

fn policy(rtc: RtcMode) -> (Policy, Config, tempfile::TempDir) {
    let cfg = small();
    let net = random_net(&cfg, 5);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("head.safetensors");
    net.save(&norm(&cfg), &path).expect("save");
    let p = Policy::load(&path, &cpu(), 10, rtc, 1).expect("policy");
    (p, cfg, dir)
}

fn obs(cfg: &Config) -> Observation {
    let mut rng = Rng::new(4);
    // A 4x4 patch grid (pooled to 2x2 by the policy).
    Observation {
        vision: rng.normals(17 * cfg.feature_dim),
        instruction: rng.normals(cfg.feature_dim),
        state: vec![0.05, -0.1, 0.0, 0.1],
    }
}

#[test]
fn prefix_mode_freezes_min_of_delay_and_queue_and_inpaints_the_rest() {
    let (mut p, cfg, _d) = policy(RtcMode::Prefix);
    let o = obs(&cfg);
    let prefix: Vec<f32> = (0..6)
        .flat_map(|k| [0.01 * k as f32, -0.02 * k as f32])
        .collect();
    // delay 3 < queued 6 -> 3 frozen.
    let c = p.chunk(&o, &prefix, 3, || false).expect("chunk");
    assert_eq!(c.frozen, 3);
    assert_eq!(c.actions.len(), cfg.horizon * 2);
    assert_eq!(&c.actions[..6], &prefix[..6]);
    assert!(c.actions.iter().all(|v| v.is_finite()));
    // delay beyond the queue and the trained maximum: capped.
    assert_eq!(p.chunk(&o, &prefix[..4], 7, || false).expect("c").frozen, 2);
    assert_eq!(
        p.chunk(&o, &prefix, 7, || false).expect("c").frozen,
        cfg.max_prefix
    );
    assert_eq!(p.chunk(&o, &[], 3, || false).expect("c").frozen, 0);
    // The frozen prefix conditions what follows: a different prefix gives a
    // different continuation for the same noise seed.
    let (mut p1, ..) = policy(RtcMode::Prefix);
    let (mut p2, ..) = policy(RtcMode::Prefix);
    let other: Vec<f32> = prefix.iter().map(|v| v + 0.1).collect();
    let a = p1.chunk(&o, &prefix, 3, || false).expect("a");
    let b = p2.chunk(&o, &other, 3, || false).expect("b");
    assert!(a.actions[6..]
        .iter()
        .zip(&b.actions[6..])
        .any(|(x, y)| (x - y).abs() > 1e-4));
}

#[test]
fn none_mode_ignores_the_prefix() {
    let (mut p, cfg, _d) = policy(RtcMode::None);
    let (mut q, ..) = policy(RtcMode::None);
    let o = obs(&cfg);
    let a = p.chunk(&o, &[0.1, 0.1, 0.2, 0.2], 2, || false).expect("a");
    let b = q.chunk(&o, &[], 0, || false).expect("b");
    assert_eq!(a.frozen, 0);
    assert_eq!(a.actions, b.actions, "same seed, prefix ignored");
}

#[test]
fn a_cancel_between_ode_steps_stops_sampling() {
    let (mut p, cfg, _d) = policy(RtcMode::Prefix);
    let mut n = 0;
    let r = p.chunk(&obs(&cfg), &[], 0, || {
        n += 1;
        n > 4
    });
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    assert_eq!(n, 5);
}

#[test]
fn bad_observations_are_clear_errors() {
    let (mut p, cfg, _d) = policy(RtcMode::Prefix);
    let good = obs(&cfg);
    let mut o = good.clone();
    o.vision.truncate(16 * cfg.feature_dim);
    let e = p.chunk(&o, &[], 0, || false).expect_err("grid");
    assert!(e.to_string().contains("square patch grid"), "{e}");
    // Extra state values (velocities a position-only head ignores) are
    // fine; too few are not.
    let mut o = good.clone();
    o.state.push(0.0);
    p.chunk(&o, &[], 0, || false).expect("a longer state");
    let mut o = good.clone();
    o.state.truncate(1);
    let e = p.chunk(&o, &[], 0, || false).expect_err("state");
    assert!(e.to_string().contains("robot state has 1 values"), "{e}");
    let mut o = good.clone();
    o.instruction[0] = f32::NAN;
    assert!(p.chunk(&o, &[], 0, || false).is_err());
    let e = p.chunk(&good, &[0.1], 1, || false).expect_err("prefix");
    assert!(e.to_string().contains("prefix"), "{e}");
}

#[test]
fn an_ensemble_follows_the_mean_of_its_heads_and_refuses_a_stranger() {
    let dir = tempfile::tempdir().expect("tmp");
    let save = |cfg: &Config, seed: u64, n: &Normalizer, name: &str| {
        let path = dir.path().join(name);
        random_net(cfg, seed).save(n, &path).expect("save");
        path
    };
    let cfg = small();
    // Two heads of the same shape from different seeds, and one with
    // other options (an MLP body reading angles): all on one
    // normalisation, as heads trained on the same data are.
    let a = save(&cfg, 5, &norm(&cfg), "a.safetensors");
    let b = save(&cfg, 6, &norm(&cfg), "b.safetensors");
    let mlp = Config {
        arch: Arch::Mlp,
        keypoint_angles: 2,
        prediction: Prediction::Sample,
        ..cfg.clone()
    };
    let c = save(&mlp, 7, &norm(&cfg), "c.safetensors");
    let o = obs(&cfg);
    // One Euler step from the same noise: the chunk is affine in the
    // velocity, so the ensemble's chunk is the mean of its heads' chunks.
    let chunk = |paths: &[&std::path::Path]| {
        let mut p = Policy::load_ensemble(paths, &cpu(), 1, RtcMode::Prefix, 3).expect("load");
        p.chunk(&o, &[0.01, 0.02], 1, || false)
            .expect("chunk")
            .actions
    };
    for (x, y) in [(&a, &b), (&a, &c)] {
        let (cx, cy, both) = (chunk(&[x]), chunk(&[y]), chunk(&[x, y]));
        let spread = cx
            .iter()
            .zip(&cy)
            .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(spread > 1e-3, "the heads should differ: {spread}");
        let err = both
            .iter()
            .zip(cx.iter().zip(&cy))
            .fold(0f32, |m, (e, (p, q))| m.max((e - 0.5 * (p + q)).abs()));
        // f32 rounding of the same sums in another order.
        assert!(
            err <= 1e-5 * (1.0 + spread),
            "ensemble off the mean by {err}"
        );
        // The frozen prefix is the queued action, exactly.
        assert_eq!(&both[..2], &[0.01, 0.02]);
    }
    // Ten steps, three heads: runs and stays finite.
    let mut p = Policy::load_ensemble(&[&a, &b, &c], &cpu(), 10, RtcMode::Prefix, 3).expect("3");
    assert_eq!(p.heads().len(), 3);
    assert!(p
        .chunk(&o, &[], 0, || false)
        .expect("chunk")
        .actions
        .iter()
        .all(|v| v.is_finite()));
    // Another chunk length, or other training data (another action
    // normalisation), cannot join.
    let long = Config {
        horizon: 12,
        ..cfg.clone()
    };
    let l = save(&long, 8, &norm(&long), "long.safetensors");
    let e = Policy::load_ensemble(&[&a, &l], &cpu(), 10, RtcMode::Prefix, 0).expect_err("horizon");
    assert!(
        e.to_string().contains("cannot join") && e.to_string().contains("horizon"),
        "{e}"
    );
    let other = Normalizer {
        action_std: vec![0.06, 0.04],
        ..norm(&cfg)
    };
    let d = save(&cfg, 9, &other, "d.safetensors");
    let e = Policy::load_ensemble(&[&a, &d], &cpu(), 10, RtcMode::Prefix, 0).expect_err("norm");
    assert!(e.to_string().contains("normalisation"), "{e}");
    let none: [&std::path::Path; 0] = [];
    assert!(Policy::load_ensemble(&none, &cpu(), 10, RtcMode::Prefix, 0).is_err());
}

#[test]
fn a_file_that_is_not_a_head_checkpoint_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("x.safetensors");
    std::fs::write(&path, b"not safetensors").expect("w");
    let e = Policy::load(&path, &cpu(), 10, RtcMode::Prefix, 0).expect_err("bad");
    assert!(e.to_string().contains("safetensors"), "{e}");
}

/// Chunk latency of the default (shipped) shape on the CPU, 10 Euler
/// steps: `cargo test -p edgeflow-action --test twins -- --ignored
/// --nocapture chunk_latency`.
#[test]
#[ignore = "timing figure, not a check"]
fn chunk_latency_of_the_default_shape() {
    let cfg = Config::default();
    let net = TrainNet::init(&cfg, 0).expect("init");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("head.safetensors");
    net.save(&Normalizer::identity(&cfg), &path).expect("save");
    let mut p = Policy::load(&path, &cpu(), 10, RtcMode::Prefix, 0).expect("load");
    let mut rng = Rng::new(1);
    let o = Observation {
        vision: rng.normals(65 * cfg.feature_dim),
        instruction: rng.normals(cfg.feature_dim),
        state: vec![0.0; 4],
    };
    let mut ms = Vec::new();
    for _ in 0..30 {
        let t0 = std::time::Instant::now();
        p.chunk(&o, &[0.0; 8], 4, || false).expect("chunk");
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    eprintln!(
        "chunk (10 Euler steps, H = {}): p50 {:.2} ms, max {:.2} ms",
        cfg.horizon, ms[15], ms[29]
    );
}
