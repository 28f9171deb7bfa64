//! The seeded normal generator behind [`crate::Op::RandNormal`].
//!
//! ## Design
//! Every backend must produce bit-identical samples for a seed, so the
//! samples are always generated on the host by this one in-tree generator
//! (never by a device RNG or a crate whose stream may change between
//! versions), then uploaded:
//! - the seed is expanded with SplitMix64 into the 256-bit state of
//!   xoshiro256++ (Blackman & Vigna), which produces the uniform stream;
//! - uniforms are the top 53 bits of a draw, mapped to (0, 1];
//! - pairs of uniforms become pairs of normals by Box-Muller in f64
//!   (`r = sqrt(-2 ln u1)`, `z0 = r cos(2 pi u2)`, `z1 = r sin(2 pi u2)`);
//! - each sample is `mean + std * z` computed in f64 and rounded to f32.
//!
//! Element `i` of the output is the `i`-th sample in row-major order.

use crate::{Result, Tensor};

/// xoshiro256++ seeded through SplitMix64.
#[derive(Debug, Clone)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Xoshiro256 {
    /// Generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let s = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        Xoshiro256 { s }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in (0, 1] with 53 bits of precision.
    pub fn next_open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// `n` samples of N(mean, std^2) for `seed`, as documented in this module.
pub fn normal_f32(n: usize, mean: f64, std: f64, seed: u64) -> Vec<f32> {
    let mut rng = Xoshiro256::new(seed);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let u1 = rng.next_open01();
        let u2 = rng.next_open01();
        let r = (-2.0 * u1.ln()).sqrt();
        let th = 2.0 * std::f64::consts::PI * u2;
        out.push((mean + std * r * th.cos()) as f32);
        if out.len() < n {
            out.push((mean + std * r * th.sin()) as f32);
        }
    }
    out
}

/// A host f32 tensor of seeded normal samples (what every backend returns
/// for [`crate::Op::RandNormal`], uploaded where needed).
pub fn rand_normal_host(shape: &[usize], mean: f64, std: f64, seed: u64) -> Result<Tensor> {
    let n = shape.iter().product();
    Tensor::from_vec(normal_f32(n, mean, std, seed), shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_normal() {
        let a = normal_f32(10_001, 0.0, 1.0, 42);
        let b = normal_f32(10_001, 0.0, 1.0, 42);
        let c = normal_f32(10_001, 0.0, 1.0, 43);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let n = a.len() as f64;
        let m = a.iter().map(|&x| x as f64).sum::<f64>() / n;
        let v = a.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n;
        assert!(m.abs() < 0.05, "mean {m}");
        assert!((v - 1.0).abs() < 0.05, "var {v}");
    }

    #[test]
    fn xoshiro_reference_stream() {
        // xoshiro256++ with state {1, 2, 3, 4}: first outputs from the
        // reference C implementation.
        let mut r = Xoshiro256 { s: [1, 2, 3, 4] };
        assert_eq!(r.next_u64(), 41943041);
        assert_eq!(r.next_u64(), 58720359);
        assert_eq!(r.next_u64(), 3588806011781223);
    }
}
