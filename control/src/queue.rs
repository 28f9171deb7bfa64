//! The timestep-indexed action queue behind the `controller` stage.
//!
//! Chunks arrive as (first timestep, H actions of `dim` values). Each
//! timestep holds one action; a timestep that a new chunk also covers is
//! merged by the [`MergeMode`]. Actions whose timestep has passed are
//! dropped and counted, whether they arrive late or were never popped.

use std::collections::BTreeMap;

/// How a new chunk's action for a timestep combines with the one queued.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MergeMode {
    /// The new action replaces the old one.
    LatestOnly,
    /// `old_weight * old + (1 - old_weight) * new` (LeRobot default 0.3 / 0.7).
    WeightedAverage {
        /// Weight of the queued action, in [0, 1].
        old_weight: f32,
    },
    /// `0.5 * old + 0.5 * new`.
    Average,
    /// `0.7 * old + 0.3 * new`: the queued plan dominates.
    Conservative,
    /// ACT temporal ensembling: every prediction for the timestep,
    /// weighted `exp(-m * i)` with i = 0 the oldest, normalised.
    Ensemble {
        /// Decay `m` (ACT uses 0.01).
        m: f32,
    },
}

impl MergeMode {
    /// Parse a YAML name (`latest_only`, `weighted_average`, `average`,
    /// `conservative`, `ensemble`) with its parameter.
    pub fn parse(name: &str, old_weight: f32, ensemble_m: f32) -> Option<Self> {
        Some(match name {
            "latest_only" => MergeMode::LatestOnly,
            "weighted_average" => MergeMode::WeightedAverage { old_weight },
            "average" => MergeMode::Average,
            "conservative" => MergeMode::Conservative,
            "ensemble" | "temporal_ensemble" => MergeMode::Ensemble { m: ensemble_m },
            _ => return None,
        })
    }
}

#[derive(Debug, Clone)]
struct Slot {
    /// The action to apply.
    value: Vec<f32>,
    /// Ensembling: weighted sum and total weight, and predictions so far.
    sum: Vec<f32>,
    wsum: f32,
    n: u32,
}

/// What inserting a chunk did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InsertReport {
    /// Timesteps that were new.
    pub added: usize,
    /// Timesteps merged with a queued action.
    pub merged: usize,
    /// Actions dropped because their timestep had already passed.
    pub stale: usize,
}

/// Why a chunk was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// Action dimension differs from the queue's.
    #[error("action chunk has dim {got}, the queue holds dim {expected}")]
    DimMismatch {
        /// Queue's dim.
        expected: usize,
        /// Chunk's dim.
        got: usize,
    },
    /// `values.len()` is not a multiple of `dim`, or dim is 0.
    #[error("{len} values are not whole actions of dim {dim}")]
    Ragged {
        /// Values given.
        len: usize,
        /// Dim given.
        dim: usize,
    },
}

/// A timestep-indexed action queue.
#[derive(Debug, Clone)]
pub struct ActionQueue {
    mode: MergeMode,
    dim: Option<usize>,
    slots: BTreeMap<u64, Slot>,
    dropped: u64,
}

impl ActionQueue {
    /// An empty queue merging by `mode`; the dim is fixed by the first chunk
    /// (or `dim`).
    pub fn new(mode: MergeMode, dim: Option<usize>) -> Self {
        ActionQueue {
            mode,
            dim,
            slots: BTreeMap::new(),
            dropped: 0,
        }
    }

    /// Action dimension, once known.
    pub fn dim(&self) -> Option<usize> {
        self.dim
    }

    /// Actions dropped so far because their time had passed.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Queued actions for timesteps `>= step`.
    pub fn len_from(&self, step: u64) -> usize {
        self.slots.range(step..).count()
    }

    /// The queued actions for `step`, `step + 1`, ... up to the first gap,
    /// flattened: what will execute from `step` on if nothing else arrives
    /// (the prefix a real-time-chunking policy freezes).
    pub fn values_from(&self, step: u64) -> Vec<f32> {
        let mut out = Vec::new();
        for (next, (&t, slot)) in (step..).zip(self.slots.range(step..)) {
            if t != next {
                break;
            }
            out.extend_from_slice(&slot.value);
        }
        out
    }

    /// Whether nothing is queued at or after `step`.
    pub fn is_empty_from(&self, step: u64) -> bool {
        self.slots.range(step..).next().is_none()
    }

    /// Forget everything (new episode); the drop counter stays.
    pub fn clear(&mut self) {
        self.slots.clear();
    }

    /// Insert a chunk whose first action is for `start_step`; `now_step` is
    /// the next step to be executed, so earlier actions are stale.
    pub fn insert(
        &mut self,
        start_step: u64,
        dim: usize,
        values: &[f32],
        now_step: u64,
    ) -> Result<InsertReport, QueueError> {
        if dim == 0 || !values.len().is_multiple_of(dim) {
            return Err(QueueError::Ragged {
                len: values.len(),
                dim,
            });
        }
        match self.dim {
            Some(d) if d != dim => {
                return Err(QueueError::DimMismatch {
                    expected: d,
                    got: dim,
                })
            }
            _ => self.dim = Some(dim),
        }
        let mut rep = InsertReport::default();
        for (i, a) in values.chunks_exact(dim).enumerate() {
            let t = start_step + i as u64;
            if t < now_step {
                rep.stale += 1;
                continue;
            }
            match self.slots.get_mut(&t) {
                None => {
                    self.slots.insert(
                        t,
                        Slot {
                            value: a.to_vec(),
                            sum: a.to_vec(),
                            wsum: 1.0,
                            n: 1,
                        },
                    );
                    rep.added += 1;
                }
                Some(s) => {
                    merge(self.mode, s, a);
                    rep.merged += 1;
                }
            }
        }
        self.dropped += rep.stale as u64;
        Ok(rep)
    }

    /// Take the action for `step`, dropping (and counting) queued actions
    /// for earlier steps.
    pub fn pop(&mut self, step: u64) -> Option<Vec<f32>> {
        while let Some((&t, _)) = self.slots.first_key_value() {
            if t >= step {
                break;
            }
            self.slots.pop_first();
            self.dropped += 1;
        }
        self.slots.remove(&step).map(|s| s.value)
    }
}

fn blend(old: &mut [f32], new: &[f32], w_old: f32) {
    for (o, n) in old.iter_mut().zip(new) {
        *o = w_old * *o + (1.0 - w_old) * n;
    }
}

fn merge(mode: MergeMode, s: &mut Slot, a: &[f32]) {
    match mode {
        MergeMode::LatestOnly => s.value.copy_from_slice(a),
        MergeMode::WeightedAverage { old_weight } => blend(&mut s.value, a, old_weight),
        MergeMode::Average => blend(&mut s.value, a, 0.5),
        MergeMode::Conservative => blend(&mut s.value, a, 0.7),
        MergeMode::Ensemble { m } => {
            // The i-th prediction (0 = oldest) weighs exp(-m i).
            let w = (-m * s.n as f32).exp();
            for (sum, x) in s.sum.iter_mut().zip(a) {
                *sum += w * x;
            }
            s.wsum += w;
            s.n += 1;
            for (v, sum) in s.value.iter_mut().zip(&s.sum) {
                *v = sum / s.wsum;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(mode: MergeMode) -> ActionQueue {
        let mut q = ActionQueue::new(mode, None);
        q.insert(10, 1, &[1.0, 2.0, 3.0], 10).expect("insert");
        q
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn latest_only_replaces() {
        let mut q = q(MergeMode::LatestOnly);
        let r = q.insert(11, 1, &[20.0, 30.0, 40.0], 10).expect("insert");
        assert_eq!(
            r,
            InsertReport {
                added: 1,
                merged: 2,
                stale: 0
            }
        );
        assert_eq!(q.pop(10), Some(vec![1.0]));
        assert_eq!(q.pop(11), Some(vec![20.0]));
        assert_eq!(q.pop(12), Some(vec![30.0]));
        assert_eq!(q.pop(13), Some(vec![40.0]));
        assert_eq!(q.pop(14), None);
    }

    #[test]
    fn weighted_average_is_03_old_07_new() {
        let mut q = q(MergeMode::WeightedAverage { old_weight: 0.3 });
        q.insert(11, 1, &[12.0], 10).expect("insert");
        q.pop(10);
        let v = q.pop(11).expect("11")[0];
        assert!(close(v, 0.3 * 2.0 + 0.7 * 12.0), "{v}");
    }

    #[test]
    fn average_and_conservative() {
        let mut a = q(MergeMode::Average);
        a.insert(12, 1, &[5.0], 10).expect("insert");
        assert_eq!(a.pop(12), Some(vec![4.0]));
        let mut c = q(MergeMode::Conservative);
        c.insert(12, 1, &[13.0], 10).expect("insert");
        let v = c.pop(12).expect("12")[0];
        assert!(close(v, 0.7 * 3.0 + 0.3 * 13.0), "{v}");
    }

    #[test]
    fn ensemble_weights_exp_minus_m_i_older_first() {
        let m = 0.5f32;
        let mut q = ActionQueue::new(MergeMode::Ensemble { m }, None);
        q.insert(0, 2, &[1.0, 10.0], 0).expect("a");
        q.insert(0, 2, &[2.0, 20.0], 0).expect("b");
        q.insert(0, 2, &[4.0, 40.0], 0).expect("c");
        let w = [1.0f32, (-m).exp(), (-2.0 * m).exp()];
        let ws: f32 = w.iter().sum();
        let want = (w[0] * 1.0 + w[1] * 2.0 + w[2] * 4.0) / ws;
        let got = q.pop(0).expect("0");
        assert!(close(got[0], want), "{got:?} vs {want}");
        assert!(close(got[1], want * 10.0), "{got:?}");
    }

    #[test]
    fn stale_actions_are_dropped_and_counted() {
        let mut q = ActionQueue::new(MergeMode::LatestOnly, None);
        // Chunk for steps 5..9 arriving when step 7 is next: 5 and 6 are stale.
        let r = q
            .insert(5, 1, &[5.0, 6.0, 7.0, 8.0, 9.0], 7)
            .expect("insert");
        assert_eq!(r.stale, 2);
        assert_eq!(q.dropped(), 2);
        // Skipping step 7 (e.g. a missed period) drops it when 8 is popped.
        assert_eq!(q.pop(8), Some(vec![8.0]));
        assert_eq!(q.dropped(), 3);
        assert_eq!(q.len_from(9), 1);
    }

    #[test]
    fn dim_is_checked() {
        let mut q = ActionQueue::new(MergeMode::LatestOnly, Some(2));
        assert_eq!(
            q.insert(0, 3, &[0.0; 3], 0),
            Err(QueueError::DimMismatch {
                expected: 2,
                got: 3
            })
        );
        assert_eq!(
            q.insert(0, 2, &[0.0; 3], 0),
            Err(QueueError::Ragged { len: 3, dim: 2 })
        );
    }
}
