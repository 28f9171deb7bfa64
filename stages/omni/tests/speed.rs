//! Timing of token2wav at Qwen2.5-Omni's real configuration on seeded
//! random weights, with the CPU device's op profile: BigVGAN on 50 mel
//! frames and one guided DiT velocity on 50 codes. Not a correctness test
//! (`cargo test -p edgeflow-omni --test speed -- --ignored --nocapture`).

use edgeflow_nn::VarBuilder;
use edgeflow_omni::{bigvgan, dit};
use edgeflow_runtime::weights::RandomWeights;
use edgeflow_runtime::{render_op_profile, Device, DeviceSpec, Tensor};
use std::collections::BTreeMap;
use std::time::Instant;

fn cpu() -> Device {
    edgeflow_backends::open(DeviceSpec::Cpu).expect("cpu")
}

/// Time `f` `runs` times (after one warm-up), print the best, then the op
/// profile of one more run: top rows by (op, shapes) and totals per op.
fn profile(dev: &Device, label: &str, runs: usize, mut f: impl FnMut()) {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let t0 = Instant::now();
        f();
        best = best.min(t0.elapsed().as_secs_f64() * 1e3);
    }
    eprintln!("{label}: best of {runs}: {best:.0} ms");
    let stats = dev.stats();
    stats.profile_ops(true);
    f();
    let rows = stats.op_profile();
    stats.profile_ops(false);
    eprintln!("{}", render_op_profile(&rows, 40));
    let mut by_op: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for r in &rows {
        let name = r.op.split(' ').next().unwrap_or_default().to_string();
        let e = by_op.entry(name).or_default();
        e.0 += r.calls;
        e.1 += r.seconds;
    }
    let total: f64 = rows.iter().map(|r| r.seconds).sum();
    let mut v: Vec<_> = by_op.into_iter().collect();
    v.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    for (op, (calls, s)) in v.iter().take(10) {
        eprintln!(
            "  {:>9.1} ms {:>5.1}% {calls:>6}  {op}",
            s * 1e3,
            100.0 * s / total
        );
    }
}

#[test]
#[ignore]
fn bigvgan_50_frames() {
    let dev = cpu();
    let cfg = bigvgan::Config::default();
    let w = RandomWeights::new("random:bigvgan", bigvgan::weight_shapes(&cfg), 2).expect("random");
    let m = bigvgan::BigVgan::load(&VarBuilder::from_reader(w, &dev), &cfg).expect("load");
    let frames = 50;
    let mel: Vec<f32> = (0..80 * frames)
        .map(|i| -5.0 + 2.0 * (i as f32 * 0.37).sin())
        .collect();
    let mel = Tensor::from_vec(mel, &[1, 80, frames]).expect("mel");
    profile(&dev, "BigVGAN, 50 frames", 2, || {
        let y = m.forward(&mel).expect("forward");
        let _ = dev.to_host(&y).expect("host");
    });
}

#[test]
#[ignore]
fn dit_one_velocity() {
    let dev = cpu();
    let cfg = dit::Config::default();
    let w = RandomWeights::new("random:dit", dit::weight_shapes(&cfg), 1).expect("random");
    let m = dit::Dit::load(&VarBuilder::from_reader(w, &dev), &cfg).expect("load");
    let cond = dev
        .rand_normal(&[1, cfg.enc_emb_dim], 0.0, 1.0, 3)
        .expect("cond");
    let ref_mel = dev
        .rand_normal(&[1, 300, cfg.mel_dim], 0.0, 1.0, 4)
        .expect("ref");
    let spk = m.speaker(&cond, &ref_mel).expect("speaker");
    let codes: Vec<u32> = (0..50)
        .map(|i| ((i * 7919) % cfg.num_embeds) as u32)
        .collect();
    let c = m.prepare(&spk, &codes, true).expect("prepare");
    let x = m.noise(codes.len() * cfg.repeats, 5).expect("noise");
    profile(&dev, "DiT velocity, 50 codes, guided", 3, || {
        let v = m.velocity(&c, &x, 0.3, 0.5).expect("velocity");
        let _ = dev.to_host(&v).expect("host");
    });
}
