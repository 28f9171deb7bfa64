//! Training data: per episode, the instruction embedding, cached vision
//! features of some of its frames, and the recorded states and actions.

use crate::config::{Config, Normalizer, MIN_STD};
use crate::{Error, Result};

/// One recorded episode, with its frozen encoder features.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeFeatures {
    /// Instruction embedding `[feature_dim]`.
    pub instruction: Vec<f32>,
    /// `(step, the head's vision tokens [vision_tokens * vision_width])`, in
    /// increasing step order. Not every step needs a frame: a sample at
    /// step `i` sees the newest frame at or before `i` (the camera runs
    /// slower than the control loop, as it does live).
    pub frames: Vec<(usize, Vec<f32>)>,
    /// Auxiliary keypoint targets, one row per entry of `frames` (same
    /// order), each `[A * 2]`: where the first `A` keypoints should land,
    /// in [`crate::config::patch_coords`]' coordinates (for the push task,
    /// the blocks' and zones' centres from the simulator's true state).
    /// Training-only supervision; empty when the recording has none.
    pub frame_targets: Vec<Vec<f32>>,
    /// Auxiliary angle targets, one row per entry of `frames` (same
    /// order), each `[A * 2]`: `(cos 4a, sin 4a)` of the angle `a` of the
    /// object under each of the first `A` keypoints (for the push task,
    /// the blocks; see [`crate::config::Config::keypoint_angles`]).
    /// Training-only supervision; empty when the recording has none.
    pub frame_angles: Vec<Vec<f32>>,
    /// Robot states `[steps * state_dim]`, row `i` observed at step `i`.
    pub states: Vec<f32>,
    /// Commanded actions `[steps * action_dim]`, row `i` at step `i`.
    pub actions: Vec<f32>,
    /// Expert labels `[steps * horizon * action_dim]`: row `i` is the
    /// chunk the expert plans from the true state at step `i`, the
    /// training target there instead of the commanded actions that follow
    /// (an episode a policy drove, labelled by the expert: DAgger). Empty
    /// for the expert's own episodes.
    pub labels: Vec<f32>,
}

impl EpisodeFeatures {
    /// Control steps.
    pub fn steps(&self, cfg: &Config) -> usize {
        self.actions.len() / cfg.action_dim.max(1)
    }

    /// The newest frame at or before `step` (the first one before it).
    pub fn frame_at(&self, step: usize) -> &[f32] {
        &self.frames[self.frame_index_at(step)].1
    }

    /// Index in `frames` of [`Self::frame_at`]'s frame.
    pub fn frame_index_at(&self, step: usize) -> usize {
        self.frames
            .partition_point(|(s, _)| *s <= step)
            .saturating_sub(1)
    }

    /// The training target at `step`: the expert's label there when the
    /// episode has labels, else the `horizon` actions from `step`, the last
    /// one repeated past the end (the robot holds where the episode ended).
    pub fn chunk_at(&self, cfg: &Config, step: usize) -> Vec<f32> {
        let (n, d) = (self.steps(cfg), cfg.action_dim);
        if !self.labels.is_empty() {
            let w = cfg.horizon * d;
            return self.labels[step * w..(step + 1) * w].to_vec();
        }
        (0..cfg.horizon)
            .flat_map(|k| {
                let i = (step + k).min(n - 1);
                self.actions[i * d..(i + 1) * d].iter().copied()
            })
            .collect()
    }

    /// State row `step`.
    pub fn state_at(&self, cfg: &Config, step: usize) -> &[f32] {
        &self.states[step * cfg.state_dim..(step + 1) * cfg.state_dim]
    }
}

/// A training set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dataset {
    /// The episodes.
    pub episodes: Vec<EpisodeFeatures>,
}

impl Dataset {
    /// Check sizes against `cfg` (each error names the episode and what).
    pub fn validate(&self, cfg: &Config) -> Result<()> {
        if self.episodes.is_empty() {
            return Err(Error::Data(
                "no episodes (record some with `edgeflow sim push --record DIR`)".into(),
            ));
        }
        let with = self
            .episodes
            .iter()
            .filter(|e| !e.frame_targets.is_empty())
            .count();
        if with != 0 && with != self.episodes.len() {
            return Err(Error::Data(format!(
                "{with} of {} episodes have keypoint targets: all or none must",
                self.episodes.len()
            )));
        }
        let vt = cfg.vision_tokens() * cfg.vision_width();
        for (k, e) in self.episodes.iter().enumerate() {
            let bad = |m: String| Err(Error::Data(format!("episode {k}: {m}")));
            let n = e.steps(cfg);
            if n == 0 || e.actions.len() != n * cfg.action_dim {
                return bad(format!(
                    "{} action values is not a non-empty whole number of {}-wide rows",
                    e.actions.len(),
                    cfg.action_dim
                ));
            }
            if e.states.len() != n * cfg.state_dim {
                return bad(format!(
                    "{} state values for {n} steps of {} (states and actions must have the same rows)",
                    e.states.len(),
                    cfg.state_dim
                ));
            }
            if e.instruction.len() != cfg.feature_dim {
                return bad(format!(
                    "instruction embedding of {} values, expected {}",
                    e.instruction.len(),
                    cfg.feature_dim
                ));
            }
            if e.frames.is_empty() {
                return bad("no vision features".into());
            }
            if let Some((s, f)) = e.frames.iter().find(|(_, f)| f.len() != vt) {
                return bad(format!(
                    "frame at step {s} has {} values, expected {} pooled tokens of {} ({vt})",
                    f.len(),
                    cfg.vision_tokens(),
                    cfg.vision_width()
                ));
            }
            if !e.frame_targets.is_empty() {
                if e.frame_targets.len() != e.frames.len() {
                    return bad(format!(
                        "{} keypoint target rows for {} frames",
                        e.frame_targets.len(),
                        e.frames.len()
                    ));
                }
                let w = e.frame_targets[0].len();
                if w == 0 || !w.is_multiple_of(2) || w / 2 > cfg.keypoints {
                    return bad(format!(
                        "keypoint targets of {w} values: must be (x, y) pairs for at most the {} keypoints",
                        cfg.keypoints
                    ));
                }
                let other = self.episodes[0].frame_targets.first().map_or(w, Vec::len);
                if e.frame_targets.iter().any(|t| t.len() != w) || w != other {
                    return bad("keypoint target rows differ in width".into());
                }
                if e.frame_targets.iter().flatten().any(|v| !v.is_finite()) {
                    return bad("a keypoint target is not finite".into());
                }
            }
            if cfg.keypoint_angles > 0 {
                let w = 2 * cfg.keypoint_angles;
                if e.frame_angles.len() != e.frames.len() {
                    return bad(format!(
                        "{} angle target rows for {} frames: a head with keypoint_angles {} needs one per frame (re-encode the episodes)",
                        e.frame_angles.len(),
                        e.frames.len(),
                        cfg.keypoint_angles
                    ));
                }
                if e.frame_angles.iter().any(|t| t.len() < w) {
                    return bad(format!(
                        "angle target rows narrower than the {w} values (cos, sin for {} keypoints) the head reads",
                        cfg.keypoint_angles
                    ));
                }
                if e.frame_angles.iter().flatten().any(|v| !v.is_finite()) {
                    return bad("an angle target is not finite".into());
                }
            }
            if !e.labels.is_empty() && e.labels.len() != n * cfg.horizon * cfg.action_dim {
                return bad(format!(
                    "{} label values for {n} steps of {} x {} (labels must be the head's horizon)",
                    e.labels.len(),
                    cfg.horizon,
                    cfg.action_dim
                ));
            }
            if e.frames.windows(2).any(|w| w[1].0 <= w[0].0) {
                return bad("frames are not in increasing step order".into());
            }
            let finite = e
                .states
                .iter()
                .chain(&e.actions)
                .chain(&e.labels)
                .chain(&e.instruction)
                .chain(e.frames.iter().flat_map(|(_, f)| f))
                .all(|v| v.is_finite());
            if !finite {
                return bad("holds a non-finite value".into());
            }
        }
        Ok(())
    }

    /// Training samples (one per recorded step).
    pub fn samples(&self, cfg: &Config) -> usize {
        self.episodes.iter().map(|e| e.steps(cfg)).sum()
    }

    /// Mean and standard deviation of the states, and of every chunk's
    /// actions relative to the state it starts from.
    pub fn fit_normalizer(&self, cfg: &Config) -> Normalizer {
        let (sd, ad) = (cfg.state_dim, cfg.action_dim);
        let mut s = Moments::new(sd);
        let mut a = Moments::new(ad);
        for e in &self.episodes {
            for i in 0..e.steps(cfg) {
                let st = e.state_at(cfg, i);
                s.add(st);
                let c = e.chunk_at(cfg, i);
                for row in c.chunks(ad) {
                    let d: Vec<f32> = row.iter().zip(st).map(|(x, p)| x - p).collect();
                    a.add(&d);
                }
            }
        }
        let (state_mean, state_std) = s.finish();
        let (action_mean, action_std) = a.finish();
        let (vision_mean, vision_std) = if cfg.vision_norm {
            // Over every real feature segment of every cached frame (the
            // CLS token's zero padding left out).
            let d = cfg.feature_dim;
            let segs = cfg.vision_stack * cfg.vision_stack;
            let mut v = Moments::new(d);
            for e in &self.episodes {
                for (_, f) in &e.frames {
                    for (k, seg) in f.chunks(d).enumerate() {
                        if k == 0 || k >= segs {
                            v.add(seg);
                        }
                    }
                }
            }
            v.finish()
        } else {
            (Vec::new(), Vec::new())
        };
        let (text_mean, text_std) = if cfg.text_norm {
            // Per sample, as the batches draw them.
            let mut t = Moments::new(cfg.feature_dim);
            for e in &self.episodes {
                for _ in 0..e.steps(cfg) {
                    t.add(&e.instruction);
                }
            }
            let (mean, std) = t.finish();
            let rms = (std.iter().map(|s| s * s).sum::<f32>() / std.len().max(1) as f32).sqrt();
            let floor = (0.1 * rms).max(MIN_STD);
            (mean, std.into_iter().map(|s| s.max(floor)).collect())
        } else {
            (Vec::new(), Vec::new())
        };
        Normalizer {
            text_mean,
            text_std,
            state_mean,
            state_std,
            action_mean,
            action_std,
            vision_mean,
            vision_std,
        }
    }
}

struct Moments {
    n: f64,
    sum: Vec<f64>,
    sq: Vec<f64>,
}

impl Moments {
    fn new(d: usize) -> Self {
        Moments {
            n: 0.0,
            sum: vec![0.0; d],
            sq: vec![0.0; d],
        }
    }
    fn add(&mut self, v: &[f32]) {
        self.n += 1.0;
        for (k, x) in v.iter().enumerate() {
            self.sum[k] += *x as f64;
            self.sq[k] += (*x as f64).powi(2);
        }
    }
    fn finish(&self) -> (Vec<f32>, Vec<f32>) {
        let n = self.n.max(1.0);
        let mean: Vec<f64> = self.sum.iter().map(|s| s / n).collect();
        let std = self
            .sq
            .iter()
            .zip(&mean)
            .map(|(q, m)| ((q / n - m * m).max(0.0).sqrt() as f32).max(MIN_STD))
            .collect();
        (mean.iter().map(|m| *m as f32).collect(), std)
    }
}

/// Metadata key of a cached dataset's description (see [`Dataset::save`]).
const CACHE_KEY: &str = "edgeflow.action.dataset";

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Dataset {
    /// Write the dataset (features included) as safetensors, `key`
    /// describing how it was made (the encoder settings and the episodes)
    /// in the metadata; [`Dataset::load`] gives it back only for the same
    /// key. Written to a temporary name and renamed, so a file that exists
    /// is whole.
    pub fn save(&self, path: &std::path::Path, key: &str) -> Result<()> {
        use safetensors::tensor::{Dtype, TensorView};
        let mut bufs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for (k, e) in self.episodes.iter().enumerate() {
            let nf = e.frames.len();
            let fw = e.frames.first().map_or(0, |f| f.1.len());
            let steps: Vec<u8> = e
                .frames
                .iter()
                .flat_map(|(s, _)| (*s as u64).to_le_bytes())
                .collect();
            let frames: Vec<f32> = e.frames.iter().flat_map(|f| f.1.iter().copied()).collect();
            bufs.push((format!("{k}.frame_steps"), Dtype::U64, vec![nf], steps));
            bufs.push((
                format!("{k}.frames"),
                Dtype::F32,
                vec![nf, fw],
                f32_bytes(&frames),
            ));
            if !e.frame_targets.is_empty() {
                let w = e.frame_targets[0].len();
                let t: Vec<f32> = e.frame_targets.iter().flatten().copied().collect();
                bufs.push((
                    format!("{k}.frame_targets"),
                    Dtype::F32,
                    vec![e.frame_targets.len(), w],
                    f32_bytes(&t),
                ));
            }
            if !e.frame_angles.is_empty() {
                let w = e.frame_angles[0].len();
                if e.frame_angles.iter().any(|t| t.len() != w) {
                    return Err(Error::Data(format!(
                        "episode {k}: angle target rows differ in width"
                    )));
                }
                let t: Vec<f32> = e.frame_angles.iter().flatten().copied().collect();
                bufs.push((
                    format!("{k}.frame_angles"),
                    Dtype::F32,
                    vec![e.frame_angles.len(), w],
                    f32_bytes(&t),
                ));
            }
            let mut arrays = vec![
                ("instruction", &e.instruction),
                ("states", &e.states),
                ("actions", &e.actions),
            ];
            if !e.labels.is_empty() {
                arrays.push(("labels", &e.labels));
            }
            for (name, v) in arrays {
                bufs.push((
                    format!("{k}.{name}"),
                    Dtype::F32,
                    vec![v.len()],
                    f32_bytes(v),
                ));
            }
        }
        let views = bufs
            .iter()
            .map(|(n, d, s, b)| {
                TensorView::new(*d, s.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| Error::Data(format!("dataset tensor {n}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let meta = std::collections::HashMap::from([
            (CACHE_KEY.to_string(), key.to_string()),
            ("episodes".to_string(), self.episodes.len().to_string()),
        ]);
        let tmp = path.with_extension("partial");
        safetensors::tensor::serialize_to_file(views, Some(meta), &tmp)
            .map_err(|e| Error::Data(format!("writing {}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    }

    /// Read a dataset [`Dataset::save`] wrote with the same `key`; `None`
    /// when there is no file or it was made another way.
    pub fn load(path: &std::path::Path, key: &str) -> Result<Option<Self>> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(path, e)),
        };
        let bad = |m: String| Error::Data(format!("{}: {m}", path.display()));
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let m = meta.metadata().clone().unwrap_or_default();
        if m.get(CACHE_KEY).map(String::as_str) != Some(key) {
            return Ok(None);
        }
        let n: usize = m
            .get("episodes")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("metadata lacks `episodes`".into()))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
        // Views into the file's bytes: each value is decoded once, not copied
        // first (the cache of a real run is gigabytes).
        let get = |name: String| -> Result<(Vec<usize>, &[u8])> {
            let t = st.tensor(&name).map_err(|e| bad(format!("{name}: {e}")))?;
            Ok((t.shape().to_vec(), t.data()))
        };
        let floats = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let mut ds = Dataset::default();
        for k in 0..n {
            let (_, steps) = get(format!("{k}.frame_steps"))?;
            let (shape, frames) = get(format!("{k}.frames"))?;
            let fw = shape.get(1).copied().unwrap_or(0).max(1);
            let steps: Vec<usize> = steps
                .chunks_exact(8)
                .map(|c| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(c);
                    u64::from_le_bytes(a) as usize
                })
                .collect();
            let rows = |name: &str| match st.tensor(&format!("{k}.{name}")) {
                Ok(t) => {
                    let w = t.shape().get(1).copied().unwrap_or(0).max(1);
                    t.data().chunks(w * 4).map(floats).collect()
                }
                Err(_) => Vec::new(),
            };
            let frame_targets = rows("frame_targets");
            let frame_angles = rows("frame_angles");
            ds.episodes.push(EpisodeFeatures {
                instruction: floats(get(format!("{k}.instruction"))?.1),
                frame_targets,
                frame_angles,
                frames: steps
                    .into_iter()
                    .zip(frames.chunks(fw * 4).map(floats))
                    .collect(),
                states: floats(get(format!("{k}.states"))?.1),
                actions: floats(get(format!("{k}.actions"))?.1),
                labels: st
                    .tensor(&format!("{k}.labels"))
                    .map_or_else(|_| Vec::new(), |t| floats(t.data())),
            });
        }
        Ok(Some(ds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_dataset_reads_back_only_under_its_key() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("features.safetensors");
        let ds = Dataset {
            episodes: vec![EpisodeFeatures {
                instruction: vec![0.5, -0.5],
                frames: vec![(0, vec![1.0, 2.0, 3.0]), (3, vec![4.0, 5.0, 6.0])],
                frame_targets: vec![vec![0.5, -0.5], vec![0.25, 0.0]],
                frame_angles: vec![vec![1.0, 0.0], vec![0.0, -1.0]],
                states: vec![0.1, 0.2, 0.3, 0.4],
                actions: vec![0.0, 1.0],
                labels: vec![0.5, 1.5, 2.5, 3.5],
            }],
        };
        assert!(Dataset::load(&path, "k").expect("absent").is_none());
        ds.save(&path, "k").expect("save");
        assert_eq!(Dataset::load(&path, "k").expect("load"), Some(ds));
        assert!(Dataset::load(&path, "other").expect("other key").is_none());
        std::fs::write(&path, b"garbage").expect("w");
        assert!(Dataset::load(&path, "k").is_err());
    }

    #[test]
    fn labels_replace_the_commanded_actions_as_targets() {
        let cfg = Config {
            horizon: 2,
            action_dim: 2,
            state_dim: 2,
            ..Config::default()
        };
        let mut e = EpisodeFeatures {
            instruction: vec![0.0; cfg.feature_dim],
            frames: vec![(0, vec![0.0; cfg.vision_tokens() * cfg.vision_width()])],
            frame_targets: Vec::new(),
            frame_angles: Vec::new(),
            states: vec![0.0; 6],
            actions: vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0],
            labels: Vec::new(),
        };
        // Without labels: the actions that follow, the last held.
        assert_eq!(e.chunk_at(&cfg, 2), vec![3.0, 3.0, 3.0, 3.0]);
        e.labels = (0..12).map(|v| v as f32).collect();
        assert_eq!(e.chunk_at(&cfg, 1), vec![4.0, 5.0, 6.0, 7.0]);
        let ds = Dataset {
            episodes: vec![e.clone()],
        };
        ds.validate(&cfg).expect("valid");
        e.labels.pop();
        let e = Dataset { episodes: vec![e] }
            .validate(&cfg)
            .expect_err("short labels")
            .to_string();
        assert!(e.contains("11 label values"), "{e}");
    }
}
