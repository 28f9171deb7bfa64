//! The direct-loop attention (decoder steps and causal prefill, see
//! [`super`]) on AVX2 + FMA for all the query heads that share one
//! key / value head at once.
//!
//! Why: the per-head loops read every visible key and value row once per
//! query head and row. With grouped-query heads (Qwen2.5-1.5B: 6 query
//! heads per key / value head) those reads come from L2 and bound the
//! loop; here each key or value vector is loaded once and used by every
//! head of the group, which also gives each pass several independent FMA
//! chains (a single head's dot product is one chain of `d / 8` dependent
//! FMAs).
//!
//! Every head's arithmetic is the per-head loops' own: a score is
//! [`super::dot`]'s eight-lane FMA chain and lane sum, the softmax is
//! [`super::softmax_row`], and each output element is one FMA per key
//! in key order from zero, as in [`super::weighted_sum`]. So the results are the
//! same bits, and a prefill's rows still equal decode's.

use super::{lane_sum, softmax_row, Shape};
use crate::cpu::gemm::View;
use std::arch::x86_64::*;

/// Heads per pass (one accumulator register each).
const MAX_GROUP: usize = 8;

/// Whether [`group_rows`] takes a call of this shape.
pub(super) fn fits(sh: &Shape) -> bool {
    sh.d.is_multiple_of(8)
        && sh.dv.is_multiple_of(8)
        && std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
}

/// Query rows `r0..r0 + rows` of query heads `h0..h0 + outs.len()`, which
/// share key / value head `h0 / rep`, in batch `bi`: `outs[g]` (`rows x
/// dv`) is head `h0 + g`'s output block. `sc` holds at least
/// `min(outs.len(), 8) * t` scores.
///
/// # Safety
/// [`fits`] is true for `sh`; the views have unit last-dim strides and
/// hold `[b, h, s, d]` queries, `[b, hk, t, d]` keys and `[b, hk, t, dv]`
/// values as `sh` says; the heads share one key / value head.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn group_rows(
    sh: &Shape,
    (bi, h0): (usize, usize),
    r0: usize,
    views: (&View<'_>, &View<'_>, &View<'_>),
    mv: Option<&View<'_>>,
    outs: &mut [&mut [f32]],
    sc: &mut [f32],
) {
    let hki = h0 / sh.rep;
    debug_assert!(!outs.is_empty() && (h0 + outs.len() - 1) / sh.rep == hki);
    let mut g0 = 0;
    for part in outs.chunks_mut(MAX_GROUP) {
        let at = (bi, hki, h0 + g0);
        // SAFETY: the caller's promises; `part` holds 1..=8 heads.
        unsafe {
            match part.len() {
                1 => rows::<1, 4, 4>(sh, at, r0, views, mv, part, sc),
                2 => rows::<2, 4, 4>(sh, at, r0, views, mv, part, sc),
                3 => rows::<3, 2, 4>(sh, at, r0, views, mv, part, sc),
                4 => rows::<4, 2, 2>(sh, at, r0, views, mv, part, sc),
                5 => rows::<5, 1, 2>(sh, at, r0, views, mv, part, sc),
                6 => rows::<6, 1, 2>(sh, at, r0, views, mv, part, sc),
                7 => rows::<7, 1, 1>(sh, at, r0, views, mv, part, sc),
                _ => rows::<8, 1, 1>(sh, at, r0, views, mv, part, sc),
            }
        }
        g0 += part.len();
    }
}

/// [`group_rows`] for `G` heads from head `h0`: scores `KP` keys per pass
/// (`G * KP` independent chains), weighted sums `CW` vectors of columns per
/// pass (`G * CW` accumulators).
///
/// # Safety
/// As [`group_rows`]; `outs` holds `G` blocks.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<const G: usize, const KP: usize, const CW: usize>(
    sh: &Shape,
    (bi, hki, h0): (usize, usize, usize),
    r0: usize,
    (qv, kv, vv): (&View<'_>, &View<'_>, &View<'_>),
    mv: Option<&View<'_>>,
    outs: &mut [&mut [f32]],
    sc: &mut [f32],
) {
    let (t, d, dv) = (sh.t, sh.d, sh.dv);
    assert!(outs.len() == G && sc.len() >= G * t);
    let rows = outs[0].len() / dv;
    // The lanes of one dot product's accumulator, summed as `dot` does.
    let finish = |a: __m256| {
        let mut l = [0f32; 8];
        // SAFETY: `l` holds 8 floats.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), a) };
        lane_sum(&l, &[], &[])
    };
    for r in 0..rows {
        let i = r0 + r;
        let visible = if sh.causal {
            (i + t - sh.s + 1).min(t)
        } else {
            t
        };
        let q: [&[f32]; G] = std::array::from_fn(|g| &qv.data[qv.at(bi, h0 + g, i, 0)..][..d]);
        // Scores: each key vector loaded once for the G heads.
        let mut j = 0;
        while j < visible {
            let kp = KP.min(visible - j);
            let k: [&[f32]; KP] =
                std::array::from_fn(|x| &kv.data[kv.at(bi, hki, j + x.min(kp - 1), 0)..][..d]);
            let mut acc = [[_mm256_setzero_ps(); G]; KP];
            for c in (0..d).step_by(8) {
                for (a, k) in acc.iter_mut().zip(k).take(kp) {
                    // SAFETY: c + 8 <= d, the length of every slice.
                    let kc = unsafe { _mm256_loadu_ps(k.as_ptr().add(c)) };
                    for (a, q) in a.iter_mut().zip(q) {
                        // SAFETY: as above.
                        *a = _mm256_fmadd_ps(unsafe { _mm256_loadu_ps(q.as_ptr().add(c)) }, kc, *a);
                    }
                }
            }
            for (x, a) in acc.iter().enumerate().take(kp) {
                for (g, &a) in a.iter().enumerate() {
                    sc[g * t + j + x] = finish(a) * sh.scale;
                }
            }
            j += kp;
        }
        for g in 0..G {
            let row = &mut sc[g * t..g * t + visible];
            if let Some(m) = mv {
                for (j, x) in row.iter_mut().enumerate() {
                    *x += m.data[m.at(bi, h0 + g, i, j)];
                }
            }
            softmax_row(row);
        }
        // Weighted sums: each value vector loaded once for the G heads.
        let vbase = vv.at(bi, hki, 0, 0);
        let vs = vv.stride[2];
        assert!(
            vs >= 0 && (visible == 0 || vbase + (visible - 1) * vs as usize + dv <= vv.data.len())
        );
        // SAFETY: value row j < visible spans vbase + j vs .. + dv, inside
        // `vv.data` (asserted); `sc` holds G rows of t >= visible scores.
        unsafe {
            let (v, p) = (vv.data.as_ptr().add(vbase), sc.as_ptr());
            let mut c0 = 0;
            while c0 + 8 * CW <= dv {
                weighted::<G, CW>(v, vs as usize, p, t, visible, c0, r * dv, outs);
                c0 += 8 * CW;
            }
            while c0 < dv {
                weighted::<G, 1>(v, vs as usize, p, t, visible, c0, r * dv, outs);
                c0 += 8;
            }
        }
    }
}

/// Columns `c0..c0 + 8 CW` of the G heads' weighted sums over the
/// `visible` value rows, stored at `o + c0` of each head's output block:
/// per element one FMA per key in key order from zero.
///
/// # Safety
/// AVX2 and FMA; value row j < visible is readable at `v + j vs .. + c0 + 8
/// CW`; `p + g t + j` is readable for g < G, j < visible; each `outs[g]`
/// holds `o + c0 + 8 CW` values.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn weighted<const G: usize, const CW: usize>(
    v: *const f32,
    vs: usize,
    p: *const f32,
    t: usize,
    visible: usize,
    c0: usize,
    o: usize,
    outs: &mut [&mut [f32]],
) {
    let mut acc = [[_mm256_setzero_ps(); CW]; G];
    for j in 0..visible {
        // SAFETY: the caller's promises.
        unsafe {
            let vr = v.add(j * vs + c0);
            let vc: [__m256; CW] = std::array::from_fn(|c| _mm256_loadu_ps(vr.add(8 * c)));
            for (g, a) in acc.iter_mut().enumerate() {
                let pg = _mm256_broadcast_ss(&*p.add(g * t + j));
                for (a, &vc) in a.iter_mut().zip(&vc) {
                    *a = _mm256_fmadd_ps(pg, vc, *a);
                }
            }
        }
    }
    for (out, a) in outs.iter_mut().zip(acc) {
        let out = &mut out[o + c0..][..8 * CW];
        for (c, a) in a.iter().enumerate() {
            // SAFETY: `out` holds 8 CW values.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), *a) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::tests::values;

    /// Contiguous `[1, heads, rows, width]`.
    fn view(data: &[f32], heads: usize, rows: usize, width: usize) -> View<'_> {
        assert_eq!(data.len(), heads * rows * width);
        View {
            data,
            dims: [1, heads, rows, width],
            stride: [
                (heads * rows * width) as isize,
                (rows * width) as isize,
                width as isize,
                1,
            ],
        }
    }

    /// Every query head of every group gives the per-head portable loops'
    /// bits: 1, 6 and 9 heads per key / value head (9 runs as 8 + 1),
    /// causal prefill rows whose visible keys are odd and even, decode-like
    /// rows (2 queries against 13 keys), an additive mask, widths of 8, 24
    /// and 128.
    #[test]
    fn grouped_heads_give_the_per_head_bits() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            return;
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (rep, d, (s, t, causal), masked) in [
            (6, 128, (11, 11, true), false),
            (1, 64, (9, 9, true), true),
            (9, 24, (2, 13, false), true),
            (6, 8, (3, 7, true), false),
        ] {
            let (hk, dv) = (2, d);
            let h = rep * hk;
            let (q, k, v) = (
                values(h * s * d, 1),
                values(hk * t * d, 2),
                values(hk * t * dv, 3),
            );
            let m = values(h * s * t, 4);
            let (qv, kv, vv, mv) = (
                view(&q, h, s, d),
                view(&k, hk, t, d),
                view(&v, hk, t, dv),
                view(&m, h, s, t),
            );
            let mv = masked.then_some(&mv);
            let sh = Shape {
                h,
                rep,
                s,
                t,
                d,
                dv,
                scale: 0.125,
                causal,
            };
            assert!(fits(&sh));
            for hki in 0..hk {
                let mut outs: Vec<Vec<f32>> = vec![vec![f32::NAN; s * dv]; rep];
                let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                let mut sc = vec![0f32; rep.min(8) * t];
                // SAFETY: AVX2 and FMA were detected; the views are as
                // `sh` says.
                unsafe {
                    group_rows(
                        &sh,
                        (0, hki * rep),
                        0,
                        (&qv, &kv, &vv),
                        mv,
                        &mut refs,
                        &mut sc,
                    )
                };
                for (g, got) in outs.iter().enumerate() {
                    let mut want = vec![0f32; s * dv];
                    let mut sc = vec![0f32; t];
                    let bh = hki * rep + g;
                    super::super::small_head_portable(
                        &sh, bh, 0, &qv, &kv, &vv, mv, &mut want, &mut sc,
                    );
                    assert_eq!(bits(got), bits(&want), "rep {rep} d {d} head {bh}");
                }
            }
        }
    }

    /// A batch of two with grouped heads (6 query heads on 2 key / value
    /// heads) gives each item the bits it gets alone: the tasks map each
    /// output block to its own batch item and heads.
    #[test]
    fn batched_grouped_attention_equals_each_item_alone() {
        use candle_core::{Device, Tensor};
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            return;
        }
        let dev = Device::Cpu;
        let (b, h, hk, s, d) = (2, 6, 2, 19, 16);
        let mk = |heads: usize, seed: usize| {
            Tensor::from_vec(
                values(b * heads * s * d, seed as u32),
                (b, heads, s, d),
                &dev,
            )
            .expect("tensor")
        };
        let (q, k, v) = (mk(h, 5), mk(hk, 6), mk(hk, 7));
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("values")
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        for causal in [true, false] {
            let all = super::super::attention(&q, &k, &v, None, 0.25, causal)
                .expect("runs")
                .expect("f32 takes the fused path");
            for i in 0..b {
                let one = |t: &Tensor| t.narrow(0, i, 1).expect("narrow");
                let alone =
                    super::super::attention(&one(&q), &one(&k), &one(&v), None, 0.25, causal)
                        .expect("runs")
                        .expect("fused");
                assert_eq!(bits(&one(&all)), bits(&alone), "item {i} causal {causal}");
            }
        }
    }
}
