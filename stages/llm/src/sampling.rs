//! Next-token selection: greedy, or temperature / top-k / top-p sampling,
//! with an optional repetition penalty, from a seeded generator so a seed
//! reproduces a run.

use crate::{Error, Result};
use edgeflow_runtime::rng::Xoshiro256;

/// How to pick the next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// HF-style penalty (> 1 discourages tokens already in the context:
    /// positive logits divided, negative multiplied); 1 = off.
    pub repetition_penalty: f32,
    /// Seed of the sampling generator.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Check the ranges (temperature >= 0, 0 < top_p <= 1, penalty > 0).
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::BadInput(format!(
                "temperature must be >= 0 (0 = greedy), got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::BadInput(format!(
                "top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(Error::BadInput(format!(
                "repetition_penalty must be > 0 (1 = off), got {}",
                self.repetition_penalty
            )));
        }
        Ok(())
    }
}

/// Picks tokens from logits according to [`SamplingParams`].
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Xoshiro256,
}

/// Index of the largest value; the first one on ties (as torch's argmax).
pub fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}

impl Sampler {
    /// A sampler; errors on out-of-range params.
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Sampler {
            params,
            rng: Xoshiro256::new(params.seed),
        })
    }

    /// The params.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Restart the generator from the seed.
    pub fn reseed(&mut self) {
        self.rng = Xoshiro256::new(self.params.seed);
    }

    /// Pick the next token from `logits` (modified in place), given the
    /// tokens already in the context (`history`, for the penalty).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::BadInput("no logits to sample from".into()));
        }
        let p = self.params;
        if p.repetition_penalty != 1.0 {
            let mut seen = vec![false; logits.len()];
            for &t in history {
                let t = t as usize;
                if t < logits.len() && !seen[t] {
                    seen[t] = true;
                    let l = &mut logits[t];
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.temperature == 0.0 {
            return Ok(argmax(logits) as u32);
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l / p.temperature))
            .collect();
        if cand.is_empty() {
            return Err(Error::BadInput("every logit is infinite or NaN".into()));
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.truncate(p.top_k);
        }
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|c| f64::from(c.1 - max).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = probs.len();
            for (i, &x) in probs.iter().enumerate() {
                cum += x;
                if cum >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|x| *x /= total);
        }
        let u = self.rng.next_open01();
        let mut cum = 0.0;
        for (i, &x) in probs.iter().enumerate() {
            cum += x;
            if u < cum {
                return Ok(cand[i].0);
            }
        }
        Ok(cand[probs.len() - 1].0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_max() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&mut [0.0, 2.0, 2.0, 1.0], &[]).unwrap(), 1);
    }

    #[test]
    fn penalty_changes_greedy_choice() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let mut s = Sampler::new(p).unwrap();
        // 3.0 / 2 = 1.5 < 2.0
        assert_eq!(s.sample(&mut [3.0, 2.0, -1.0], &[0, 0]).unwrap(), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_seed_reproduces() {
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(p).unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [0.1, 0.3, 0.2], &[]).unwrap(), 1);
        }
        let p = SamplingParams {
            temperature: 1.0,
            seed: 7,
            ..Default::default()
        };
        let run = || {
            let mut s = Sampler::new(p).unwrap();
            (0..50)
                .map(|_| s.sample(&mut [0.0, 0.5, 1.0, 0.2], &[]).unwrap())
                .collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        // Every token is possible at temperature 1 with no truncation.
        assert!((0..4).all(|t| a.contains(&t)));
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            seed: 3,
            ..Default::default()
        };
        let mut s = Sampler::new(p).unwrap();
        // softmax([5, 0, 0]) puts > 0.98 on token 0: the nucleus is {0}.
        for _ in 0..50 {
            assert_eq!(s.sample(&mut [5.0, 0.0, 0.0], &[]).unwrap(), 0);
        }
    }

    #[test]
    fn bad_params_are_rejected() {
        for p in [
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(p).is_err());
        }
    }
}
