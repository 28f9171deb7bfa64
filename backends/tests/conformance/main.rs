//! Backend conformance: every op on every backend that `probe_all` reports
//! available, against an f64 reference written here in plain loops, on
//! seeded random inputs with odd sizes (1, 7, 33, 129...).
//!
//! Each op runs through `Device::run` with inputs placed once on the device,
//! [`REPEAT`] times (the NPU simulator runs its first calls in f32 while it
//! calibrates, then in int8: both paths are checked). When the backend does
//! not support an op natively, the dispatcher must run it on the CPU: the
//! test asserts the fallback counter moved by exactly one per run, and the
//! result is checked all the same.
//!
//! Tolerances (error = max |got - ref| / max(1, max |ref|)), per backend and dtype:
//! - CPU f32: 1e-4 (f32 rounding over sums of at most a few hundred terms).
//! - GPU f32: 1e-3 (shader math: `exp`, `tanh`, division may be
//!   approximate to a few ulp on drivers such as lavapipe).
//! - f16: 1e-2, bf16: 4e-2 (10 and 7 mantissa bits, compounded over a sum).
//! - Q8_0 / Q4_1 / Q4_0 linear vs the dequantized weights: 1e-2 / 3e-2 / 3e-2
//!   (the CPU backend's kernels quantize the activations to 8 bits per
//!   block of 32, as llama.cpp does); Q5_0 / Q4_K / Q5_K 3e-2 and Q6_K 2e-2
//!   (int8 activations per block of 32 or super-block of 256).
//! - NPU simulator (int8): error relative to the reference's range
//!   (max - min) below [`NPU_RANGE_TOL`]: about 13 int8 steps, the bound for
//!   a few chained requantizations. The measured errors are printed.

#![allow(clippy::unwrap_used)]

use edgeflow_backends::{open, probe_all, ProbeReport};
use edgeflow_runtime::{rng, Device, DeviceKind, DeviceSpec, Op, Tensor, UnaryOp};
use std::sync::OnceLock;

const REPEAT: usize = 6;
const NPU_RANGE_TOL: f64 = 0.05;

mod cases;
mod ops;
mod reference;

use cases::{a, cases, Case};
use reference::*;

/// Max error of `got` against `want`, relative to max(1, max |want|), and
/// relative to the range of `want`.
fn errors(got: &A, want: &A) -> (f64, f64) {
    assert_eq!(got.d, want.d, "shape mismatch");
    let mut e = 0.0f64;
    for (g, w) in got.v.iter().zip(&want.v) {
        let d = (g - w).abs();
        e = if d.is_nan() { f64::INFINITY } else { e.max(d) };
    }
    let mx = want.v.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let (lo, hi) = want
        .v
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| {
            (l.min(v), h.max(v))
        });
    // A single value (or a constant output) has no range: fall back to its magnitude.
    let range = (hi - lo).max(mx.min(lo.abs().max(hi.abs()))).max(1e-6);
    (e / mx, e / range)
}

struct Outcome {
    native: bool,
    err: f64,
    range_err: f64,
}

fn run_case(dev: &Device, c: &Case) -> Result<Outcome, String> {
    let placed: Vec<Tensor> = c
        .inputs
        .iter()
        .map(|t| dev.place(t))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let refs: Vec<&Tensor> = placed.iter().collect();
    let is_cpu = dev.kind() == DeviceKind::Cpu;
    let mut worst = (0.0f64, 0.0f64);
    let mut native_all = true;
    for rep in 0..REPEAT {
        let native = dev.backend().supports(&c.op, &refs);
        native_all &= native;
        let before = dev.stats().snapshot().fallback_ops;
        let y = dev
            .run(c.op.clone(), &refs)
            .map_err(|e| format!("run {rep}: {e}"))?;
        let after = dev.stats().snapshot().fallback_ops;
        let expect = if native || is_cpu { 0 } else { 1 };
        if after - before != expect {
            return Err(format!(
                "run {rep}: supports()={native} but the fallback counter moved by {}",
                after - before
            ));
        }
        let host = dev.to_host(&y).map_err(|e| e.to_string())?;
        let got = A::from_t(&host);
        if got.d != c.want.d {
            return Err(format!(
                "run {rep}: dims {:?}, expected {:?}",
                got.d, c.want.d
            ));
        }
        let (e, r) = errors(&got, &c.want);
        worst = (worst.0.max(e), worst.1.max(r));
    }
    Ok(Outcome {
        native: native_all,
        err: worst.0,
        range_err: worst.1,
    })
}

/// The backends that passed their probe, probed afresh once per test
/// process (every test shares the result).
fn available() -> Vec<ProbeReport> {
    static AVAILABLE: OnceLock<Vec<ProbeReport>> = OnceLock::new();
    AVAILABLE.get_or_init(probe_available).clone()
}

fn probe_available() -> Vec<ProbeReport> {
    let reports = probe_all(true);
    for r in &reports {
        eprintln!(
            "probe {:<6} available={:<5} simulated={:<5} err={:?} {:.2}ms  {}  {}",
            r.name,
            r.available,
            r.simulated,
            r.max_abs_err,
            r.probe_ms,
            r.adapter,
            r.reason.clone().unwrap_or_default()
        );
    }
    let cpu = reports
        .iter()
        .find(|r| r.kind == DeviceKind::Cpu)
        .expect("cpu report");
    assert!(cpu.available, "the CPU must always pass its probe: {cpu:?}");
    reports.into_iter().filter(|r| r.available).collect()
}

fn spec_of(r: &ProbeReport) -> DeviceSpec {
    r.name.parse().expect("report names parse as placements")
}

#[test]
fn rand_normal_is_identical_on_every_backend() {
    let op = Op::RandNormal {
        shape: vec![7, 33],
        mean: 0.5,
        std: 2.0,
        seed: 99,
    };
    let want = rng::normal_f32(7 * 33, 0.5, 2.0, 99);
    for r in available() {
        let dev = open(spec_of(&r)).unwrap();
        let y = dev.run(op.clone(), &[]).unwrap();
        let got = dev.to_host(&y).unwrap().to_vec_f32().unwrap();
        assert_eq!(y.dims(), &[7, 33]);
        assert_eq!(
            got, want,
            "{}: samples differ from the host generator",
            r.name
        );
        let other = dev.rand_normal(&[7, 33], 0.5, 2.0, 100).unwrap();
        assert_ne!(dev.to_host(&other).unwrap().to_vec_f32().unwrap(), want);
    }
    let big = rng::normal_f32(100_000, 0.5, 2.0, 7);
    let m = big.iter().map(|&x| x as f64).sum::<f64>() / big.len() as f64;
    let sd = (big.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / big.len() as f64).sqrt();
    assert!(
        (m - 0.5).abs() < 0.03 && (sd - 2.0).abs() < 0.03,
        "mean {m} sd {sd}"
    );
}

/// A small model-like sequence: linear -> gelu -> layer norm -> softmax.
fn block(dev: &Device, x: &Tensor, w: &Tensor, b: &Tensor, g: &Tensor, beta: &Tensor) -> Tensor {
    let h = dev.linear(x, w, Some(b)).unwrap();
    let h = dev.gelu(&h).unwrap();
    let h = dev.layer_norm(&h, g, Some(beta), 1e-5).unwrap();
    dev.softmax(&h, 1).unwrap()
}

#[test]
fn placement_same_result_on_every_backend() {
    let x = randn(&[9, 33], 1);
    let w = scaled(&[17, 33], 2, 0.3);
    let b = randn(&[17], 3);
    let g = randn(&[17], 4);
    let beta = randn(&[17], 5);
    let host = open(DeviceSpec::Cpu).unwrap();
    let want = A::from_t(&block(&host, &x, &w, &b, &g, &beta));
    let reference = {
        let h = r_linear(&a(&x), &a(&w), Some(&a(&b))).map(|v| r_unary(UnaryOp::Gelu, v));
        r_softmax(&r_layer_norm(&h, &a(&g), Some(&a(&beta)), 1e-5), 1)
    };
    assert!(errors(&want, &reference).0 < 1e-5);
    let mut devices = Vec::new();
    for r in available() {
        let dev = open(spec_of(&r)).unwrap();
        let placed: Vec<Tensor> = [&x, &w, &b, &g, &beta]
            .iter()
            .map(|t| dev.place(t).unwrap())
            .collect();
        let mut worst = 0.0f64;
        for _ in 0..REPEAT {
            let y = block(
                &dev, &placed[0], &placed[1], &placed[2], &placed[3], &placed[4],
            );
            let got = A::from_t(&dev.to_host(&y).unwrap());
            worst = worst.max(errors(&got, &want).0);
        }
        // Softmax outputs lie in [0, 1]: absolute error bounds per backend.
        let tol = match r.kind {
            DeviceKind::Cpu => 1e-6,
            DeviceKind::Gpu => 1e-4,
            DeviceKind::Npu => 0.03,
        };
        eprintln!(
            "placement {}: max abs error {worst:.2e} (tolerance {tol:.0e}), stats {:?}",
            r.name,
            dev.stats().snapshot()
        );
        assert!(worst <= tol, "{}: {worst} > {tol}", r.name);
        devices.push(dev);
    }
    // One pipeline across devices: each stage on the next backend, tensors
    // handed over through the host as the graph's edges do.
    let stages = devices.len();
    let mut h = x.clone();
    for (i, f) in [0usize, 1, 2, 3].iter().enumerate() {
        let dev = &devices[i % stages];
        let hin = dev.place(&h).unwrap();
        let out = match f {
            0 => dev
                .linear(&hin, &dev.place(&w).unwrap(), Some(&dev.place(&b).unwrap()))
                .unwrap(),
            1 => dev.gelu(&hin).unwrap(),
            2 => dev
                .layer_norm(
                    &hin,
                    &dev.place(&g).unwrap(),
                    Some(&dev.place(&beta).unwrap()),
                    1e-5,
                )
                .unwrap(),
            _ => dev.softmax(&hin, 1).unwrap(),
        };
        h = dev.to_host(&out).unwrap();
    }
    let got = A::from_t(&h);
    let worst = errors(&got, &want).0;
    assert!(worst <= 0.03, "mixed placement error {worst}");
}

#[test]
fn fallback_is_counted_and_correct() {
    // Whatever backend lacks an op, Device::run must fall back and count it.
    for r in available()
        .into_iter()
        .filter(|r| r.kind != DeviceKind::Cpu)
    {
        let dev = open(spec_of(&r)).unwrap();
        let x = randn(&[7, 33], 11);
        let c = cases()
            .into_iter()
            .find(|c| c.label == "cumsum dim 1")
            .unwrap();
        let xd = dev.place(&c.inputs[0]).unwrap();
        let native = dev.backend().supports(&c.op, &[&xd]);
        let before = dev.stats().snapshot();
        let y = dev.run(c.op.clone(), &[&xd]).unwrap();
        let after = dev.stats().snapshot();
        let got = A::from_t(&dev.to_host(&y).unwrap());
        assert!(errors(&got, &c.want).0 < 1e-4);
        if !native {
            assert_eq!(after.fallback_ops, before.fallback_ops + 1);
            assert_eq!(
                after.fallback_by_op.get("cumsum").copied().unwrap_or(0),
                before.fallback_by_op.get("cumsum").copied().unwrap_or(0) + 1
            );
        }
        let _ = x;
    }
}

#[test]
fn conv1d_fused_is_composed_where_not_native() {
    // Device::conv1d_fused_phases on every backend, whether it runs
    // Op::Conv1dFused itself or composes it from its parts.
    for r in available() {
        let dev = open(spec_of(&r)).unwrap();
        for c in cases()
            .into_iter()
            .filter(|c| c.label.starts_with("conv1d_fused"))
        {
            let Op::Conv1dFused {
                stride,
                padding,
                dilation,
                groups,
                pre_slope,
                residual,
                phases,
            } = c.op
            else {
                unreachable!("filtered on the label")
            };
            let ins: Vec<Tensor> = c.inputs.iter().map(|t| dev.place(t).unwrap()).collect();
            let cfg = edgeflow_runtime::ConvCfg {
                stride,
                padding,
                dilation,
                groups,
            };
            let res = residual.then(|| &ins[3]);
            let y = dev
                .conv1d_fused_phases(&ins[0], &ins[1], &ins[2], cfg, pre_slope, res, phases)
                .unwrap();
            let got = A::from_t(&dev.to_host(&y).unwrap());
            assert_eq!(got.d, c.want.d, "{} on {:?}", c.label, r.kind);
            let tol = if r.kind == DeviceKind::Npu {
                NPU_RANGE_TOL
            } else {
                c.tol
            };
            let (abs, _) = errors(&got, &c.want);
            assert!(abs < tol, "{} on {:?}: error {abs}", c.label, r.kind);
        }
    }
}
