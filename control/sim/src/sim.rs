//! The simulator: a rapier2d world with a kinematic circular pusher and two
//! dynamic square blocks on a walled table, top-down (no gravity; table
//! friction slows the blocks down and stops them).

use rapier2d::prelude::*;

use crate::error::Result;
use crate::render::{self, Image};
use crate::task::{
    dist, BlockColour, BlockState, EpisodeInfo, Layout, PushConfig, TrueState, Variant, Workspace,
    ZoneColour, ZoneState, BLOCK_HALF, PUSHER_RADIUS, TABLE_HALF, WALL_THICKNESS,
};

/// Coulomb friction between a block and the table, as a deceleration
/// (mu * g with mu = 0.3), m/s^2.
const TABLE_FRICTION_DECEL: f32 = 0.3 * 9.81;
/// The same friction's angular deceleration for a square block: mu * g *
/// (mean lever arm 0.383 * side) / (I/m = side^2 / 6), rad/s^2.
const TABLE_FRICTION_ANG_DECEL: f32 =
    TABLE_FRICTION_DECEL * 0.383 * 2.0 * BLOCK_HALF / (4.0 * BLOCK_HALF * BLOCK_HALF / 6.0);
/// Viscous damping on the blocks (air, table), 1/s.
const BLOCK_DAMPING: f32 = 2.0;
/// Block density (mass per area), kg/m^2: a 6 cm block weighs 0.1 kg.
const BLOCK_DENSITY: f32 = 0.1 / (4.0 * BLOCK_HALF * BLOCK_HALF);

/// The simulated Push-T-like robot: a pusher that pushes a named block onto
/// a named target zone. See the crate docs for the task.
pub struct PushSim {
    cfg: PushConfig,
    world: PhysicsWorld,
    pusher: RigidBodyHandle,
    blocks: [RigidBodyHandle; 2],
    zones: [[f32; 2]; 2],
    info: EpisodeInfo,
    target: [f32; 2],
    step: u64,
    in_zone_steps: u32,
    success: bool,
}

impl std::fmt::Debug for PushSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushSim")
            .field("cfg", &self.cfg)
            .field("info", &self.info)
            .field("step", &self.step)
            .field("success", &self.success)
            .finish()
    }
}

/// A fresh world laid out as `layout`.
fn build_world(
    cfg: &PushConfig,
    layout: &Layout,
) -> (PhysicsWorld, RigidBodyHandle, [RigidBodyHandle; 2]) {
    let mut world = PhysicsWorld::new();
    world.gravity = Vector::ZERO;
    world.integration_parameters.dt = (1.0 / cfg.physics_hz) as f32;
    // Walls: four static boxes whose inner faces are WALL_THICKNESS inside
    // the table's edge.
    let c = TABLE_HALF - 0.5 * WALL_THICKNESS;
    let hw = 0.5 * WALL_THICKNESS;
    for (x, y, hx, hy) in [
        (0.0, c, TABLE_HALF, hw),
        (0.0, -c, TABLE_HALF, hw),
        (c, 0.0, hw, TABLE_HALF),
        (-c, 0.0, hw, TABLE_HALF),
    ] {
        world.insert(
            RigidBodyBuilder::fixed().translation(Vector::new(x, y)),
            ColliderBuilder::cuboid(hx, hy)
                .friction(0.3)
                .restitution(0.0),
        );
    }
    let mut blocks = [RigidBodyHandle::invalid(); 2];
    for (i, (pos, angle)) in layout.blocks.iter().enumerate() {
        let (h, _) = world.insert(
            RigidBodyBuilder::dynamic()
                .translation(Vector::new(pos[0], pos[1]))
                .rotation(*angle)
                .linear_damping(BLOCK_DAMPING)
                .angular_damping(BLOCK_DAMPING)
                .can_sleep(false),
            ColliderBuilder::cuboid(BLOCK_HALF, BLOCK_HALF)
                .density(BLOCK_DENSITY)
                .friction(0.5)
                .restitution(0.0),
        );
        blocks[i] = h;
    }
    let (pusher, _) = world.insert(
        RigidBodyBuilder::kinematic_velocity_based()
            .translation(Vector::new(layout.pusher[0], layout.pusher[1]))
            .can_sleep(false),
        ColliderBuilder::ball(PUSHER_RADIUS)
            .friction(0.3)
            .restitution(0.0),
    );
    (world, pusher, blocks)
}

impl PushSim {
    /// A simulator with `cfg` (validated), already reset with seed 0.
    pub fn new(cfg: PushConfig) -> Result<Self> {
        cfg.validate()?;
        let layout = Layout::sample(0);
        let (world, pusher, blocks) = build_world(&cfg, &layout);
        let mut sim = Self {
            cfg,
            world,
            pusher,
            blocks,
            zones: layout.zones,
            info: EpisodeInfo {
                seed: 0,
                variant: layout.variant,
                instruction: layout.variant.instruction(),
            },
            target: layout.pusher,
            step: 0,
            in_zone_steps: 0,
            success: false,
        };
        sim.reset(0);
        Ok(sim)
    }

    /// The configuration.
    pub fn config(&self) -> &PushConfig {
        &self.cfg
    }

    /// Start a new episode laid out from `seed` (goal variant, block poses,
    /// zones, pusher start). The world is rebuilt from scratch, so the same
    /// seed and the same commands give the same trajectory bit for bit.
    pub fn reset(&mut self, seed: u64) -> EpisodeInfo {
        let layout = Layout::sample(seed);
        let (world, pusher, blocks) = build_world(&self.cfg, &layout);
        self.world = world;
        self.pusher = pusher;
        self.blocks = blocks;
        self.zones = layout.zones;
        self.info = EpisodeInfo {
            seed,
            variant: layout.variant,
            instruction: layout.variant.instruction(),
        };
        self.target = layout.pusher;
        self.step = 0;
        self.in_zone_steps = 0;
        self.success = false;
        self.info.clone()
    }

    /// The current episode.
    pub fn episode(&self) -> &EpisodeInfo {
        &self.info
    }

    /// Where commanded targets are clamped to (table frame, metres).
    pub fn workspace(&self) -> Workspace {
        Workspace::PUSHER
    }

    /// A safe action: the pusher's current position (it stops there).
    pub fn hold_action(&self) -> [f32; 2] {
        let s = self.robot_state();
        [s[0], s[1]]
    }

    /// Run one control period with pusher position target `target` (table
    /// frame, metres). The target is clamped to [`PushSim::workspace`]; a
    /// non-finite target holds the pusher where it is. The pusher's velocity
    /// is commanded each physics step as `gain * (target - position)`,
    /// limited in speed and acceleration. Stepping after [`PushSim::done`]
    /// goes on simulating (success stays latched).
    pub fn step(&mut self, target: [f32; 2]) {
        let target = if target.iter().all(|v| v.is_finite()) {
            Workspace::PUSHER.clamp(target)
        } else {
            self.hold_action()
        };
        self.target = target;
        let dt = self.world.integration_parameters.dt;
        let hard = TABLE_HALF - WALL_THICKNESS - PUSHER_RADIUS;
        for _ in 0..self.cfg.substeps() {
            if let Some(p) = self.world.bodies.get_mut(self.pusher) {
                let pos = p.translation();
                let vel = p.linvel();
                let e = Vector::new(target[0], target[1]) - pos;
                let mut want = e * self.cfg.pusher_gain;
                let speed = want.length();
                if speed > self.cfg.pusher_max_speed {
                    want *= self.cfg.pusher_max_speed / speed;
                }
                let mut dv = want - vel;
                let max_dv = self.cfg.pusher_max_accel * dt;
                let l = dv.length();
                if l > max_dv {
                    dv *= max_dv / l;
                }
                let mut v = vel + dv;
                // Never drive the pusher into a wall.
                let next = pos + v * dt;
                if next.x.abs() > hard {
                    v.x = 0.0;
                }
                if next.y.abs() > hard {
                    v.y = 0.0;
                }
                p.set_linvel(v, true);
            }
            self.world.step();
            for h in self.blocks {
                if let Some(b) = self.world.bodies.get_mut(h) {
                    apply_table_friction(b, dt);
                }
            }
        }
        self.step += 1;
        let s_block = self.block_pos(self.info.variant.block);
        let zone = self.zones[self.info.variant.zone.index()];
        if dist(s_block, zone) <= self.cfg.success_tolerance {
            self.in_zone_steps = self.in_zone_steps.saturating_add(1);
        } else {
            self.in_zone_steps = 0;
        }
        if self.in_zone_steps >= self.cfg.success_hold_steps {
            self.success = true;
        }
    }

    fn block_pos(&self, c: BlockColour) -> [f32; 2] {
        self.world
            .bodies
            .get(self.blocks[c.index()])
            .map(|b| {
                let t = b.translation();
                [t.x, t.y]
            })
            .unwrap_or([0.0, 0.0])
    }

    /// Everything about the simulation now.
    pub fn true_state(&self) -> TrueState {
        let (pusher_pos, pusher_vel) = self
            .world
            .bodies
            .get(self.pusher)
            .map(|p| {
                let (t, v) = (p.translation(), p.linvel());
                ([t.x, t.y], [v.x, v.y])
            })
            .unwrap_or(([0.0; 2], [0.0; 2]));
        let blocks = BlockColour::ALL
            .iter()
            .map(|&colour| {
                let b = self.world.bodies.get(self.blocks[colour.index()]);
                let (pos, angle, vel, ang_vel) = b
                    .map(|b| {
                        let (t, v) = (b.translation(), b.linvel());
                        ([t.x, t.y], b.rotation().angle(), [v.x, v.y], b.angvel())
                    })
                    .unwrap_or(([0.0; 2], 0.0, [0.0; 2], 0.0));
                BlockState {
                    colour,
                    pos,
                    angle,
                    vel,
                    ang_vel,
                }
            })
            .collect();
        let zones = ZoneColour::ALL
            .iter()
            .map(|&colour| ZoneState {
                colour,
                pos: self.zones[colour.index()],
            })
            .collect();
        TrueState {
            pusher_pos,
            pusher_vel,
            pusher_target: self.target,
            blocks,
            zones,
            variant: self.info.variant,
            time: self.step as f64 / self.cfg.control_hz,
            step: self.step,
            in_zone_steps: self.in_zone_steps,
            success: self.success,
        }
    }

    /// What the robot reports: pusher `[x, y, vx, vy]` (metres, m/s).
    pub fn robot_state(&self) -> [f32; 4] {
        self.world
            .bodies
            .get(self.pusher)
            .map(|p| {
                let (t, v) = (p.translation(), p.linvel());
                [t.x, t.y, v.x, v.y]
            })
            .unwrap_or([0.0; 4])
    }

    /// The camera image (`image_size` x `image_size` RGB8, top-down over the
    /// whole table).
    pub fn render(&self) -> Image {
        render::render(&self.true_state(), self.cfg.image_size)
    }

    /// The episode's text instruction.
    pub fn instruction(&self) -> &str {
        &self.info.instruction
    }

    /// The episode's goal.
    pub fn variant(&self) -> Variant {
        self.info.variant
    }

    /// Whether the named block has been held on the named zone for
    /// `success_hold_steps` control steps (latched until reset).
    pub fn success(&self) -> bool {
        self.success
    }

    /// Whether the episode timed out (`episode_seconds` elapsed).
    pub fn timed_out(&self) -> bool {
        self.step >= self.cfg.max_steps()
    }

    /// Success or timeout.
    pub fn done(&self) -> bool {
        self.success || self.timed_out()
    }
}

/// Coulomb friction with the table, applied after each physics step: the
/// block's speed (and spin) drop by the friction deceleration times `dt`,
/// never past zero, so a released block slides and stops.
fn apply_table_friction(b: &mut RigidBody, dt: f32) {
    let v = b.linvel();
    let speed = v.length();
    let dec = TABLE_FRICTION_DECEL * dt;
    let nv = if speed <= dec {
        Vector::ZERO
    } else {
        v * ((speed - dec) / speed)
    };
    b.set_linvel(nv, false);
    let w = b.angvel();
    let wdec = TABLE_FRICTION_ANG_DECEL * dt;
    let nw = if w.abs() <= wdec {
        0.0
    } else {
        w - wdec * w.signum()
    };
    b.set_angvel(nw, false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use crate::Expert;

    #[test]
    fn privileged_state_is_the_position_then_blocks_zones_and_velocity() {
        let mut sim = PushSim::new(PushConfig::default()).unwrap();
        sim.reset(5);
        sim.step([0.05, -0.02]);
        let (t, p) = (sim.true_state(), sim.true_state().privileged());
        assert_eq!(p.len(), crate::PRIVILEGED_DIM);
        let r = sim.robot_state();
        assert_eq!(p[..2], r[..2]);
        assert_eq!(p[2..4], t.blocks[0].pos);
        assert_eq!(p[4], t.blocks[0].angle.cos());
        assert_eq!(p[6..8], t.blocks[1].pos);
        assert_eq!(p[10..12], t.zones[0].pos);
        assert_eq!(p[12..14], t.zones[1].pos);
        assert_eq!(p[14..16], r[2..4]);
        let q = t.privileged_relative();
        let rel = |i: usize| [p[i] - p[0], p[i + 1] - p[1]];
        assert_eq!(q[..2], p[..2]);
        for i in [2, 6, 10, 12] {
            assert_eq!(q[i..i + 2], rel(i), "value {i}");
        }
        for i in [4, 8, 14] {
            assert_eq!(q[i..i + 2], p[i..i + 2], "value {i}");
        }
    }

    /// Run `steps` control steps from `seed`: the expert for a while, then
    /// random targets; return the bit patterns of every state.
    fn trajectory(sim: &mut PushSim, seed: u64, steps: usize) -> Vec<Vec<u32>> {
        sim.reset(seed);
        let mut expert = Expert::new(sim.config());
        let mut rng = SplitMix64::new(seed ^ 0xABCD);
        let mut out = Vec::new();
        let mut queue = Vec::new();
        for k in 0..steps {
            let target = if k < steps / 2 {
                if queue.is_empty() {
                    queue = expert.chunk(&sim.true_state(), 16);
                    queue.reverse();
                }
                queue.pop().unwrap()
            } else {
                [rng.range(-0.3, 0.3), rng.range(-0.3, 0.3)]
            };
            sim.step(target);
            let s = sim.true_state();
            let mut bits: Vec<u32> = s
                .pusher_pos
                .iter()
                .chain(&s.pusher_vel)
                .map(|v| v.to_bits())
                .collect();
            for b in &s.blocks {
                bits.extend(
                    [b.pos[0], b.pos[1], b.angle, b.vel[0], b.vel[1], b.ang_vel].map(f32::to_bits),
                );
            }
            out.push(bits);
        }
        out
    }

    #[test]
    fn same_seed_and_commands_give_the_same_trajectory_bit_for_bit() {
        let mut a = PushSim::new(PushConfig::default()).unwrap();
        let mut b = PushSim::new(PushConfig::default()).unwrap();
        let ta = trajectory(&mut a, 11, 300);
        // b runs another episode first: nothing may leak across resets.
        let other = trajectory(&mut b, 12, 50);
        let tb = trajectory(&mut b, 11, 300);
        assert_eq!(ta, tb);
        assert_ne!(ta[..50], other[..]);
        // The blocks moved (the trajectory exercises contacts).
        let first = &ta[0][4..6];
        assert!(ta
            .iter()
            .any(|s| &s[4..6] != first || s[10..12] != ta[0][10..12]));
    }

    #[test]
    fn reset_reports_a_seeded_variant_and_instruction() {
        let mut sim = PushSim::new(PushConfig::default()).unwrap();
        let mut seen = std::collections::HashSet::new();
        for seed in 0..40 {
            let info = sim.reset(seed);
            assert_eq!(info.seed, seed);
            assert_eq!(info.instruction, info.variant.instruction());
            assert_eq!(sim.instruction(), info.instruction);
            assert_eq!(sim.true_state().variant, info.variant);
            assert_eq!(sim.true_state().step, 0);
            seen.insert(info.variant);
        }
        assert_eq!(seen.len(), 4);
        assert_eq!(sim.reset(7), sim.reset(7));
    }

    #[test]
    fn pusher_tracks_target_within_limits_and_clamps() {
        let cfg = PushConfig::default();
        let mut sim = PushSim::new(cfg.clone()).unwrap();
        sim.reset(1);
        let mut max_speed = 0.0f32;
        for _ in 0..100 {
            sim.step([10.0, -10.0]); // far outside: clamped to the corner
            let r = sim.robot_state();
            max_speed = max_speed.max((r[2] * r[2] + r[3] * r[3]).sqrt());
        }
        let w = sim.workspace();
        let r = sim.robot_state();
        assert!(
            (r[0] - w.max[0]).abs() < 2e-3 && (r[1] - w.min[1]).abs() < 2e-3,
            "{r:?}"
        );
        assert!(max_speed <= cfg.pusher_max_speed * 1.0001, "{max_speed}");
        assert!(max_speed > 0.9 * cfg.pusher_max_speed);
        assert_eq!(sim.true_state().pusher_target, [w.max[0], w.min[1]]);
        // A NaN target holds: the pusher stops where it is.
        let before = sim.hold_action();
        for _ in 0..20 {
            sim.step([f32::NAN, 0.0]);
        }
        assert!(dist(before, sim.hold_action()) < 1e-3);
    }

    #[test]
    fn a_pushed_block_slides_and_stops() {
        let mut sim = PushSim::new(PushConfig::default()).unwrap();
        sim.reset(2);
        let s = sim.true_state();
        let b = s.blocks[0].pos;
        // Drive the pusher through the block's centre from the side.
        let from = [b[0] - 0.08, b[1]];
        for _ in 0..60 {
            sim.step(from);
        }
        for _ in 0..15 {
            sim.step([b[0] + 0.05, b[1]]);
        }
        let moved = sim.true_state().blocks[0].pos;
        assert!(dist(moved, b) > 0.01, "block moved {:?} -> {:?}", b, moved);
        // Pull back and let it come to rest.
        for _ in 0..50 {
            sim.step(from);
        }
        let s = sim.true_state();
        assert_eq!(s.blocks[0].vel, [0.0, 0.0]);
        assert_eq!(s.blocks[0].ang_vel, 0.0);
    }

    #[test]
    fn episodes_time_out() {
        let cfg = PushConfig {
            episode_seconds: 0.5,
            ..PushConfig::default()
        };
        let mut sim = PushSim::new(cfg).unwrap();
        sim.reset(3);
        let hold = sim.hold_action();
        for k in 0..25 {
            assert!(!sim.done(), "done early at step {k}");
            sim.step(hold);
        }
        assert!(sim.done() && sim.timed_out() && !sim.success());
        assert!((sim.true_state().time - 0.5).abs() < 1e-12);
    }

    #[test]
    fn random_commands_keep_everything_finite_and_on_the_table() {
        let mut sim = PushSim::new(PushConfig::default()).unwrap();
        let inner = TABLE_HALF - WALL_THICKNESS;
        for seed in 0..4 {
            sim.reset(seed);
            let mut rng = SplitMix64::new(seed);
            let mut target = [0.0, 0.0];
            for k in 0..1500 {
                if k % 10 == 0 {
                    // Often at a wall, to squeeze blocks against it.
                    target = [rng.range(-0.4, 0.4), rng.range(-0.4, 0.4)];
                }
                sim.step(target);
            }
            let s = sim.true_state();
            assert!(
                Workspace::PUSHER.contains(s.pusher_pos)
                    || dist(Workspace::PUSHER.clamp(s.pusher_pos), s.pusher_pos) < 0.01
            );
            for b in &s.blocks {
                assert!(b.pos.iter().chain(&b.vel).all(|v| v.is_finite()), "{b:?}");
                assert!(
                    b.pos[0].abs() < inner && b.pos[1].abs() < inner,
                    "seed {seed}: {b:?} left the table"
                );
            }
        }
    }

    #[test]
    fn bad_config_is_an_error_not_a_panic() {
        let e = PushSim::new(PushConfig {
            physics_hz: 120.0,
            control_hz: 50.0,
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("physics_hz"), "{e}");
    }
}
