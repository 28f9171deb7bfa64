//! A small random-initialised Dinov2 (2 layers, 32 wide, patch 4) on the
//! GPU backend (wgpu; Mesa's lavapipe on the build machines) and on the
//! NPU simulator, against the CPU backend; fallbacks to the CPU reported.
//! A device that does not open here is skipped with a message.

use edgeflow_dinov2::{Config, Dinov2};
use edgeflow_nn::VarBuilder;
use edgeflow_runtime::{Device, DeviceSpec, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

fn tiny() -> Config {
    Config {
        hidden_size: 32,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        patch_size: 4,
        ..Config::vits14()
    }
}

/// Deterministic pseudo-random values in [-scale, scale].
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn write_checkpoint(path: &Path, cfg: &Config) {
    let (d, p, m) = (
        cfg.hidden_size,
        cfg.patch_size,
        cfg.hidden_size * cfg.mlp_ratio,
    );
    let mut t = BTreeMap::new();
    let mut seed = 0;
    let mut put = |name: String, dims: &[usize], scale: f32, offset: f32| {
        seed += 1;
        let v = values(dims.iter().product(), seed, scale)
            .into_iter()
            .map(|x| x + offset)
            .collect();
        t.insert(name, Tensor::from_vec(v, dims).expect("tensor"));
    };
    put("embeddings.cls_token".into(), &[1, 1, d], 0.5, 0.0);
    // A 3 x 3 pretraining grid, resampled to whatever the input needs.
    put(
        "embeddings.position_embeddings".into(),
        &[1, 10, d],
        0.5,
        0.0,
    );
    put(
        "embeddings.patch_embeddings.projection.weight".into(),
        &[d, 3, p, p],
        0.2,
        0.0,
    );
    put(
        "embeddings.patch_embeddings.projection.bias".into(),
        &[d],
        0.1,
        0.0,
    );
    for i in 0..cfg.num_hidden_layers {
        let l = format!("encoder.layer.{i}");
        for n in ["norm1", "norm2"] {
            put(format!("{l}.{n}.weight"), &[d], 0.1, 1.0);
            put(format!("{l}.{n}.bias"), &[d], 0.1, 0.0);
        }
        for q in ["query", "key", "value"] {
            put(
                format!("{l}.attention.attention.{q}.weight"),
                &[d, d],
                0.3,
                0.0,
            );
            put(format!("{l}.attention.attention.{q}.bias"), &[d], 0.1, 0.0);
        }
        put(
            format!("{l}.attention.output.dense.weight"),
            &[d, d],
            0.3,
            0.0,
        );
        put(format!("{l}.attention.output.dense.bias"), &[d], 0.1, 0.0);
        put(format!("{l}.layer_scale1.lambda1"), &[d], 0.2, 0.5);
        put(format!("{l}.layer_scale2.lambda1"), &[d], 0.2, 0.5);
        put(format!("{l}.mlp.fc1.weight"), &[m, d], 0.3, 0.0);
        put(format!("{l}.mlp.fc1.bias"), &[m], 0.1, 0.0);
        put(format!("{l}.mlp.fc2.weight"), &[d, m], 0.2, 0.0);
        put(format!("{l}.mlp.fc2.bias"), &[d], 0.1, 0.0);
    }
    put("layernorm.weight".into(), &[d], 0.1, 1.0);
    put("layernorm.bias".into(), &[d], 0.1, 0.0);
    edgeflow_runtime::weights::write_safetensors(path, &t, None).expect("write");
}

fn run(dev: &Device, path: &Path, pixels: &Tensor) -> Vec<f32> {
    let cfg = tiny();
    let model = Dinov2::load(&VarBuilder::open(&[path], dev).expect("open"), &cfg).expect("load");
    let x = dev.place(pixels).expect("place");
    let y = model.forward(dev, &x).expect("forward");
    // 2 images, 18 x 22 pixels: a 4 x 5 grid (remainders dropped).
    assert_eq!(y.dims(), &[2, 21, 32]);
    dev.to_host(&y).expect("host").to_vec_f32().expect("values")
}

fn try_open(spec: DeviceSpec) -> Option<Device> {
    match edgeflow_backends::open(spec) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipping {spec:?}: {e}");
            None
        }
    }
}

#[test]
fn gpu_and_npu_agree_with_the_cpu_on_a_small_model() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("tiny.safetensors");
    write_checkpoint(&path, &tiny());
    let pixels = Tensor::from_vec(values(2 * 3 * 18 * 22, 99, 2.0), &[2, 3, 18, 22]).expect("x");
    let cpu = edgeflow_backends::open(DeviceSpec::Cpu).expect("cpu");
    let want = run(&cpu, &path, &pixels);
    // Batch items are independent: the second image alone gives its rows.
    let single = Tensor::from_vec(
        pixels.to_vec_f32().expect("v")[3 * 18 * 22..].to_vec(),
        &[1, 3, 18, 22],
    )
    .expect("x1");
    let cfg = tiny();
    let model = Dinov2::load(&VarBuilder::open(&[&path], &cpu).expect("open"), &cfg).expect("load");
    let one = model
        .forward(&cpu, &single)
        .expect("forward")
        .to_vec_f32()
        .expect("v");
    let worst = one
        .iter()
        .zip(&want[21 * 32..])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-5, "batch of 2 vs 1: {worst:.2e}");
    if let Some(gpu) = try_open(DeviceSpec::Gpu(0)) {
        let got = run(&gpu, &path, &pixels);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let stats = gpu.stats().snapshot();
        eprintln!(
            "gpu vs cpu: max |diff| {worst:.2e}; {} ops, {} CPU fallbacks {:?}",
            stats.ops, stats.fallback_ops, stats.fallback_by_op
        );
        // f32 on both; the GPU's reductions sum in another order.
        assert!(worst < 1e-3, "gpu max |diff| {worst:.2e}");
    }
    if let Some(npu) = try_open(DeviceSpec::Npu(0)) {
        let got = run(&npu, &path, &pixels);
        let dot: f64 = got
            .iter()
            .zip(&want)
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum();
        let na: f64 = got.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt();
        let cos = dot / (na * nb);
        let stats = npu.stats().snapshot();
        eprintln!(
            "npu simulator vs cpu: cosine {cos:.5}; {} ops, {} CPU fallbacks {:?}",
            stats.ops, stats.fallback_ops, stats.fallback_by_op
        );
        // The simulator quantizes linear layers to int8: close, not equal.
        assert!(cos > 0.99, "npu cosine {cos:.5}");
    }
}
