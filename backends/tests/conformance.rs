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
//!   block of 32, as llama.cpp does).
//! - NPU simulator (int8): error relative to the reference's range
//!   (max - min) below [`NPU_RANGE_TOL`]: about 13 int8 steps, the bound for
//!   a few chained requantizations. The measured errors are printed.

#![allow(clippy::unwrap_used)]

use edgeflow_backends::{open, probe_all, ProbeReport};
use edgeflow_runtime::{
    rng, BinaryOp, DType, Device, DeviceKind, DeviceSpec, Op, PadMode, ReduceOp, Tensor, UnaryOp,
};
use std::fmt::Write as _;

const REPEAT: usize = 6;
const NPU_RANGE_TOL: f64 = 0.05;

/// A dense f64 array in row-major order: the reference's data type.
#[derive(Clone, Debug)]
struct A {
    d: Vec<usize>,
    v: Vec<f64>,
}

fn strides(d: &[usize]) -> Vec<usize> {
    let mut s = vec![1; d.len()];
    for i in (0..d.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * d[i + 1];
    }
    s
}

impl A {
    fn new(d: &[usize], v: Vec<f64>) -> A {
        assert_eq!(d.iter().product::<usize>(), v.len());
        A { d: d.to_vec(), v }
    }
    fn zeros(d: &[usize]) -> A {
        A::new(d, vec![0.0; d.iter().product()])
    }
    fn from_t(t: &Tensor) -> A {
        A::new(
            t.dims(),
            t.to_vec_f32().unwrap().iter().map(|&x| x as f64).collect(),
        )
    }
    fn map(&self, f: impl Fn(f64) -> f64) -> A {
        A::new(&self.d, self.v.iter().map(|&x| f(x)).collect())
    }
    /// (outer, n, inner) around `dim`.
    fn split(&self, dim: usize) -> (usize, usize, usize) {
        let o = self.d[..dim].iter().product();
        let i = self.d[dim + 1..].iter().product();
        (o, self.d[dim], i)
    }
    fn unravel(&self, mut i: usize) -> Vec<usize> {
        let mut idx = vec![0; self.d.len()];
        for k in (0..self.d.len()).rev() {
            idx[k] = i % self.d[k];
            i /= self.d[k];
        }
        idx
    }
    fn at(&self, idx: &[usize]) -> f64 {
        let s = strides(&self.d);
        self.v[idx.iter().zip(&s).map(|(a, b)| a * b).sum::<usize>()]
    }
}

fn randn(d: &[usize], seed: u64) -> Tensor {
    rng::rand_normal_host(d, 0.0, 1.0, seed).unwrap()
}

fn scaled(d: &[usize], seed: u64, s: f64) -> Tensor {
    rng::rand_normal_host(d, 0.0, s, seed).unwrap()
}

fn positive(d: &[usize], seed: u64) -> Tensor {
    let v: Vec<f32> = rng::normal_f32(d.iter().product(), 0.0, 1.0, seed)
        .into_iter()
        .map(|x| x.abs() + 0.1)
        .collect();
    Tensor::from_vec(v, d).unwrap()
}

// ----------------------------------------------------------------------------
// f64 reference ops
// ----------------------------------------------------------------------------

fn r_matmul(a: &A, b: &A) -> A {
    let (m, k) = (a.d[a.d.len() - 2], a.d[a.d.len() - 1]);
    let n = b.d[b.d.len() - 1];
    let ba: usize = a.d[..a.d.len() - 2].iter().product();
    let bb: usize = b.d[..b.d.len() - 2].iter().product();
    let batch = ba.max(bb);
    let mut out_d = if ba >= bb {
        a.d[..a.d.len() - 2].to_vec()
    } else {
        b.d[..b.d.len() - 2].to_vec()
    };
    out_d.extend([m, n]);
    let mut o = vec![0.0; batch * m * n];
    for bi in 0..batch {
        let (ao, bo) = ((bi % ba) * m * k, (bi % bb) * k * n);
        for i in 0..m {
            for j in 0..n {
                o[bi * m * n + i * n + j] = (0..k)
                    .map(|p| a.v[ao + i * k + p] * b.v[bo + p * n + j])
                    .sum();
            }
        }
    }
    A::new(&out_d, o)
}

fn r_linear(x: &A, w: &A, b: Option<&A>) -> A {
    let (n, k) = (w.d[0], w.d[1]);
    let rows = x.v.len() / k;
    let mut o = vec![0.0; rows * n];
    for r in 0..rows {
        for j in 0..n {
            o[r * n + j] = (0..k).map(|p| x.v[r * k + p] * w.v[j * k + p]).sum::<f64>()
                + b.map_or(0.0, |b| b.v[j]);
        }
    }
    let mut d = x.d.clone();
    *d.last_mut().unwrap() = n;
    A::new(&d, o)
}

#[allow(clippy::too_many_arguments)]
fn r_conv1d(
    x: &A,
    w: &A,
    b: Option<&A>,
    stride: usize,
    pad: usize,
    dil: usize,
    groups: usize,
) -> A {
    let (bn, cin, l) = (x.d[0], x.d[1], x.d[2]);
    let (cout, cg, k) = (w.d[0], w.d[1], w.d[2]);
    let lo = (l + 2 * pad - dil * (k - 1) - 1) / stride + 1;
    let og = cout / groups;
    let mut o = A::zeros(&[bn, cout, lo]);
    for bi in 0..bn {
        for oc in 0..cout {
            let g = oc / og;
            for t in 0..lo {
                let mut s = b.map_or(0.0, |b| b.v[oc]);
                for c in 0..cg {
                    let ic = g * cg + c;
                    for kk in 0..k {
                        let pos = (t * stride + kk * dil) as isize - pad as isize;
                        if pos >= 0 && (pos as usize) < l {
                            s += x.v[(bi * cin + ic) * l + pos as usize]
                                * w.v[(oc * cg + c) * k + kk];
                        }
                    }
                }
                o.v[(bi * cout + oc) * lo + t] = s;
            }
        }
    }
    o
}

#[allow(clippy::too_many_arguments)]
fn r_conv2d(
    x: &A,
    w: &A,
    b: Option<&A>,
    stride: usize,
    pad: usize,
    dil: usize,
    groups: usize,
) -> A {
    let (bn, cin, h, wd) = (x.d[0], x.d[1], x.d[2], x.d[3]);
    let (cout, cg, kh, kw) = (w.d[0], w.d[1], w.d[2], w.d[3]);
    let ho = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
    let wo = (wd + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
    let og = cout / groups;
    let mut o = A::zeros(&[bn, cout, ho, wo]);
    for bi in 0..bn {
        for oc in 0..cout {
            let g = oc / og;
            for y in 0..ho {
                for xo in 0..wo {
                    let mut s = b.map_or(0.0, |b| b.v[oc]);
                    for c in 0..cg {
                        let ic = g * cg + c;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (y * stride + ky * dil) as isize - pad as isize;
                                let ix = (xo * stride + kx * dil) as isize - pad as isize;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wd {
                                    s += x.v
                                        [((bi * cin + ic) * h + iy as usize) * wd + ix as usize]
                                        * w.v[((oc * cg + c) * kh + ky) * kw + kx];
                                }
                            }
                        }
                    }
                    o.v[((bi * cout + oc) * ho + y) * wo + xo] = s;
                }
            }
        }
    }
    o
}

#[allow(clippy::too_many_arguments)]
fn r_conv_t1d(
    x: &A,
    w: &A,
    b: Option<&A>,
    stride: usize,
    pad: usize,
    opad: usize,
    dil: usize,
    groups: usize,
) -> A {
    let (bn, cin, l) = (x.d[0], x.d[1], x.d[2]);
    let (_, og, k) = (w.d[0], w.d[1], w.d[2]);
    let cout = og * groups;
    let ig = cin / groups;
    let lo = (l - 1) * stride + dil * (k - 1) + opad + 1 - 2 * pad;
    let mut o = A::zeros(&[bn, cout, lo]);
    for bi in 0..bn {
        for oc in 0..cout {
            for t in 0..lo {
                o.v[(bi * cout + oc) * lo + t] = b.map_or(0.0, |b| b.v[oc]);
            }
        }
        for ic in 0..cin {
            let g = ic / ig;
            for j in 0..og {
                let oc = g * og + j;
                for i in 0..l {
                    for kk in 0..k {
                        let t = (i * stride + kk * dil) as isize - pad as isize;
                        if t >= 0 && (t as usize) < lo {
                            o.v[(bi * cout + oc) * lo + t as usize] +=
                                x.v[(bi * cin + ic) * l + i] * w.v[(ic * og + j) * k + kk];
                        }
                    }
                }
            }
        }
    }
    o
}

fn r_layer_norm(x: &A, g: &A, b: Option<&A>, eps: f64) -> A {
    let n = *x.d.last().unwrap();
    let mut o = x.clone();
    for row in o.v.chunks_mut(n) {
        let m = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / n as f64;
        for (i, v) in row.iter_mut().enumerate() {
            *v = (*v - m) / (var + eps).sqrt() * g.v[i] + b.map_or(0.0, |b| b.v[i]);
        }
    }
    o
}

fn r_rms_norm(x: &A, g: &A, eps: f64) -> A {
    let n = *x.d.last().unwrap();
    let mut o = x.clone();
    for row in o.v.chunks_mut(n) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        for (i, v) in row.iter_mut().enumerate() {
            *v = *v / (ms + eps).sqrt() * g.v[i];
        }
    }
    o
}

fn r_softmax(x: &A, dim: usize) -> A {
    let (outer, n, inner) = x.split(dim);
    let mut o = x.clone();
    for a in 0..outer {
        for c in 0..inner {
            let ix = |i: usize| (a * n + i) * inner + c;
            let m = (0..n).map(|i| x.v[ix(i)]).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..n).map(|i| (x.v[ix(i)] - m).exp()).sum();
            for i in 0..n {
                o.v[ix(i)] = (x.v[ix(i)] - m).exp() / s;
            }
        }
    }
    o
}

fn r_attention(q: &A, k: &A, v: &A, mask: Option<&A>, scale: f64, causal: bool) -> A {
    let (b, h, s, d) = (q.d[0], q.d[1], q.d[2], q.d[3]);
    let (hk, t) = (k.d[1], k.d[2]);
    let rep = h / hk;
    let mut o = A::zeros(&[b, h, s, d]);
    for bi in 0..b {
        for hi in 0..h {
            let kh = hi / rep;
            for i in 0..s {
                let mut sc: Vec<f64> = (0..t)
                    .map(|j| {
                        let dot: f64 = (0..d)
                            .map(|x| q.at(&[bi, hi, i, x]) * k.at(&[bi, kh, j, x]))
                            .sum();
                        let mut val = dot * scale;
                        if let Some(m) = mask {
                            // mask broadcast to [b, h, s, t]
                            let idx: Vec<usize> = [bi, hi, i, j]
                                .iter()
                                .zip(&m.d)
                                .map(|(&ix, &dm)| if dm == 1 { 0 } else { ix })
                                .collect();
                            val += m.at(&idx);
                        }
                        if causal && j > i + (t - s) {
                            val = f64::NEG_INFINITY;
                        }
                        val
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
                for x in sc.iter_mut() {
                    *x = (*x - mx).exp() / z;
                }
                for x in 0..d {
                    o.v[((bi * h + hi) * s + i) * d + x] =
                        (0..t).map(|j| sc[j] * v.at(&[bi, kh, j, x])).sum();
                }
            }
        }
    }
    o
}

fn r_rope(x: &A, cos: &A, sin: &A, interleaved: bool) -> A {
    let (s, d) = (x.d[2], x.d[3]);
    let half = d / 2;
    let mut o = x.clone();
    for (ri, row) in o.v.chunks_mut(d).enumerate() {
        let si = ri % s;
        let src: Vec<f64> = row.to_vec();
        for i in 0..half {
            let (c, sn) = (cos.v[si * half + i], sin.v[si * half + i]);
            if interleaved {
                let (a, b) = (src[2 * i], src[2 * i + 1]);
                row[2 * i] = a * c - b * sn;
                row[2 * i + 1] = a * sn + b * c;
            } else {
                let (a, b) = (src[i], src[i + half]);
                row[i] = a * c - b * sn;
                row[i + half] = b * c + a * sn;
            }
        }
    }
    o
}

fn erf(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse for 1e-4; use a series/continued
    // fraction split good to ~1e-14.
    let ax = x.abs();
    let r = if ax < 2.5 {
        let mut sum = ax;
        let mut term = ax;
        let x2 = ax * ax;
        for n in 1..100 {
            term *= -x2 / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        2.0 / std::f64::consts::PI.sqrt() * sum
    } else {
        // erfc continued fraction.
        let mut f = 0.0;
        for n in (1..60).rev() {
            f = n as f64 / 2.0 / (ax + f);
        }
        1.0 - (-ax * ax).exp() / std::f64::consts::PI.sqrt() / (ax + f)
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

fn r_unary(u: UnaryOp, x: f64) -> f64 {
    match u {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Sqr => x * x,
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Gelu => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        }
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Softplus => (1.0 + x.exp()).ln(),
    }
}

fn broadcast_dims(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let db = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            da.max(db)
        })
        .collect()
}

fn bidx(src: &A, out_idx: &[usize]) -> f64 {
    let off = out_idx.len() - src.d.len();
    let idx: Vec<usize> = src
        .d
        .iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { out_idx[i + off] })
        .collect();
    src.at(&idx)
}

fn r_binary(op: BinaryOp, a: &A, b: &A) -> A {
    let d = broadcast_dims(&a.d, &b.d);
    let mut o = A::zeros(&d);
    for i in 0..o.v.len() {
        let idx = o.unravel(i);
        let (x, y) = (bidx(a, &idx), bidx(b, &idx));
        o.v[i] = match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Max => x.max(y),
            BinaryOp::Min => x.min(y),
            BinaryOp::Pow => x.powf(y),
        };
    }
    o
}

fn r_reduce(op: ReduceOp, x: &A, dim: usize, keepdim: bool) -> A {
    let (outer, n, inner) = x.split(dim);
    let mut v = Vec::with_capacity(outer * inner);
    for a in 0..outer {
        for c in 0..inner {
            let it = (0..n).map(|i| x.v[(a * n + i) * inner + c]);
            v.push(match op {
                ReduceOp::Sum => it.sum(),
                ReduceOp::Mean => it.sum::<f64>() / n as f64,
                ReduceOp::Max => it.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => it.fold(f64::INFINITY, f64::min),
                ReduceOp::ArgMax => {
                    let vals: Vec<f64> = it.collect();
                    (0..n).fold(0, |best, i| if vals[i] > vals[best] { i } else { best }) as f64
                }
            });
        }
    }
    let mut d = x.d.clone();
    if keepdim {
        d[dim] = 1;
    } else {
        d.remove(dim);
    }
    A::new(&d, v)
}

fn r_cumsum(x: &A, dim: usize) -> A {
    let (outer, n, inner) = x.split(dim);
    let mut o = x.clone();
    for a in 0..outer {
        for c in 0..inner {
            let mut s = 0.0;
            for i in 0..n {
                s += x.v[(a * n + i) * inner + c];
                o.v[(a * n + i) * inner + c] = s;
            }
        }
    }
    o
}

fn r_permute(x: &A, p: &[usize]) -> A {
    let d: Vec<usize> = p.iter().map(|&i| x.d[i]).collect();
    let mut o = A::zeros(&d);
    for i in 0..o.v.len() {
        let oi = o.unravel(i);
        let mut si = vec![0; p.len()];
        for (k, &pk) in p.iter().enumerate() {
            si[pk] = oi[k];
        }
        o.v[i] = x.at(&si);
    }
    o
}

fn r_concat(xs: &[&A], dim: usize) -> A {
    let mut d = xs[0].d.clone();
    d[dim] = xs.iter().map(|x| x.d[dim]).sum();
    let mut o = A::zeros(&d);
    for i in 0..o.v.len() {
        let mut idx = o.unravel(i);
        let mut k = idx[dim];
        for x in xs {
            if k < x.d[dim] {
                idx[dim] = k;
                o.v[i] = x.at(&idx);
                break;
            }
            k -= x.d[dim];
        }
    }
    o
}

fn r_narrow(x: &A, dim: usize, start: usize, len: usize) -> A {
    let mut d = x.d.clone();
    d[dim] = len;
    let mut o = A::zeros(&d);
    for i in 0..o.v.len() {
        let mut idx = o.unravel(i);
        idx[dim] += start;
        o.v[i] = x.at(&idx);
    }
    o
}

fn r_pad(x: &A, dim: usize, before: usize, after: usize, mode: PadMode) -> A {
    let n = x.d[dim];
    let mut d = x.d.clone();
    d[dim] = n + before + after;
    let mut o = A::zeros(&d);
    for i in 0..o.v.len() {
        let mut idx = o.unravel(i);
        let p = idx[dim] as isize - before as isize;
        let src = match mode {
            PadMode::Zeros => {
                if p < 0 || p >= n as isize {
                    continue;
                }
                p
            }
            PadMode::Replicate => p.clamp(0, n as isize - 1),
            PadMode::Reflect => {
                if p < 0 {
                    -p
                } else if p >= n as isize {
                    2 * (n as isize - 1) - p
                } else {
                    p
                }
            }
        };
        idx[dim] = src as usize;
        o.v[i] = x.at(&idx);
    }
    o
}

fn r_gather(x: &A, idx: &A, dim: usize) -> A {
    let mut o = A::zeros(&idx.d);
    for i in 0..o.v.len() {
        let mut ii = o.unravel(i);
        ii[dim] = idx.v[i] as usize;
        o.v[i] = x.at(&ii);
    }
    o
}

fn r_index_select(x: &A, idx: &[usize], dim: usize) -> A {
    let mut d = x.d.clone();
    d[dim] = idx.len();
    let mut o = A::zeros(&d);
    for i in 0..o.v.len() {
        let mut ii = o.unravel(i);
        ii[dim] = idx[ii[dim]];
        o.v[i] = x.at(&ii);
    }
    o
}

// ----------------------------------------------------------------------------
// The harness
// ----------------------------------------------------------------------------

/// One conformance case: an op, its host inputs, the reference output and
/// the error allowed on a float backend for the inputs' dtype.
struct Case {
    label: String,
    op: Op,
    inputs: Vec<Tensor>,
    want: A,
    tol: f64,
    /// Integer-valued output (argmax, index ops): compared exactly.
    exact: bool,
}

fn case(label: impl Into<String>, op: Op, inputs: Vec<Tensor>, want: A) -> Case {
    Case {
        label: label.into(),
        op,
        inputs,
        want,
        tol: 1e-4,
        exact: false,
    }
}

fn a(t: &Tensor) -> A {
    A::from_t(t)
}

fn cases() -> Vec<Case> {
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
    // quantized linear: reference on the dequantized weights.
    let host = open(DeviceSpec::Cpu).unwrap();
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

fn available() -> Vec<ProbeReport> {
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
fn every_op_on_every_available_backend() {
    let cases = cases();
    let mut failures = String::new();
    let mut table = String::new();
    for r in available() {
        let dev = open(spec_of(&r)).unwrap();
        let (mut native, mut fallback) = (0, 0);
        let mut npu_worst = (0.0f64, String::new());
        for c in &cases {
            // An NPU compiles a model once, with activation ranges calibrated
            // on representative data, and later inputs outside those ranges
            // saturate. Each case is its own model: a fresh simulator,
            // calibrated on the case's input by its first runs.
            let fresh;
            let dev = if r.kind == DeviceKind::Npu {
                fresh = open(spec_of(&r)).unwrap();
                &fresh
            } else {
                &dev
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
        let s = dev.stats().snapshot();
        eprintln!(
            "{}: {} cases, {native} native, {fallback} via CPU fallback (shared device: {} fallback ops, {} bytes moved){}",
            r.name,
            cases.len(),
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
