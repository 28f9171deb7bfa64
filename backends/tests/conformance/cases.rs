//! The conformance cases: every op on seeded inputs with odd sizes, each
//! with its reference output and tolerance.

use crate::reference::*;
use edgeflow_backends::open;
use edgeflow_runtime::{BinaryOp, DType, DeviceSpec, Op, PadMode, ReduceOp, Tensor, UnaryOp};

/// One conformance case: an op, its host inputs, the reference output and
/// the error allowed on a float backend for the inputs' dtype.
pub(crate) struct Case {
    pub(crate) label: String,
    pub(crate) op: Op,
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) want: A,
    pub(crate) tol: f64,
    /// Integer-valued output (argmax, index ops): compared exactly.
    pub(crate) exact: bool,
}

pub(crate) fn case(label: impl Into<String>, op: Op, inputs: Vec<Tensor>, want: A) -> Case {
    Case {
        label: label.into(),
        op,
        inputs,
        want,
        tol: 1e-4,
        exact: false,
    }
}

pub(crate) fn a(t: &Tensor) -> A {
    A::from_t(t)
}

pub(crate) fn cases() -> Vec<Case> {
    let mut cs = Vec::new();
    let mut seed = 1000u64;
    let mut next = || {
        seed += 1;
        seed
    };

    // matmul: odd sizes, batched, broadcast batch.
    for &(m, k, n) in &[(1, 7, 33), (7, 33, 1), (33, 129, 7), (1, 1, 1)] {
        let (x, y) = (randn(&[m, k], next()), randn(&[k, n], next()));
        let want = r_matmul(&a(&x), &a(&y));
        cs.push(case(
            format!("matmul {m}x{k}x{n}"),
            Op::MatMul,
            vec![x, y],
            want,
        ));
    }
    let (x, y) = (randn(&[3, 7, 33], next()), randn(&[3, 33, 5], next()));
    let want = r_matmul(&a(&x), &a(&y));
    cs.push(case(
        "matmul batched 3x7x33x5",
        Op::MatMul,
        vec![x, y],
        want,
    ));
    let (x, y) = (randn(&[2, 3, 7, 9], next()), randn(&[9, 4], next()));
    let want = r_matmul(&a(&x), &a(&y));
    cs.push(case("matmul broadcast rhs", Op::MatMul, vec![x, y], want));

    // linear, f32, with and without bias, rank 1..3 inputs.
    for (xd, n) in [(vec![129], 7), (vec![7, 33], 129), (vec![2, 7, 33], 1)] {
        let k = *xd.last().unwrap();
        let (x, w, b) = (
            randn(&xd, next()),
            scaled(&[n, k], next(), 0.2),
            randn(&[n], next()),
        );
        let want = r_linear(&a(&x), &a(&w), Some(&a(&b)));
        cs.push(case(
            format!("linear {xd:?}->{n} +bias"),
            Op::Linear,
            vec![x.clone(), w.clone(), b],
            want,
        ));
        let want = r_linear(&a(&x), &a(&w), None);
        cs.push(case(
            format!("linear {xd:?}->{n}"),
            Op::Linear,
            vec![x, w],
            want,
        ));
    }
    // Prefill-shaped f32 products (the CPU backend's packed GEMM from 5
    // rows): sizes off its 14-row panels and 32-lane blocks, k over one
    // 256-step slice, one valid lane in the last block, bias, and
    // transposed (non-contiguous) operands.
    let host = open(DeviceSpec::Cpu).unwrap();
    for &(m, k, n) in &[(5, 17, 16), (45, 300, 37), (70, 513, 33), (33, 64, 100)] {
        let (x, y) = (randn(&[m, k], next()), scaled(&[k, n], next(), 0.2));
        let want = r_matmul(&a(&x), &a(&y));
        cs.push(case(
            format!("matmul prefill {m}x{k}x{n}"),
            Op::MatMul,
            vec![x, y],
            want,
        ));
    }
    for &(rows, k, n) in &[(7, 33, 129), (97, 260, 45), (257, 96, 17), (200, 64, 30)] {
        let (x, w, b) = (
            randn(&[rows, k], next()),
            scaled(&[n, k], next(), 0.2),
            randn(&[n], next()),
        );
        let want = r_linear(&a(&x), &a(&w), Some(&a(&b)));
        cs.push(case(
            format!("linear prefill {rows}x{k}->{n} +bias"),
            Op::Linear,
            vec![x.clone(), w.clone(), b],
            want,
        ));
        let want = r_linear(&a(&x), &a(&w), None);
        cs.push(case(
            format!("linear prefill {rows}x{k}->{n}"),
            Op::Linear,
            vec![x, w],
            want,
        ));
    }
    // matmul of transposed views: a^T [k, m]^T, b^T [n, k]^T, both.
    let (m, k, n) = (37, 290, 41);
    let (xt, yt) = (randn(&[k, m], next()), scaled(&[n, k], next(), 0.2));
    let (xv, yv) = (
        host.transpose(&xt, 0, 1).unwrap(),
        host.transpose(&yt, 0, 1).unwrap(),
    );
    let (xc, yc) = (randn(&[m, k], next()), scaled(&[k, n], next(), 0.2));
    for (label, x, y) in [
        ("a transposed", &xv, &yc),
        ("b transposed", &xc, &yv),
        ("both transposed", &xv, &yv),
    ] {
        let want = r_matmul(&a(x), &a(y));
        cs.push(case(
            format!("matmul prefill {m}x{k}x{n}, {label}"),
            Op::MatMul,
            vec![x.clone(), y.clone()],
            want,
        ));
    }
    // quantized linear: reference on the dequantized weights.
    for (dt, tol) in [
        (DType::Q8_0, 1e-2),
        (DType::Q4_1, 3e-2),
        (DType::Q4_0, 3e-2),
    ] {
        let (x, w, b) = (
            randn(&[7, 128], next()),
            scaled(&[33, 128], next(), 0.2),
            randn(&[33], next()),
        );
        let wq = host.cast(&w, dt).unwrap();
        assert_eq!(wq.dtype(), dt);
        let deq = host.cast(&wq, DType::F32).unwrap();
        let want = r_linear(&a(&x), &a(&deq), Some(&a(&b)));
        let mut c = case(
            format!("linear {dt} 7x128->33"),
            Op::Linear,
            vec![x, wq.clone(), b.clone()],
            want,
        );
        c.tol = tol;
        cs.push(c);
        // One row (decode): the same kernels' one-row tiles.
        let x1 = randn(&[1, 1, 128], next());
        let want = r_linear(&a(&x1), &a(&deq), Some(&a(&b)));
        let mut c = case(
            format!("linear {dt} decode 1x128->33"),
            Op::Linear,
            vec![x1, wq, b],
            want,
        );
        c.tol = tol;
        cs.push(c);
    }
    // Q5_0 and K-quant linear (kept quantized, int8 activations per block
    // of 32 / super-block of 256): 13 rows (an eight-row group of the
    // prefill kernel and a tail) and one row (decode).
    for (dt, tol) in [
        (DType::Q5_0, 3e-2),
        (DType::Q4K, 3e-2),
        (DType::Q5K, 3e-2),
        (DType::Q6K, 2e-2),
    ] {
        let w = scaled(&[37, 512], next(), 0.2);
        let wq = host.cast(&w, dt).unwrap();
        assert_eq!(wq.dtype(), dt);
        let deq = host.cast(&wq, DType::F32).unwrap();
        let b = randn(&[37], next());
        for (name, x) in [
            ("13x512->37", randn(&[13, 512], next())),
            ("decode 1x512->37", randn(&[1, 1, 512], next())),
        ] {
            let want = r_linear(&a(&x), &a(&deq), Some(&a(&b)));
            let mut c = case(
                format!("linear {dt} {name}"),
                Op::Linear,
                vec![x, wq.clone(), b.clone()],
                want,
            );
            c.tol = tol;
            cs.push(c);
        }
    }
    // f16 / bf16 inputs.
    for (dt, tol) in [(DType::F16, 1e-2), (DType::BF16, 4e-2)] {
        let x = host.cast(&randn(&[7, 33], next()), dt).unwrap();
        let w = host.cast(&scaled(&[9, 33], next(), 0.2), dt).unwrap();
        let want = r_linear(&a(&x), &a(&w), None);
        let mut c = case(format!("linear {dt}"), Op::Linear, vec![x.clone(), w], want);
        c.tol = tol;
        cs.push(c);
        let want = r_softmax(&a(&x), 1);
        let mut c = case(
            format!("softmax {dt}"),
            Op::Softmax { dim: 1 },
            vec![x.clone()],
            want,
        );
        c.tol = tol;
        cs.push(c);
        let want = a(&x).map(|v| r_unary(UnaryOp::Gelu, v));
        let mut c = case(
            format!("gelu {dt}"),
            Op::Unary(UnaryOp::Gelu),
            vec![x],
            want,
        );
        c.tol = tol;
        cs.push(c);
    }

    // conv1d.
    for &(cin, cout, l, k, stride, pad, dil, groups) in &[
        (1, 1, 1, 1, 1, 0, 1, 1),
        (7, 5, 33, 3, 1, 1, 1, 1),
        (6, 9, 129, 5, 2, 2, 2, 3),
        (4, 4, 17, 7, 1, 3, 1, 4),
        // Depthwise with a stride: a decimating filter, one channel and
        // several (the CPU backend's depthwise kernel).
        (1, 1, 40, 12, 2, 0, 1, 1),
        (5, 5, 33, 4, 3, 2, 2, 5),
    ] {
        let x = randn(&[2, cin, l], next());
        let w = scaled(&[cout, cin / groups, k], next(), 0.3);
        let b = randn(&[cout], next());
        let want = r_conv1d(&a(&x), &a(&w), Some(&a(&b)), stride, pad, dil, groups);
        let op = Op::Conv1d {
            stride,
            padding: pad,
            dilation: dil,
            groups,
        };
        cs.push(case(
            format!("conv1d c{cin}->{cout} l{l} k{k} s{stride} p{pad} d{dil} g{groups}"),
            op,
            vec![x, w, b],
            want,
        ));
    }
    // conv1d with a leaky ReLU before it and a residual after it (the
    // HiFi-GAN unit), some with the output channels interleaved as the
    // phases of a transposed convolution; the strided/grouped shapes take
    // the composed path.
    for &(cin, cout, l, k, stride, pad, dil, groups, res, phases) in &[
        (7, 7, 33, 3, 1, 1, 1, 1, true, 1),
        (9, 5, 61, 5, 1, 6, 3, 1, false, 1),
        (6, 9, 129, 5, 2, 2, 2, 3, false, 1),
        (5, 12, 40, 3, 1, 1, 1, 1, true, 3),
        (4, 16, 23, 3, 1, 1, 1, 1, false, 8),
        (6, 9, 129, 5, 2, 2, 2, 3, true, 3),
    ] {
        let x = randn(&[2, cin, l], next());
        let w = scaled(&[cout, cin / groups, k], next(), 0.3);
        let b = randn(&[cout], next());
        let mut xa = a(&x);
        for v in xa.v.iter_mut() {
            if *v < 0.0 {
                *v *= 0.2;
            }
        }
        let mut want = r_conv1d(&xa, &a(&w), Some(&a(&b)), stride, pad, dil, groups);
        if phases > 1 {
            // [n, p * c + o, t] -> [n, o, t * phases + p].
            let (n, l_out, c) = (want.d[0], want.d[2], cout / phases);
            let mut v = vec![0.0; want.v.len()];
            for bi in 0..n {
                for ch in 0..cout {
                    let (p, o) = (ch / c, ch % c);
                    for t in 0..l_out {
                        v[(bi * c + o) * l_out * phases + t * phases + p] =
                            want.v[(bi * cout + ch) * l_out + t];
                    }
                }
            }
            want = A::new(&[n, c, l_out * phases], v);
        }
        let mut inputs = vec![x, w, b];
        if res {
            let r = randn(&want.d, next());
            for (v, r) in want.v.iter_mut().zip(a(&r).v) {
                *v += r;
            }
            inputs.push(r);
        }
        let op = Op::Conv1dFused {
            stride,
            padding: pad,
            dilation: dil,
            groups,
            pre_slope: Some(0.2),
            residual: res,
            phases,
        };
        cs.push(case(
            format!(
                "conv1d_fused c{cin}->{cout} l{l} k{k} s{stride} d{dil} g{groups} res={res} phases={phases}"
            ),
            op,
            inputs,
            want,
        ));
    }
    // conv2d.
    for &(cin, cout, h, wd, k, stride, pad, dil, groups) in
        &[(3, 4, 7, 9, 3, 1, 1, 1, 1), (4, 6, 11, 5, 3, 2, 0, 1, 2)]
    {
        let x = randn(&[1, cin, h, wd], next());
        let w = scaled(&[cout, cin / groups, k, k], next(), 0.3);
        let b = randn(&[cout], next());
        let want = r_conv2d(&a(&x), &a(&w), Some(&a(&b)), stride, pad, dil, groups);
        let op = Op::Conv2d {
            stride,
            padding: pad,
            dilation: dil,
            groups,
        };
        cs.push(case(
            format!("conv2d c{cin}->{cout} {h}x{wd} k{k} s{stride} p{pad} g{groups}"),
            op,
            vec![x, w, b],
            want,
        ));
    }
    // conv_transpose1d (vocoder upsampling shapes).
    for &(cin, cout, l, k, stride, pad, opad, dil) in &[
        (5, 3, 7, 4, 2, 1, 0, 1),
        (8, 4, 33, 16, 8, 4, 0, 1),
        (3, 2, 1, 3, 1, 0, 0, 2),
        (4, 4, 9, 5, 3, 1, 2, 1),
        // Kernel shorter than the stride, stride 1, padding past the kernel.
        (6, 5, 13, 3, 5, 0, 0, 1),
        (7, 9, 20, 7, 1, 3, 0, 1),
        (8, 4, 25, 5, 2, 6, 1, 1),
    ] {
        let x = randn(&[2, cin, l], next());
        let w = scaled(&[cin, cout, k], next(), 0.3);
        let b = randn(&[cout], next());
        let want = r_conv_t1d(&a(&x), &a(&w), Some(&a(&b)), stride, pad, opad, dil, 1);
        let op = Op::ConvTranspose1d {
            stride,
            padding: pad,
            output_padding: opad,
            dilation: dil,
            groups: 1,
        };
        cs.push(case(
            format!("conv_t1d c{cin}->{cout} l{l} k{k} s{stride} p{pad} op{opad} d{dil}"),
            op,
            vec![x, w, b],
            want,
        ));
    }

    // norms.
    for n in [1usize, 7, 129] {
        let x = randn(&[3, n], next());
        let (g, b) = (randn(&[n], next()), randn(&[n], next()));
        let eps = 1e-5;
        if n > 1 {
            let want = r_layer_norm(&a(&x), &a(&g), Some(&a(&b)), eps);
            cs.push(case(
                format!("layer_norm n{n}"),
                Op::LayerNorm { eps },
                vec![x.clone(), g.clone(), b],
                want,
            ));
            let want = r_layer_norm(&a(&x), &a(&g), None, eps);
            cs.push(case(
                format!("layer_norm n{n} no beta"),
                Op::LayerNorm { eps },
                vec![x.clone(), g.clone()],
                want,
            ));
        }
        let want = r_rms_norm(&a(&x), &a(&g), 1e-6);
        cs.push(case(
            format!("rms_norm n{n}"),
            Op::RmsNorm { eps: 1e-6 },
            vec![x, g],
            want,
        ));
    }

    // softmax over every dim of a 3-D tensor.
    let x = scaled(&[7, 33, 5], next(), 3.0);
    for dim in 0..3 {
        let want = r_softmax(&a(&x), dim);
        cs.push(case(
            format!("softmax [7,33,5] dim {dim}"),
            Op::Softmax { dim },
            vec![x.clone()],
            want,
        ));
    }
    let x = scaled(&[2, 129], next(), 3.0);
    cs.push(case(
        "softmax [2,129]",
        Op::Softmax { dim: 1 },
        vec![x.clone()],
        r_softmax(&a(&x), 1),
    ));

    // attention: MHA, GQA, decode with causal alignment, additive mask.
    for &(b, h, hk, s, t, d, causal, masked) in &[
        (1, 2, 2, 7, 7, 8, true, false),
        (2, 4, 2, 5, 9, 16, false, true),
        (1, 6, 2, 1, 33, 8, true, false),
        (1, 3, 1, 4, 7, 5, true, true),
    ] {
        let q = randn(&[b, h, s, d], next());
        let k = randn(&[b, hk, t, d], next());
        let v = randn(&[b, hk, t, d], next());
        let scale = 1.0 / (d as f64).sqrt();
        let mut inputs = vec![q.clone(), k.clone(), v.clone()];
        let mask = if masked {
            let m = scaled(&[1, 1, s, t], next(), 2.0);
            inputs.push(m.clone());
            Some(a(&m))
        } else {
            None
        };
        let want = r_attention(&a(&q), &a(&k), &a(&v), mask.as_ref(), scale, causal);
        let label =
            format!("attention b{b} h{h}/{hk} s{s} t{t} d{d} causal={causal} mask={masked}");
        cs.push(case(label, Op::Attention { scale, causal }, inputs, want));
    }

    // rope, both layouts.
    for interleaved in [false, true] {
        let (s, d) = (7, 16);
        let x = randn(&[2, 3, s, d], next());
        let theta: Vec<f32> = (0..s)
            .flat_map(|p| {
                (0..d / 2).map(move |i| p as f32 / 10000f32.powf(2.0 * i as f32 / d as f32))
            })
            .collect();
        let cos = Tensor::from_vec(theta.iter().map(|t| t.cos()).collect(), &[s, d / 2]).unwrap();
        let sin = Tensor::from_vec(theta.iter().map(|t| t.sin()).collect(), &[s, d / 2]).unwrap();
        let want = r_rope(&a(&x), &a(&cos), &a(&sin), interleaved);
        cs.push(case(
            format!("rope interleaved={interleaved}"),
            Op::Rope { interleaved },
            vec![x, cos, sin],
            want,
        ));
    }

    // unary: every function, odd size.
    use UnaryOp::*;
    for u in [
        Neg, Abs, Exp, Log, Sqrt, Sqr, Recip, Sin, Cos, Tanh, Sigmoid, Relu, Gelu, GeluErf, Silu,
        Softplus,
    ] {
        let x = match u {
            Log | Sqrt | Recip => positive(&[7, 33], next()),
            _ => scaled(&[7, 33], next(), 2.0),
        };
        let want = a(&x).map(|v| r_unary(u, v));
        cs.push(case(format!("unary {u:?}"), Op::Unary(u), vec![x], want));
    }
    let x = scaled(&[129], next(), 2.0);
    let want = a(&x).map(|v| v.max(0.1 * v));
    cs.push(case(
        "leaky_relu 0.1",
        Op::LeakyRelu { slope: 0.1 },
        vec![x],
        want,
    ));
    let (x, al) = (randn(&[2, 7, 33], next()), positive(&[7], next()));
    let want = {
        let (xa, aa) = (a(&x), a(&al));
        let mut o = xa.clone();
        for (i, v) in o.v.iter_mut().enumerate() {
            let c = (i / 33) % 7;
            let al = aa.v[c];
            *v += (al * *v).sin().powi(2) / al;
        }
        o
    };
    cs.push(case("snake", Op::Snake, vec![x, al], want));
    // With a gain per channel (SnakeBeta), and arguments past a few periods.
    let (x, al, g) = (
        scaled(&[2, 7, 33], next(), 4.0),
        positive(&[7], next()),
        positive(&[7], next()),
    );
    let want = {
        let (xa, aa, ga) = (a(&x), a(&al), a(&g));
        let mut o = xa.clone();
        for (i, v) in o.v.iter_mut().enumerate() {
            let c = (i / 33) % 7;
            *v += ga.v[c] * (aa.v[c] * *v).sin().powi(2);
        }
        o
    };
    cs.push(case("snake with gain", Op::Snake, vec![x, al, g], want));

    // SnakeBeta between resamplers: BigVGAN's 2x with a 7-tap polyphase
    // upsampler and a 12-tap downsampler, and a 3x one with other pads.
    for (ratio, taps, k, up_pad, down_pad) in
        [(2, 7, 12, (3, 3), (5, 6)), (3, 4, 6, (1, 2), (2, 3))]
    {
        let (b, c, t) = (2, 5, 37);
        let x = scaled(&[b, c, t], next(), 2.0);
        let (fr, g) = (positive(&[c], next()), positive(&[c], next()));
        let up = scaled(&[ratio, 1, taps], next(), 0.5);
        let ub = scaled(&[ratio], next(), 0.1);
        let down = scaled(&[1, 1, k], next(), 0.3);
        let (xa, fa, ga, upa, uba, da) = (a(&x), a(&fr), a(&g), a(&up), a(&ub), a(&down));
        let per_phase = t + up_pad.0 + up_pad.1 + 1 - taps;
        let len = per_phase * ratio;
        let t_out = (len + down_pad.0 + down_pad.1 - k) / ratio + 1;
        let clamp = |i: i64, n: usize| i.clamp(0, n as i64 - 1) as usize;
        let mut o = A::zeros(&[b, c, t_out]);
        for row in 0..b * c {
            let ch = row % c;
            let xr = &xa.v[row * t..][..t];
            let xp = |i: usize| xr[clamp(i as i64 - up_pad.0 as i64, t)];
            let mut act = vec![0f64; len];
            for (i, v) in act.iter_mut().enumerate() {
                let (m, q) = (i / ratio, i % ratio);
                let u = uba.v[q]
                    + (0..taps)
                        .map(|j| upa.v[q * taps + j] * xp(m + j))
                        .sum::<f64>();
                *v = u + ga.v[ch] * (fa.v[ch] * u).sin().powi(2);
            }
            for n in 0..t_out {
                o.v[row * t_out + n] = (0..k)
                    .map(|j| da.v[j] * act[clamp((n * ratio + j) as i64 - down_pad.0 as i64, len)])
                    .sum();
            }
        }
        let rs = edgeflow_runtime::SnakeResampling {
            ratio,
            up_pad,
            down_pad,
        };
        cs.push(case(
            format!("resampled snake {ratio}x"),
            Op::ResampledSnake(rs),
            vec![x, fr, g, up, ub, down],
            o,
        ));
    }

    // SwiGLU: gate then up stacked on the last dim (f = 13: vector tails),
    // and gate and up as two tensors.
    let silu = |v: f64| v / (1.0 + (-v).exp());
    let f = 13;
    let gu = scaled(&[2, 3, 2 * f], next(), 4.0);
    let want = A {
        d: vec![2, 3, f],
        v: a(&gu)
            .v
            .chunks(2 * f)
            .flat_map(|r| (0..f).map(move |i| silu(r[i]) * r[f + i]))
            .collect(),
    };
    cs.push(case("swiglu stacked", Op::SwiGlu, vec![gu], want));
    let (g, u) = (scaled(&[3, 37], next(), 4.0), randn(&[3, 37], next()));
    let want = A {
        d: vec![3, 37],
        v: a(&g)
            .v
            .iter()
            .zip(&a(&u).v)
            .map(|(g, u)| silu(*g) * u)
            .collect(),
    };
    cs.push(case("swiglu gate and up", Op::SwiGlu, vec![g, u], want));

    // binary: every op, same shape and broadcast shapes.
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
    ] {
        for (da, db) in [
            (vec![7, 33], vec![7, 33]),
            (vec![2, 7, 33], vec![33]),
            (vec![1, 1, 40], vec![3, 5, 40]),
            (vec![7, 1], vec![1, 33]),
            (vec![1], vec![129]),
        ] {
            let (x, y) = match op {
                BinaryOp::Pow => (positive(&da, next()), randn(&db, next())),
                BinaryOp::Div => (randn(&da, next()), positive(&db, next())),
                _ => (randn(&da, next()), randn(&db, next())),
            };
            let want = r_binary(op, &a(&x), &a(&y));
            cs.push(case(
                format!("binary {op:?} {da:?} {db:?}"),
                Op::Binary(op),
                vec![x, y],
                want,
            ));
        }
    }
    let x = randn(&[7, 33], next());
    cs.push(case(
        "affine",
        Op::Affine {
            mul: -1.5,
            add: 0.25,
        },
        vec![x.clone()],
        a(&x).map(|v| v * -1.5 + 0.25),
    ));

    // reductions over each dim, keepdim both ways.
    let x = randn(&[7, 33, 5], next());
    for op in [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::ArgMax,
    ] {
        for dim in 0..3 {
            for keepdim in [false, true] {
                let want = r_reduce(op, &a(&x), dim, keepdim);
                let mut c = case(
                    format!("reduce {op:?} dim {dim} keep={keepdim}"),
                    Op::Reduce { op, dim, keepdim },
                    vec![x.clone()],
                    want,
                );
                c.exact = op == ReduceOp::ArgMax;
                cs.push(c);
            }
        }
    }
    for dim in 0..2 {
        let x = randn(&[7, 129], next());
        cs.push(case(
            format!("cumsum dim {dim}"),
            Op::Cumsum { dim },
            vec![x.clone()],
            r_cumsum(&a(&x), dim),
        ));
    }

    // layout ops (exact).
    let x = randn(&[2, 7, 33], next());
    let mut layout = vec![
        case(
            "reshape",
            Op::Reshape {
                shape: vec![14, 33],
            },
            vec![x.clone()],
            A::new(&[14, 33], a(&x).v),
        ),
        case(
            "permute 2,0,1",
            Op::Permute {
                dims: vec![2, 0, 1],
            },
            vec![x.clone()],
            r_permute(&a(&x), &[2, 0, 1]),
        ),
        case(
            "narrow dim 2",
            Op::Narrow {
                dim: 2,
                start: 5,
                len: 7,
            },
            vec![x.clone()],
            r_narrow(&a(&x), 2, 5, 7),
        ),
        case(
            "narrow dim 0",
            Op::Narrow {
                dim: 0,
                start: 1,
                len: 1,
            },
            vec![x.clone()],
            r_narrow(&a(&x), 0, 1, 1),
        ),
    ];
    let (y, z) = (randn(&[2, 1, 33], next()), randn(&[2, 5, 33], next()));
    layout.push(case(
        "concat dim 1",
        Op::Concat { dim: 1 },
        vec![x.clone(), y.clone(), z.clone()],
        r_concat(&[&a(&x), &a(&y), &a(&z)], 1),
    ));
    let w = randn(&[2, 7, 4], next());
    layout.push(case(
        "concat dim 2",
        Op::Concat { dim: 2 },
        vec![x.clone(), w.clone()],
        r_concat(&[&a(&x), &a(&w)], 2),
    ));
    for mode in [PadMode::Zeros, PadMode::Reflect, PadMode::Replicate] {
        layout.push(case(
            format!("pad {mode:?}"),
            Op::Pad {
                dim: 2,
                before: 3,
                after: 2,
                mode,
            },
            vec![x.clone()],
            r_pad(&a(&x), 2, 3, 2, mode),
        ));
        layout.push(case(
            format!("pad {mode:?} dim1"),
            Op::Pad {
                dim: 1,
                before: 1,
                after: 4,
                mode,
            },
            vec![x.clone()],
            r_pad(&a(&x), 1, 1, 4, mode),
        ));
    }
    let gi: Vec<i64> = (0..2 * 7 * 5).map(|i| (i * 13 % 33) as i64).collect();
    let idx = Tensor::from_i64(gi.clone(), &[2, 7, 5]).unwrap();
    layout.push(case(
        "gather dim 2",
        Op::Gather { dim: 2 },
        vec![x.clone(), idx.clone()],
        r_gather(
            &a(&x),
            &A::new(&[2, 7, 5], gi.iter().map(|&v| v as f64).collect()),
            2,
        ),
    ));
    let sel = [6usize, 0, 3, 3];
    let si = Tensor::from_i64(sel.iter().map(|&v| v as i64).collect(), &[4]).unwrap();
    layout.push(case(
        "index_select dim 1",
        Op::IndexSelect { dim: 1 },
        vec![x.clone(), si.clone()],
        r_index_select(&a(&x), &sel, 1),
    ));
    // Strided views (a narrowed channel range, a transposed tensor): candle's
    // CPU kernels read these as contiguous, so the backend must copy first.
    let view = host.narrow(&x, 2, 5, 20).unwrap();
    layout.push(case(
        "index_select on a narrowed view",
        Op::IndexSelect { dim: 1 },
        vec![view.clone(), si.clone()],
        r_index_select(&a(&view), &sel, 1),
    ));
    let xt = host.transpose(&x, 1, 2).unwrap();
    layout.push(case(
        "index_select on a transposed view",
        Op::IndexSelect { dim: 2 },
        vec![xt.clone(), si.clone()],
        r_index_select(&a(&xt), &sel, 2),
    ));
    let gt: Vec<i64> = (0..2 * 33 * 5).map(|i| (i * 5 % 7) as i64).collect();
    let gti = Tensor::from_i64(gt.clone(), &[2, 33, 5]).unwrap();
    layout.push(case(
        "gather on a transposed view",
        Op::Gather { dim: 2 },
        vec![xt.clone(), gti],
        r_gather(
            &a(&xt),
            &A::new(&[2, 33, 5], gt.iter().map(|&v| v as f64).collect()),
            2,
        ),
    ));
    let emb = randn(&[33, 8], next());
    let tok = [32usize, 0, 7];
    let ti = Tensor::from_i64(tok.iter().map(|&v| v as i64).collect(), &[3]).unwrap();
    layout.push(case(
        "index_select embedding",
        Op::IndexSelect { dim: 0 },
        vec![emb.clone(), ti.clone()],
        r_index_select(&a(&emb), &tok, 0),
    ));
    // Embedding lookup in a quantized table (GGUF token_embd): reference on the dequantized rows.
    let embq = host.cast(&randn(&[33, 64], next()), DType::Q8_0).unwrap();
    let deq = host.cast(&embq, DType::F32).unwrap();
    layout.push(case(
        "index_select q8_0 embedding",
        Op::IndexSelect { dim: 0 },
        vec![embq, ti],
        r_index_select(&a(&deq), &tok, 0),
    ));
    for mut c in layout {
        c.exact = true;
        cs.push(c);
    }
    // cast round trips.
    let x = randn(&[7, 33], next());
    let mut c = case(
        "cast f16",
        Op::Cast { dtype: DType::F16 },
        vec![x.clone()],
        a(&x),
    );
    c.tol = 1e-3;
    cs.push(c);
    let mut c = case(
        "cast bf16",
        Op::Cast { dtype: DType::BF16 },
        vec![x.clone()],
        a(&x),
    );
    c.tol = 1e-2;
    cs.push(c);
    let xf16 = host.cast(&x, DType::F16).unwrap();
    let mut c = case(
        "cast f16->f32",
        Op::Cast { dtype: DType::F32 },
        vec![xf16.clone()],
        a(&xf16),
    );
    c.exact = true;
    cs.push(c);
    cs
}
