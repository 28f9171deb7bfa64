//! Rotary position embeddings ([`RotaryEmbedding`]) in both layouts.

use crate::{Error, Result};
use edgeflow_runtime::{Device, Tensor};

/// Which elements of a head a rotary pair couples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs `(2i, 2i + 1)` (GPT-J; llama.cpp's GGUF layout, whose
    /// converter permutes Llama's Q/K rows into it).
    Interleaved,
    /// Halves `(i, i + d/2)` (GPT-NeoX; transformers' Llama, Qwen2).
    Halves,
}

/// cos / sin tables of `pos * theta^(-2i/d)` for every position up to a
/// maximum, applied to `[b, h, s, d]` queries or keys at an offset.
#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    cos: Tensor,
    sin: Tensor,
    layout: RopeLayout,
    head_dim: usize,
}

/// The tables narrowed to the positions of one forward pass
/// ([`RotaryEmbedding::at`]), shared by every layer of that pass.
#[derive(Debug, Clone)]
pub struct RopeAt {
    cos: Tensor,
    sin: Tensor,
    layout: RopeLayout,
}

impl RotaryEmbedding {
    /// Tables for `max_positions` positions of heads of `head_dim` (even),
    /// base `theta`; angles computed in f64.
    pub fn new(
        head_dim: usize,
        max_positions: usize,
        theta: f64,
        layout: RopeLayout,
    ) -> Result<Self> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(Error::BadInput(format!(
                "rotary embedding needs an even head size, got {head_dim}"
            )));
        }
        let half = head_dim / 2;
        let inv: Vec<f64> = (0..half)
            .map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64))
            .collect();
        let n = max_positions;
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in 0..n {
            for f in &inv {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Ok(RotaryEmbedding {
            cos: Tensor::from_vec(cos, &[n, half])?,
            sin: Tensor::from_vec(sin, &[n, half])?,
            layout,
            head_dim,
        })
    }

    /// Positions the tables cover.
    pub fn max_positions(&self) -> usize {
        self.cos.dims()[0]
    }

    /// The layout.
    pub fn layout(&self) -> RopeLayout {
        self.layout
    }

    /// Head size.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The tables for positions `start..start + len`.
    pub fn at(&self, dev: &Device, start: usize, len: usize) -> Result<RopeAt> {
        if start + len > self.max_positions() {
            return Err(Error::BadInput(format!(
                "positions {start}..{} exceed the rotary tables' {}",
                start + len,
                self.max_positions()
            )));
        }
        Ok(RopeAt {
            cos: dev.narrow(&self.cos, 0, start, len)?,
            sin: dev.narrow(&self.sin, 0, start, len)?,
            layout: self.layout,
        })
    }

    /// Rotate `x[b, h, s, d]` as positions `start..start + s`.
    pub fn forward(&self, dev: &Device, x: &Tensor, start: usize) -> Result<Tensor> {
        let s = x.dims().get(2).copied().unwrap_or(0);
        self.at(dev, start, s)?.apply(dev, x)
    }
}

impl RopeAt {
    /// Rotate `x[b, h, s, d]` (`s` = the positions these tables hold).
    pub fn apply(&self, dev: &Device, x: &Tensor) -> Result<Tensor> {
        let interleaved = self.layout == RopeLayout::Interleaved;
        Ok(dev.rope(x, &self.cos, &self.sin, interleaved)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rotation of each pair by `pos * theta^(-2i/d)` in f64, pairs as the
    /// layout says.
    fn reference(x: &[f32], s: usize, d: usize, start: usize, layout: RopeLayout) -> Vec<f64> {
        let half = d / 2;
        let mut y = vec![0f64; x.len()];
        for p in 0..s {
            for i in 0..half {
                let a = (start + p) as f64 / 10_000f64.powf(2.0 * i as f64 / d as f64);
                let (j0, j1) = match layout {
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    RopeLayout::Halves => (i, i + half),
                };
                let (x0, x1) = (x[p * d + j0] as f64, x[p * d + j1] as f64);
                y[p * d + j0] = x0 * a.cos() - x1 * a.sin();
                y[p * d + j1] = x0 * a.sin() + x1 * a.cos();
            }
        }
        y
    }

    #[test]
    fn both_layouts_rotate_the_right_pairs() {
        let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu");
        let (s, d) = (3, 8);
        let xv: Vec<f32> = (0..s * d).map(|i| (i as f32 * 0.37).sin()).collect();
        let x = Tensor::from_vec(xv.clone(), &[1, 1, s, d]).expect("x");
        for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
            let rope = RotaryEmbedding::new(d, 16, 10_000.0, layout).expect("rope");
            let got = rope
                .forward(&dev, &x, 5)
                .expect("rope")
                .to_vec_f32()
                .expect("v");
            let want = reference(&xv, s, d, 5, layout);
            for (g, w) in got.iter().zip(&want) {
                assert!((*g as f64 - w).abs() < 1e-5, "{layout:?}: {g} vs {w}");
            }
            assert!(rope.at(&dev, 14, 3).is_err());
        }
        assert!(RotaryEmbedding::new(7, 4, 10_000.0, RopeLayout::Halves).is_err());
    }
}
