//! The task's fixed geometry, its configuration, its goal variants, the
//! state types and the seeded layout of an episode. No physics here.

use crate::error::{Result, SimError};
use crate::rng::SplitMix64;

/// Half the side of the square table, metres: the table (walls included)
/// spans `[-TABLE_HALF, TABLE_HALF]` in x and y, and the camera sees exactly
/// that square. Table frame: origin at the centre, x right, y up (in the
/// image: y up is towards the top row).
pub const TABLE_HALF: f32 = 0.30;
/// Thickness of the walls that fence the table, metres (inside `TABLE_HALF`).
pub const WALL_THICKNESS: f32 = 0.02;
/// Half the side of a (square) block, metres.
pub const BLOCK_HALF: f32 = 0.03;
/// Radius of the circular pusher, metres.
pub const PUSHER_RADIUS: f32 = 0.015;
/// Half the side of a (square, axis-aligned) target zone, metres: a block
/// plus 1 cm all round, drawn pale with a full-colour outline so it cannot
/// be mistaken for a block.
pub const ZONE_HALF: f32 = BLOCK_HALF + 0.01;

/// Where the blocks and target zones are placed at reset: `[-LAYOUT_HALF,
/// LAYOUT_HALF]` in x and y, far enough from the walls that the pusher fits
/// behind any block.
const LAYOUT_HALF: f32 = 0.17;
/// Where the pusher starts.
const PUSHER_START_HALF: f32 = 0.24;

/// The simulator's settings. `Default` gives a 96 x 96 camera, 50 Hz control,
/// 500 Hz physics and 20 s episodes.
#[derive(Debug, Clone, PartialEq)]
pub struct PushConfig {
    /// Side of the square camera image, pixels (8..=1024).
    pub image_size: u32,
    /// Control rate, Hz: one [`crate::PushSim::step`] is one control period.
    pub control_hz: f64,
    /// Physics rate, Hz: an integer multiple of `control_hz`.
    pub physics_hz: f64,
    /// An episode times out after this many seconds.
    pub episode_seconds: f64,
    /// Success: the named block's centre within this distance of the named
    /// zone's centre, metres.
    pub success_tolerance: f32,
    /// ... for this many consecutive control steps.
    pub success_hold_steps: u32,
    /// The pusher's speed limit, m/s.
    pub pusher_max_speed: f32,
    /// The pusher's acceleration limit, m/s^2.
    pub pusher_max_accel: f32,
    /// Proportional gain of the pusher's position controller, 1/s: the
    /// commanded velocity is `gain * (target - position)`, then limited.
    pub pusher_gain: f32,
}

impl Default for PushConfig {
    fn default() -> Self {
        Self {
            image_size: 96,
            control_hz: 50.0,
            physics_hz: 500.0,
            episode_seconds: 20.0,
            success_tolerance: 0.02,
            success_hold_steps: 10,
            pusher_max_speed: 0.5,
            pusher_max_accel: 5.0,
            pusher_gain: 20.0,
        }
    }
}

impl PushConfig {
    /// Check every field; the error names the field, its value and the
    /// accepted range.
    pub fn validate(&self) -> Result<()> {
        fn bad(field: &'static str, value: impl ToString, why: &str) -> SimError {
            SimError::Config {
                field,
                value: value.to_string(),
                why: why.to_string(),
            }
        }
        if !(8..=1024).contains(&self.image_size) {
            return Err(bad(
                "image_size",
                self.image_size,
                "must be 8..=1024 pixels",
            ));
        }
        if !(self.control_hz.is_finite() && (1.0..=1000.0).contains(&self.control_hz)) {
            return Err(bad("control_hz", self.control_hz, "must be 1..=1000 Hz"));
        }
        if !(self.physics_hz.is_finite() && (self.control_hz..=20_000.0).contains(&self.physics_hz))
        {
            return Err(bad(
                "physics_hz",
                self.physics_hz,
                "must be finite, >= control_hz and <= 20000 Hz",
            ));
        }
        let ratio = self.physics_hz / self.control_hz;
        if (ratio - ratio.round()).abs() > 1e-9 * ratio {
            return Err(bad(
                "physics_hz",
                self.physics_hz,
                "must be an integer multiple of control_hz (e.g. 500 for 50 Hz control)",
            ));
        }
        if !(self.episode_seconds.is_finite() && self.episode_seconds > 0.0)
            || self.episode_seconds * self.control_hz > 1e9
        {
            return Err(bad(
                "episode_seconds",
                self.episode_seconds,
                "must be > 0 and under 1e9 control steps",
            ));
        }
        if !(self.success_tolerance.is_finite()
            && self.success_tolerance > 0.0
            && self.success_tolerance < TABLE_HALF)
        {
            return Err(bad(
                "success_tolerance",
                self.success_tolerance,
                "must be in (0, 0.3) metres",
            ));
        }
        if self.success_hold_steps == 0 {
            return Err(bad("success_hold_steps", 0, "must be at least 1"));
        }
        for (field, v) in [
            ("pusher_max_speed", self.pusher_max_speed),
            ("pusher_max_accel", self.pusher_max_accel),
            ("pusher_gain", self.pusher_gain),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 1000.0) {
                return Err(bad(field, v, "must be in (0, 1000]"));
            }
        }
        Ok(())
    }

    /// Physics steps per control step.
    pub fn substeps(&self) -> u32 {
        (self.physics_hz / self.control_hz).round() as u32
    }

    /// Control steps after which an episode times out.
    pub fn max_steps(&self) -> u64 {
        (self.episode_seconds * self.control_hz).round().max(1.0) as u64
    }

    /// One control period, seconds.
    pub fn control_dt(&self) -> f32 {
        (1.0 / self.control_hz) as f32
    }
}

/// The axis-aligned box the pusher's commanded position is clamped to,
/// table frame, metres: the play area inside the walls, less the pusher's
/// radius and a small margin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workspace {
    /// Lower corner `[x, y]`.
    pub min: [f32; 2],
    /// Upper corner `[x, y]`.
    pub max: [f32; 2],
}

impl Workspace {
    /// The pusher's workspace.
    pub const PUSHER: Workspace = {
        let h = TABLE_HALF - WALL_THICKNESS - PUSHER_RADIUS - 0.005;
        Workspace {
            min: [-h, -h],
            max: [h, h],
        }
    };

    /// `p` moved into the box; a non-finite coordinate becomes the box's
    /// centre on that axis.
    pub fn clamp(&self, p: [f32; 2]) -> [f32; 2] {
        let mut out = [0.0; 2];
        for i in 0..2 {
            out[i] = if p[i].is_finite() {
                p[i].clamp(self.min[i], self.max[i])
            } else {
                0.5 * (self.min[i] + self.max[i])
            };
        }
        out
    }

    /// Whether `p` lies inside the box (edges included).
    pub fn contains(&self, p: [f32; 2]) -> bool {
        (0..2).all(|i| p[i] >= self.min[i] && p[i] <= self.max[i])
    }
}

/// A block's colour (and identity: there is one block of each colour).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockColour {
    /// The red block (index 0 in [`TrueState::blocks`]).
    Red,
    /// The blue block (index 1).
    Blue,
}

/// A target zone's colour (one zone of each colour).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZoneColour {
    /// The green zone (index 0 in [`TrueState::zones`]).
    Green,
    /// The yellow zone (index 1).
    Yellow,
}

impl BlockColour {
    /// Every block, in [`TrueState::blocks`] order.
    pub const ALL: [BlockColour; 2] = [BlockColour::Red, BlockColour::Blue];
    /// Lower-case name as used in instructions.
    pub fn name(self) -> &'static str {
        match self {
            BlockColour::Red => "red",
            BlockColour::Blue => "blue",
        }
    }
    /// Index in [`TrueState::blocks`].
    pub fn index(self) -> usize {
        self as usize
    }
    /// The colour it is drawn in, RGB8.
    pub fn rgb(self) -> [u8; 3] {
        match self {
            BlockColour::Red => [220, 40, 40],
            BlockColour::Blue => [40, 80, 220],
        }
    }
}

impl ZoneColour {
    /// Every zone, in [`TrueState::zones`] order.
    pub const ALL: [ZoneColour; 2] = [ZoneColour::Green, ZoneColour::Yellow];
    /// Lower-case name as used in instructions.
    pub fn name(self) -> &'static str {
        match self {
            ZoneColour::Green => "green",
            ZoneColour::Yellow => "yellow",
        }
    }
    /// Index in [`TrueState::zones`].
    pub fn index(self) -> usize {
        self as usize
    }
    /// The colour of its outline, RGB8.
    pub fn rgb(self) -> [u8; 3] {
        match self {
            ZoneColour::Green => [40, 170, 70],
            ZoneColour::Yellow => [235, 195, 30],
        }
    }
    /// The colour of its (pale) inside, RGB8.
    pub fn fill_rgb(self) -> [u8; 3] {
        match self {
            ZoneColour::Green => [160, 220, 170],
            ZoneColour::Yellow => [245, 230, 160],
        }
    }
}

/// An episode's goal: which block goes onto which zone. Four variants, drawn
/// from the seed; the instruction names both, so a policy has to read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Variant {
    /// The block to push.
    pub block: BlockColour,
    /// The zone to push it onto.
    pub zone: ZoneColour,
}

impl Variant {
    /// Every variant, indexed by [`Variant::index`].
    pub const ALL: [Variant; 4] = [
        Variant {
            block: BlockColour::Red,
            zone: ZoneColour::Green,
        },
        Variant {
            block: BlockColour::Red,
            zone: ZoneColour::Yellow,
        },
        Variant {
            block: BlockColour::Blue,
            zone: ZoneColour::Green,
        },
        Variant {
            block: BlockColour::Blue,
            zone: ZoneColour::Yellow,
        },
    ];

    /// `0..4`, the position in [`Variant::ALL`].
    pub fn index(self) -> usize {
        self.block.index() * 2 + self.zone.index()
    }

    /// Short name, e.g. `"red-green"`.
    pub fn name(self) -> String {
        format!("{}-{}", self.block.name(), self.zone.name())
    }

    /// The text instruction, e.g. `"push the red block onto the green target"`.
    pub fn instruction(self) -> String {
        format!(
            "push the {} block onto the {} target",
            self.block.name(),
            self.zone.name()
        )
    }
}

/// What [`crate::PushSim::reset`] reports about the new episode.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeInfo {
    /// The seed the episode was laid out from.
    pub seed: u64,
    /// Its goal.
    pub variant: Variant,
    /// Its text instruction (names the goal).
    pub instruction: String,
}

/// One block's pose and velocity, table frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockState {
    /// Which block.
    pub colour: BlockColour,
    /// Centre `[x, y]`, metres.
    pub pos: [f32; 2],
    /// Orientation, radians (counter-clockwise from +x).
    pub angle: f32,
    /// Linear velocity, m/s.
    pub vel: [f32; 2],
    /// Angular velocity, rad/s.
    pub ang_vel: f32,
}

/// One target zone (static, axis-aligned square of side `2 * ZONE_HALF`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZoneState {
    /// Which zone.
    pub colour: ZoneColour,
    /// Centre `[x, y]`, metres.
    pub pos: [f32; 2],
}

/// Everything about the simulation at one instant (for experts, tests and
/// logging; a robot would only report [`crate::PushSim::robot_state`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TrueState {
    /// Pusher centre `[x, y]`, metres.
    pub pusher_pos: [f32; 2],
    /// Pusher velocity, m/s.
    pub pusher_vel: [f32; 2],
    /// The last commanded pusher target (clamped to the workspace).
    pub pusher_target: [f32; 2],
    /// Every block, indexed by [`BlockColour::index`].
    pub blocks: Vec<BlockState>,
    /// Every zone, indexed by [`ZoneColour::index`].
    pub zones: Vec<ZoneState>,
    /// The episode's goal.
    pub variant: Variant,
    /// Simulated time since reset, seconds (`step / control_hz`).
    pub time: f64,
    /// Control steps since reset.
    pub step: u64,
    /// Consecutive control steps the named block has been within tolerance.
    pub in_zone_steps: u32,
    /// Whether the episode has succeeded (latched).
    pub success: bool,
}

impl TrueState {
    /// The block the instruction names.
    pub fn goal_block(&self) -> &BlockState {
        &self.blocks[self.variant.block.index()]
    }
    /// The zone the instruction names.
    pub fn goal_zone(&self) -> &ZoneState {
        &self.zones[self.variant.zone.index()]
    }
    /// Distance from the named block's centre to the named zone's centre.
    pub fn goal_distance(&self) -> f32 {
        dist(self.goal_block().pos, self.goal_zone().pos)
    }

    /// The privileged observation, [`PRIVILEGED_DIM`] values: the pusher's
    /// position (x, y), each block (red, blue) as x, y, cos(angle),
    /// sin(angle), each zone (green, yellow) as x, y, and last the pusher's
    /// velocity (vx, vy), so a head that reads the first
    /// `PRIVILEGED_DIM - 2` values sees the scene without the velocity.
    /// What a policy would see with perfect perception: training one on it
    /// tells a perception fault from an imitation fault. A robot never
    /// reports it.
    pub fn privileged(&self) -> Vec<f32> {
        let mut s = Vec::with_capacity(PRIVILEGED_DIM);
        s.extend(self.pusher_pos);
        for b in &self.blocks {
            s.extend([b.pos[0], b.pos[1], b.angle.cos(), b.angle.sin()]);
        }
        for z in &self.zones {
            s.extend(z.pos);
        }
        s.extend(self.pusher_vel);
        s
    }

    /// [`Self::privileged`] with every block and zone position taken
    /// relative to the pusher (the pusher's own position stays absolute,
    /// for the walls): the geometry a head must otherwise work out from
    /// absolute coordinates.
    pub fn privileged_relative(&self) -> Vec<f32> {
        let mut s = self.privileged();
        let [px, py] = self.pusher_pos;
        for at in [2, 6, 10, 12] {
            s[at] -= px;
            s[at + 1] -= py;
        }
        s
    }
}

/// Length of [`TrueState::privileged`].
pub const PRIVILEGED_DIM: usize = 16;

/// Distance between two points.
pub(crate) fn dist(a: [f32; 2], b: [f32; 2]) -> f32 {
    ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2)).sqrt()
}

/// An episode's initial layout.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Layout {
    pub variant: Variant,
    pub blocks: [([f32; 2], f32); 2],
    pub zones: [[f32; 2]; 2],
    pub pusher: [f32; 2],
}

impl Layout {
    /// Sample a layout from `seed` by rejection: zones apart, blocks apart,
    /// no block on or next to a zone, the pusher clear of both blocks.
    pub(crate) fn sample(seed: u64) -> Layout {
        let mut rng = SplitMix64::new(seed);
        let variant = Variant::ALL[rng.below(4) as usize];
        let l = LAYOUT_HALF;
        for _ in 0..10_000 {
            let zones = [
                [rng.range(-l, l), rng.range(-l, l)],
                [rng.range(-l, l), rng.range(-l, l)],
            ];
            let b = [
                [rng.range(-l, l), rng.range(-l, l)],
                [rng.range(-l, l), rng.range(-l, l)],
            ];
            let angles = [
                rng.range(-std::f32::consts::PI, std::f32::consts::PI),
                rng.range(-std::f32::consts::PI, std::f32::consts::PI),
            ];
            let p = PUSHER_START_HALF;
            let pusher = [rng.range(-p, p), rng.range(-p, p)];
            let ok = dist(zones[0], zones[1]) >= 0.12
                && dist(b[0], b[1]) >= 0.14
                && b.iter()
                    .all(|bp| zones.iter().all(|z| dist(*bp, *z) >= 0.10))
                && dist(b[variant.block.index()], zones[variant.zone.index()]) >= 0.12
                && b.iter().all(|bp| dist(*bp, pusher) >= 0.10);
            if ok {
                return Layout {
                    variant,
                    blocks: [(b[0], angles[0]), (b[1], angles[1])],
                    zones,
                    pusher,
                };
            }
        }
        // Practically unreachable (the constraints leave most of the space
        // free); a fixed valid layout keeps reset total.
        Layout {
            variant,
            blocks: [([-0.1, 0.1], 0.0), ([0.1, -0.1], 0.0)],
            zones: [[0.12, 0.12], [-0.12, -0.12]],
            pusher: [0.0, -0.22],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        let c = PushConfig::default();
        c.validate().unwrap();
        assert_eq!(c.substeps(), 10);
        assert_eq!(c.max_steps(), 1000);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let cases: Vec<(PushConfig, &str)> = vec![
            (
                PushConfig {
                    image_size: 0,
                    ..Default::default()
                },
                "image_size",
            ),
            (
                PushConfig {
                    physics_hz: 333.0,
                    ..Default::default()
                },
                "physics_hz",
            ),
            (
                PushConfig {
                    physics_hz: 10.0,
                    ..Default::default()
                },
                "physics_hz",
            ),
            (
                PushConfig {
                    control_hz: f64::NAN,
                    ..Default::default()
                },
                "control_hz",
            ),
            (
                PushConfig {
                    episode_seconds: -1.0,
                    ..Default::default()
                },
                "episode_seconds",
            ),
            (
                PushConfig {
                    success_tolerance: 0.0,
                    ..Default::default()
                },
                "success_tolerance",
            ),
            (
                PushConfig {
                    success_hold_steps: 0,
                    ..Default::default()
                },
                "success_hold_steps",
            ),
            (
                PushConfig {
                    pusher_max_speed: f32::INFINITY,
                    ..Default::default()
                },
                "pusher_max_speed",
            ),
        ];
        for (c, field) in cases {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e} should name {field}");
        }
    }

    #[test]
    fn workspace_clamps_and_handles_nan() {
        let w = Workspace::PUSHER;
        assert_eq!(w.clamp([10.0, -10.0]), [w.max[0], w.min[1]]);
        assert_eq!(w.clamp([f32::NAN, 0.1]), [0.0, 0.1]);
        assert!(w.contains([0.0, 0.0]));
        assert!(!w.contains([0.29, 0.0]));
    }

    #[test]
    fn variants_and_instructions() {
        for (i, v) in Variant::ALL.iter().enumerate() {
            assert_eq!(v.index(), i);
        }
        assert_eq!(
            Variant::ALL[3].instruction(),
            "push the blue block onto the yellow target"
        );
    }

    #[test]
    fn layouts_are_seeded_and_respect_constraints() {
        assert_eq!(Layout::sample(5), Layout::sample(5));
        assert_ne!(Layout::sample(5), Layout::sample(6));
        let mut seen = [false; 4];
        for seed in 0..200 {
            let l = Layout::sample(seed);
            seen[l.variant.index()] = true;
            assert!(dist(l.blocks[0].0, l.blocks[1].0) >= 0.14);
            for (b, _) in l.blocks {
                assert!(b[0].abs() <= LAYOUT_HALF && b[1].abs() <= LAYOUT_HALF);
            }
        }
        assert!(seen.iter().all(|s| *s), "every variant is drawn");
    }
}
