//! [`edgeflow_runtime::Op::ResampledSnake`] in one pass per channel: BigVGAN's
//! anti-aliased SnakeBeta (upsample, activate, low-pass and decimate).
//!
//! Composed from ops, the activation pads, upsamples, activates, pads and
//! downsamples each channel through four tensors twice the input's size
//! or more, and the two resampling convolutions have one input channel,
//! the shape the direct convolution kernel is slowest at. Here a task
//! takes one channel row at a time through buffers that stay in cache:
//! the replicate-padded input, each upsampled phase (kept apart, never
//! interleaved), SnakeBeta on each phase ([`math::snake_row`]), then every
//! downsampler tap as one contiguous multiply-add over the phase it reads.
//! The phases carry the downsampler's replicate padding as margins, so no
//! loop has an edge case. Multiply-adds are plain loops the compiler
//! vectorizes for the widest unit this machine has; each output sums its
//! taps in the same order on every machine.

use super::math;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// The filters and padding of one call (shapes checked by [`Plan::new`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan<'a> {
    ratio: usize,
    /// Upsampler phase filters `[ratio][taps]` and their bias `[ratio]`.
    up: &'a [f32],
    up_bias: &'a [f32],
    taps: usize,
    up_pad: (usize, usize),
    /// Downsampler filter `[k]`.
    down: &'a [f32],
    down_pad: (usize, usize),
    /// Input length, upsampled samples per phase, output length.
    t: usize,
    per_phase: usize,
    t_out: usize,
}

impl<'a> Plan<'a> {
    /// The plan for rows of `t` samples, or why the shapes do not fit.
    pub(crate) fn new(
        rs: edgeflow_runtime::SnakeResampling,
        (up, up_bias, down): (&'a [f32], &'a [f32], &'a [f32]),
        t: usize,
    ) -> Result<Self, String> {
        let ratio = rs.ratio;
        if ratio == 0 || up.is_empty() || !up.len().is_multiple_of(ratio) {
            return Err(format!(
                "ratio {ratio} with {} upsampling filter values: need ratio >= 1 and \
                 a [ratio, 1, taps] filter",
                up.len()
            ));
        }
        if up_bias.len() != ratio {
            return Err(format!(
                "the upsampler bias has {} values for ratio {ratio}",
                up_bias.len()
            ));
        }
        let taps = up.len() / ratio;
        let padded = t + rs.up_pad.0 + rs.up_pad.1;
        if t == 0 || padded < taps {
            return Err(format!(
                "{t} samples padded by {:?} are shorter than the {taps}-tap upsampler",
                rs.up_pad
            ));
        }
        let per_phase = padded + 1 - taps;
        let down_len = per_phase * ratio + rs.down_pad.0 + rs.down_pad.1;
        if down.is_empty() || down_len < down.len() {
            return Err(format!(
                "{} upsampled samples padded by {:?} are shorter than the {}-tap downsampler",
                per_phase * ratio,
                rs.down_pad,
                down.len()
            ));
        }
        Ok(Plan {
            ratio,
            up,
            up_bias,
            taps,
            up_pad: rs.up_pad,
            down,
            down_pad: rs.down_pad,
            t,
            per_phase,
            t_out: (down_len - down.len()) / ratio + 1,
        })
    }

    /// Output samples per row.
    pub(crate) fn t_out(&self) -> usize {
        self.t_out
    }

    /// Margin of each activated phase on the left and right: the
    /// downsampler's replicate padding, in samples of one phase.
    fn margins(&self) -> (usize, usize) {
        (
            self.down_pad.0.div_ceil(self.ratio),
            self.down_pad.1.div_ceil(self.ratio) + 1,
        )
    }

    /// Where downsampler tap `j` reads: (phase, offset in the margined phase
    /// buffer of output 0).
    fn tap_source(&self, j: usize) -> (usize, usize) {
        let i = j as i64 - self.down_pad.0 as i64;
        let r = self.ratio as i64;
        let (q, m) = (i.rem_euclid(r) as usize, i.div_euclid(r));
        (q, (m + self.margins().0 as i64) as usize)
    }
}

/// Per-task buffers, reused row after row.
#[derive(Default)]
struct Scratch {
    padded: Vec<f32>,
    phase: Vec<f32>,
    act: Vec<Vec<f32>>,
}

/// `x` as `rows` rows of `plan.t` samples, row `i` of channel `i % c`
/// (`freq[c]`, `gain[c]`): `rows` rows of `plan.t_out()` samples.
pub(crate) fn resampled_snake(
    x: &[f32],
    c: usize,
    freq: &[f32],
    gain: &[f32],
    plan: &Plan<'_>,
) -> Vec<f32> {
    let rows = x.len() / plan.t.max(1);
    let mut y = vec![0f32; rows * plan.t_out];
    let work = |s: &mut Scratch, (i, out): (usize, &mut [f32])| {
        let ch = i % c.max(1);
        let src = &x[i * plan.t..][..plan.t];
        row(plan, src, freq[ch], gain[ch], s, out);
    };
    // Rows are independent; a row of a long signal is a task's worth.
    if rows > 1 && rows * plan.t_out * (plan.taps + plan.down.len()) > 1 << 15 {
        y.par_chunks_mut(plan.t_out)
            .enumerate()
            .for_each_init(Scratch::default, work);
    } else {
        let mut s = Scratch::default();
        y.chunks_mut(plan.t_out)
            .enumerate()
            .for_each(|r| work(&mut s, r));
    }
    y
}

/// One channel row: `src` (`plan.t` samples) -> `out` (`plan.t_out`).
fn row(plan: &Plan<'_>, src: &[f32], freq: f32, gain: f32, s: &mut Scratch, out: &mut [f32]) {
    let (r, n) = (plan.ratio, plan.per_phase);
    let (ml, mr) = plan.margins();
    // The replicate-padded input.
    let (first, last) = (src[0], src[src.len() - 1]);
    s.padded.clear();
    s.padded.resize(plan.up_pad.0, first);
    s.padded.extend_from_slice(src);
    s.padded
        .resize(plan.up_pad.0 + src.len() + plan.up_pad.1, last);
    s.act.resize_with(r, Vec::new);
    for q in 0..r {
        // Phase q of the upsampled signal: bias + sum_j up[q][j] * padded[m + j].
        s.phase.clear();
        s.phase.resize(n, plan.up_bias[q]);
        for (j, &w) in plan.up[q * plan.taps..][..plan.taps].iter().enumerate() {
            axpy(&mut s.phase, w, &s.padded[j..j + n]);
        }
        // SnakeBeta into the margined buffer.
        let act = &mut s.act[q];
        act.clear();
        act.resize(ml + n + mr, 0.0);
        // SAFETY: f32 and MaybeUninit<f32> share a layout, and snake_row
        // only writes initialised values.
        let dst = unsafe { &mut *(&mut act[ml..ml + n] as *mut [f32] as *mut [MaybeUninit<f32>]) };
        math::snake_row(&s.phase, dst, freq, Some(gain));
    }
    // The downsampler's replicate padding: the first and last upsampled
    // samples (phase 0's first, phase r - 1's last) fill the margins.
    let (head, tail) = (s.act[0][ml], s.act[r - 1][ml + n - 1]);
    for act in &mut s.act {
        act[..ml].fill(head);
        act[ml + n..].fill(tail);
    }
    out.fill(0.0);
    for (j, &w) in plan.down.iter().enumerate() {
        let (q, at) = plan.tap_source(j);
        axpy(out, w, &s.act[q][at..at + out.len()]);
    }
}

/// `y += w * x` (same lengths), vectorized for this machine.
fn axpy(y: &mut [f32], w: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected at run time.
            unsafe { axpy_avx512(y, w, x) };
            return;
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected at run time.
            unsafe { axpy_avx2(y, w, x) };
            return;
        }
    }
    axpy_portable(y, w, x);
}

#[inline(always)]
fn axpy_portable(y: &mut [f32], w: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += w * x;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_avx512(y: &mut [f32], w: f32, x: &[f32]) {
    axpy_portable(y, w, x);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn axpy_avx2(y: &mut [f32], w: f32, x: &[f32]) {
    axpy_portable(y, w, x);
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeflow_runtime::SnakeResampling;

    const RS: SnakeResampling = SnakeResampling {
        ratio: 2,
        up_pad: (3, 3),
        down_pad: (5, 6),
    };

    /// Shapes that do not fit are refused with what is wrong, before any
    /// row is read.
    #[test]
    fn plans_refuse_filters_and_lengths_that_do_not_fit() {
        let (up, ub, down) = (vec![0.1f32; 14], vec![0f32; 2], vec![0.1f32; 12]);
        let plan = Plan::new(RS, (&up, &ub, &down), 37).expect("fits");
        assert_eq!(plan.t_out(), 37);
        let bias = Plan::new(RS, (&up, &ub[..1], &down), 37).expect_err("bias");
        assert!(bias.contains("bias has 1 values"), "{bias}");
        let odd = Plan::new(RS, (&up[..13], &ub, &down), 37).expect_err("filter");
        assert!(odd.contains("[ratio, 1, taps]"), "{odd}");
        let zero = SnakeResampling { ratio: 0, ..RS };
        assert!(Plan::new(zero, (&up, &ub, &down), 37).is_err());
        assert!(Plan::new(RS, (&up, &ub, &down), 0).is_err());
        let long = vec![0.1f32; 200];
        let short = Plan::new(RS, (&up, &ub, &long), 37).expect_err("down");
        assert!(short.contains("200-tap downsampler"), "{short}");
    }

    /// Rows split across the pool give the bits one task gives them.
    #[test]
    fn rows_on_the_pool_give_the_bits_of_one_task() {
        let vals = |n: usize, seed: u32| crate::cpu::tests::values(n, seed);
        let (up, down) = (vals(14, 1), vals(12, 2));
        let ub = vec![0.01f32, -0.02];
        let (c, t) = (6, 301);
        let plan = Plan::new(RS, (&up, &ub, &down), t).expect("fits");
        let x: Vec<f32> = vals(4 * c * t, 3).iter().map(|v| 3.0 * v).collect();
        let freq: Vec<f32> = (0..c).map(|i| 0.5 + i as f32).collect();
        let gain: Vec<f32> = (0..c).map(|i| 1.0 / (1.0 + i as f32)).collect();
        let all = resampled_snake(&x, c, &freq, &gain, &plan);
        let mut s = Scratch::default();
        for (i, want) in all.chunks(plan.t_out()).enumerate() {
            let mut one = vec![0f32; plan.t_out()];
            let ch = i % c;
            row(
                &plan,
                &x[i * t..][..t],
                freq[ch],
                gain[ch],
                &mut s,
                &mut one,
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(want), bits(&one), "row {i}");
        }
    }
}
