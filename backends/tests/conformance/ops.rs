//! One test per op and backend: `cargo test -p edgeflow-backends --test
//! conformance conv1d::` runs every `conv1d` case on each backend,
//! `conv1d::gpu` only on the GPU. A backend that is not available passes
//! its tests without running them (as the probe decides, which the test
//! prints). [`native_and_fallback_counts`] reports how many cases each
//! backend runs natively.

use crate::cases::{cases, Case};
use crate::{available, run_case, spec_of, NPU_RANGE_TOL};
use edgeflow_backends::{open, ProbeReport};
use edgeflow_runtime::{DeviceKind, Tensor};
use std::fmt::Write as _;
use std::sync::OnceLock;

/// Every case, built once per test process (the inputs are seeded in
/// order, so the set is built whole and each test takes its op's cases).
fn all_cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(cases)
}

/// Run every case of op `op` on every available backend of `kind`,
/// checking each against its tolerance; fails listing every case over it.
fn check_op(op: &str, kind: DeviceKind) {
    let mine: Vec<&Case> = all_cases().iter().filter(|c| c.op.name() == op).collect();
    assert!(!mine.is_empty(), "no conformance case for op {op}");
    let backends: Vec<ProbeReport> = available().into_iter().filter(|r| r.kind == kind).collect();
    if backends.is_empty() {
        eprintln!("{op}: no {kind:?} backend available, nothing to check");
        return;
    }
    let mut failures = String::new();
    let mut table = String::new();
    for r in backends {
        let shared = open(spec_of(&r)).unwrap();
        let (mut native, mut fallback) = (0, 0);
        let mut npu_worst = (0.0f64, String::new());
        for c in &mine {
            // An NPU compiles a model once, with activation ranges calibrated
            // on representative data, and later inputs outside those ranges
            // saturate. Each case is its own model: a fresh simulator,
            // calibrated on the case's input by its first runs.
            let fresh;
            let dev = if r.kind == DeviceKind::Npu {
                fresh = open(spec_of(&r)).unwrap();
                &fresh
            } else {
                &shared
            };
            match run_case(dev, c) {
                Ok(o) => {
                    if o.native {
                        native += 1;
                    } else {
                        fallback += 1;
                    }
                    let (ok, shown) = match (r.kind, o.native) {
                        // Fallback ops ran on the CPU: CPU tolerance.
                        (_, false) | (DeviceKind::Cpu, true) => (
                            if c.exact {
                                o.err == 0.0
                            } else {
                                o.err <= c.tol
                            },
                            o.err,
                        ),
                        (DeviceKind::Gpu, true) => (
                            if c.exact {
                                o.err == 0.0
                            } else {
                                o.err <= c.tol.max(1e-3)
                            },
                            o.err,
                        ),
                        (DeviceKind::Npu, true) => {
                            if o.range_err > npu_worst.0 {
                                npu_worst = (o.range_err, c.label.clone());
                            }
                            (o.range_err <= NPU_RANGE_TOL, o.range_err)
                        }
                    };
                    let _ = writeln!(
                        table,
                        "{:<7} {:<62} {:<8} err {:.2e}",
                        r.name,
                        c.label,
                        if o.native { "native" } else { "fallback" },
                        shown
                    );
                    if !ok {
                        let _ = writeln!(
                            failures,
                            "{} {}: error {:.3e} over tolerance {:.1e}",
                            r.name, c.label, shown, c.tol
                        );
                    }
                }
                Err(e) => {
                    let _ = writeln!(failures, "{} {}: {e}", r.name, c.label);
                }
            }
        }
        let s = shared.stats().snapshot();
        eprintln!(
            "{} {op}: {} cases, {native} native, {fallback} via CPU fallback (shared device: {} fallback ops, {} bytes moved){}",
            r.name,
            mine.len(),
            s.fallback_ops,
            s.bytes_transferred,
            if r.kind == DeviceKind::Npu { format!("; worst int8 error {:.2}% of range ({})", npu_worst.0 * 100.0, npu_worst.1) } else { String::new() }
        );
        if r.kind == DeviceKind::Cpu {
            assert_eq!(fallback, 0, "the CPU backend must run every op itself");
        }
    }
    eprintln!("{table}");
    assert!(failures.is_empty(), "conformance failures:\n{failures}");
}

/// A module per op with a test per backend (`linear::cpu`, `linear::gpu`,
/// `linear::npu`), and [`OPS`], the ops covered.
macro_rules! op_tests {
    ($($op:ident),* $(,)?) => {
        /// The ops [`op_tests!`] made tests for, by [`edgeflow_runtime::Op::name`].
        const OPS: &[&str] = &[$(stringify!($op)),*];
        $(
            mod $op {
                use edgeflow_runtime::DeviceKind;

                #[test]
                fn cpu() {
                    super::check_op(stringify!($op), DeviceKind::Cpu);
                }

                #[test]
                fn gpu() {
                    super::check_op(stringify!($op), DeviceKind::Gpu);
                }

                #[test]
                fn npu() {
                    super::check_op(stringify!($op), DeviceKind::Npu);
                }
            }
        )*
    };
}

op_tests!(
    matmul,
    linear,
    conv1d,
    conv1d_fused,
    conv2d,
    conv_transpose1d,
    layer_norm,
    rms_norm,
    softmax,
    attention,
    rope,
    neg,
    abs,
    exp,
    log,
    sqrt,
    sqr,
    recip,
    sin,
    cos,
    tanh,
    sigmoid,
    relu,
    gelu,
    gelu_erf,
    silu,
    softplus,
    leaky_relu,
    snake,
    resampled_snake,
    swiglu,
    add,
    sub,
    mul,
    div,
    maximum,
    minimum,
    pow,
    affine,
    sum,
    mean,
    max,
    min,
    argmax,
    cumsum,
    reshape,
    permute,
    concat,
    narrow,
    pad,
    gather,
    index_select,
    cast,
);

#[test]
fn every_case_has_an_op_test() {
    let missing: Vec<String> = all_cases()
        .iter()
        .filter(|c| !OPS.contains(&c.op.name()))
        .map(|c| c.label.clone())
        .collect();
    assert!(
        missing.is_empty(),
        "cases of ops without a test: {missing:?}"
    );
}

/// How many cases each available backend runs natively, and how many
/// through the counted CPU fallback (the per-op tests check that
/// `supports` and the fallback counter agree on every run). The CPU
/// backend must run every case itself.
#[test]
fn native_and_fallback_counts() {
    let cases = all_cases();
    for r in available() {
        let shared = open(spec_of(&r)).unwrap();
        let (mut native, mut fallback) = (0, 0);
        for c in cases {
            // A fresh simulator per case, as in the per-op tests.
            let fresh;
            let dev = if r.kind == DeviceKind::Npu {
                fresh = open(spec_of(&r)).unwrap();
                &fresh
            } else {
                &shared
            };
            let placed: Vec<Tensor> = c.inputs.iter().map(|t| dev.place(t).unwrap()).collect();
            let refs: Vec<&Tensor> = placed.iter().collect();
            if dev.backend().supports(&c.op, &refs) {
                native += 1;
            } else {
                fallback += 1;
            }
        }
        eprintln!(
            "{}: {} cases, {native} native, {fallback} via CPU fallback",
            r.name,
            cases.len()
        );
        if r.kind == DeviceKind::Cpu {
            assert_eq!(fallback, 0, "the CPU backend must run every op itself");
        }
    }
}
