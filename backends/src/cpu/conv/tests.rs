use super::*;

/// f64 reference of the same convolution.
fn reference(s: Conv1dShape, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
    let t_out = s.t_out().unwrap_or(0);
    let mut y = vec![0f64; s.batch * s.c_out * t_out];
    for bi in 0..s.batch {
        for o in 0..s.c_out {
            for t in 0..t_out {
                let mut acc = b.map_or(0.0, |b| f64::from(b[o]));
                for c in 0..s.c_in {
                    for j in 0..s.k {
                        let i = (t + j * s.dilation) as isize - s.padding as isize;
                        if (0..s.t_in as isize).contains(&i) {
                            acc += f64::from(w[(o * s.c_in + c) * s.k + j])
                                * f64::from(x[(bi * s.c_in + c) * s.t_in + i as usize]);
                        }
                    }
                }
                y[(bi * s.c_out + o) * t_out + t] = acc;
            }
        }
    }
    y
}

use crate::cpu::tests::values as data;

fn check(s: Conv1dShape, with_bias: bool) {
    let x = data(s.batch * s.c_in * s.t_in, 1);
    let w = data(s.c_out * s.c_in * s.k, 2);
    let b = data(s.c_out, 3);
    let b = with_bias.then_some(b.as_slice());
    let want = reference(s, &x, &w, b);
    for isa in available() {
        let got = conv1d_on(isa, s, &x, &w, b, Fused::default()).expect("valid shape");
        compare(s, &got, &want, isa);
    }
}

/// Every instruction set this machine can run.
fn available() -> Vec<Isa> {
    let mut v = vec![Isa::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            v.push(Isa::Avx2);
        }
        if std::is_x86_feature_detected!("avx512f") {
            v.push(Isa::Avx512);
        }
    }
    v
}

fn compare(s: Conv1dShape, got: &[f32], want: &[f64], isa: Isa) {
    assert_eq!(got.len(), want.len(), "{s:?} on {isa:?}");
    // f32 accumulation over c_in * k products of magnitude <= 1: the
    // error bound grows with the sum's length.
    let tol = 1e-6 * (s.c_in * s.k) as f64 + 1e-6;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(*g) - w).abs() <= tol,
            "{s:?} on {isa:?} at {i}: {g} vs {w} (tol {tol})"
        );
    }
}

#[test]
fn matches_f64_reference_on_odd_shapes() {
    for &(batch, c_in, t_in, c_out, k, padding, dilation) in &[
        (1, 1, 1, 1, 1, 0, 1),
        (1, 3, 5, 1, 3, 1, 1),
        (1, 7, 50, 5, 3, 1, 1),
        (2, 5, 31, 9, 7, 9, 3),
        (1, 32, 1000, 32, 7, 18, 6),
        (1, 13, 403, 6, 5, 0, 2),
        (1, 192, 97, 256, 7, 3, 1),
        (3, 4, 24, 4, 1, 0, 1),
        (1, 2, 9, 3, 4, 2, 1),
        // A vocoder's last layer: one output channel, a long input.
        (1, 32, 5000, 1, 7, 3, 1),
    ] {
        let s = Conv1dShape {
            batch,
            c_in,
            t_in,
            c_out,
            k,
            padding,
            dilation,
        };
        check(s, true);
        check(s, false);
    }
}

#[test]
fn folds_leaky_relu_and_residual() {
    let s = Conv1dShape {
        batch: 2,
        c_in: 37,
        t_in: 301,
        c_out: 11,
        k: 5,
        padding: 6,
        dilation: 3,
    };
    let x = data(s.batch * s.c_in * s.t_in, 4);
    let w = data(s.c_out * s.c_in * s.k, 5);
    let b = data(s.c_out, 6);
    let t_out = s.t_out().expect("fits");
    let r = data(s.batch * s.c_out * t_out, 7);
    let xa: Vec<f32> = x
        .iter()
        .map(|&v| if v >= 0.0 { v } else { 0.1 * v })
        .collect();
    let want = reference(s, &xa, &w, Some(&b));
    let fused = Fused {
        pre_slope: Some(0.1),
        residual: Some(&r),
        phases: 1,
    };
    let want: Vec<f64> = want
        .iter()
        .zip(&r)
        .map(|(w, r)| w + f64::from(*r))
        .collect();
    for isa in available() {
        let got = conv1d_on(isa, s, &x, &w, Some(&b), fused).expect("valid shape");
        compare(s, &got, &want, isa);
    }
    let short = &r[..r.len() - 1];
    let bad = Fused {
        residual: Some(short),
        ..fused
    };
    assert!(
        conv1d(s, &x, &w, Some(&b), bad).is_none(),
        "residual of the wrong size"
    );
}

#[test]
fn interleaves_phases() {
    // 3 phases of 4 channels: output channel p * 4 + o at time t lands
    // at [o, t * 3 + p]; the residual is laid out like the output.
    for &(c_out, phases, k, pre) in &[(12, 3, 3, true), (16, 8, 3, false), (6, 2, 1, true)] {
        let s = Conv1dShape {
            batch: 2,
            c_in: 9,
            t_in: 101,
            c_out,
            k,
            padding: k / 2,
            dilation: 1,
        };
        let x = data(s.batch * s.c_in * s.t_in, 8);
        let w = data(s.c_out * s.c_in * s.k, 9);
        let b = data(s.c_out, 10);
        let t_out = s.t_out().expect("fits");
        let r = data(s.batch * s.c_out * t_out, 11);
        let slope = pre.then_some(0.2f32);
        let xa: Vec<f32> = x
            .iter()
            .map(|&v| match slope {
                Some(a) if v < 0.0 => a * v,
                _ => v,
            })
            .collect();
        let plain = reference(s, &xa, &w, Some(&b));
        let c = c_out / phases;
        let mut want = vec![0f64; plain.len()];
        for bi in 0..s.batch {
            for ch in 0..c_out {
                let (p, o) = (ch / c, ch % c);
                for t in 0..t_out {
                    let at = (bi * c + o) * t_out * phases + t * phases + p;
                    want[at] = plain[(bi * c_out + ch) * t_out + t] + f64::from(r[at]);
                }
            }
        }
        let fused = Fused {
            pre_slope: slope,
            residual: Some(&r),
            phases,
        };
        for isa in available() {
            let got = conv1d_on(isa, s, &x, &w, Some(&b), fused).expect("valid shape");
            compare(s, &got, &want, isa);
        }
        let bad = Fused { phases: 5, ..fused };
        assert!(
            conv1d(s, &x, &w, Some(&b), bad).is_none(),
            "phases must divide c_out"
        );
    }
}

#[test]
fn skips_zero_taps() {
    // Blocks whose leading / trailing taps are all zero (as in the
    // phases of a transposed convolution), and an all-zero block.
    let s = Conv1dShape {
        batch: 1,
        c_in: 6,
        t_in: 77,
        c_out: 24,
        k: 5,
        padding: 4,
        dilation: 2,
    };
    let mut w = data(s.c_out * s.c_in * s.k, 12);
    for o in 0..s.c_out {
        for c in 0..s.c_in {
            for j in 0..s.k {
                let zero = match o {
                    0..4 => j == 0 || j == 4,
                    4..8 => j < 3,
                    8..16 => j == 4,
                    _ => true,
                };
                if zero {
                    w[(o * s.c_in + c) * s.k + j] = 0.0;
                }
            }
        }
    }
    let x = data(s.batch * s.c_in * s.t_in, 13);
    let b = data(s.c_out, 14);
    let want = reference(s, &x, &w, Some(&b));
    for isa in available() {
        let got = conv1d_on(isa, s, &x, &w, Some(&b), Fused::default()).expect("valid shape");
        compare(s, &got, &want, isa);
    }
}

#[test]
fn pads_span_by_span_on_long_inputs() {
    // Long enough for the per-span padding path, with a padding longer
    // than a span on each side, phases, leaky ReLU and a residual.
    for &(padding, phases) in &[(3, 1), (500, 1), (2, 4)] {
        let s = Conv1dShape {
            batch: 2,
            c_in: 5,
            t_in: T_TASK * LOCAL_SPANS + 37,
            c_out: 12,
            k: 5,
            padding,
            dilation: 2,
        };
        let x = data(s.batch * s.c_in * s.t_in, 15);
        let w = data(s.c_out * s.c_in * s.k, 16);
        let b = data(s.c_out, 17);
        let t_out = s.t_out().expect("fits");
        assert!(t_out.div_ceil(T_TASK) >= LOCAL_SPANS);
        let r = data(s.batch * s.c_out * t_out, 18);
        let xa: Vec<f32> = x
            .iter()
            .map(|&v| if v >= 0.0 { v } else { 0.3 * v })
            .collect();
        let plain = reference(s, &xa, &w, Some(&b));
        let c = s.c_out / phases;
        let mut want = vec![0f64; plain.len()];
        for bi in 0..s.batch {
            for ch in 0..s.c_out {
                let (p, o) = (ch / c, ch % c);
                for t in 0..t_out {
                    let at = (bi * c + o) * t_out * phases + t * phases + p;
                    want[at] = plain[(bi * s.c_out + ch) * t_out + t] + f64::from(r[at]);
                }
            }
        }
        let fused = Fused {
            pre_slope: Some(0.3),
            residual: Some(&r),
            phases,
        };
        for isa in available() {
            let got = conv1d_on(isa, s, &x, &w, Some(&b), fused).expect("valid shape");
            compare(s, &got, &want, isa);
        }
    }
}

#[test]
fn depthwise_matches_f64_reference() {
    for &(batch, c, t_in, k, padding, dilation, stride) in &[
        (1, 192, 193, 3, 1, 1, 1),
        (2, 5, 17, 3, 3, 3, 1),
        (1, 4, 9, 5, 0, 1, 1),
        (1, 3, 4, 3, 9, 9, 1),
        (5, 1, 31, 12, 0, 1, 2),
        (2, 3, 20, 4, 2, 2, 3),
        (1, 2, 6, 3, 4, 1, 2),
    ] {
        let s = Conv1dShape {
            batch,
            c_in: c,
            t_in,
            c_out: c,
            k,
            padding,
            dilation,
        };
        let x = data(batch * c * t_in, 4);
        let w = data(c * k, 5);
        let b = data(c, 6);
        let got = depthwise(s, stride, &x, &w, Some(&b)).expect("valid shape");
        // The grouped reference: a full conv whose weights are zero off the diagonal.
        let mut full = vec![0f32; c * c * k];
        for o in 0..c {
            full[(o * c + o) * k..][..k].copy_from_slice(&w[o * k..][..k]);
        }
        // Stride s keeps every s-th output of the stride-1 convolution.
        let full_out = s.t_out().expect("valid shape");
        let want: Vec<f64> = reference(s, &x, &full, Some(&b))
            .chunks(full_out)
            .flat_map(|row| row.iter().copied().step_by(stride))
            .collect();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(*g) - w).abs() <= 1e-5,
                "{s:?} at {i}: {g} vs {w}"
            );
        }
    }
    let bad = Conv1dShape {
        batch: 1,
        c_in: 2,
        t_in: 4,
        c_out: 3,
        k: 3,
        padding: 1,
        dilation: 1,
    };
    assert!(depthwise(bad, 1, &[0.0; 8], &[0.0; 6], None).is_none());
}

#[test]
fn rejects_degenerate_shapes() {
    let s = Conv1dShape {
        batch: 1,
        c_in: 1,
        t_in: 2,
        c_out: 1,
        k: 5,
        padding: 0,
        dilation: 1,
    };
    assert!(s.t_out().is_none());
    assert!(conv1d(s, &[0.0; 2], &[0.0; 5], None, Fused::default()).is_none());
    let s = Conv1dShape { k: 1, ..s };
    assert!(
        conv1d(s, &[0.0; 3], &[0.0; 1], None, Fused::default()).is_none(),
        "x too long"
    );
}

/// Direct convolution speed on this CPU, one thread, the min of 5 calls,
/// for BigVGAN's wide short shapes and HiFi-GAN's narrow long ones:
/// `cargo test -p edgeflow-backends --lib conv_speed -- --ignored
/// --nocapture`. Prints GFLOP/s; asserts nothing about time.
#[test]
#[ignore = "a speed probe: run it by hand"]
fn conv_speed() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(
            std::env::var("PROBE_THREADS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1),
        )
        .build()
        .expect("pool");
    for (c, t, k) in [
        (768, 250, 11),
        (384, 750, 11),
        (96, 3000, 11),
        (768, 250, 3),
        (512, 500, 3),
        (256, 2000, 11),
        (128, 4000, 7),
        (64, 8000, 7),
    ] {
        let s = Conv1dShape {
            batch: 1,
            c_in: c,
            t_in: t,
            c_out: c,
            k,
            padding: k / 2,
            dilation: 1,
        };
        let x: Vec<f32> = (0..c * t)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0)
            .collect();
        let w: Vec<f32> = (0..c * c * k)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 50.0)
            .collect();
        let pw = PackedWeights::on(isa(), c, c, k, &w, 1).expect("pack");
        let best = pool.install(|| {
            (0..5)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    let y = conv1d_packed(s, &x, &pw, None, Fused::default()).expect("fits");
                    std::hint::black_box(y);
                    t0.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        });
        let flops = 2.0 * (c * c * k * t) as f64;
        eprintln!(
            "{c} x {c} x {k} over {t}: {:.2} ms, {:.1} GFLOP/s",
            best * 1e3,
            flops / best / 1e9
        );
    }
}
