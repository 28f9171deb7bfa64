//! Multi-head / grouped-query [`Attention`] over the runtime's fused
//! attention op and [`KvCache`].

use crate::{Error, Linear, Result, RopeAt};
use edgeflow_runtime::{Device, KvCache, Tensor};

/// How queries see keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Masking {
    /// Every query sees every key (encoders, cross-attention).
    #[default]
    Full,
    /// Query `i` sees keys up to its own position, aligned to the end of
    /// the keys (so a decode step after a KV cache sees all of it).
    Causal,
}

/// The query / key / value projections.
// One value per attention layer, built once at load: the size difference
// between the variants costs nothing, boxing would cost an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Projections {
    /// One linear whose output rows are `[q; k; v]` (one GEMV per token).
    Fused(Linear),
    /// Three linears.
    Separate {
        /// Query projection.
        q: Linear,
        /// Key projection.
        k: Linear,
        /// Value projection.
        v: Linear,
    },
}

/// Multi-head attention with `n_head` query heads and `n_kv_head` key /
/// value heads (grouped-query when fewer; they divide `n_head`), scale
/// `1 / sqrt(head_dim)`, an optional rotary embedding on queries and keys,
/// and an optional KV cache owned by the caller (so a model's weights stay
/// shared while each stream keeps its own cache).
///
/// Activations are `[b, s, n_head * head_dim]`; heads are `[b, h, s, d]`.
#[derive(Debug, Clone)]
pub struct Attention {
    proj: Projections,
    o: Linear,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    query_chunk: Option<usize>,
}

impl Attention {
    /// Over projections and the output linear.
    pub fn new(
        proj: Projections,
        o: Linear,
        n_head: usize,
        n_kv_head: usize,
        head_dim: usize,
    ) -> Result<Self> {
        if n_head == 0 || n_kv_head == 0 || !n_head.is_multiple_of(n_kv_head) || head_dim == 0 {
            return Err(Error::BadInput(format!(
                "attention with {n_head} query heads, {n_kv_head} key/value heads of size {head_dim}: \
                 key/value heads must divide query heads"
            )));
        }
        if let Projections::Fused(l) = &proj {
            let want = (n_head + 2 * n_kv_head) * head_dim;
            if l.out_dim() != want {
                return Err(Error::BadInput(format!(
                    "fused q/k/v projection has {} outputs, expected {want}",
                    l.out_dim()
                )));
            }
        }
        Ok(Attention {
            proj,
            o,
            n_head,
            n_kv_head,
            head_dim,
            query_chunk: None,
        })
    }

    /// Compute [`Masking::Full`] attention for blocks of `rows` queries at
    /// a time, so each block's score matrix stays cache-sized (identical
    /// results). Causal attention is not chunked.
    pub fn with_query_chunk(mut self, rows: usize) -> Self {
        self.query_chunk = Some(rows);
        self
    }

    /// Change the query block size (see [`Self::with_query_chunk`]).
    pub fn set_query_chunk(&mut self, rows: usize) {
        self.query_chunk = Some(rows);
    }

    /// `1 / sqrt(head_dim)`.
    pub fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }

    /// The projections.
    pub fn projections(&self) -> &Projections {
        &self.proj
    }

    /// The output projection.
    pub fn out(&self) -> &Linear {
        &self.o
    }

    /// Bytes of every weight.
    pub fn size_bytes(&self) -> usize {
        let p = match &self.proj {
            Projections::Fused(l) => l.size_bytes(),
            Projections::Separate { q, k, v } => q.size_bytes() + k.size_bytes() + v.size_bytes(),
        };
        p + self.o.size_bytes()
    }

    /// Query, key and value heads of `x[b, s, _]`, rotated by `rope`.
    pub fn qkv(
        &self,
        dev: &Device,
        x: &Tensor,
        rope: Option<&RopeAt>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (h, hk, hd) = (self.n_head, self.n_kv_head, self.head_dim);
        let (q, k, v) = match &self.proj {
            Projections::Fused(l) => {
                let qkv = l.forward(dev, x)?;
                let last = qkv.rank().saturating_sub(1);
                let heads = |start: usize, n: usize| -> Result<Tensor> {
                    let y = dev.narrow(&qkv, last, start, n * hd)?;
                    split_heads(dev, &y, n, hd)
                };
                (heads(0, h)?, heads(h * hd, hk)?, heads((h + hk) * hd, hk)?)
            }
            Projections::Separate { q, k, v } => (
                split_heads(dev, &q.forward(dev, x)?, h, hd)?,
                split_heads(dev, &k.forward(dev, x)?, hk, hd)?,
                split_heads(dev, &v.forward(dev, x)?, hk, hd)?,
            ),
        };
        match rope {
            Some(r) => Ok((r.apply(dev, &q)?, r.apply(dev, &k)?, v)),
            None => Ok((q, k, v)),
        }
    }

    /// Key and value heads of a memory `m[b, t, _]` (an encoder's output
    /// for cross-attention), computed once per memory.
    pub fn key_values(&self, dev: &Device, m: &Tensor) -> Result<(Tensor, Tensor)> {
        let (hk, hd) = (self.n_kv_head, self.head_dim);
        match &self.proj {
            Projections::Separate { k, v, .. } => Ok((
                split_heads(dev, &k.forward(dev, m)?, hk, hd)?,
                split_heads(dev, &v.forward(dev, m)?, hk, hd)?,
            )),
            Projections::Fused(_) => {
                let (_, k, v) = self.qkv(dev, m, None)?;
                Ok((k, v))
            }
        }
    }

    /// Self-attention of `x[b, s, _]`: project, rotate, append the keys and
    /// values to `cache` (which then holds the whole sequence), attend, and
    /// project out.
    pub fn forward(
        &self,
        dev: &Device,
        x: &Tensor,
        rope: Option<&RopeAt>,
        cache: Option<&mut KvCache>,
        masking: Masking,
    ) -> Result<Tensor> {
        let (q, k, v) = self.qkv(dev, x, rope)?;
        let (k, v) = match cache {
            Some(c) => c.append(dev, &k, &v)?,
            None => (k, v),
        };
        let a = attend(dev, &q, &k, &v, self.scale(), masking, self.query_chunk)?;
        self.o.forward(dev, &merge_heads(dev, &a)?)
    }

    /// Cross-attention: queries from `x[b, s, _]`, keys and values from
    /// [`Self::key_values`] of a memory; every key visible.
    pub fn forward_cross(
        &self,
        dev: &Device,
        x: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Tensor> {
        let q = match &self.proj {
            Projections::Separate { q, .. } => {
                split_heads(dev, &q.forward(dev, x)?, self.n_head, self.head_dim)?
            }
            Projections::Fused(_) => self.qkv(dev, x, None)?.0,
        };
        let a = attend(dev, &q, k, v, self.scale(), Masking::Full, self.query_chunk)?;
        self.o.forward(dev, &merge_heads(dev, &a)?)
    }
}

/// `[b, s, n * d]` -> `[b, n, s, d]`.
pub fn split_heads(dev: &Device, x: &Tensor, n: usize, d: usize) -> Result<Tensor> {
    let (b, s) = match x.dims() {
        [b, s, _] => (*b, *s),
        other => {
            return Err(Error::BadInput(format!(
                "attention takes [batch, seq, features] activations, got {other:?}"
            )))
        }
    };
    let y = dev.reshape(x, &[b, s, n, d])?;
    Ok(dev.permute(&y, &[0, 2, 1, 3])?)
}

/// `[b, n, s, d]` -> `[b, s, n * d]`.
pub fn merge_heads(dev: &Device, x: &Tensor) -> Result<Tensor> {
    let &[b, n, s, d] = x.dims() else {
        return Err(Error::BadInput(format!(
            "merging heads of a {:?} tensor (expected [b, h, s, d])",
            x.dims()
        )));
    };
    let y = dev.permute(x, &[0, 2, 1, 3])?;
    Ok(dev.reshape(&y, &[b, s, n * d])?)
}

/// Scaled dot-product attention of heads `q[b, h, s, d]` over `k`/`v[b,
/// hk, t, d]`; with `query_chunk`, [`Masking::Full`] runs in blocks of that
/// many query rows (same result).
pub fn attend(
    dev: &Device,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    masking: Masking,
    query_chunk: Option<usize>,
) -> Result<Tensor> {
    let causal = masking == Masking::Causal;
    let n = q.dims().get(2).copied().unwrap_or(0);
    let chunk = match query_chunk {
        Some(c) if !causal => c.max(1),
        _ => n,
    };
    if n <= chunk {
        return Ok(dev.attention(q, k, v, None, scale, causal)?);
    }
    let mut outs = Vec::new();
    let mut s = 0;
    while s < n {
        let len = chunk.min(n - s);
        let qc = dev.narrow(q, 2, s, len)?;
        outs.push(dev.attention(&qc, k, v, None, scale, false)?);
        s += len;
    }
    let refs: Vec<&Tensor> = outs.iter().collect();
    Ok(dev.concat(&refs, 2)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RopeLayout, RotaryEmbedding};

    fn dev() -> Device {
        edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu")
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((((i * 53 + seed * 17) % 97) as f32) / 48.0 - 1.0) * 0.5)
            .collect()
    }

    fn lin(o: usize, i: usize, seed: usize) -> Linear {
        Linear::new(
            Tensor::from_vec(values(o * i, seed), &[o, i]).expect("w"),
            None,
        )
    }

    fn rows(x: &[f32], w: &[f32], n_in: usize, n_out: usize) -> Vec<f64> {
        let s = x.len() / n_in;
        let mut y = vec![0f64; s * n_out];
        for r in 0..s {
            for o in 0..n_out {
                y[r * n_out + o] = (0..n_in)
                    .map(|i| x[r * n_in + i] as f64 * w[o * n_in + i] as f64)
                    .sum();
            }
        }
        y
    }

    /// GQA attention of `x[s, dm]` in f64 loops (no rope, output projection).
    fn reference(
        x: &[f32],
        w: [&[f32]; 4],
        h: usize,
        hk: usize,
        d: usize,
        causal: bool,
    ) -> Vec<f64> {
        let dm = h * d;
        let s = x.len() / dm;
        let q = rows(x, w[0], dm, h * d);
        let k = rows(x, w[1], dm, hk * d);
        let v = rows(x, w[2], dm, hk * d);
        let mut a = vec![0f64; s * h * d];
        for head in 0..h {
            let g = head / (h / hk);
            for i in 0..s {
                let upto = if causal { i + 1 } else { s };
                let sc: Vec<f64> = (0..upto)
                    .map(|j| {
                        (0..d)
                            .map(|e| q[i * h * d + head * d + e] * k[j * hk * d + g * d + e])
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|v| (v - m).exp()).sum();
                for e in 0..d {
                    a[i * h * d + head * d + e] = (0..upto)
                        .map(|j| (sc[j] - m).exp() / z * v[j * hk * d + g * d + e])
                        .sum();
                }
            }
        }
        let af: Vec<f32> = a.iter().map(|&v| v as f32).collect();
        rows(&af, w[3], h * d, dm)
    }

    #[test]
    fn grouped_query_attention_matches_the_reference_fused_or_not() {
        let dev = dev();
        let (h, hk, d, s) = (4, 2, 4, 5);
        let dm = h * d;
        let xv = values(s * dm, 1);
        let x = Tensor::from_vec(xv.clone(), &[1, s, dm]).expect("x");
        let (wq, wk, wv, wo) = (
            values(dm * dm, 2),
            values(hk * d * dm, 3),
            values(hk * d * dm, 4),
            values(dm * dm, 5),
        );
        let t = |v: &[f32], o: usize| {
            Linear::new(Tensor::from_vec(v.to_vec(), &[o, dm]).expect("w"), None)
        };
        let sep = Attention::new(
            Projections::Separate {
                q: t(&wq, dm),
                k: t(&wk, hk * d),
                v: t(&wv, hk * d),
            },
            t(&wo, dm),
            h,
            hk,
            d,
        )
        .expect("attn");
        let mut fused_w = wq.clone();
        fused_w.extend(&wk);
        fused_w.extend(&wv);
        let fused = Attention::new(
            Projections::Fused(t(&fused_w, dm + 2 * hk * d)),
            t(&wo, dm),
            h,
            hk,
            d,
        )
        .expect("attn");
        for masking in [Masking::Full, Masking::Causal] {
            let want = reference(
                &xv,
                [&wq, &wk, &wv, &wo],
                h,
                hk,
                d,
                masking == Masking::Causal,
            );
            for a in [&sep, &fused] {
                let got = a
                    .forward(&dev, &x, None, None, masking)
                    .expect("f")
                    .to_vec_f32()
                    .expect("v");
                for (g, w) in got.iter().zip(&want) {
                    assert!((*g as f64 - w).abs() < 1e-4, "{masking:?}: {g} vs {w}");
                }
            }
            let chunked = sep.clone().with_query_chunk(2);
            let a = sep
                .forward(&dev, &x, None, None, masking)
                .expect("f")
                .to_vec_f32()
                .expect("v");
            let b = chunked
                .forward(&dev, &x, None, None, masking)
                .expect("f")
                .to_vec_f32()
                .expect("v");
            // Chunking changes the row count of each matrix product, so the
            // kernels may pick another blocking and round differently: the
            // outputs agree to float rounding (|x| < 1, so 1e-6 is a few ULP).
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() < 1e-6,
                    "{masking:?}: chunked {y} vs whole {x}"
                );
            }
        }
        assert!(
            Attention::new(Projections::Fused(lin(7, dm, 1)), lin(dm, dm, 2), h, hk, d).is_err()
        );
        assert!(
            Attention::new(Projections::Fused(lin(7, dm, 1)), lin(dm, dm, 2), 3, 2, d).is_err()
        );
    }

    /// Decoding token by token through the cache gives the rows of one
    /// causal pass over the whole sequence, with rotary positions.
    #[test]
    fn kv_cache_decode_equals_the_full_causal_pass() {
        let dev = dev();
        let (h, hk, d, s) = (2, 1, 8, 6);
        let dm = h * d;
        let a = Attention::new(
            Projections::Fused(lin((h + 2 * hk) * d, dm, 7)),
            lin(dm, dm, 8),
            h,
            hk,
            d,
        )
        .expect("attn");
        let rope = RotaryEmbedding::new(d, 32, 10_000.0, RopeLayout::Halves).expect("rope");
        let xv = values(s * dm, 9);
        let x = Tensor::from_vec(xv.clone(), &[1, s, dm]).expect("x");
        let full = a
            .forward(
                &dev,
                &x,
                Some(&rope.at(&dev, 0, s).expect("at")),
                None,
                Masking::Causal,
            )
            .expect("full")
            .to_vec_f32()
            .expect("v");
        let mut cache = KvCache::new();
        let first = Tensor::from_vec(xv[..2 * dm].to_vec(), &[1, 2, dm]).expect("x");
        let mut got = a
            .forward(
                &dev,
                &first,
                Some(&rope.at(&dev, 0, 2).expect("at")),
                Some(&mut cache),
                Masking::Causal,
            )
            .expect("prefill")
            .to_vec_f32()
            .expect("v");
        for p in 2..s {
            let xi = Tensor::from_vec(xv[p * dm..(p + 1) * dm].to_vec(), &[1, 1, dm]).expect("x");
            let r = rope.at(&dev, p, 1).expect("at");
            let y = a
                .forward(&dev, &xi, Some(&r), Some(&mut cache), Masking::Causal)
                .expect("step");
            got.extend(y.to_vec_f32().expect("v"));
        }
        assert_eq!(cache.len(), s);
        for (g, w) in got.iter().zip(&full) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }

    #[test]
    fn cross_attention_reads_the_memory_keys() {
        let dev = dev();
        let (h, d) = (2, 4);
        let dm = h * d;
        let a = Attention::new(
            Projections::Separate {
                q: lin(dm, dm, 1),
                k: lin(dm, dm, 2),
                v: lin(dm, dm, 3),
            },
            lin(dm, dm, 4),
            h,
            h,
            d,
        )
        .expect("attn");
        let mem = Tensor::from_vec(values(3 * dm, 5), &[1, 3, dm]).expect("m");
        let x = Tensor::from_vec(values(2 * dm, 6), &[1, 2, dm]).expect("x");
        let (k, v) = a.key_values(&dev, &mem).expect("kv");
        assert_eq!(k.dims(), &[1, h, 3, d]);
        let y = a.forward_cross(&dev, &x, &k, &v).expect("cross");
        assert_eq!(y.dims(), &[1, 2, dm]);
        // Each query's output is a convex mix of value rows, projected: not
        // the self-attention of x.
        let own = a
            .forward(&dev, &x, None, None, Masking::Full)
            .expect("self");
        assert_ne!(y.to_vec_f32().expect("v"), own.to_vec_f32().expect("v"));
        assert!(split_heads(&dev, &Tensor::zeros(&[2, 3]).expect("z"), 1, 3).is_err());
    }
}
