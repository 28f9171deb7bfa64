//! Element-wise work on contiguous f32 host tensors with this crate's
//! loops and rayon's pool instead of candle's. Candle splits every
//! element-wise op over 64K elements across its spinning barrier pool; on
//! a loaded machine the caller then spins while a descheduled worker holds
//! its share (perf: up to 19% of `bench tts` samples at load 6). Rayon's
//! idle workers sleep, and busy ones take a straggler's remaining chunks.
//! Same arithmetic per element as candle's kernels, except tanh and
//! sigmoid ([`crate::cpu::math`]: vectorized, within 1e-6 relative).
use super::tensors::{cdev, with_f32_slice};
use candle_core::Tensor as CTensor;
use edgeflow_runtime::Result;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Below this many elements one thread does it all (as candle does).
const PAR_MIN: usize = 1 << 16;
/// Elements per parallel chunk.
const CHUNK: usize = 1 << 14;

pub(crate) fn run<S: Sync>(
    n: usize,
    src: S,
    f: impl Fn(&S, usize, &mut [MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    let mut y: Vec<f32> = Vec::with_capacity(n);
    let dst = &mut y.spare_capacity_mut()[..n];
    if n >= PAR_MIN {
        dst.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, d)| f(&src, i * CHUNK, d));
    } else {
        f(&src, 0, dst);
    }
    // SAFETY: `f` wrote every element of `dst` (each chunk in full).
    unsafe { y.set_len(n) };
    y
}

/// `f(x)` per element; None unless `x` is a contiguous f32 host tensor.
pub(crate) fn map(x: &CTensor, f: impl Fn(f32) -> f32 + Sync) -> Result<Option<CTensor>> {
    let y = with_f32_slice(x, |xs| {
        run(xs.len(), xs, |xs, at, d| {
            for (d, &v) in d.iter_mut().zip(&xs[at..]) {
                d.write(f(v));
            }
        })
    })?;
    Ok(match y {
        Some(y) => Some(CTensor::from_vec(y, x.shape(), &cdev())?),
        None => None,
    })
}

/// [`map`] with `f` applied by [`crate::cpu::math::map`] (vectorized).
pub(crate) fn map_vec(
    x: &CTensor,
    f: impl Fn(f32) -> f32 + Copy + Sync,
) -> Result<Option<CTensor>> {
    let y = with_f32_slice(x, |xs| {
        run(xs.len(), xs, |xs, at, d| {
            crate::cpu::math::map(&xs[at..], d, f);
        })
    })?;
    Ok(match y {
        Some(y) => Some(CTensor::from_vec(y, x.shape(), &cdev())?),
        None => None,
    })
}

/// `f(a, b)` per element of two same-shape tensors; None unless both are
/// contiguous f32 host tensors of one shape.
pub(crate) fn zip(
    a: &CTensor,
    b: &CTensor,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Result<Option<CTensor>> {
    if a.dims() != b.dims() {
        return Ok(None);
    }
    let y = with_f32_slice(a, |xa| {
        with_f32_slice(b, |xb| {
            run(xa.len(), (xa, xb), |(xa, xb), at, d| {
                for ((d, &u), &v) in d.iter_mut().zip(&xa[at..]).zip(&xb[at..]) {
                    d.write(f(u, v));
                }
            })
        })
    })?;
    Ok(match y.transpose()?.flatten() {
        Some(y) => Some(CTensor::from_vec(y, a.shape(), &cdev())?),
        None => None,
    })
}

/// `f(a, b)` per element of `a`, with `b` repeating along `a` every
/// `b.len()` elements (a row broadcast over leading dims: a per-channel
/// scale on `[.., t, c]`); None unless both are contiguous f32 host
/// tensors and `b`'s length divides `a`'s. The output has `a`'s shape.
pub(crate) fn zip_rows(
    a: &CTensor,
    b: &CTensor,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Result<Option<CTensor>> {
    let n = b.elem_count();
    if n == 0 || !a.elem_count().is_multiple_of(n) {
        return Ok(None);
    }
    let y = with_f32_slice(a, |xa| {
        with_f32_slice(b, |xb| {
            run(xa.len(), (xa, xb), |(xa, xb), at, d| {
                // Whole stretches of `b` at a time, so each loop vectorizes.
                let (mut at, mut j, mut d) = (at, at % n, d);
                while !d.is_empty() {
                    let len = (n - j).min(d.len());
                    let (head, rest) = d.split_at_mut(len);
                    for ((d, &u), &v) in head.iter_mut().zip(&xa[at..at + len]).zip(&xb[j..j + len])
                    {
                        d.write(f(u, v));
                    }
                    (at, j, d) = (at + len, 0, rest);
                }
            })
        })
    })?;
    Ok(match y.transpose()?.flatten() {
        Some(y) => Some(CTensor::from_vec(y, a.shape(), &cdev())?),
        None => None,
    })
}
