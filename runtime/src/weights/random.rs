//! [`RandomWeights`]: a [`WeightReader`] that makes up seeded random
//! tensors of stated names and shapes instead of reading a file.
//!
//! It exists for models whose real weights cannot be had: a model loads
//! from it exactly as from its checkpoint (same names, same shapes), so the
//! structure, the speed and the memory of the real configuration can be run
//! and measured, and a small configuration can run end to end. Outputs of
//! such a model are meaningless; whoever uses it says so.
//!
//! The values follow PyTorch's default initialisation closely enough for
//! activations to stay finite through deep stacks:
//! - tensors of rank 2 and more: uniform in `[-b, b]` with
//!   `b = 1 / sqrt(fan_in)`, `fan_in` the product of every dim but the
//!   first (a linear's `in_features`, a conv's `in_channels * kernel`);
//! - rank-1 tensors whose name ends in `weight` or `gamma` (norm gains): 1;
//! - other rank-1 tensors (biases, Snake's log-scale `alpha` / `beta`): 0;
//! - rank 0: 0.
//!
//! Each tensor's stream is seeded by the reader's seed and the tensor's
//! name, so a tensor's values do not depend on which others exist or on
//! the order they are loaded in.

use super::{TensorInfo, WeightReader};
use crate::rng::Xoshiro256;
use crate::{DType, Error, Result, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Seeded random tensors under given names and shapes (see the module).
#[derive(Debug, Clone)]
pub struct RandomWeights {
    label: PathBuf,
    seed: u64,
    shapes: BTreeMap<String, Vec<usize>>,
}

/// Largest tensor this reader makes (elements): a typo in a shape list
/// must not allocate what it says.
const MAX_ELEMENTS: usize = 1 << 31;

impl RandomWeights {
    /// A reader of `shapes` (name, dims) seeded by `seed`. `label` stands
    /// where a file path would in messages (e.g. `random:token2wav`).
    /// Duplicate names, empty names and tensors over 2^31 elements are
    /// refused.
    pub fn new(
        label: impl Into<PathBuf>,
        shapes: impl IntoIterator<Item = (String, Vec<usize>)>,
        seed: u64,
    ) -> Result<Self> {
        let label = label.into();
        let mut map = BTreeMap::new();
        for (name, dims) in shapes {
            let bad = |msg: String| Error::Weights {
                path: label.clone(),
                msg,
            };
            if name.is_empty() {
                return Err(bad("a random tensor needs a name".into()));
            }
            dims.iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .filter(|&n| n <= MAX_ELEMENTS)
                .ok_or_else(|| bad(format!("tensor `{name}` {dims:?} is too large")))?;
            if map.insert(name.clone(), dims).is_some() {
                return Err(bad(format!("tensor `{name}` is listed twice")));
            }
        }
        Ok(RandomWeights {
            label,
            seed,
            shapes: map,
        })
    }

    /// Total elements of every tensor (f32 bytes are four times this).
    pub fn elements(&self) -> usize {
        self.shapes
            .values()
            .map(|d| d.iter().product::<usize>())
            .sum()
    }

    fn values(&self, name: &str, dims: &[usize]) -> Vec<f32> {
        let n: usize = dims.iter().product();
        match dims.len() {
            0 => vec![0.0; n],
            1 => {
                let gain = name.ends_with("weight") || name.ends_with("gamma");
                vec![if gain { 1.0 } else { 0.0 }; n]
            }
            _ => {
                let fan_in: usize = dims[1..].iter().product();
                let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
                // FNV-1a of the name, mixed into the seed.
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in name.bytes() {
                    h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                }
                let mut rng = Xoshiro256::new(self.seed ^ h);
                (0..n)
                    .map(|_| ((rng.next_open01() * 2.0 - 1.0) * bound) as f32)
                    .collect()
            }
        }
    }
}

impl WeightReader for RandomWeights {
    fn path(&self) -> &Path {
        &self.label
    }

    fn names(&self) -> Vec<String> {
        self.shapes.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.shapes.get(name).map(|dims| TensorInfo {
            name: name.to_string(),
            dims: dims.clone(),
            dtype: DType::F32,
        })
    }

    fn load(&self, name: &str) -> Result<Tensor> {
        let dims = self.shapes.get(name).ok_or_else(|| Error::Weights {
            path: self.label.clone(),
            msg: format!("no tensor `{name}` among the random weights"),
        })?;
        Tensor::from_vec(self.values(name, dims), dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader() -> RandomWeights {
        RandomWeights::new(
            "random:test",
            [
                ("a.weight".to_string(), vec![4, 8]),
                ("a.bias".to_string(), vec![4]),
                ("norm.weight".to_string(), vec![8]),
                ("conv.weight".to_string(), vec![2, 3, 5]),
            ],
            7,
        )
        .unwrap()
    }

    #[test]
    fn shapes_init_and_determinism() {
        let r = reader();
        assert_eq!(r.names().len(), 4);
        assert_eq!(r.elements(), 32 + 4 + 8 + 30);
        let w = r.load("a.weight").unwrap().to_vec_f32().unwrap();
        assert_eq!(w.len(), 32);
        let b = 1.0 / 8f32.sqrt();
        assert!(w.iter().all(|v| v.abs() <= b));
        // Not constant: a real spread over the bound.
        let (lo, hi) = w
            .iter()
            .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(hi - lo > b / 2.0);
        assert_eq!(w, reader().load("a.weight").unwrap().to_vec_f32().unwrap());
        assert_eq!(
            r.load("a.bias").unwrap().to_vec_f32().unwrap(),
            vec![0.0; 4]
        );
        assert_eq!(
            r.load("norm.weight").unwrap().to_vec_f32().unwrap(),
            vec![1.0; 8]
        );
        let c = r.load("conv.weight").unwrap().to_vec_f32().unwrap();
        assert!(c.iter().all(|v| v.abs() <= 1.0 / 15f32.sqrt()));
        // Another seed, other values.
        let other = RandomWeights::new("x", [("a.weight".to_string(), vec![4, 8])], 8).unwrap();
        assert_ne!(w, other.load("a.weight").unwrap().to_vec_f32().unwrap());
    }

    #[test]
    fn refuses_bad_lists() {
        let dup = RandomWeights::new("x", [("a".into(), vec![1]), ("a".into(), vec![2])], 0);
        assert!(dup.unwrap_err().to_string().contains("twice"));
        let huge = RandomWeights::new("x", [("a".into(), vec![1 << 20, 1 << 20])], 0);
        assert!(huge.unwrap_err().to_string().contains("too large"));
        let r = reader();
        assert!(r
            .load("missing")
            .unwrap_err()
            .to_string()
            .contains("missing"));
    }
}
