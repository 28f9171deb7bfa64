//! Simulator tests. Tolerances are written beside each check; they are what
//! int8 with per-channel weights and calibrated per-tensor activations
//! achieves (about 8 bits → ~40-48 dB SQNR per op on well-spread data, less
//! where calibration and test data differ or errors accumulate).

use super::*;
use crate::cpu::CpuBackend;
use edgeflow_runtime::{Backend, BinaryOp, Device, Op, Tensor, UnaryOp};
use std::sync::Arc;

/// Deterministic normal samples (splitmix64 + Box-Muller).
struct Rng(u64);
impl Rng {
    fn u(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (a, b) = (self.u().max(1e-12), self.u());
                ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32 * std
            })
            .collect()
    }
    fn tensor(&mut self, dims: &[usize], std: f32) -> Tensor {
        let n = dims.iter().product();
        Tensor::from_vec(self.normal(n, std), dims).expect("tensor")
    }
}

/// Settings with one calibration run per site (first call f32, then int8).
fn one_shot() -> SimNpuConfig {
    SimNpuConfig {
        calibration_runs: 1,
        ..SimNpuConfig::default()
    }
}

fn devices(cfg: SimNpuConfig) -> (Arc<SimNpu>, Device, Device) {
    let npu = Arc::new(SimNpu::with_config(0, cfg).expect("npu"));
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let dev = Device::new(npu.clone(), cpu.clone());
    let host = Device::new(cpu.clone(), cpu);
    (npu, dev, host)
}

fn host_vec(dev: &Device, t: &Tensor) -> Vec<f32> {
    dev.to_host(t).expect("to host").to_vec_f32().expect("f32")
}

/// SQNR in dB and max error over the reference range.
fn compare(got: &[f32], want: &[f32]) -> (f64, f64) {
    let mut acc = ErrorAccum::default();
    acc.add(got, want);
    let s = acc.stats();
    assert_eq!(got.len(), want.len());
    (s.sqnr_db, s.max_err_over_range)
}

#[test]
fn identity_and_names() {
    let npu = SimNpu::new(2).expect("npu");
    assert_eq!(npu.name(), "npu-sim:2");
    assert_eq!(npu.adapter(), "edgeflow NPU simulator (int8)");
    assert_eq!(npu.kind(), edgeflow_runtime::DeviceKind::Npu);
}

#[test]
fn linear_int8_matches_f32_within_tolerance() {
    let (npu, dev, host) = devices(SimNpuConfig::default());
    let mut rng = Rng(1);
    let (k, n) = (67, 45); // odd sizes
    let w = rng.tensor(&[n, k], 0.2);
    let b = rng.tensor(&[n], 0.5);
    let wd = dev.place(&w).expect("place w");
    let bd = dev.place(&b).expect("place b");
    // Calibrate on a few samples, then measure on fresh ones.
    let x0 = rng.tensor(&[3, 5, k], 1.0);
    npu.calibrate(|| {
        dev.run(Op::Linear, &[&x0, &wd, &bd])?;
        for _ in 0..3 {
            let x = rng.tensor(&[3, 5, k], 1.0);
            dev.run(Op::Linear, &[&x, &wd, &bd])?;
        }
        Ok(())
    })
    .expect("calibrate");
    assert_eq!(npu.counters().compiles, 1);
    // (a) On a calibration sample (inside the calibrated ranges): only
    // rounding. Tolerance: SQNR > 35 dB, every element within 2% of range.
    let got = host_vec(
        &dev,
        &dev.run(Op::Linear, &[&x0, &wd, &bd]).expect("npu linear"),
    );
    let want = host_vec(
        &host,
        &host.run(Op::Linear, &[&x0, &w, &b]).expect("cpu linear"),
    );
    let (sqnr, max_rel) = compare(&got, &want);
    eprintln!("linear (calibrated data): SQNR {sqnr:.2} dB, max err {max_rel:.4} of range");
    assert!(sqnr > 35.0, "linear SQNR {sqnr:.1} dB");
    assert!(max_rel < 0.02, "linear max error {max_rel:.4} of range");
    // (b) Fresh samples may exceed the calibrated range and saturate, as on
    // hardware: SQNR > 30 dB, worst element within 10% of range.
    for _ in 0..2 {
        let x = rng.tensor(&[3, 5, k], 1.0);
        let got = host_vec(
            &dev,
            &dev.run(Op::Linear, &[&x, &wd, &bd]).expect("npu linear"),
        );
        let want = host_vec(
            &host,
            &host.run(Op::Linear, &[&x, &w, &b]).expect("cpu linear"),
        );
        let (sqnr, max_rel) = compare(&got, &want);
        eprintln!("linear (fresh data): SQNR {sqnr:.2} dB, max err {max_rel:.4} of range");
        assert!(sqnr > 30.0, "linear SQNR {sqnr:.1} dB");
        assert!(max_rel < 0.10, "linear max error {max_rel:.4} of range");
    }
    let c = npu.counters();
    assert_eq!(c.calibration_runs, 4);
    assert_eq!(c.int8_runs, 4 + 3, "warm-up calls compute in int8 too");
    assert_eq!(dev.stats().snapshot().fallback_ops, 0);
}

#[test]
fn conv1d_int8_matches_f32_within_tolerance() {
    let (npu, dev, host) = devices(SimNpuConfig::default());
    let mut rng = Rng(2);
    for (groups, stride, padding, dilation) in [(1, 1, 2, 1), (3, 2, 1, 2)] {
        let (cin, cout, kw, l) = (12, 9, 5, 53);
        let w = rng.tensor(&[cout, cin / groups, kw], 0.3);
        let b = rng.tensor(&[cout], 0.2);
        let op = Op::Conv1d {
            stride,
            padding,
            dilation,
            groups,
        };
        let wd = dev.place(&w).expect("w");
        let bd = dev.place(&b).expect("b");
        npu.calibrate(|| {
            for _ in 0..3 {
                let x = rng.tensor(&[2, cin, l], 1.0);
                dev.run(op.clone(), &[&x, &wd, &bd])?;
            }
            Ok(())
        })
        .expect("calibrate");
        let x = rng.tensor(&[2, cin, l], 1.0);
        let got = host_vec(
            &dev,
            &dev.run(op.clone(), &[&x, &wd, &bd]).expect("npu conv"),
        );
        let want = host_vec(&host, &host.run(op, &[&x, &w, &b]).expect("cpu conv"));
        let (sqnr, max_rel) = compare(&got, &want);
        eprintln!("conv1d groups {groups}: SQNR {sqnr:.2} dB, max err {max_rel:.4} of range");
        // int8 tolerance: SQNR > 30 dB, max error < 3% of output range.
        assert!(sqnr > 30.0, "conv1d groups {groups}: SQNR {sqnr:.1} dB");
        assert!(
            max_rel < 0.03,
            "conv1d groups {groups}: max err {max_rel:.4}"
        );
    }
    assert_eq!(dev.stats().snapshot().fallback_ops, 0);
}

#[test]
fn conv2d_and_elementwise_ops_in_int8() {
    let (npu, dev, host) = devices(one_shot());
    let mut rng = Rng(3);
    let x = rng.tensor(&[1, 4, 9, 11], 1.0);
    let y = rng.tensor(&[4, 1, 11], 1.0); // broadcasts against x
    let w = rng.tensor(&[6, 4, 3, 3], 0.3);
    let cases: Vec<(Op, Vec<Tensor>)> = vec![
        (
            Op::Conv2d {
                stride: 1,
                padding: 1,
                dilation: 1,
                groups: 1,
            },
            vec![x.clone(), dev.place(&w).expect("w")],
        ),
        (Op::Binary(BinaryOp::Add), vec![x.clone(), y.clone()]),
        (Op::Binary(BinaryOp::Sub), vec![x.clone(), y.clone()]),
        (Op::Binary(BinaryOp::Mul), vec![x.clone(), y.clone()]),
        (Op::Unary(UnaryOp::Relu), vec![x.clone()]),
        (Op::Unary(UnaryOp::Sigmoid), vec![x.clone()]),
        (Op::Unary(UnaryOp::Tanh), vec![x.clone()]),
        (Op::Unary(UnaryOp::Gelu), vec![x.clone()]),
        (Op::Unary(UnaryOp::GeluErf), vec![x.clone()]),
        (Op::Unary(UnaryOp::Silu), vec![x.clone()]),
        (Op::LeakyRelu { slope: 0.1 }, vec![x.clone()]),
        (Op::Softmax { dim: 3 }, vec![x.clone()]),
        (Op::MatMul, vec![x.clone(), rng.tensor(&[4, 11, 7], 1.0)]),
    ];
    for (op, ins) in cases {
        let refs: Vec<&Tensor> = ins.iter().collect();
        // First call calibrates (f32), second runs int8 on the same data.
        dev.run(op.clone(), &refs).expect("calibration");
        let got = host_vec(&dev, &dev.run(op.clone(), &refs).expect("int8"));
        let host_ins: Vec<Tensor> = ins.iter().map(|t| dev.to_host(t).expect("host")).collect();
        let hrefs: Vec<&Tensor> = host_ins.iter().collect();
        let want = host_vec(&host, &host.run(op.clone(), &hrefs).expect("cpu"));
        let (sqnr, max_rel) = compare(&got, &want);
        eprintln!(
            "{}: SQNR {sqnr:.2} dB, max err {max_rel:.4} of range",
            op.name()
        );
        // Same data as calibration: no saturation; error is rounding of
        // inputs and output, a few int8 steps at most. SQNR > 28 dB and
        // max error < 4% of range (softmax: fixed 1/256 steps, looser SQNR
        // because most outputs are near 0).
        let min_sqnr = if matches!(op, Op::Softmax { .. }) {
            20.0
        } else {
            28.0
        };
        assert!(sqnr > min_sqnr, "{}: SQNR {sqnr:.1} dB", op.name());
        assert!(max_rel < 0.04, "{}: max err {max_rel:.4}", op.name());
    }
    assert_eq!(dev.stats().snapshot().fallback_ops, 0);
    assert!(npu.counters().int8_runs >= 13);
}

#[test]
fn new_shape_recompiles_then_falls_back_past_budget() {
    let cfg = SimNpuConfig {
        recompile_budget: 1,
        ..one_shot()
    };
    let (npu, dev, host) = devices(cfg);
    let mut rng = Rng(4);
    let w = rng.tensor(&[8, 16], 0.3);
    let wd = dev.place(&w).expect("w");
    let run = |rows: usize, rng: &mut Rng| {
        let x = rng.tensor(&[rows, 16], 1.0);
        let got = host_vec(&dev, &dev.run(Op::Linear, &[&x, &wd]).expect("linear"));
        let want = host_vec(&host, &host.run(Op::Linear, &[&x, &w]).expect("cpu"));
        compare(&got, &want)
    };
    run(3, &mut rng); // calibrate + compile shape [3, 16]
    run(3, &mut rng); // int8, same shape: no compile
    assert_eq!((npu.counters().compiles, npu.counters().recompiles), (1, 0));
    run(5, &mut rng); // new shape: calibrate again, a counted recompile
    let c = npu.counters();
    assert_eq!((c.compiles, c.recompiles), (2, 1));
    assert_eq!(dev.stats().snapshot().fallback_ops, 0);
    // Third shape: the budget (1 recompile) is spent -> CPU fallback, exact.
    let (sqnr, _) = run(7, &mut rng);
    assert!(
        sqnr >= EXACT_SQNR_DB - 1.0,
        "fallback is exact f32, got {sqnr}"
    );
    let s = dev.stats().snapshot();
    assert_eq!(s.fallback_ops, 1);
    assert_eq!(s.fallback_by_op.get("linear"), Some(&1));
    let c = npu.counters();
    assert_eq!((c.compiles, c.recompiles), (2, 1));
    assert!(c.budget_rejections >= 1);
    // Compiled shapes keep running on the NPU.
    run(5, &mut rng);
    assert_eq!(dev.stats().snapshot().fallback_ops, 1);
}

#[test]
fn unsupported_op_falls_back_with_right_answer_and_count() {
    let (npu, dev, host) = devices(SimNpuConfig::default());
    let mut rng = Rng(5);
    let w = rng.tensor(&[10, 6], 0.4);
    let wd = dev.place(&w).expect("w");
    let gamma = rng.tensor(&[10], 1.0);
    let x = rng.tensor(&[4, 6], 1.0);
    // linear (NPU) -> layer_norm (not in the int8 set: CPU) -> exp (CPU)
    let ln = Op::LayerNorm { eps: 1e-5 };
    assert!(!npu.supports(&ln, &[&x, &gamma]));
    assert!(!npu.supports(&Op::Unary(UnaryOp::Exp), &[&x]));
    let h = dev.run(Op::Linear, &[&x, &wd]).expect("linear");
    assert!(!h.is_host(), "linear stays on the NPU");
    let y = dev.run(ln.clone(), &[&h, &gamma]).expect("ln fallback");
    let z = dev
        .run(Op::Unary(UnaryOp::Exp), &[&y])
        .expect("exp fallback");
    assert!(z.is_host());
    // The fallback ops are exact on what they were given.
    let hh = dev.to_host(&h).expect("h");
    let want_y = host.run(ln, &[&hh, &gamma]).expect("cpu ln");
    let want_z = host_vec(
        &host,
        &host.run(Op::Unary(UnaryOp::Exp), &[&want_y]).expect("exp"),
    );
    assert_eq!(host_vec(&dev, &z), want_z);
    let s = dev.stats().snapshot();
    assert_eq!(s.fallback_ops, 2);
    assert_eq!(s.fallback_by_op.get("layer_norm"), Some(&1));
    assert_eq!(s.fallback_by_op.get("exp"), Some(&1));
    // Integer inputs are refused too.
    let idx = Tensor::from_i64(vec![0, 1], &[2]).expect("idx");
    assert!(!npu.supports(&Op::Unary(UnaryOp::Relu), &[&idx]));
}

#[test]
fn chain_error_report_is_nontrivial_and_bounded() {
    let (npu, dev, host) = devices(SimNpuConfig::default());
    let mut rng = Rng(6);
    let (d, hdim) = (32, 48);
    let w1 = rng.tensor(&[hdim, d], 0.2);
    let b1 = rng.tensor(&[hdim], 0.1);
    let w2 = rng.tensor(&[d, hdim], 0.2);
    let (w1d, b1d, w2d) = (
        dev.place(&w1).expect("w1"),
        dev.place(&b1).expect("b1"),
        dev.place(&w2).expect("w2"),
    );
    let mlp = |dev: &Device, x: &Tensor, w1: &Tensor, b1: &Tensor, w2: &Tensor| {
        let h = dev.run(Op::Linear, &[x, w1, b1])?;
        let h = dev.run(Op::Unary(UnaryOp::Gelu), &[&h])?;
        let o = dev.run(Op::Linear, &[&h, w2])?;
        dev.run(Op::Binary(BinaryOp::Add), &[&o, x])
    };
    npu.calibrate(|| {
        for _ in 0..16 {
            let x = rng.tensor(&[6, d], 1.0);
            mlp(&dev, &x, &w1d, &b1d, &w2d)?;
        }
        Ok(())
    })
    .expect("calibration");
    npu.reset_error_stats();
    let x = rng.tensor(&[6, d], 1.0);
    let got = host_vec(&dev, &mlp(&dev, &x, &w1d, &b1d, &w2d).expect("npu mlp"));
    let want = host_vec(&host, &mlp(&host, &x, &w1, &b1, &w2).expect("cpu mlp"));
    let (sqnr, _) = compare(&got, &want);
    // Four int8 ops in a chain (calibrated on other samples): > 25 dB.
    assert!(sqnr > 25.0, "mlp end-to-end SQNR {sqnr:.1} dB");

    let r = npu.error_report();
    eprintln!("{r}");
    assert!(r.shadow);
    assert_eq!(r.backend, "npu-sim:0");
    for op in ["linear", "gelu", "add"] {
        let o = r.op(op).unwrap_or_else(|| panic!("{op} in report"));
        assert!(o.calls >= 1);
        // Non-trivial (int8 is never exact on random data) and bounded:
        // SQNR in (25, 80) dB; fresh data may saturate past the calibrated
        // range, so the worst element is bounded by 10% of the range.
        assert!(o.local.max_abs_err > 0.0, "{op}: zero error is suspicious");
        assert!(
            o.local.sqnr_db > 25.0 && o.local.sqnr_db < 80.0,
            "{op}: {:?}",
            o.local
        );
        assert!(o.local.max_err_over_range < 0.10, "{op}: {:?}", o.local);
        assert!(o.end_to_end.sqnr_db > 20.0, "{op}: {:?}", o.end_to_end);
    }
    // The end-to-end shadow of the last op is the whole-chain f32 result.
    let add = r.op("add").expect("add");
    assert!(
        (add.end_to_end.sqnr_db - sqnr).abs() < 1.0,
        "{} vs {sqnr}",
        add.end_to_end.sqnr_db
    );
    assert!(r.overall_local.elements > 0);
    let text = r.to_string();
    assert!(
        text.contains("simulated NPU") && text.contains("linear"),
        "{text}"
    );

    // With the shadow off nothing more is recorded.
    npu.set_shadow(false);
    let before = npu.error_report().op("linear").map(|o| o.calls);
    mlp(&dev, &x, &w1d, &b1d, &w2d).expect("mlp");
    assert_eq!(npu.error_report().op("linear").map(|o| o.calls), before);
}

#[test]
fn symmetric_scheme_and_reshape_passthrough() {
    let cfg = SimNpuConfig {
        scheme: ActivationScheme::Symmetric,
        ..one_shot()
    };
    let (_npu, dev, host) = devices(cfg);
    let mut rng = Rng(7);
    let w = rng.tensor(&[12, 20], 0.3);
    let wd = dev.place(&w).expect("w");
    let x = rng.tensor(&[2, 3, 20], 1.0);
    for _ in 0..2 {
        let h = dev.run(Op::Linear, &[&x, &wd]).expect("linear");
        let r = dev
            .run(Op::Reshape { shape: vec![6, 12] }, &[&h])
            .expect("reshape");
        assert!(!r.is_host());
        assert_eq!(r.dims(), &[6, 12]);
        let got = host_vec(&dev, &r);
        let want = host_vec(&host, &host.run(Op::Linear, &[&x, &w]).expect("cpu"));
        let (sqnr, _) = compare(&got, &want);
        // Symmetric loses < 1 bit on two-sided data: > 28 dB.
        assert!(sqnr > 28.0, "symmetric SQNR {sqnr:.1}");
    }
    assert_eq!(dev.stats().snapshot().fallback_ops, 0);
}

#[test]
fn delegate_partitions_compiles_and_enforces_static_shapes() {
    let npu = SimNpu::new(0).expect("npu");
    let mut rng = Rng(8);
    let (d, h) = (24, 40);
    let w1 = rng.tensor(&[h, d], 0.2);
    let w2 = rng.tensor(&[d, h], 0.2);
    let gamma = rng.tensor(&[h], 1.0);
    let node = |op: Op, inputs: Vec<ValueRef>| Node { op, inputs };
    let mut g = Subgraph {
        input_shapes: vec![vec![5, d]],
        constants: vec![w1.clone(), w2.clone(), gamma],
        nodes: vec![
            node(Op::Linear, vec![ValueRef::Input(0), ValueRef::Const(0)]),
            node(Op::Unary(UnaryOp::Relu), vec![ValueRef::Node(0)]),
            node(
                Op::LayerNorm { eps: 1e-5 },
                vec![ValueRef::Node(1), ValueRef::Const(2)],
            ),
            node(Op::Linear, vec![ValueRef::Node(2), ValueRef::Const(1)]),
            // A weight that is not a constant: not compile-able ahead of time.
            node(Op::Linear, vec![ValueRef::Node(3), ValueRef::Input(0)]),
        ],
        outputs: vec![ValueRef::Node(1)],
    };
    let parts = npu.partition(&g);
    assert_eq!(
        parts,
        vec![
            Partition { nodes: vec![0, 1] },
            Partition { nodes: vec![3] }
        ]
    );
    // Compiling a graph with an unsupported node is refused.
    assert!(npu.compile(&g, &[vec![rng.tensor(&[5, d], 1.0)]]).is_err());

    // The first partition alone: linear -> relu -> linear.
    g.nodes = vec![
        node(Op::Linear, vec![ValueRef::Input(0), ValueRef::Const(0)]),
        node(Op::Unary(UnaryOp::Relu), vec![ValueRef::Node(0)]),
        node(Op::Linear, vec![ValueRef::Node(1), ValueRef::Const(1)]),
    ];
    g.outputs = vec![ValueRef::Node(2)];
    let calib: Vec<Vec<Tensor>> = (0..4).map(|_| vec![rng.tensor(&[5, d], 1.0)]).collect();
    let compiled = npu.compile(&g, &calib).expect("compile");
    assert_eq!(compiled.input_shapes(), &[vec![5, d]]);
    assert_eq!(npu.counters().subgraphs_compiled, 1);

    let x = rng.tensor(&[5, d], 1.0);
    let out = compiled.execute(&[&x]).expect("execute");
    let cpu = CpuBackend::new();
    let hid = cpu.execute(&Op::Linear, &[&x, &w1]).expect("l1");
    let hid = cpu
        .execute(&Op::Unary(UnaryOp::Relu), &[&hid])
        .expect("relu");
    let want = cpu.execute(&Op::Linear, &[&hid, &w2]).expect("l2");
    let (sqnr, max_rel) = compare(
        &out[0].to_vec_f32().expect("out"),
        &want.to_vec_f32().expect("want"),
    );
    // Three int8 ops, calibrated on other samples: > 28 dB, < 5% of range.
    assert!(sqnr > 28.0, "graph SQNR {sqnr:.1}");
    assert!(max_rel < 0.05, "graph max err {max_rel:.4}");
    // Static shapes: another batch size is an error, not a silent recompile.
    let err = compiled
        .execute(&[&rng.tensor(&[6, d], 1.0)])
        .expect_err("shape must be static");
    assert!(err.to_string().contains("compiled for"), "{err}");
    assert!(npu.error_report().op("relu").is_some());
}

#[test]
fn first_call_is_already_int8_like_a_probe() {
    // A fresh simulator, one call (what `edgeflow devices` probes): the
    // result is int8 (not f32-exact) and within the probe's 5% tolerance.
    let (npu, dev, host) = devices(SimNpuConfig::default());
    let mut rng = Rng(9);
    let x = rng.tensor(&[8, 67], 1.0);
    let w = rng.tensor(&[33, 67], 0.2);
    let b = rng.tensor(&[33], 0.1);
    let (xd, wd, bd) = (
        dev.place(&x).expect("x"),
        dev.place(&w).expect("w"),
        dev.place(&b).expect("b"),
    );
    let got = host_vec(&dev, &dev.run(Op::Linear, &[&xd, &wd, &bd]).expect("npu"));
    let want = host_vec(&host, &host.run(Op::Linear, &[&x, &w, &b]).expect("cpu"));
    let (sqnr, max_rel) = compare(&got, &want);
    assert!(sqnr < 80.0, "int8 is not exact: {sqnr:.1} dB");
    // Calibrated on this very call: SQNR > 35 dB, < 2% of range.
    assert!(sqnr > 35.0 && max_rel < 0.02, "{sqnr:.1} dB, {max_rel:.4}");
    assert_eq!(npu.counters().int8_runs, 1);
    assert_eq!(npu.error_report().op("linear").map(|o| o.calls), Some(1));
}

#[test]
fn ggml_quantized_linear_weights_are_requantized_to_int8() {
    use edgeflow_runtime::candle_core::{quantized, Device as CDevice};
    let (npu, dev, host) = devices(one_shot());
    let mut rng = Rng(10);
    let (k, n) = (64, 24);
    let wf = rng.normal(k * n, 0.2);
    let wc = edgeflow_runtime::candle_core::Tensor::from_vec(wf, (n, k), &CDevice::Cpu)
        .expect("candle w");
    let q = quantized::QTensor::quantize(&wc, quantized::GgmlDType::Q8_0).expect("q8_0");
    let w = Tensor::from_quantized(Arc::new(q)).expect("w");
    let x = rng.tensor(&[5, k], 1.0);
    assert!(npu.supports(&Op::Linear, &[&x, &w]));
    let wd = dev.place(&w).expect("place");
    let mut last = (0.0, 1.0);
    for _ in 0..2 {
        let got = host_vec(&dev, &dev.run(Op::Linear, &[&x, &wd]).expect("npu"));
        let want = host_vec(&host, &host.run(Op::Linear, &[&x, &w]).expect("cpu q8"));
        last = compare(&got, &want);
    }
    // Same tolerance as f32 weights: SQNR > 30 dB.
    assert!(last.0 > 30.0, "{last:?}");
    assert_eq!(dev.stats().snapshot().fallback_ops, 0);
    assert_eq!(npu.counters().compiles, 1, "one site across calls");
}

#[test]
fn partitioned_graph_runs_npu_partitions_and_cpu_rest() {
    let npu = SimNpu::new(0).expect("npu");
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut rng = Rng(11);
    let (d, h, o) = (24, 40, 16);
    let consts = vec![
        rng.tensor(&[h, d], 0.2),
        rng.tensor(&[h], 1.0),
        rng.tensor(&[o, h], 0.2),
        rng.tensor(&[o], 0.1),
    ];
    let node = |op: Op, inputs: Vec<ValueRef>| Node { op, inputs };
    use ValueRef::{Const, Input, Node as N};
    let g = Subgraph {
        input_shapes: vec![vec![6, d]],
        constants: consts,
        nodes: vec![
            node(Op::Linear, vec![Input(0), Const(0)]),
            node(Op::Unary(UnaryOp::Relu), vec![N(0)]),
            node(Op::LayerNorm { eps: 1e-5 }, vec![N(1), Const(1)]),
            node(Op::Linear, vec![N(2), Const(2), Const(3)]),
            node(Op::Unary(UnaryOp::Gelu), vec![N(3)]),
            node(Op::Affine { mul: 0.5, add: 1.0 }, vec![N(4)]),
        ],
        outputs: vec![N(5), N(1), N(4)],
    };
    let calib: Vec<Vec<Tensor>> = (0..32).map(|_| vec![rng.tensor(&[6, d], 1.0)]).collect();
    let pg = PartitionedGraph::build(&g, &npu, cpu.clone(), &calib).expect("build");
    assert_eq!((pg.partitions(), pg.npu_nodes(), pg.cpu_nodes()), (2, 4, 2));
    assert_eq!(npu.counters().subgraphs_compiled, 2);

    let x = rng.tensor(&[6, d], 1.0);
    npu.reset_error_stats();
    let got = pg.execute(&[&x]).expect("execute");
    eprintln!("{}", npu.error_report());
    assert_eq!(got.len(), 3);
    // f32 reference: the same graph, every node on the CPU.
    let h0 = cpu
        .execute(&Op::Linear, &[&x, &g.constants[0]])
        .expect("l1");
    let h1 = cpu
        .execute(&Op::Unary(UnaryOp::Relu), &[&h0])
        .expect("relu");
    let h2 = cpu
        .execute(&Op::LayerNorm { eps: 1e-5 }, &[&h1, &g.constants[1]])
        .expect("ln");
    let h3 = cpu
        .execute(&Op::Linear, &[&h2, &g.constants[2], &g.constants[3]])
        .expect("l2");
    let h4 = cpu
        .execute(&Op::Unary(UnaryOp::Gelu), &[&h3])
        .expect("gelu");
    let h5 = cpu
        .execute(&Op::Affine { mul: 0.5, add: 1.0 }, &[&h4])
        .expect("affine");
    for (t, want) in got.iter().zip([&h5, &h1, &h4]).rev() {
        assert_eq!(t.dims(), want.dims());
        let (sqnr, _) = compare(
            &t.to_vec_f32().expect("got"),
            &want.to_vec_f32().expect("want"),
        );
        eprintln!("partitioned output {:?}: SQNR {sqnr:.1} dB", want.dims());
        // Two int8 partitions around an f32 layer norm, calibrated on 32
        // other samples: > 25 dB.
        assert!(sqnr > 25.0, "partitioned graph SQNR {sqnr:.1} dB");
    }
}

#[test]
fn config_reset_and_graph_validation() {
    let bad = SimNpuConfig {
        calibration_runs: 0,
        ..SimNpuConfig::default()
    };
    assert!(SimNpu::with_config(0, bad).is_err());

    let (npu, dev, _host) = devices(one_shot());
    let mut rng = Rng(12);
    let w = dev.place(&rng.tensor(&[4, 8], 0.3)).expect("w");
    let x = rng.tensor(&[2, 8], 1.0);
    dev.run(Op::Linear, &[&x, &w]).expect("run");
    dev.run(Op::Linear, &[&x, &w]).expect("run");
    assert_eq!(npu.counters().compiles, 1);
    assert_eq!(npu.counters().sites, 1);
    // Forgetting the sites calibrates again: a fresh compile, not a recompile.
    npu.reset_sites();
    assert_eq!(npu.counters().sites, 0);
    dev.run(Op::Linear, &[&x, &w]).expect("run");
    let c = npu.counters();
    assert_eq!((c.compiles, c.recompiles, c.sites), (2, 0, 1));
    // A different weight is a different site even with the same shapes.
    let w2 = dev.place(&rng.tensor(&[4, 8], 0.3)).expect("w2");
    dev.run(Op::Linear, &[&x, &w2]).expect("run");
    assert_eq!(npu.counters().sites, 2);

    // Graph validation: forward references and bad shapes are errors.
    let g = Subgraph {
        input_shapes: vec![vec![2, 8]],
        constants: vec![rng.tensor(&[4, 8], 0.3)],
        nodes: vec![
            Node {
                op: Op::Unary(UnaryOp::Relu),
                inputs: vec![ValueRef::Node(1)],
            },
            Node {
                op: Op::Linear,
                inputs: vec![ValueRef::Input(0), ValueRef::Const(0)],
            },
        ],
        outputs: vec![ValueRef::Node(0)],
    };
    assert!(g.infer_dims().is_err());
    let g2 = Subgraph {
        input_shapes: vec![vec![2, 9]],
        nodes: vec![g.nodes[1].clone()],
        outputs: vec![ValueRef::Node(0)],
        ..g
    };
    let err = npu
        .compile(&g2, &[vec![rng.tensor(&[2, 9], 1.0)]])
        .expect_err("k mismatch");
    assert!(err.to_string().contains("linear"), "{err}");
}

#[test]
fn live_reports_reach_simulators_held_as_dyn_backend() {
    let npu: Arc<dyn Backend> = Arc::new(SimNpu::new(7).expect("npu"));
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let dev = Device::new(npu.clone(), cpu);
    let x = Rng(13).tensor(&[3, 5], 1.0);
    dev.run(Op::Unary(UnaryOp::Tanh), &[&x]).expect("tanh");
    let mine = |reps: Vec<NpuErrorReport>| {
        reps.into_iter()
            .filter(|r| r.backend == "npu-sim:7" && r.op("tanh").is_some())
            .count()
    };
    assert_eq!(mine(live_error_reports()), 1);
    drop(dev);
    drop(npu);
    assert_eq!(
        mine(live_error_reports()),
        0,
        "dropped simulators leave the registry"
    );
}

/// A model block written once against the Device API (the way stages are),
/// captured by running it, then deployed ahead of time: the captured graph
/// replays the eager result exactly on the CPU, and partitioned onto the
/// simulator it stays within the int8 tolerance of the other graph tests.
#[test]
fn captured_eager_code_partitions_and_matches_eager_results() {
    let mut rng = Rng(21);
    let (d, h) = (24, 48);
    let (w1, b1, w2) = (
        rng.tensor(&[h, d], 0.2),
        rng.tensor(&[h], 0.1),
        rng.tensor(&[d, h], 0.2),
    );
    let (gamma, beta) = (rng.tensor(&[d], 1.0), rng.tensor(&[d], 0.1));
    // x + W2 gelu(W1 x + b1), layer-normed: W1 / b1 / W2 / gamma / beta are
    // host weights the code closes over.
    let block = |dev: &Device, x: &Tensor| -> edgeflow_runtime::Result<Tensor> {
        let y = dev.gelu(&dev.linear(x, &w1, Some(&b1))?)?;
        let y = dev.add(x, &dev.linear(&y, &w2, None)?)?;
        dev.layer_norm(&y, &gamma, Some(&beta), 1e-5)
    };
    let x0 = rng.tensor(&[5, d], 1.0);
    let g = capture(std::slice::from_ref(&x0), |dev, xs| {
        Ok(vec![block(dev, &xs[0])?])
    })
    .expect("capture");
    assert_eq!(g.input_shapes, vec![vec![5, d]]);
    assert_eq!(g.nodes.len(), 5, "linear, gelu, linear, add, layer_norm");
    assert_eq!(g.constants.len(), 5, "each weight once");
    assert_eq!(g.outputs, vec![ValueRef::Node(4)]);
    assert!(matches!(g.nodes[0].inputs[0], ValueRef::Input(0)));

    // The captured graph on the CPU is the eager computation, bit for bit.
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let host = Device::new(cpu.clone(), cpu.clone());
    let x = rng.tensor(&[5, d], 1.0);
    let want = block(&host, &x).expect("eager").to_vec_f32().expect("f32");
    let mut vals: Vec<Tensor> = Vec::new();
    for n in &g.nodes {
        let args: Vec<Tensor> = n
            .inputs
            .iter()
            .map(|r| match r {
                ValueRef::Input(_) => x.clone(),
                ValueRef::Const(i) => g.constants[*i].clone(),
                ValueRef::Node(j) => vals[*j].clone(),
            })
            .collect();
        let refs: Vec<&Tensor> = args.iter().collect();
        vals.push(cpu.execute(&n.op, &refs).expect("replay"));
    }
    assert_eq!(vals[4].to_vec_f32().expect("f32"), want);

    // Ahead of time on the simulator: linear/gelu/linear/add compile as one
    // int8 partition, the layer norm (not in the NPU op set) runs on the CPU.
    let npu = SimNpu::new(0).expect("npu");
    let calib: Vec<Vec<Tensor>> = (0..32).map(|_| vec![rng.tensor(&[5, d], 1.0)]).collect();
    let pg = PartitionedGraph::build(&g, &npu, cpu, &calib).expect("build");
    assert_eq!((pg.npu_nodes(), pg.cpu_nodes()), (4, 1));
    let got = pg.execute(&[&x]).expect("execute");
    let (sqnr, _) = compare(&got[0].to_vec_f32().expect("f32"), &want);
    eprintln!("captured block on the NPU simulator: SQNR {sqnr:.1} dB");
    // As the hand-built graph above: > 25 dB.
    assert!(sqnr > 25.0, "SQNR {sqnr:.1} dB");

    // A weight on another device cannot be captured: a clear error.
    let other = SimNpu::new(1).expect("npu").upload(&x).expect("upload");
    let e = capture(std::slice::from_ref(&x0), |dev, xs| {
        Ok(vec![dev.add(&xs[0], &other)?])
    })
    .expect_err("a tensor of another device");
    assert!(e.to_string().contains("another device"), "{e}");
}
