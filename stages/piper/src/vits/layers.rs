//! The small channel helpers VITS's blocks share (split, flip) and its
//! layer-norm epsilon; the layers themselves are `edgeflow-nn`'s.

use crate::Result;
use edgeflow_runtime::{Device, Tensor};

/// The epsilon of VITS's layer norms.
pub const LN_EPS: f64 = 1e-5;

/// Split `[1, c, t]` into its first `a` channels and the rest.
pub fn split_channels(dev: &Device, x: &Tensor, a: usize) -> Result<(Tensor, Tensor)> {
    let c = x.dims()[1];
    Ok((dev.narrow(x, 1, 0, a)?, dev.narrow(x, 1, a, c - a)?))
}

/// Reverse the channel order of `[1, c, t]` (VITS's `Flip`).
pub fn flip_channels(dev: &Device, x: &Tensor) -> Result<Tensor> {
    let c = x.dims()[1];
    let idx = Tensor::from_i64((0..c as i64).rev().collect(), &[c])?;
    Ok(dev.index_select(x, &idx, 1)?)
}
