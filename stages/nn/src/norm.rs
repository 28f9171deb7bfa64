//! [`LayerNorm`] and [`RmsNorm`] over the last dim (and over the channels
//! of channel-major `[b, c, t]` activations).

use crate::{Result, VarBuilder};
use edgeflow_runtime::{Device, Tensor};

/// Layer normalization over the last dim: `(x - mean) / sqrt(var + eps) *
/// gamma (+ beta)`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    gamma: Tensor,
    beta: Option<Tensor>,
    eps: f64,
}

impl LayerNorm {
    /// Over placed `gamma[d]` and `beta[d]`.
    pub fn new(gamma: Tensor, beta: Option<Tensor>, eps: f64) -> Self {
        LayerNorm { gamma, beta, eps }
    }

    /// PyTorch names under `vb`: `weight` and `bias`, both `[dim]` (as f32).
    pub fn load(vb: &VarBuilder, dim: usize, eps: f64) -> Result<Self> {
        Self::load_named(vb, dim, eps, "weight", "bias")
    }

    /// Named `gamma` / `beta` (VITS, CTranslate2), both `[dim]` (as f32).
    pub fn load_gamma_beta(vb: &VarBuilder, dim: usize, eps: f64) -> Result<Self> {
        Self::load_named(vb, dim, eps, "gamma", "beta")
    }

    fn load_named(vb: &VarBuilder, dim: usize, eps: f64, g: &str, b: &str) -> Result<Self> {
        Ok(LayerNorm {
            gamma: vb.get_f32(g, &[dim])?,
            beta: Some(vb.get_f32(b, &[dim])?),
            eps,
        })
    }

    /// The epsilon.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// Normalize over the last dim (`[..., d]`).
    pub fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        Ok(dev.layer_norm(x, &self.gamma, self.beta.as_ref(), self.eps)?)
    }

    /// Normalize channel-major activations `[b, c, t]` over `c` (a
    /// transpose to `[b, t, c]` and back around [`Self::forward`]).
    pub fn forward_channels(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let xt = dev.transpose(x, 1, 2)?;
        let y = self.forward(dev, &xt)?;
        Ok(dev.transpose(&y, 1, 2)?)
    }
}

/// RMS normalization over the last dim: `x / sqrt(mean(x^2) + eps) * w`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    w: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Over placed weights `w[d]`.
    pub fn new(w: Tensor, eps: f64) -> Self {
        RmsNorm { w, eps }
    }

    /// `weight` `[dim]` under `vb` (as f32).
    pub fn load(vb: &VarBuilder, dim: usize, eps: f64) -> Result<Self> {
        Ok(RmsNorm::new(vb.get_f32("weight", &[dim])?, eps))
    }

    /// The weights.
    pub fn weight(&self) -> &Tensor {
        &self.w
    }

    /// Normalize over the last dim.
    pub fn forward(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        Ok(dev.rms_norm(x, &self.w, self.eps)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> Device {
        edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu")
    }

    fn x(rows: usize, d: usize) -> Vec<f32> {
        (0..rows * d)
            .map(|i| ((i * 29 % 37) as f32 / 9.0) - 2.0)
            .collect()
    }

    #[test]
    fn layer_norm_matches_the_reference_on_rows_and_channels() {
        let dev = dev();
        let (rows, d) = (3, 7);
        let xv = x(rows, d);
        let g: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 * 0.25).collect();
        let b: Vec<f32> = (0..d).map(|i| i as f32 * 0.1 - 0.3).collect();
        let mut want = vec![0f64; rows * d];
        for r in 0..rows {
            let row = &xv[r * d..(r + 1) * d];
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            for i in 0..d {
                want[r * d + i] =
                    (row[i] as f64 - mean) / (var + 1e-5).sqrt() * g[i] as f64 + b[i] as f64;
            }
        }
        let ln = LayerNorm::new(
            Tensor::from_vec(g, &[d]).expect("g"),
            Some(Tensor::from_vec(b, &[d]).expect("b")),
            1e-5,
        );
        let t = Tensor::from_vec(xv, &[1, rows, d]).expect("x");
        let got = ln.forward(&dev, &t).expect("ln").to_vec_f32().expect("v");
        for (a, w) in got.iter().zip(&want) {
            assert!((*a as f64 - w).abs() < 1e-5, "{a} vs {w}");
        }
        // The same rows as channel-major [1, d, rows].
        let tc = dev.transpose(&t, 1, 2).expect("t");
        let yc = ln.forward_channels(&dev, &tc).expect("lnc");
        assert_eq!(yc.dims(), &[1, d, rows]);
        let back = dev.transpose(&yc, 1, 2).expect("t");
        assert_eq!(dev.to_host(&back).expect("h").to_vec_f32().expect("v"), got);
    }

    #[test]
    fn rms_norm_matches_the_reference() {
        let dev = dev();
        let (rows, d) = (2, 6);
        let xv = x(rows, d);
        let w: Vec<f32> = (0..d).map(|i| 1.0 + i as f32 * 0.5).collect();
        let n = RmsNorm::new(Tensor::from_vec(w.clone(), &[d]).expect("w"), 1e-6);
        let got = n
            .forward(&dev, &Tensor::from_vec(xv.clone(), &[rows, d]).expect("x"))
            .expect("rms")
            .to_vec_f32()
            .expect("v");
        for r in 0..rows {
            let row = &xv[r * d..(r + 1) * d];
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
            for i in 0..d {
                let want = row[i] as f64 / (ms + 1e-6).sqrt() * w[i] as f64;
                assert!((got[r * d + i] as f64 - want).abs() < 1e-5);
            }
        }
    }
}
