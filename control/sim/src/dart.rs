//! Expert episodes with noise injected into the executed commands (DART,
//! Laskey et al. 2017), each step labelled with the chunk the expert plans
//! from the state there.
//!
//! A policy trained on clean demonstrations only ever sees the states the
//! expert reaches; its own small errors take it elsewhere, where the data
//! shows no way back. Perturbing what the expert executes, while recording
//! what it would have done, puts those states and their corrections into
//! the data without a trained policy in the loop (DAgger needs one).

use std::path::Path;

use crate::record::EpisodeWriter;
use crate::rng::SplitMix64;
use crate::task::{EpisodeInfo, Workspace};
use crate::{Expert, PushSim, Result, SimError};

/// The noise added to the expert's executed targets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Perturbation {
    /// Standard deviation of the offset on each axis, metres.
    pub sigma: f32,
    /// Control steps each offset is held before the next is drawn (a held
    /// offset moves the pusher; one redrawn every step mostly averages out
    /// in its position controller).
    pub hold: usize,
}

impl Perturbation {
    /// Check the values.
    pub fn validate(&self) -> Result<()> {
        if !(self.sigma.is_finite() && (0.0..=0.1).contains(&self.sigma)) || self.hold == 0 {
            return Err(SimError::Argument {
                what: format!(
                    "perturbation sigma {} m must be in [0, 0.1] and hold {} steps at least 1",
                    self.sigma, self.hold
                ),
            });
        }
        Ok(())
    }
}

/// Two independent standard normal values (Box-Muller).
fn normal2(rng: &mut SplitMix64) -> [f32; 2] {
    let u1 = rng.unit().max(f32::MIN_POSITIVE);
    let u2 = rng.unit();
    let r = (-2.0 * u1.ln()).sqrt();
    let a = std::f32::consts::TAU * u2;
    [r * a.cos(), r * a.sin()]
}

/// Run one episode from `seed` on `sim`: `expert` plans `horizon` targets
/// from the true state and the first `execute` run, each moved by the
/// current offset of `noise` (drawn from the seed alone, so the same seed
/// gives the same episode); every step is labelled with the chunk the
/// expert plans from that state alone ([`Expert::label`]). Recorded into
/// the episode folder `dest` with labels and finished with its success.
/// Returns the episode's info.
pub fn record_perturbed_episode(
    sim: &mut PushSim,
    expert: &mut Expert,
    seed: u64,
    horizon: usize,
    execute: usize,
    noise: Perturbation,
    dest: &Path,
) -> Result<EpisodeInfo> {
    noise.validate()?;
    let cfg = sim.config().clone();
    let info = sim.reset(seed);
    expert.reset();
    let mut writer = EpisodeWriter::create(dest, &info, &cfg)?.with_labels(horizon)?;
    let mut rng = SplitMix64::new(seed ^ 0xDA27_0000_0000_0001);
    let (mut offset, mut step) = ([0.0f32; 2], 0usize);
    let execute = execute.clamp(1, horizon.max(1));
    while !sim.done() {
        for target in expert
            .chunk(&sim.true_state(), horizon)
            .into_iter()
            .take(execute)
        {
            if step.is_multiple_of(noise.hold) {
                let n = normal2(&mut rng);
                offset = [n[0] * noise.sigma, n[1] * noise.sigma];
            }
            step += 1;
            let sent = Workspace::PUSHER.clamp([target[0] + offset[0], target[1] + offset[1]]);
            let truth = sim.true_state();
            let label = expert.label(&truth, horizon);
            writer.push_labelled(truth.time, &sim.render(), sim.robot_state(), sent, &label)?;
            sim.step(sent);
            if sim.done() {
                break;
            }
        }
    }
    writer.finish(sim.success())?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::EpisodeReader;
    use crate::PushConfig;

    fn small_cfg() -> PushConfig {
        PushConfig {
            episode_seconds: 1.0,
            ..PushConfig::default()
        }
    }

    #[test]
    fn noise_moves_the_commands_and_labels_are_the_expert_plan() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = small_cfg();
        let mut sim = PushSim::new(cfg.clone()).unwrap();
        let mut expert = Expert::new(&cfg);
        let noise = Perturbation {
            sigma: 0.01,
            hold: 4,
        };
        let a = dir.path().join("a");
        record_perturbed_episode(&mut sim, &mut expert, 5, 16, 8, noise, &a).unwrap();
        let r = EpisodeReader::open(&a).unwrap();
        let actions = r.actions().unwrap();
        let (h, labels) = r.labels().unwrap().expect("labelled");
        assert_eq!((h, labels.len()), (16, actions.len() * 16 * 2));
        // Each row's label is what a new expert plans from the replayed
        // state alone.
        let states = r.true_states(&cfg).unwrap();
        for (i, s) in states.iter().enumerate() {
            let plan: Vec<f32> = Expert::new(&cfg)
                .chunk(s, 16)
                .into_iter()
                .flatten()
                .collect();
            assert_eq!(plan, labels[i * 32..(i + 1) * 32], "row {i}");
        }
        // The executed commands are not the labels' first targets: the
        // offsets moved them, by about sigma.
        let moved: Vec<f32> = actions
            .iter()
            .enumerate()
            .map(|(i, a)| {
                ((a[0] - labels[i * 32]).powi(2) + (a[1] - labels[i * 32 + 1]).powi(2)).sqrt()
            })
            .collect();
        let mean = moved.iter().sum::<f32>() / moved.len() as f32;
        assert!(mean > 0.003 && mean < 0.05, "mean offset {mean} m");
        // Same seed, same files.
        let b = dir.path().join("b");
        record_perturbed_episode(&mut sim, &mut expert, 5, 16, 8, noise, &b).unwrap();
        for f in ["actions.f32", "labels.f32", "state.f32"] {
            assert_eq!(
                std::fs::read(a.join(f)).unwrap(),
                std::fs::read(b.join(f)).unwrap(),
                "{f}"
            );
        }
    }

    #[test]
    fn bad_noise_is_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = small_cfg();
        let mut sim = PushSim::new(cfg.clone()).unwrap();
        let mut expert = Expert::new(&cfg);
        for noise in [
            Perturbation {
                sigma: -0.01,
                hold: 4,
            },
            Perturbation {
                sigma: f32::NAN,
                hold: 4,
            },
            Perturbation {
                sigma: 0.01,
                hold: 0,
            },
        ] {
            let d = dir.path().join("x");
            assert!(record_perturbed_episode(&mut sim, &mut expert, 1, 16, 8, noise, &d).is_err());
            assert!(!d.exists());
        }
    }
}
