//! [`Linear`] in every weight format the runtime has, [`Embedding`], and
//! stacking of projections that share an input ([`stack_rows`]).

use crate::{Error, Result, VarBuilder, WeightFormat};
use edgeflow_runtime::candle_core;
use edgeflow_runtime::{Device, Storage, Tensor};
use std::sync::Arc;

/// `y = x @ w^T (+ b)` over the last dim: `x[..., in]`, `w[out, in]`.
///
/// The weight may be f32, f16, bf16 or a block-quantized format (Q4_0 /
/// Q4_1 / Q8_0, kept quantized: the runtime's `linear` reads the blocks). A
/// second copy of the same weights for calls with few activation rows can
/// be attached ([`Linear::with_small_batch_weight`]): e.g. a checkpoint's
/// f16 values for decode steps, which stream half the bytes of the f32
/// copy with the same products.
#[derive(Debug, Clone)]
pub struct Linear {
    w: Tensor,
    b: Option<Tensor>,
    /// Weights used up to `.1` activation rows.
    small: Option<(Tensor, usize)>,
}

impl Linear {
    /// A linear over placed weights `w[out, in]` and `b[out]`.
    pub fn new(w: Tensor, b: Option<Tensor>) -> Self {
        Linear { w, b, small: None }
    }

    /// `weight` (and `bias` when `bias`) under `vb`, in the stored format,
    /// checked against `[out, in]` / `[out]`.
    pub fn load(vb: &VarBuilder, in_dim: usize, out_dim: usize, bias: bool) -> Result<Self> {
        Self::load_as(vb, in_dim, out_dim, bias, WeightFormat::Stored)
    }

    /// [`Linear::load`] keeping the weight in `format` (the bias is f32 in
    /// every case).
    pub fn load_as(
        vb: &VarBuilder,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
        format: WeightFormat,
    ) -> Result<Self> {
        let dims = [out_dim, in_dim];
        let w = match format {
            WeightFormat::Stored => vb.get("weight", &dims)?,
            WeightFormat::F32 => vb.get_f32("weight", &dims)?,
            _ => {
                let t = vb.host("weight", &dims)?;
                match format.kept_as(t.dtype()) {
                    to if to != t.dtype() => vb.place(&vb.device().host().cast(&t, to)?)?,
                    _ => vb.get("weight", &dims)?,
                }
            }
        };
        let b = if bias {
            Some(vb.get_f32("bias", &[out_dim])?)
        } else {
            None
        };
        Ok(Linear::new(w, b))
    }

    /// `weight` / `bias` under `vb` converted to f32 (f16 checkpoints run in
    /// f32), shapes read from the checkpoint.
    pub fn load_f32(vb: &VarBuilder, bias: bool) -> Result<Self> {
        let w = vb.get_f32_unchecked("weight")?;
        let b = if bias {
            Some(vb.get_f32_unchecked("bias")?)
        } else {
            None
        };
        if w.rank() != 2 {
            return Err(vb.error(
                "weight",
                format!("has dims {:?}, expected [out, in]", w.dims()),
            ));
        }
        Ok(Linear::new(w, b))
    }

    /// Use `w` (the same values in another format, same dims) for calls with
    /// at most `max_rows` activation rows.
    pub fn with_small_batch_weight(mut self, w: Tensor, max_rows: usize) -> Result<Self> {
        if w.dims() != self.w.dims() {
            return Err(Error::BadInput(format!(
                "small-batch weights {:?} differ from the linear's {:?}",
                w.dims(),
                self.w.dims()
            )));
        }
        self.small = Some((w, max_rows));
        Ok(self)
    }

    /// The weights `[out, in]`.
    pub fn weight(&self) -> &Tensor {
        &self.w
    }

    /// The bias `[out]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.b.as_ref()
    }

    /// Output features.
    pub fn out_dim(&self) -> usize {
        self.w.dims().first().copied().unwrap_or(0)
    }

    /// Rows `start..start + len` of the weights (and of the bias when
    /// `keep_bias`): one projection of a fused one (`[q; k; v]`).
    pub fn rows(&self, dev: &Device, start: usize, len: usize, keep_bias: bool) -> Result<Linear> {
        if start + len > self.out_dim() {
            return Err(Error::BadInput(format!(
                "rows {start}..{} of a linear with {} outputs",
                start + len,
                self.out_dim()
            )));
        }
        let w = dev.narrow(&self.w, 0, start, len)?;
        let small = match &self.small {
            Some((s, rows)) => Some((dev.narrow(s, 0, start, len)?, *rows)),
            None => None,
        };
        let b = match (&self.b, keep_bias) {
            (Some(b), true) => Some(dev.narrow(b, 0, start, len)?),
            _ => None,
        };
        Ok(Linear { w, b, small })
    }

    /// Bytes of the weights and bias as stored.
    pub fn size_bytes(&self) -> usize {
        self.w.size_bytes() + self.b.as_ref().map_or(0, |b| b.size_bytes())
    }

    /// `x[..., in] -> [..., out]`.
    pub fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let w = match &self.small {
            Some((w, max_rows)) => {
                let rows = x.dims().iter().rev().skip(1).product::<usize>();
                if rows <= *max_rows {
                    w
                } else {
                    &self.w
                }
            }
            None => &self.w,
        };
        Ok(dev.linear(x, w, self.b.as_ref())?)
    }
}

/// A lookup table `[vocab, dim]`: rows by id.
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Tensor,
}

impl Embedding {
    /// Over a placed table `[vocab, dim]`.
    pub fn new(table: Tensor) -> Self {
        Embedding { table }
    }

    /// The table.
    pub fn table(&self) -> &Tensor {
        &self.table
    }

    /// Rows of the table.
    pub fn vocab(&self) -> usize {
        self.table.dims().first().copied().unwrap_or(0)
    }

    /// `ids[n]` (i64) -> `[n, dim]`.
    pub fn forward(&self, dev: &Device, ids: &Tensor) -> Result<Tensor> {
        Ok(dev.index_select(&self.table, ids, 0)?)
    }
}

/// Host tensors `parts` (each `[n_i, k]`) stacked into `[sum n_i, k]`, so
/// projections that read the same input run as one linear. Quantized parts
/// of one block format are stacked as raw blocks (rows are whole blocks in
/// GGML's row-major layout), so they stay quantized; others are
/// concatenated on `host`.
pub fn stack_rows(host: &Device, parts: &[Tensor]) -> Result<Tensor> {
    match parts {
        [] => return Err(Error::BadInput("stacking zero tensors".into())),
        [one] => return Ok(one.clone()),
        _ => {}
    }
    let quantized: Option<Vec<_>> = parts
        .iter()
        .map(|t| match t.storage() {
            Storage::Quantized(q) => Some(q.clone()),
            _ => None,
        })
        .collect();
    if let Some(qs) = quantized {
        let dt = qs[0].dtype();
        let k = qs[0].shape().dims()[1];
        if qs
            .iter()
            .all(|q| q.dtype() == dt && q.shape().dims()[1] == k)
        {
            let mut raw = Vec::new();
            let mut rows = 0;
            for q in &qs {
                raw.extend_from_slice(&q.data().map_err(edgeflow_runtime::Error::from)?);
                rows += q.shape().dims()[0];
            }
            let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
                dt,
                &raw,
                vec![rows, k],
                &candle_core::Device::Cpu,
            )
            .map_err(edgeflow_runtime::Error::from)?;
            return Ok(Tensor::from_quantized(Arc::new(q))?);
        }
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    Ok(host.concat(&refs, 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use edgeflow_runtime::DType;

    fn dev() -> Device {
        edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu")
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 37 + seed * 11) % 101) as f32 / 50.0) - 1.0)
            .collect()
    }

    /// `x[m, k] @ w[n, k]^T + b` in f64 loops.
    fn reference(
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        m: usize,
        k: usize,
        n: usize,
    ) -> Vec<f64> {
        let mut y = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = b.map_or(0.0, |b| b[j] as f64);
                for t in 0..k {
                    s += x[i * k + t] as f64 * w[j * k + t] as f64;
                }
                y[i * n + j] = s;
            }
        }
        y
    }

    /// Every weight format against the f64 product of the weights it holds
    /// (dequantized): exact-ish for f32 / f16, within the int8 activation
    /// rounding for the block formats; with and without bias, one row and
    /// several.
    #[test]
    fn linear_matches_the_reference_in_every_weight_format() {
        let dev = dev();
        let (k, n) = (64, 5);
        let wv = values(n * k, 1);
        let bv = values(n, 2);
        let wc = candle_core::Tensor::from_vec(wv.clone(), (n, k), &candle_core::Device::Cpu)
            .expect("w");
        for m in [1, 3] {
            let xv = values(m * k, 3 + m);
            let x = Tensor::from_vec(xv.clone(), &[m, k]).expect("x");
            let mut cases: Vec<(DType, Tensor, Vec<f32>, f64)> = vec![(
                DType::F32,
                Tensor::from_vec(wv.clone(), &[n, k]).expect("w"),
                wv.clone(),
                1e-4,
            )];
            let w16 = dev.cast(&cases[0].1, DType::F16).expect("f16");
            let w16v = w16.to_vec_f32().expect("v");
            cases.push((DType::F16, w16, w16v, 1e-3));
            for (dt, g) in [
                (DType::Q8_0, GgmlDType::Q8_0),
                (DType::Q4_0, GgmlDType::Q4_0),
                (DType::Q4_1, GgmlDType::Q4_1),
            ] {
                let q = QTensor::quantize(&wc, g).expect("quantize");
                let deq = q
                    .dequantize(&candle_core::Device::Cpu)
                    .expect("deq")
                    .flatten_all()
                    .expect("flat")
                    .to_vec1::<f32>()
                    .expect("v");
                let t = Tensor::from_quantized(Arc::new(q)).expect("q");
                assert_eq!(t.dtype(), dt);
                cases.push((dt, t, deq, 1e-4));
            }
            for (dt, w, held, tol) in cases {
                for bias in [false, true] {
                    let b = bias.then(|| Tensor::from_vec(bv.clone(), &[n]).expect("b"));
                    let lin = Linear::new(dev.place(&w).expect("place"), b);
                    let y = lin.forward(&dev, &x).expect("forward");
                    assert_eq!(y.dims(), &[m, n]);
                    let got = dev.to_host(&y).expect("h").to_vec_f32().expect("v");
                    let want = reference(&xv, &held, bias.then_some(&bv[..]), m, k, n);
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        // Quantized kernels round the activations to int8
                        // per block of 32: at most amax / 254 per element.
                        let bound = if dt.is_quantized() {
                            let row = &xv[(i / n) * k..(i / n + 1) * k];
                            let amax = row.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                            let wsum: f64 = held[(i % n) * k..(i % n + 1) * k]
                                .iter()
                                .map(|v| v.abs() as f64)
                                .sum();
                            wsum * amax / 254.0 + tol
                        } else {
                            tol
                        };
                        let e = (g as f64 - w).abs();
                        assert!(e <= bound, "{dt} m={m} bias={bias}: error {e} over {bound}");
                    }
                }
            }
        }
    }

    #[test]
    fn small_batch_weights_serve_few_rows_and_rows_split_a_fused_projection() {
        let dev = dev();
        let (k, n) = (8, 6);
        let wv = values(n * k, 4);
        let w = Tensor::from_vec(wv.clone(), &[n, k]).expect("w");
        // A deliberately different "copy" shows which one ran.
        let other = Tensor::from_vec(wv.iter().map(|v| -v).collect(), &[n, k]).expect("o");
        let lin = Linear::new(w, None)
            .with_small_batch_weight(other, 1)
            .expect("same dims");
        let x1 = Tensor::from_vec(values(k, 5), &[1, k]).expect("x");
        let x2 = Tensor::from_vec(values(2 * k, 5), &[2, k]).expect("x");
        let y1 = lin.forward(&dev, &x1).expect("y").to_vec_f32().expect("v");
        let y2 = lin.forward(&dev, &x2).expect("y").to_vec_f32().expect("v");
        for (a, b) in y1.iter().zip(&y2[..n]) {
            assert!((a + b).abs() < 1e-5, "{a} vs {b}");
        }
        let b = Tensor::from_vec(values(n, 6), &[n]).expect("b");
        let fused = Linear::new(Tensor::from_vec(wv.clone(), &[n, k]).expect("w"), Some(b));
        let part = fused.rows(&dev, 2, 3, true).expect("rows");
        let whole = fused
            .forward(&dev, &x2)
            .expect("y")
            .to_vec_f32()
            .expect("v");
        let got = part.forward(&dev, &x2).expect("y").to_vec_f32().expect("v");
        for r in 0..2 {
            assert_eq!(&got[r * 3..r * 3 + 3], &whole[r * n + 2..r * n + 5]);
        }
        assert!(fused.rows(&dev, 4, 3, true).is_err());
        assert!(fused
            .rows(&dev, 0, 2, false)
            .expect("rows")
            .bias()
            .is_none());
    }

    #[test]
    fn stacked_quantized_rows_stay_quantized_and_equal_their_parts() {
        let dev = dev();
        let k = 32;
        let mk = |rows: usize, seed| {
            let w = candle_core::Tensor::from_vec(
                values(rows * k, seed),
                (rows, k),
                &candle_core::Device::Cpu,
            )
            .expect("w");
            Tensor::from_quantized(Arc::new(QTensor::quantize(&w, GgmlDType::Q4_1).expect("q")))
                .expect("t")
        };
        let (a, b) = (mk(2, 1), mk(3, 2));
        let s = stack_rows(&dev.host(), &[a.clone(), b.clone()]).expect("stack");
        assert_eq!((s.dtype(), s.dims()), (DType::Q4_1, &[5, k][..]));
        let deq = |t: &Tensor| {
            dev.cast(t, DType::F32)
                .expect("deq")
                .to_vec_f32()
                .expect("v")
        };
        let mut want = deq(&a);
        want.extend(deq(&b));
        assert_eq!(deq(&s), want);
        let f = stack_rows(
            &dev.host(),
            &[
                Tensor::from_vec(vec![1.0, 2.0], &[1, 2]).expect("t"),
                Tensor::from_vec(vec![3.0, 4.0], &[1, 2]).expect("t"),
            ],
        )
        .expect("f32");
        assert_eq!(f.to_vec_f32().expect("v"), vec![1.0, 2.0, 3.0, 4.0]);
        assert!(stack_rows(&dev.host(), &[]).is_err());
    }

    #[test]
    fn embedding_selects_rows() {
        let dev = dev();
        let e = Embedding::new(
            Tensor::from_vec((0..12).map(|v| v as f32).collect(), &[4, 3]).expect("t"),
        );
        let ids = Tensor::from_i64(vec![2, 0, 2], &[3]).expect("ids");
        let y = e.forward(&dev, &ids).expect("y");
        assert_eq!(
            y.to_vec_f32().expect("v"),
            vec![6., 7., 8., 0., 1., 2., 6., 7., 8.]
        );
        assert_eq!(e.vocab(), 4);
    }
}
