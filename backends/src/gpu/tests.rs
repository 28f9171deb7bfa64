//! GPU backend tests against candle / the CPU backend on small random inputs.
//!
//! They run on any wgpu adapter (lavapipe in CI, which is slow: sizes stay
//! small). With no adapter they fail, unless `EDGEFLOW_SKIP_GPU=1` is set.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::cpu::CpuBackend;
use edgeflow_runtime::{Backend, BinaryOp, Device, PadMode, ReduceOp, UnaryOp};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::sync::OnceLock;

/// The shared backend for all tests, or `None` when skipping is allowed.
fn gpu() -> Option<Arc<GpuBackend>> {
    static GPU: OnceLock<std::result::Result<Arc<GpuBackend>, String>> = OnceLock::new();
    match GPU.get_or_init(|| GpuBackend::new(0).map(Arc::new).map_err(|e| e.to_string())) {
        Ok(g) => Some(g.clone()),
        Err(e) if std::env::var("EDGEFLOW_SKIP_GPU").as_deref() == Ok("1") => {
            eprintln!("skipping GPU test (EDGEFLOW_SKIP_GPU=1): {e}");
            None
        }
        Err(e) => panic!(
            "no usable GPU adapter: {e}\n\
             Install `mesa-vulkan-drivers libvulkan1` (software Vulkan) or set \
             EDGEFLOW_SKIP_GPU=1 to skip the GPU tests."
        ),
    }
}

fn rand_vec(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

fn rand_t(rng: &mut StdRng, dims: &[usize]) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(rand_vec(rng, n, -1.0, 1.0), dims).unwrap()
}

fn rand_pos(rng: &mut StdRng, dims: &[usize]) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(rand_vec(rng, n, 0.1, 2.0), dims).unwrap()
}

/// Runs `op` natively on the GPU (asserting it is supported) and downloads.
fn on_gpu(g: &GpuBackend, op: &Op, inputs: &[&Tensor]) -> Tensor {
    assert!(g.supports(op, inputs), "GPU should support {op:?}");
    let up: Vec<Tensor> = inputs.iter().map(|t| g.upload(t).unwrap()).collect();
    let refs: Vec<&Tensor> = up.iter().collect();
    let out = g.execute(op, &refs).unwrap();
    assert!(g.holds(&out), "result should stay on the GPU");
    let host = g.download(&out).unwrap();
    assert_eq!(host.dims(), out.dims());
    host
}

fn on_cpu(op: &Op, inputs: &[&Tensor]) -> Tensor {
    CpuBackend::new().execute(op, inputs).unwrap()
}

/// `|got - want| <= atol + rtol * |want|` element-wise, NaNs matching.
fn assert_close(got: &Tensor, want: &Tensor, rtol: f32, atol: f32, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let (g, w) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if a.is_nan() && b.is_nan() {
            continue;
        }
        assert!(
            (a - b).abs() <= atol + rtol * b.abs(),
            "{what}: element {i}: gpu {a} vs reference {b}"
        );
    }
}

fn candle(t: &Tensor) -> candle_core::Tensor {
    t.as_candle().unwrap().clone()
}

fn wrap(t: candle_core::Tensor) -> Tensor {
    Tensor::from_candle(t).unwrap()
}

const ODD: [usize; 4] = [1, 7, 33, 65];

#[test]
fn matmul_odd_sizes_and_batches() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(1);
    let mut shapes: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    for &m in &ODD {
        for &k in &ODD {
            for &n in &[1usize, 33, 65] {
                shapes.push((vec![m, k], vec![k, n]));
            }
        }
    }
    // Batched, and broadcast batch dims (including a rank difference).
    shapes.push((vec![3, 7, 33], vec![3, 33, 5]));
    shapes.push((vec![2, 1, 7, 9], vec![4, 9, 17]));
    shapes.push((vec![2, 3, 5, 4], vec![1, 3, 4, 6]));
    for (da, db) in shapes {
        let (a, b) = (rand_t(&mut rng, &da), rand_t(&mut rng, &db));
        let got = on_gpu(&g, &Op::MatMul, &[&a, &b]);
        let want = wrap(candle(&a).broadcast_matmul(&candle(&b)).unwrap());
        // f32 sums of up to 65 products of values in [-1, 1]: accumulation
        // order differs from candle's GEMM, so allow 1e-5 relative + 1e-5 absolute.
        assert_close(&got, &want, 1e-5, 1e-5, &format!("matmul {da:?} x {db:?}"));
    }
}

#[test]
fn linear_with_and_without_bias() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(2);
    for (xd, n) in [
        (vec![1usize, 7], 33usize),
        (vec![2, 3, 65], 7),
        (vec![33], 1),
    ] {
        let k = *xd.last().unwrap();
        let x = rand_t(&mut rng, &xd);
        let w = rand_t(&mut rng, &[n, k]);
        let b = rand_t(&mut rng, &[n]);
        // Reference: the CPU backend (candle). Tolerance as matmul: 1e-5 rel + 1e-5 abs.
        let got = on_gpu(&g, &Op::Linear, &[&x, &w]);
        assert_close(&got, &on_cpu(&Op::Linear, &[&x, &w]), 1e-5, 1e-5, "linear");
        let got = on_gpu(&g, &Op::Linear, &[&x, &w, &b]);
        let want = on_cpu(&Op::Linear, &[&x, &w, &b]);
        assert_close(&got, &want, 1e-5, 1e-5, "linear+bias");
    }
}

#[test]
fn quantized_linear_is_not_native() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(3);
    let x = rand_t(&mut rng, &[2, 64]);
    let w = rand_t(&mut rng, &[8, 64]);
    let q = candle_core::quantized::QTensor::quantize(
        &candle(&w),
        candle_core::quantized::GgmlDType::Q8_0,
    )
    .unwrap();
    let wq = Tensor::from_quantized(Arc::new(q)).unwrap();
    assert!(!g.supports(&Op::Linear, &[&x, &wq]));
    // Through the dispatcher: the CPU runs it, counted, with the right answer.
    let dev = Device::new(g.clone(), Arc::new(CpuBackend::new()));
    let wq = dev.place(&wq).unwrap();
    let got = dev.run(Op::Linear, &[&x, &wq]).unwrap();
    let want = on_cpu(&Op::Linear, &[&x, &wq]);
    assert_close(&got, &want, 0.0, 0.0, "quantized linear fallback");
    assert_eq!(dev.stats().snapshot().fallback_ops, 1);
}

#[test]
fn unary_ops() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(4);
    use UnaryOp::*;
    // (op, needs positive input, rtol, atol). Exact ops: 1e-6. Transcendental
    // functions (driver exp/log/sin/tanh are a few ulp, lavapipe's sin/cos
    // are looser): 1e-5 relative, 1e-5..1e-4 absolute.
    let cases = [
        (Neg, false, 0.0, 0.0),
        (Abs, false, 0.0, 0.0),
        (Sqr, false, 1e-6, 0.0),
        (Relu, false, 0.0, 0.0),
        (Recip, true, 1e-6, 0.0),
        (Sqrt, true, 1e-6, 1e-7),
        (Exp, false, 1e-5, 1e-6),
        (Log, true, 1e-5, 1e-5),
        (Sin, false, 1e-5, 1e-5),
        (Cos, false, 1e-5, 1e-5),
        (Tanh, false, 1e-5, 1e-5),
        (Sigmoid, false, 1e-5, 1e-6),
        (Gelu, false, 1e-5, 1e-5),
        (GeluErf, false, 1e-5, 1e-5),
        (Silu, false, 1e-5, 1e-6),
        (Softplus, false, 1e-5, 1e-5),
    ];
    for (op, pos, rtol, atol) in cases {
        for n in ODD {
            let x = if pos {
                rand_pos(&mut rng, &[n, 3])
            } else {
                // Wider range to exercise the tails (tanh/sigmoid saturation).
                let v = rand_vec(&mut rng, n * 3, -12.0, 12.0);
                Tensor::from_vec(v, &[n, 3]).unwrap()
            };
            let o = Op::Unary(op);
            let got = on_gpu(&g, &o, &[&x]);
            assert_close(&got, &on_cpu(&o, &[&x]), rtol, atol, &format!("{op:?}"));
        }
    }
}

#[test]
fn affine_and_leaky_relu() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(5);
    let x = rand_t(&mut rng, &[7, 33]);
    for op in [
        Op::Affine {
            mul: 1.5,
            add: -0.25,
        },
        Op::LeakyRelu { slope: 0.1 },
    ] {
        let got = on_gpu(&g, &op, &[&x]);
        // One multiply-add: 1e-6 relative.
        assert_close(&got, &on_cpu(&op, &[&x]), 1e-6, 1e-7, op.name());
    }
}

#[test]
fn binary_broadcasting() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(6);
    use BinaryOp::*;
    let shapes: [(&[usize], &[usize]); 6] = [
        (&[7, 33], &[7, 33]),
        (&[7, 33], &[33]),
        (&[7, 1], &[1, 65]),
        (&[2, 1, 5], &[3, 1]),
        (&[1], &[4, 3, 2]),
        (&[65], &[]),
    ];
    for op in [Add, Sub, Mul, Div, Max, Min, Pow] {
        for (da, db) in shapes {
            // Positive operands so Div and Pow stay finite.
            let (a, b) = (rand_pos(&mut rng, da), rand_pos(&mut rng, db));
            let o = Op::Binary(op);
            let got = on_gpu(&g, &o, &[&a, &b]);
            // Exact for max/min, one rounding for + - * /; pow goes through
            // exp/log: 1e-5 relative.
            let rtol = if op == Pow { 1e-5 } else { 1e-6 };
            let what = format!("{op:?} {da:?} {db:?}");
            assert_close(&got, &on_cpu(&o, &[&a, &b]), rtol, 1e-7, &what);
        }
    }
    let (a, b) = (rand_t(&mut rng, &[3, 2]), rand_t(&mut rng, &[3]));
    assert!(
        !g.supports(&Op::Binary(Add), &[&a, &b]),
        "incompatible shapes"
    );
}

#[test]
fn softmax_last_dim_only() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(7);
    for &c in &[1usize, 7, 33, 65, 300] {
        for rows in [1usize, 5] {
            let v = rand_vec(&mut rng, rows * c, -8.0, 8.0);
            let x = Tensor::from_vec(v, &[rows, c]).unwrap();
            let op = Op::Softmax { dim: 1 };
            let got = on_gpu(&g, &op, &[&x]);
            // exp plus a sum over <= 300 terms: 1e-5 relative, 1e-7 absolute.
            assert_close(&got, &on_cpu(&op, &[&x]), 1e-5, 1e-7, "softmax");
        }
    }
    // Other dims: strided rows.
    let x = rand_t(&mut rng, &[7, 5, 33]);
    for dim in [0usize, 1] {
        let op = Op::Softmax { dim };
        let got = on_gpu(&g, &op, &[&x]);
        assert_close(&got, &on_cpu(&op, &[&x]), 1e-5, 1e-7, "softmax dim");
    }
}

#[test]
fn layer_norm_and_rms_norm() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(8);
    for &d in &[1usize, 7, 33, 65, 300] {
        let x = rand_t(&mut rng, &[3, d]);
        let gamma = rand_t(&mut rng, &[d]);
        let beta = rand_t(&mut rng, &[d]);
        // Mean/variance over <= 300 values then 1/sqrt: 1e-5 relative, 1e-5 absolute.
        let op = Op::LayerNorm { eps: 1e-5 };
        let got = on_gpu(&g, &op, &[&x, &gamma, &beta]);
        let want = on_cpu(&op, &[&x, &gamma, &beta]);
        assert_close(&got, &want, 1e-5, 1e-5, "layer_norm");
        let got = on_gpu(&g, &op, &[&x, &gamma]);
        let want = wrap(
            candle_nn::ops::layer_norm_slow(
                &candle(&x),
                &candle(&gamma),
                &candle_core::Tensor::zeros(d, candle_core::DType::F32, &candle_core::Device::Cpu)
                    .unwrap(),
                1e-5,
            )
            .unwrap(),
        );
        assert_close(&got, &want, 1e-5, 1e-5, "layer_norm without beta");
        let op = Op::RmsNorm { eps: 1e-6 };
        let got = on_gpu(&g, &op, &[&x, &gamma]);
        assert_close(&got, &on_cpu(&op, &[&x, &gamma]), 1e-5, 1e-6, "rms_norm");
    }
}

#[test]
fn conv1d_stride_padding_dilation_groups() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(9);
    // (b, c_in, l, c_out, k, stride, padding, dilation, groups)
    let cases = [
        (
            1usize, 1usize, 7usize, 1usize, 1usize, 1usize, 0usize, 1usize, 1usize,
        ),
        (2, 3, 33, 4, 3, 1, 1, 1, 1),
        (1, 4, 65, 6, 5, 2, 2, 1, 2),
        (2, 6, 33, 6, 3, 1, 3, 3, 6),
        (1, 2, 7, 4, 7, 3, 0, 1, 1),
    ];
    for (b, ci, l, co, k, stride, padding, dilation, groups) in cases {
        let x = rand_t(&mut rng, &[b, ci, l]);
        let w = rand_t(&mut rng, &[co, ci / groups, k]);
        let bias = rand_t(&mut rng, &[co]);
        let op = Op::Conv1d {
            stride,
            padding,
            dilation,
            groups,
        };
        let want = wrap(
            candle(&x)
                .conv1d(&candle(&w), padding, stride, dilation, groups)
                .unwrap(),
        );
        let got = on_gpu(&g, &op, &[&x, &w]);
        // Sums of <= 15 products: 1e-5 relative + 1e-6 absolute.
        assert_close(&got, &want, 1e-5, 1e-6, &format!("conv1d {op:?}"));
        let got = on_gpu(&g, &op, &[&x, &w, &bias]);
        let want = on_cpu(&op, &[&x, &w, &bias]);
        assert_close(&got, &want, 1e-5, 1e-6, &format!("conv1d+bias {op:?}"));
    }
}

#[test]
fn snake_activation() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(10);
    let x = rand_t(&mut rng, &[2, 7, 33]);
    let alpha = rand_pos(&mut rng, &[7]);
    let got = on_gpu(&g, &Op::Snake, &[&x, &alpha]);
    // sin and a division: 1e-5 relative, 1e-5 absolute.
    let want = on_cpu(&Op::Snake, &[&x, &alpha]);
    assert_close(&got, &want, 1e-5, 1e-5, "snake");
}

#[test]
fn layout_ops() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(11);
    let x = rand_t(&mut rng, &[2, 3, 5]);
    let y = rand_t(&mut rng, &[2, 4, 5]);
    let ops: Vec<(Op, Vec<&Tensor>)> = vec![
        (
            Op::Permute {
                dims: vec![2, 0, 1],
            },
            vec![&x],
        ),
        (
            Op::Permute {
                dims: vec![0, 2, 1],
            },
            vec![&x],
        ),
        (
            Op::Narrow {
                dim: 1,
                start: 1,
                len: 2,
            },
            vec![&x],
        ),
        (
            Op::Narrow {
                dim: 2,
                start: 4,
                len: 1,
            },
            vec![&x],
        ),
        (Op::Concat { dim: 1 }, vec![&x, &y, &x]),
        (
            Op::Pad {
                dim: 2,
                before: 2,
                after: 1,
                mode: PadMode::Zeros,
            },
            vec![&x],
        ),
        (
            Op::Pad {
                dim: 0,
                before: 0,
                after: 3,
                mode: PadMode::Zeros,
            },
            vec![&x],
        ),
        (Op::Reshape { shape: vec![6, 5] }, vec![&x]),
        (Op::Cast { dtype: DType::F32 }, vec![&x]),
    ];
    for (op, inputs) in ops {
        let got = on_gpu(&g, &op, &inputs);
        // Pure data movement: exact.
        assert_close(&got, &on_cpu(&op, &inputs), 0.0, 0.0, &format!("{op:?}"));
    }
    let reflect = Op::Pad {
        dim: 2,
        before: 5,
        after: 1,
        mode: PadMode::Reflect,
    };
    assert!(!g.supports(&reflect, &[&x]), "reflect needs before < len");
    // Reflect / replicate padding and gather.
    let idx: Vec<i64> = (0..2 * 3 * 4).map(|i| (i * 7 % 5) as i64).collect();
    let idx = Tensor::from_i64(idx, &[2, 3, 4]).unwrap();
    let idx1: Vec<i64> = (0..2 * 2 * 5).map(|i| (i % 3) as i64).collect();
    let idx1 = Tensor::from_i64(idx1, &[2, 2, 5]).unwrap();
    let ops: Vec<(Op, Vec<&Tensor>)> = vec![
        (
            Op::Pad {
                dim: 2,
                before: 4,
                after: 3,
                mode: PadMode::Reflect,
            },
            vec![&x],
        ),
        (
            Op::Pad {
                dim: 1,
                before: 2,
                after: 0,
                mode: PadMode::Reflect,
            },
            vec![&x],
        ),
        (
            Op::Pad {
                dim: 2,
                before: 6,
                after: 2,
                mode: PadMode::Replicate,
            },
            vec![&x],
        ),
        (
            Op::Pad {
                dim: 0,
                before: 1,
                after: 3,
                mode: PadMode::Replicate,
            },
            vec![&x],
        ),
        (Op::Gather { dim: 2 }, vec![&x, &idx]),
        (Op::Gather { dim: 1 }, vec![&x, &idx1]),
    ];
    for (op, inputs) in ops {
        let got = on_gpu(&g, &op, &inputs);
        // Pure data movement: exact.
        assert_close(&got, &on_cpu(&op, &inputs), 0.0, 0.0, &format!("{op:?}"));
    }
}

#[test]
fn f16_and_bf16_inputs_upload_as_f32() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(12);
    let x = rand_t(&mut rng, &[7, 33]);
    for dt in [candle_core::DType::F16, candle_core::DType::BF16] {
        let xh = wrap(candle(&x).to_dtype(dt).unwrap());
        let exact = wrap(candle(&xh).to_dtype(candle_core::DType::F32).unwrap());
        let up = g.upload(&xh).unwrap();
        assert_eq!(up.dtype(), DType::F32);
        let back = g.download(&up).unwrap();
        assert_eq!(back.dtype(), DType::F32);
        // Widening is exact.
        assert_close(&back, &exact, 0.0, 0.0, "f16/bf16 round trip");
    }
    let idx = Tensor::from_i64(vec![0, 1], &[2]).unwrap();
    assert!(
        !g.supports(&Op::Unary(UnaryOp::Neg), &[&idx]),
        "integer input"
    );
}

#[test]
fn unsupported_op_falls_back_counted_with_right_answer() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(13);
    let x = rand_t(&mut rng, &[5, 33]);
    let op = Op::Reduce {
        op: ReduceOp::ArgMax,
        dim: 1,
        keepdim: false,
    };
    assert!(!g.supports(&op, &[&x]));
    let dev = Device::new(g.clone(), Arc::new(CpuBackend::new()));
    // The input is on the GPU first, as it would be mid-model.
    let xg = dev.place(&x).unwrap();
    let got = dev.run(op.clone(), &[&xg]).unwrap();
    let got = dev.to_host(&got).unwrap();
    let want = on_cpu(&op, &[&x]);
    // The CPU ran it on the same data: exact.
    assert_close(&got, &want, 0.0, 0.0, "fallback argmax");
    let s = dev.stats().snapshot();
    assert_eq!(s.fallback_ops, 1);
    assert_eq!(s.fallback_by_op.get("argmax"), Some(&1));
    assert_eq!(s.downloads, 1, "the fallback downloaded its input once");
}

#[test]
fn chain_stays_on_the_gpu() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(14);
    let x = rand_t(&mut rng, &[7, 33]);
    let w = rand_t(&mut rng, &[65, 33]);
    let b = rand_t(&mut rng, &[65]);
    let gamma = rand_t(&mut rng, &[65]);
    let dev = Device::new(g.clone(), Arc::new(CpuBackend::new()));
    let (wg, bg, gg) = (
        dev.place(&w).unwrap(),
        dev.place(&b).unwrap(),
        dev.place(&gamma).unwrap(),
    );
    let h = dev.run(Op::Linear, &[&x, &wg, &bg]).unwrap();
    let h = dev.run(Op::Unary(UnaryOp::Silu), &[&h]).unwrap();
    let h = dev.run(Op::RmsNorm { eps: 1e-6 }, &[&h, &gg]).unwrap();
    let h = dev
        .run(
            Op::Reshape {
                shape: vec![7, 5, 13],
            },
            &[&h],
        )
        .unwrap();
    let h = dev.run(Op::Softmax { dim: 2 }, &[&h]).unwrap();
    let s = dev.stats().snapshot();
    assert_eq!(s.downloads, 0, "no readback between GPU ops");
    assert_eq!(s.fallback_ops, 0);
    assert_eq!(s.uploads, 4, "three weights placed, x uploaded once");
    let got = dev.to_host(&h).unwrap();
    assert_eq!(dev.stats().snapshot().downloads, 1);
    let cpu = CpuBackend::new();
    let r = cpu.execute(&Op::Linear, &[&x, &w, &b]).unwrap();
    let r = cpu.execute(&Op::Unary(UnaryOp::Silu), &[&r]).unwrap();
    let r = cpu
        .execute(&Op::RmsNorm { eps: 1e-6 }, &[&r, &gamma])
        .unwrap();
    let r = cpu
        .execute(
            &Op::Reshape {
                shape: vec![7, 5, 13],
            },
            &[&r],
        )
        .unwrap();
    let r = cpu.execute(&Op::Softmax { dim: 2 }, &[&r]).unwrap();
    // Four f32 ops in sequence: 1e-5 relative, 1e-6 absolute.
    assert_close(&got, &r, 1e-5, 1e-6, "chain");
}

#[test]
fn large_dispatch_is_split() {
    let Some(g) = gpu() else { return };
    // More workgroups than one dispatch dimension allows (65535 * 256 elements)
    // would be slow on lavapipe; check the folding arithmetic on a softmax with
    // many rows (one workgroup per row) instead, against a small limit.
    let rows = 70_000usize.min(g.limits().max_compute_workgroups_per_dimension as usize + 5);
    let x = Tensor::from_vec((0..rows * 2).map(|i| (i % 5) as f32).collect(), &[rows, 2]).unwrap();
    let op = Op::Softmax { dim: 1 };
    let got = on_gpu(&g, &op, &[&x]);
    // exp of small integers: 1e-5 relative.
    assert_close(&got, &on_cpu(&op, &[&x]), 1e-5, 1e-7, "split softmax");
}

#[test]
fn adapters_are_listed() {
    let Some(g) = gpu() else { return };
    let list = adapters();
    eprintln!("adapters: {list:?}");
    assert!(!list.is_empty());
    assert_eq!(g.adapter(), list[0]);
    assert!(matches!(
        GpuBackend::new(list.len() + 10),
        Err(Error::DeviceUnavailable { .. })
    ));
}

#[test]
fn no_adapter_is_a_clear_error_not_a_panic() {
    // No backend to search stands in for a machine without any driver.
    match GpuBackend::open(wgpu::Backends::empty(), 0) {
        Err(Error::DeviceUnavailable { device, reason }) => {
            assert_eq!(device, "gpu:0");
            assert!(
                reason.contains("mesa-vulkan-drivers libvulkan1"),
                "{reason}"
            );
        }
        other => panic!("expected DeviceUnavailable, got {other:?}"),
    }
}

/// (b, h, hk, s, t, d, dv, causal, mask dims)
type AttnCase = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    bool,
    Option<Vec<usize>>,
);

#[test]
fn attention_gqa_mask_causal() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(15);
    // (b, h, hk, s, t, d, dv, causal, mask dims)
    let cases: [AttnCase; 5] = [
        (1, 2, 2, 7, 7, 16, 16, true, None),
        (2, 4, 2, 1, 33, 8, 8, true, None),
        (1, 3, 1, 5, 5, 7, 9, false, Some(vec![1, 1, 5, 5])),
        (2, 2, 1, 3, 65, 4, 4, true, Some(vec![2, 1, 1, 65])),
        (1, 1, 1, 33, 33, 1, 3, false, None),
    ];
    for (b, h, hk, s, t, d, dv, causal, mask) in cases {
        let q = rand_t(&mut rng, &[b, h, s, d]);
        let k = rand_t(&mut rng, &[b, hk, t, d]);
        let v = rand_t(&mut rng, &[b, hk, t, dv]);
        let op = Op::Attention {
            scale: 1.0 / (d as f64).sqrt(),
            causal,
        };
        let m = mask.map(|md| {
            let n = md.iter().product();
            // Additive mask with some hidden keys (-inf) and soft biases.
            let vals: Vec<f32> = (0..n)
                .map(|i| {
                    if i % 7 == 3 {
                        f32::NEG_INFINITY
                    } else {
                        rng.random_range(-1.0..1.0)
                    }
                })
                .collect();
            Tensor::from_vec(vals, &md).unwrap()
        });
        let mut inputs = vec![&q, &k, &v];
        if let Some(m) = &m {
            inputs.push(m);
        }
        let got = on_gpu(&g, &op, &inputs);
        // Two matmuls around a softmax: 1e-5 relative, 1e-5 absolute.
        let what = format!("attention b{b} h{h} hk{hk} s{s} t{t} d{d} causal {causal}");
        assert_close(&got, &on_cpu(&op, &inputs), 1e-5, 1e-5, &what);
    }
}

#[test]
fn rope_both_layouts() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(16);
    for (b, h, s, d) in [
        (1usize, 2usize, 7usize, 16usize),
        (2, 1, 33, 2),
        (1, 3, 1, 64),
    ] {
        let x = rand_t(&mut rng, &[b, h, s, d]);
        let cos = rand_t(&mut rng, &[s, d / 2]);
        let sin = rand_t(&mut rng, &[s, d / 2]);
        for interleaved in [false, true] {
            let op = Op::Rope { interleaved };
            let got = on_gpu(&g, &op, &[&x, &cos, &sin]);
            // Two products and a sum: 1e-6 relative, 1e-6 absolute.
            let want = on_cpu(&op, &[&x, &cos, &sin]);
            assert_close(&got, &want, 1e-6, 1e-6, &format!("rope {interleaved}"));
        }
    }
}

#[test]
fn reductions_over_any_dim() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(17);
    let x = rand_t(&mut rng, &[7, 33, 5]);
    for r in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        for dim in 0..3 {
            for keepdim in [false, true] {
                let op = Op::Reduce {
                    op: r,
                    dim,
                    keepdim,
                };
                let got = on_gpu(&g, &op, &[&x]);
                // Sums of <= 33 values in another order: 1e-5 relative, 1e-6 absolute.
                assert_close(&got, &on_cpu(&op, &[&x]), 1e-5, 1e-6, &format!("{op:?}"));
            }
        }
    }
    let argmax = Op::Reduce {
        op: ReduceOp::ArgMax,
        dim: 0,
        keepdim: false,
    };
    assert!(!g.supports(&argmax, &[&x]));
}

#[test]
fn index_select_embedding_lookup() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(18);
    let table = rand_t(&mut rng, &[65, 7]);
    let idx = Tensor::from_i64(vec![0, 64, 3, 3, 17], &[5]).unwrap();
    for dim in [0usize, 1] {
        let idx = if dim == 0 {
            idx.clone()
        } else {
            Tensor::from_i64(vec![6, 0, 2], &[3]).unwrap()
        };
        let op = Op::IndexSelect { dim };
        let got = on_gpu(&g, &op, &[&table, &idx]);
        // Data movement: exact.
        assert_close(
            &got,
            &on_cpu(&op, &[&table, &idx]),
            0.0,
            0.0,
            "index_select",
        );
    }
    // Through the dispatcher the table stays on the GPU: nothing comes back.
    let dev = Device::new(g.clone(), Arc::new(CpuBackend::new()));
    let tg = dev.place(&table).unwrap();
    let e = dev.run(Op::IndexSelect { dim: 0 }, &[&tg, &idx]).unwrap();
    assert!(g.holds(&e));
    assert_eq!(dev.stats().snapshot().downloads, 0);
    assert_eq!(dev.stats().snapshot().fallback_ops, 0);
    // An index out of range is not run on the GPU (the CPU reports the error).
    let bad = Tensor::from_i64(vec![65], &[1]).unwrap();
    assert!(!g.supports(&Op::IndexSelect { dim: 0 }, &[&table, &bad]));
    assert!(dev.run(Op::IndexSelect { dim: 0 }, &[&tg, &bad]).is_err());
}

#[test]
fn conv_transpose1d_and_conv2d() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(19);
    // (b, c_in, l, c_out, k, stride, padding, output_padding, dilation, groups)
    let cases = [
        (
            1usize, 2usize, 7usize, 3usize, 4usize, 2usize, 1usize, 0usize, 1usize, 1usize,
        ),
        (2, 4, 33, 4, 3, 1, 0, 0, 2, 2),
        (1, 3, 5, 2, 7, 3, 2, 1, 1, 1),
        (1, 1, 1, 1, 1, 1, 0, 0, 1, 1),
    ];
    for (b, ci, l, co, k, stride, padding, output_padding, dilation, groups) in cases {
        let x = rand_t(&mut rng, &[b, ci, l]);
        let w = rand_t(&mut rng, &[ci, co / groups, k]);
        let bias = rand_t(&mut rng, &[co]);
        let op = Op::ConvTranspose1d {
            stride,
            padding,
            output_padding,
            dilation,
            groups,
        };
        let got = on_gpu(&g, &op, &[&x, &w, &bias]);
        // Sums of <= 28 products: 1e-5 relative, 1e-6 absolute.
        let want = on_cpu(&op, &[&x, &w, &bias]);
        assert_close(&got, &want, 1e-5, 1e-6, &format!("{op:?}"));
    }
    // (b, c_in, h, w, c_out, k, stride, padding, dilation, groups)
    let cases = [
        (
            1usize, 3usize, 7usize, 9usize, 4usize, 3usize, 1usize, 1usize, 1usize, 1usize,
        ),
        (2, 4, 8, 5, 6, 3, 2, 0, 1, 2),
        (1, 2, 9, 9, 2, 2, 1, 2, 2, 2),
    ];
    for (b, ci, h, wd, co, k, stride, padding, dilation, groups) in cases {
        let x = rand_t(&mut rng, &[b, ci, h, wd]);
        let w = rand_t(&mut rng, &[co, ci / groups, k, k]);
        let bias = rand_t(&mut rng, &[co]);
        let op = Op::Conv2d {
            stride,
            padding,
            dilation,
            groups,
        };
        let got = on_gpu(&g, &op, &[&x, &w]);
        // Sums of <= 36 products: 1e-5 relative, 1e-6 absolute.
        assert_close(
            &got,
            &on_cpu(&op, &[&x, &w]),
            1e-5,
            1e-6,
            &format!("{op:?}"),
        );
        let got = on_gpu(&g, &op, &[&x, &w, &bias]);
        let want = on_cpu(&op, &[&x, &w, &bias]);
        assert_close(&got, &want, 1e-5, 1e-6, &format!("{op:?}+bias"));
    }
}

/// Prints rough timings (no assertions). Run with
/// `cargo test -p edgeflow-backends gpu::tests::timings -- --ignored --nocapture`.
#[test]
#[ignore = "prints timings; run explicitly"]
fn timings() {
    use std::time::Instant;
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(20);
    eprintln!("adapter: {}", g.adapter());
    for (m, k, n) in [
        (256usize, 256usize, 256usize),
        (512, 512, 512),
        (1, 896, 4864),
    ] {
        let a = rand_t(&mut rng, &[m, k]);
        let b = rand_t(&mut rng, &[k, n]);
        let (ag, bg) = (g.upload(&a).unwrap(), g.upload(&b).unwrap());
        // Warm up (pipeline compile), then time `reps` back-to-back ops.
        g.execute(&Op::MatMul, &[&ag, &bg]).unwrap();
        g.synchronize().unwrap();
        let reps = 5;
        let t0 = Instant::now();
        for _ in 0..reps {
            g.execute(&Op::MatMul, &[&ag, &bg]).unwrap();
        }
        g.synchronize().unwrap();
        let gpu_s = t0.elapsed().as_secs_f64() / reps as f64;
        cpu.execute(&Op::MatMul, &[&a, &b]).unwrap();
        let t0 = Instant::now();
        for _ in 0..reps {
            cpu.execute(&Op::MatMul, &[&a, &b]).unwrap();
        }
        let cpu_s = t0.elapsed().as_secs_f64() / reps as f64;
        let flop = 2.0 * (m * k * n) as f64;
        eprintln!(
            "matmul {m}x{k}x{n}: gpu {:.3} ms ({:.2} GFLOP/s), cpu {:.3} ms ({:.2} GFLOP/s)",
            gpu_s * 1e3,
            flop / gpu_s / 1e9,
            cpu_s * 1e3,
            flop / cpu_s / 1e9
        );
    }
    // Per-op overhead: a tiny op, submitted and waited for each time.
    let x = g.upload(&rand_t(&mut rng, &[64])).unwrap();
    let op = Op::Unary(UnaryOp::Relu);
    g.execute(&op, &[&x]).unwrap();
    g.synchronize().unwrap();
    let reps = 200;
    let t0 = Instant::now();
    for _ in 0..reps {
        g.execute(&op, &[&x]).unwrap();
    }
    g.synchronize().unwrap();
    eprintln!(
        "tiny op (relu on 64 values), {reps} queued back to back: {:.1} us each",
        t0.elapsed().as_secs_f64() / reps as f64 * 1e6
    );
    let t0 = Instant::now();
    for _ in 0..20 {
        let y = g.execute(&op, &[&x]).unwrap();
        g.download(&y).unwrap();
    }
    eprintln!(
        "tiny op + download round trip: {:.1} us each",
        t0.elapsed().as_secs_f64() / 20.0 * 1e6
    );
}

#[test]
fn cumsum_over_any_dim() {
    let Some(g) = gpu() else { return };
    let mut rng = StdRng::seed_from_u64(21);
    let x = rand_t(&mut rng, &[7, 33, 5]);
    for dim in 0..3 {
        let op = Op::Cumsum { dim };
        let got = on_gpu(&g, &op, &[&x]);
        // Running sums of <= 33 values in [-1, 1], summed in another order
        // than candle's: 1e-5 relative, 1e-5 absolute (partial sums can be ~0).
        assert_close(&got, &on_cpu(&op, &[&x]), 1e-5, 1e-5, &format!("{op:?}"));
    }
}

#[test]
fn empty_and_scalar_tensors() {
    let Some(g) = gpu() else { return };
    let empty = Tensor::from_vec(Vec::new(), &[0, 3]).unwrap();
    let got = on_gpu(&g, &Op::Unary(UnaryOp::Exp), &[&empty]);
    assert_eq!(got.dims(), &[0, 3]);
    assert!(got.to_vec_f32().unwrap().is_empty());
    // k = 0: the product is all zeros.
    let a = Tensor::from_vec(Vec::new(), &[2, 0]).unwrap();
    let b = Tensor::from_vec(Vec::new(), &[0, 3]).unwrap();
    let got = on_gpu(&g, &Op::MatMul, &[&a, &b]);
    assert_eq!(got.to_vec_f32().unwrap(), vec![0.0; 6]);
    let s = Tensor::from_vec(vec![2.0], &[]).unwrap();
    let got = on_gpu(&g, &Op::Unary(UnaryOp::Sqr), &[&s]);
    assert_eq!(got.dims(), &[] as &[usize]);
    assert_eq!(got.to_vec_f32().unwrap(), vec![4.0]);
}

#[test]
fn two_instances_on_one_adapter_do_not_mix_buffers() {
    let Some(a) = gpu() else { return };
    let b = Arc::new(GpuBackend::new(0).unwrap());
    let mut rng = StdRng::seed_from_u64(22);
    let x = rand_t(&mut rng, &[7, 33]);
    let xa = a.upload(&x).unwrap();
    assert!(a.holds(&xa));
    assert!(
        !b.holds(&xa),
        "another instance's buffer is not bindable here"
    );
    // Either instance reads it back.
    assert_close(&b.download(&xa).unwrap(), &x, 0.0, 0.0, "foreign download");
    // Through b's dispatcher it moves via the host (counted) and runs on b.
    let dev = Device::new(b.clone(), Arc::new(CpuBackend::new()));
    let op = Op::Unary(UnaryOp::Relu);
    let y = dev.run(op.clone(), &[&xa]).unwrap();
    assert!(b.holds(&y));
    let s = dev.stats().snapshot();
    assert_eq!((s.downloads, s.uploads, s.fallback_ops), (1, 1, 0));
    let got = dev.to_host(&y).unwrap();
    assert_close(&got, &on_cpu(&op, &[&x]), 0.0, 0.0, "relu on b");
    // Direct execute with a foreign input works too.
    let z = b.execute(&op, &[&xa]).unwrap();
    assert_close(&b.download(&z).unwrap(), &got, 0.0, 0.0, "direct");
}
