//! A scripted expert that reads the true state and plans the next chunk of
//! pusher position targets: approach the named block from behind (relative
//! to its target), orbiting around it and around the other block, then push
//! it along the line to the target, re-approaching when the block turns off
//! the line; detour the block around the other block when that one is in
//! the way.

use crate::sim::PushSim;
use crate::task::{
    dist, EpisodeInfo, PushConfig, TrueState, Workspace, BLOCK_HALF, PUSHER_RADIUS, TABLE_HALF,
    WALL_THICKNESS,
};

/// Free-motion speed along the planned path, m/s.
pub(crate) const MOVE_SPEED: f32 = 0.25;
/// Pushing speed limits, m/s, and the gain from remaining distance to speed.
pub(crate) const PUSH_SPEED_MAX: f32 = 0.12;
pub(crate) const PUSH_SPEED_MIN: f32 = 0.02;
pub(crate) const PUSH_GAIN: f32 = 1.5;
/// A block's circumradius.
pub(crate) const BLOCK_RADIUS: f32 = BLOCK_HALF * std::f32::consts::SQRT_2;
/// The pusher keeps this far from a block's centre while moving around it.
pub(crate) const CLEAR: f32 = BLOCK_RADIUS + PUSHER_RADIUS + 0.015;
/// The named block keeps this far from the other block's centre.
pub(crate) const BLOCK_CLEAR: f32 = 2.0 * BLOCK_RADIUS + 0.01;
/// Start pushing when the pusher is within this angle of "behind", keep
/// pushing while within the larger one (radians).
const ALIGN_ENTER: f32 = 20.0 * std::f32::consts::PI / 180.0;
const ALIGN_KEEP: f32 = 35.0 * std::f32::consts::PI / 180.0;
/// Stop pushing when the named block is this close to its target, metres.
pub(crate) const DONE_DIST: f32 = 0.006;
/// A detour point for the block counts as reached within this distance.
const VIA_REACHED: f32 = 0.03;

pub(crate) type V2 = [f32; 2];

pub(crate) fn add(a: V2, b: V2) -> V2 {
    [a[0] + b[0], a[1] + b[1]]
}
pub(crate) fn sub(a: V2, b: V2) -> V2 {
    [a[0] - b[0], a[1] - b[1]]
}
pub(crate) fn scale(a: V2, k: f32) -> V2 {
    [a[0] * k, a[1] * k]
}
pub(crate) fn dot(a: V2, b: V2) -> f32 {
    a[0] * b[0] + a[1] * b[1]
}
pub(crate) fn norm(a: V2) -> f32 {
    dot(a, a).sqrt()
}
/// Unit vector along `a`, or `fallback` when `a` is (nearly) zero.
pub(crate) fn unit_or(a: V2, fallback: V2) -> V2 {
    let n = norm(a);
    if n > 1e-6 {
        scale(a, 1.0 / n)
    } else {
        fallback
    }
}
pub(crate) fn perp(a: V2) -> V2 {
    [-a[1], a[0]]
}
fn polar(c: V2, r: f32, theta: f32) -> V2 {
    [c[0] + r * theta.cos(), c[1] + r * theta.sin()]
}
/// Angle wrapped to `(-pi, pi]`.
pub(crate) fn wrap(a: f32) -> f32 {
    let tau = std::f32::consts::TAU;
    let mut x = a % tau;
    if x > std::f32::consts::PI {
        x -= tau;
    } else if x <= -std::f32::consts::PI {
        x += tau;
    }
    x
}
/// The point of segment `a`-`b` closest to `c`, and its parameter in [0, 1].
fn closest_on_segment(a: V2, b: V2, c: V2) -> (V2, f32) {
    let ab = sub(b, a);
    let l2 = dot(ab, ab);
    let t = if l2 > 1e-12 {
        (dot(sub(c, a), ab) / l2).clamp(0.0, 1.0)
    } else {
        0.0
    };
    (add(a, scale(ab, t)), t)
}

/// A point beside the block at `other` to push the named block at `b`
/// through on its way to `g`, when `other` lies on that way; `None` when
/// the way is clear.
pub(crate) fn detour_point(b: V2, g: V2, other: V2) -> Option<V2> {
    let (c, t) = closest_on_segment(b, g, other);
    if dist(c, other) >= BLOCK_CLEAR || t <= 0.0 || t >= 1.0 {
        return None;
    }
    let dir = unit_or(sub(g, b), [1.0, 0.0]);
    let n0 = unit_or(sub(c, other), perp(dir));
    let lim = TABLE_HALF - WALL_THICKNESS - CLEAR - 0.02;
    let inside = |q: V2| q[0].abs() <= lim && q[1].abs() <= lim;
    let r = BLOCK_CLEAR + 0.02;
    let first = add(other, scale(n0, r));
    let second = add(other, scale(n0, -r));
    Some(if inside(first) || !inside(second) {
        first
    } else {
        second
    })
}

/// `n` targets moving slowly away from the block at `b` (to let it rest in
/// the zone).
pub(crate) fn back_off(workspace: Workspace, p: V2, b: V2, n: usize) -> Vec<V2> {
    let away = unit_or(sub(p, b), [0.0, 1.0]);
    (1..=n)
        .map(|k| workspace.clamp(add(p, scale(away, (0.002 * k as f32).min(0.02)))))
        .collect()
}

/// How the expert plans a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertKind {
    /// Discrete waypoint plans (which way round, when to push, a detour
    /// point kept once chosen), with memory between chunks: the default,
    /// the one the shipped policy learned from.
    #[default]
    Waypoints,
    /// A memoryless velocity field around the named block, continuous in
    /// the state (see `expert_field.rs`), written so that a learned policy
    /// has a smooth function to imitate. It solves fewer episodes (187 of
    /// seeds 1000..1199 against 196) and, so far, heads trained on it do
    /// no better.
    Field,
}

/// The scripted expert. The waypoint planner keeps a little state between
/// chunks (whether it is pushing, and the block's current detour point);
/// call [`Expert::reset`] at every episode reset.
#[derive(Debug, Clone)]
pub struct Expert {
    kind: ExpertKind,
    dt: f32,
    workspace: Workspace,
    pushing: bool,
    via: Option<V2>,
}

impl Expert {
    /// An expert for simulations run with `cfg` (it needs the control period).
    pub fn new(cfg: &PushConfig) -> Self {
        Self::with_kind(cfg, ExpertKind::default())
    }

    /// An expert planning with `kind`.
    pub fn with_kind(cfg: &PushConfig, kind: ExpertKind) -> Self {
        Self {
            kind,
            dt: cfg.control_dt(),
            workspace: Workspace::PUSHER,
            pushing: false,
            via: None,
        }
    }

    /// Forget the previous episode.
    pub fn reset(&mut self) {
        self.pushing = false;
        self.via = None;
    }

    /// The chunk this expert plans from `s` alone, as if just reset: its
    /// label for the state. The waypoint planner remembers whether it is
    /// pushing and which detour point it is heading for, so the chunk it
    /// plans mid-episode depends on where it has been: the 16th target of
    /// 4 % of the steps of its DART and DAgger episodes lies over 5 cm from
    /// this one. A policy sees only the present, so labels come from here:
    /// they are a function of the state. Replanned this way every chunk,
    /// the expert still solves the task (see the tests).
    pub fn label(&self, s: &TrueState, horizon: usize) -> Vec<[f32; 2]> {
        let mut fresh = self.clone();
        fresh.reset();
        fresh.chunk(s, horizon)
    }

    /// Run one whole episode on `sim` from `seed`: plan `horizon` targets
    /// from the true state, execute the first `execute` of them, plan again,
    /// until the episode is done. `each` sees the simulator and the target
    /// before every control step (to record it); its error stops the
    /// episode. Returns the episode's info; `sim.success()` tells the result.
    pub fn run_episode<E>(
        &mut self,
        sim: &mut PushSim,
        seed: u64,
        horizon: usize,
        execute: usize,
        mut each: impl FnMut(&PushSim, [f32; 2]) -> std::result::Result<(), E>,
    ) -> std::result::Result<EpisodeInfo, E> {
        let info = sim.reset(seed);
        self.reset();
        let execute = execute.clamp(1, horizon.max(1));
        while !sim.done() {
            for target in self
                .chunk(&sim.true_state(), horizon)
                .into_iter()
                .take(execute)
            {
                each(sim, target)?;
                sim.step(target);
                if sim.done() {
                    break;
                }
            }
        }
        Ok(info)
    }

    /// The next `horizon` pusher position targets (table frame, metres, one
    /// per control period, all inside [`Workspace::PUSHER`]), planned from
    /// `s` alone, to be executed open-loop.
    pub fn chunk(&mut self, s: &TrueState, horizon: usize) -> Vec<[f32; 2]> {
        if self.kind == ExpertKind::Field {
            return crate::expert_field::chunk(s, self.dt, self.workspace, horizon);
        }
        let p = s.pusher_pos;
        let b = s.goal_block().pos;
        let g = s.goal_zone().pos;
        let other = s.blocks[1 - s.variant.block.index()].pos;
        if s.success || dist(b, g) < DONE_DIST {
            self.pushing = false;
            return back_off(self.workspace, p, b, horizon);
        }
        let aim = self.block_aim(b, g, other);
        let u = unit_or(sub(aim, b), [1.0, 0.0]);
        let d = dist(aim, b);
        let w = sub(p, b);
        let rho = norm(w);
        let behind = scale(u, -1.0);
        let ang = dot(unit_or(w, behind), behind).clamp(-1.0, 1.0).acos();
        let limit = if self.pushing {
            ALIGN_KEEP
        } else {
            ALIGN_ENTER
        };
        if ang < limit && rho < CLEAR + 0.03 {
            self.pushing = true;
            // Remaining distance to the real goal (not a detour point) sets
            // the speed, so a detour is pushed through briskly.
            let v = (PUSH_GAIN * dist(b, g)).clamp(PUSH_SPEED_MIN, PUSH_SPEED_MAX);
            let block_angle = s.goal_block().angle;
            let slack = if self.via.is_some() { VIA_REACHED } else { 0.0 };
            return self.push(p, b, u, d + slack, block_angle, v, horizon);
        }
        self.pushing = false;
        let path = self.approach_path(p, b, u, other);
        self.sample(p, &path, MOVE_SPEED, horizon)
    }

    /// Where to push the named block now: its target, or a detour point
    /// beside the other block when that one lies on the way.
    fn block_aim(&mut self, b: V2, g: V2, other: V2) -> V2 {
        let detour = detour_point(b, g, other);
        if let Some(v) = self.via {
            if dist(b, v) < VIA_REACHED || detour.is_none() {
                self.via = None;
            }
        }
        if self.via.is_none() {
            self.via = detour;
        }
        self.via.unwrap_or(g)
    }

    /// Targets that push the block at `b` by `d` along `u`.
    #[allow(clippy::too_many_arguments)]
    fn push(&self, p: V2, b: V2, u: V2, d: f32, block_angle: f32, v: f32, n: usize) -> Vec<V2> {
        // Distance from the block's centre to the pusher's centre at contact
        // when pushing through the centre along u.
        let phi = wrap(block_angle - u[1].atan2(u[0]));
        let c = phi.cos().abs().max(phi.sin().abs());
        let contact = ((BLOCK_HALF + PUSHER_RADIUS) / c).min(BLOCK_RADIUS + PUSHER_RADIUS);
        let along = dot(sub(b, p), u);
        let gap = (along - contact).max(0.0);
        (1..=n)
            .map(|k| {
                let adv = (v * self.dt * k as f32).min(gap + d);
                self.workspace.clamp(add(b, scale(u, adv - along)))
            })
            .collect()
    }

    /// Waypoints from `p` to the pre-push point behind `b` (relative to
    /// `u`), going around the block and clear of the other block.
    fn approach_path(&self, p: V2, b: V2, u: V2, other: V2) -> Vec<V2> {
        let theta_d = (-u[1]).atan2(-u[0]);
        let pre = polar(b, CLEAR, theta_d);
        let (c, _) = closest_on_segment(p, pre, b);
        let mut path = if dist(c, b) >= CLEAR * 0.97 {
            vec![pre]
        } else {
            // Around the block: both ways, keep the cheaper.
            let a = self.arc_path(p, b, theta_d, 1.0, other);
            let z = self.arc_path(p, b, theta_d, -1.0, other);
            if self.cost(p, &a, other) <= self.cost(p, &z, other) {
                a
            } else {
                z
            }
        };
        // Around the other block on the way to the first waypoint.
        let r_other = CLEAR;
        if dist(p, other) < r_other {
            let out = add(
                other,
                scale(unit_or(sub(p, other), perp(u)), r_other + 0.01),
            );
            path.insert(0, out);
        } else if let Some(first) = path.first().copied() {
            let (c, t) = closest_on_segment(p, first, other);
            if dist(c, other) < r_other && t > 0.0 && t < 1.0 {
                let dir = unit_or(sub(first, p), u);
                let n = unit_or(sub(c, other), perp(dir));
                path.insert(0, add(other, scale(n, r_other + 0.015)));
            }
        }
        path
    }

    /// Around `b` at radius CLEAR in direction `sign` (+1 counter-clockwise)
    /// from the pusher's side to angle `theta_d`.
    fn arc_path(&self, p: V2, b: V2, theta_d: f32, sign: f32, _other: V2) -> Vec<V2> {
        let w = sub(p, b);
        let rho = norm(w);
        let theta_p = w[1].atan2(w[0]);
        let mut path = Vec::new();
        let theta_s = if rho <= CLEAR {
            path.push(polar(b, CLEAR, theta_p));
            theta_p
        } else {
            theta_p + sign * (CLEAR / rho).clamp(-1.0, 1.0).acos()
        };
        // Arc length in direction `sign`, in [0, 2 pi).
        let mut sweep = wrap(theta_d - theta_s) * sign;
        if sweep < 0.0 {
            sweep += std::f32::consts::TAU;
        }
        let steps = (sweep / (12f32).to_radians()).ceil().max(1.0) as usize;
        for i in 0..=steps {
            let th = theta_s + sign * sweep * i as f32 / steps as f32;
            path.push(polar(b, CLEAR, th));
        }
        path
    }

    /// Path length plus penalties for passing the other block or leaving
    /// the workspace.
    fn cost(&self, p: V2, path: &[V2], other: V2) -> f32 {
        let mut len = 0.0;
        let mut prev = p;
        let mut penalty = 0.0;
        for q in path {
            len += dist(prev, *q);
            prev = *q;
            if dist(*q, other) < CLEAR {
                penalty += 1.0;
            }
            if !self.workspace.contains(*q) {
                penalty += 1.0;
            }
        }
        len + penalty
    }

    /// Sample `path` (from `p`) every `speed * dt` metres; hold at the end.
    fn sample(&self, p: V2, path: &[V2], speed: f32, n: usize) -> Vec<V2> {
        let step = speed * self.dt;
        let mut out = Vec::with_capacity(n);
        let mut seg = 0;
        let mut from = p;
        let mut left = step;
        while out.len() < n {
            let Some(&to) = path.get(seg) else {
                out.push(self.workspace.clamp(from));
                continue;
            };
            let l = dist(from, to);
            if l >= left {
                from = add(from, scale(sub(to, from), left / l));
                out.push(self.workspace.clamp(from));
                left = step;
            } else {
                left -= l;
                from = to;
                seg += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PushSim;

    /// Run one episode planning `h` targets and executing the first
    /// `execute` of each chunk open-loop. Returns (success, steps).
    pub(crate) fn run_episode(
        sim: &mut PushSim,
        expert: &mut Expert,
        seed: u64,
        h: usize,
        execute: usize,
    ) -> (bool, u64) {
        sim.reset(seed);
        expert.reset();
        while !sim.done() {
            for t in expert.chunk(&sim.true_state(), h).into_iter().take(execute) {
                sim.step(t);
                if sim.done() {
                    break;
                }
            }
        }
        (sim.success(), sim.true_state().step)
    }

    /// Seeds 0..20 that `kind` fails, planning 16 and executing `execute`.
    fn failures(kind: ExpertKind, execute: usize) -> Vec<(u64, u64)> {
        let cfg = PushConfig::default();
        let mut sim = PushSim::new(cfg.clone()).unwrap();
        let mut expert = Expert::with_kind(&cfg, kind);
        (0..20)
            .filter_map(|seed| {
                let (ok, steps) = run_episode(&mut sim, &mut expert, seed, 16, execute);
                (!ok).then_some((seed, steps))
            })
            .collect()
    }

    #[test]
    fn field_expert_solves_at_least_80_percent_of_20_episodes() {
        // As `edgeflow sim record` runs it: plan 16, execute 8. It is the
        // weaker planner (16 of these 20; 187 of seeds 1000..1199, the
        // waypoint planner 196): it stalls where the other block covers
        // the point behind the named one, or a wall does.
        let failed = failures(ExpertKind::Field, 8);
        assert!(failed.len() <= 4, "failed (seed, steps): {failed:?}");
    }

    #[test]
    fn waypoint_expert_solves_at_least_95_percent_of_20_episodes_open_loop() {
        let failed = failures(ExpertKind::Waypoints, 16);
        assert!(failed.len() <= 1, "failed (seed, steps): {failed:?}");
    }

    #[test]
    fn labels_depend_on_the_state_alone_and_replanned_from_them_the_expert_solves() {
        let cfg = PushConfig::default();
        let mut sim = PushSim::new(cfg.clone()).unwrap();
        let (mut solved, mut remembered) = (0, 0);
        for seed in 0..20 {
            sim.reset(seed);
            let mut expert = Expert::new(&cfg);
            while !sim.done() {
                let s = sim.true_state();
                // The expert's label equals a new expert's plan, whatever
                // it did before; its own chunk may not.
                let label = expert.label(&s, 16);
                assert_eq!(label, Expert::new(&cfg).chunk(&s, 16), "seed {seed}");
                let mut carried = expert.clone();
                remembered += usize::from(carried.chunk(&s, 16) != label);
                // Drive by the labels: the expert with no memory.
                expert.chunk(&s, 16);
                for t in label.into_iter().take(8) {
                    sim.step(t);
                    if sim.done() {
                        break;
                    }
                }
            }
            solved += usize::from(sim.success());
        }
        // 100 of held-out seeds 100000..100099 (the planner with its
        // memory: 98).
        assert!(solved >= 19, "the labels solved {solved} of 20");
        assert!(
            remembered > 0,
            "memory never changed a plan: nothing tested"
        );
    }

    #[test]
    fn chunks_have_the_horizon_and_stay_in_the_workspace() {
        let cfg = PushConfig::default();
        let mut sim = PushSim::new(cfg.clone()).unwrap();
        let mut expert = Expert::new(&cfg);
        sim.reset(9);
        for h in [1, 8, 16, 50] {
            let c = expert.chunk(&sim.true_state(), h);
            assert_eq!(c.len(), h);
            assert!(c.iter().all(|p| Workspace::PUSHER.contains(*p)));
        }
        assert!(expert.chunk(&sim.true_state(), 0).is_empty());
    }

    #[test]
    fn approach_goes_around_the_block_not_through_it() {
        // Pusher in front of the block (on the target side): the path to
        // the pre-push point must keep clear of the block.
        let e = Expert::new(&PushConfig::default());
        let b = [0.0, 0.0];
        let u = [1.0, 0.0];
        let p = [0.1, 0.0];
        let path = e.approach_path(p, b, u, [0.2, 0.2]);
        let pts = e.sample(p, &path, MOVE_SPEED, 200);
        assert!(pts
            .iter()
            .all(|q| dist(*q, b) > BLOCK_RADIUS + PUSHER_RADIUS));
        let end = *pts.last().unwrap();
        assert!(dist(end, [-CLEAR, 0.0]) < 1e-3, "{end:?}");
    }
}
