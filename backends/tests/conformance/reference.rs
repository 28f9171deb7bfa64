//! The f64 reference the conformance cases are checked against: a dense
//! array type, seeded inputs, and every op written as plain loops.

use edgeflow_runtime::{rng, BinaryOp, PadMode, ReduceOp, Tensor, UnaryOp};

/// A dense f64 array in row-major order: the reference's data type.
#[derive(Clone, Debug)]
pub(crate) struct A {
    pub(crate) d: Vec<usize>,
    pub(crate) v: Vec<f64>,
}

pub(crate) fn strides(d: &[usize]) -> Vec<usize> {
    let mut s = vec![1; d.len()];
    for i in (0..d.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * d[i + 1];
    }
    s
}

impl A {
    pub(crate) fn new(d: &[usize], v: Vec<f64>) -> A {
        assert_eq!(d.iter().product::<usize>(), v.len());
        A { d: d.to_vec(), v }
    }
    pub(crate) fn zeros(d: &[usize]) -> A {
        A::new(d, vec![0.0; d.iter().product()])
    }
    pub(crate) fn from_t(t: &Tensor) -> A {
        A::new(
            t.dims(),
            t.to_vec_f32().unwrap().iter().map(|&x| x as f64).collect(),
        )
    }
    pub(crate) fn map(&self, f: impl Fn(f64) -> f64) -> A {
        A::new(&self.d, self.v.iter().map(|&x| f(x)).collect())
    }
    /// (outer, n, inner) around `dim`.
    pub(crate) fn split(&self, dim: usize) -> (usize, usize, usize) {
        let o = self.d[..dim].iter().product();
        let i = self.d[dim + 1..].iter().product();
        (o, self.d[dim], i)
    }
    pub(crate) fn unravel(&self, mut i: usize) -> Vec<usize> {
        let mut idx = vec![0; self.d.len()];
        for k in (0..self.d.len()).rev() {
            idx[k] = i % self.d[k];
            i /= self.d[k];
        }
        idx
    }
    pub(crate) fn at(&self, idx: &[usize]) -> f64 {
        let s = strides(&self.d);
        self.v[idx.iter().zip(&s).map(|(a, b)| a * b).sum::<usize>()]
    }
}

pub(crate) fn randn(d: &[usize], seed: u64) -> Tensor {
    rng::rand_normal_host(d, 0.0, 1.0, seed).unwrap()
}

pub(crate) fn scaled(d: &[usize], seed: u64, s: f64) -> Tensor {
    rng::rand_normal_host(d, 0.0, s, seed).unwrap()
}

pub(crate) fn positive(d: &[usize], seed: u64) -> Tensor {
    let v: Vec<f32> = rng::normal_f32(d.iter().product(), 0.0, 1.0, seed)
        .into_iter()
        .map(|x| x.abs() + 0.1)
        .collect();
    Tensor::from_vec(v, d).unwrap()
}

pub(crate) fn r_matmul(a: &A, b: &A) -> A {
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

pub(crate) fn r_linear(x: &A, w: &A, b: Option<&A>) -> A {
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
pub(crate) fn r_conv1d(
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
pub(crate) fn r_conv2d(
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
pub(crate) fn r_conv_t1d(
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

pub(crate) fn r_layer_norm(x: &A, g: &A, b: Option<&A>, eps: f64) -> A {
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

pub(crate) fn r_rms_norm(x: &A, g: &A, eps: f64) -> A {
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

pub(crate) fn r_softmax(x: &A, dim: usize) -> A {
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

pub(crate) fn r_attention(q: &A, k: &A, v: &A, mask: Option<&A>, scale: f64, causal: bool) -> A {
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

pub(crate) fn r_rope(x: &A, cos: &A, sin: &A, interleaved: bool) -> A {
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

pub(crate) fn erf(x: f64) -> f64 {
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

pub(crate) fn r_unary(u: UnaryOp, x: f64) -> f64 {
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

pub(crate) fn broadcast_dims(a: &[usize], b: &[usize]) -> Vec<usize> {
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

pub(crate) fn bidx(src: &A, out_idx: &[usize]) -> f64 {
    let off = out_idx.len() - src.d.len();
    let idx: Vec<usize> = src
        .d
        .iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { out_idx[i + off] })
        .collect();
    src.at(&idx)
}

pub(crate) fn r_binary(op: BinaryOp, a: &A, b: &A) -> A {
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

pub(crate) fn r_reduce(op: ReduceOp, x: &A, dim: usize, keepdim: bool) -> A {
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

pub(crate) fn r_cumsum(x: &A, dim: usize) -> A {
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

pub(crate) fn r_permute(x: &A, p: &[usize]) -> A {
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

pub(crate) fn r_concat(xs: &[&A], dim: usize) -> A {
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

pub(crate) fn r_narrow(x: &A, dim: usize, start: usize, len: usize) -> A {
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

pub(crate) fn r_pad(x: &A, dim: usize, before: usize, after: usize, mode: PadMode) -> A {
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

pub(crate) fn r_gather(x: &A, idx: &A, dim: usize) -> A {
    let mut o = A::zeros(&idx.d);
    for i in 0..o.v.len() {
        let mut ii = o.unravel(i);
        ii[dim] = idx.v[i] as usize;
        o.v[i] = x.at(&ii);
    }
    o
}

pub(crate) fn r_index_select(x: &A, idx: &[usize], dim: usize) -> A {
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
