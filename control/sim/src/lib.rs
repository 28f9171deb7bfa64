//! # edgeflow-sim
//!
//! A simulated robot for edgeflow's control loops: a Push-T-like 2-D task on
//! the rapier2d physics engine, with a top-down RGB camera (tiny-skia), a
//! scripted expert and an on-disk episode format for training. Pure: no
//! zenoh, no edgeflow graph; `edgeflow-control` wires it into a process.
//!
//! ## The task
//! A walled 0.6 m x 0.6 m table (table frame: metres, origin at the centre,
//! x right, y up) holds two 6 cm square blocks, red and blue, and two target
//! zones, green and yellow. A circular pusher (kinematic, radius 1.5 cm)
//! follows a commanded position target through a velocity- and
//! acceleration-limited P controller. The seed picks one of four goals
//! ([`Variant`]), named in the text instruction, e.g. "push the red block
//! onto the green target": a policy must read it. Success: the named block's
//! centre within [`PushConfig::success_tolerance`] of the named zone's centre
//! for [`PushConfig::success_hold_steps`] consecutive control steps
//! (orientation is free). Episodes time out after
//! [`PushConfig::episode_seconds`].
//!
//! The scripted expert ([`Expert`]) plans chunks of pusher targets from
//! the true state: by default with discrete waypoint plans
//! ([`ExpertKind::Waypoints`]), or as a memoryless velocity field around
//! the named block whose chunk is a continuous function of the state
//! ([`ExpertKind::Field`]).
//!
//! Defaults: 50 Hz control, 500 Hz physics (10 substeps), 20 s episodes,
//! 96 x 96 camera, 2 cm tolerance held 10 steps, pusher 0.5 m/s, 5 m/s^2.
//!
//! ```
//! use edgeflow_sim::{Expert, PushConfig, PushSim};
//! let cfg = PushConfig::default();
//! let mut sim = PushSim::new(cfg.clone()).unwrap();
//! let info = sim.reset(3);
//! assert!(info.instruction.starts_with("push the"));
//! let mut expert = Expert::new(&cfg);
//! let chunk = expert.chunk(&sim.true_state(), 16);
//! for target in chunk {
//!     sim.step(target);
//! }
//! let image = sim.render();
//! assert_eq!(image.rgb.len(), 96 * 96 * 3);
//! ```
//!
//! Determinism: a reset rebuilds the world from the seed alone, and nothing
//! else (no clock, no thread, no global RNG) enters a step, so the same seed
//! and the same commands give the same trajectory bit for bit on one build.
//! rapier2d is built with `enhanced-determinism`, which also makes it
//! identical across platforms.

mod dart;
mod error;
mod expert;
mod expert_field;
pub mod record;
mod render;
mod rng;
mod sim;
mod task;

pub use dart::{record_perturbed_episode, Perturbation};
pub use error::{Result, SimError};
pub use expert::{Expert, ExpertKind};
pub use render::{table_to_pixel, Image, PUSHER_RGB, TABLE_RGB, WALL_RGB};
pub use sim::PushSim;
pub use task::{
    BlockColour, BlockState, EpisodeInfo, PushConfig, TrueState, Variant, Workspace, ZoneColour,
    ZoneState, BLOCK_HALF, PRIVILEGED_DIM, PUSHER_RADIUS, TABLE_HALF, WALL_THICKNESS, ZONE_HALF,
};
