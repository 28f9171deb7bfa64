//! Fused scaled dot-product attention for f32 host tensors.
//!
//! ## Why
//! The unfused path (`softmax(q k^T * scale) v` as candle ops) materializes
//! the whole `[b, h, s, t]` score matrix several times (the product, the
//! scaled copy, the contiguous copy, the softmax), copies strided keys and
//! values to contiguous ones for every call, and runs the exponentials
//! through scalar `expf`. For Whisper's encoder (6 heads over 1500 x 1500)
//! that is 54 MB per pass and most of the encoder's time.
//!
//! Here each rayon task takes one `(batch, head, block of query rows)`:
//! the block's scores go into a per-thread buffer (`rows x t`, cache-sized)
//! through a GEMM that reads `q`, `k` and `v` in place with their strides,
//! the softmax runs in that buffer (vectorized `exp`), and a second GEMM
//! writes the block's output rows. Causal attention (a decoder's prefill
//! and steps) and blocks of a few rows run direct loops instead, one query
//! row at a time: a row's result then does not depend on how many rows
//! came with it, so a prefill equals the same tokens fed one at a time bit
//! for bit. On AVX2 those loops take all the query heads that share a
//! key / value head together ([`group`]): each key and value vector is
//! loaded once for the group, with the same arithmetic per head (the same
//! bits). Grouped-query heads, an end-aligned
//! causal mask and an additive mask (broadcast over any of its leading
//! dims) are supported; anything else (another dtype) returns `None` and
//! the caller takes the unfused path.

#[cfg(target_arch = "x86_64")]
mod group;

use crate::cpu::gemm::{with_view, View};
use candle_core::Tensor as CTensor;
use edgeflow_runtime::Result;
use gemm::Parallelism;
use rayon::prelude::*;
use std::cell::RefCell;

/// Query rows per task: the score block is `ROWS x t` floats (384 KB for
/// t = 1500), which stays in L2 between the two GEMMs.
const ROWS: usize = 64;

/// Query rows per task of the grouped-head loops: small, so a causal
/// prefill's tasks (whose cost grows with the row) balance over threads.
#[cfg(target_arch = "x86_64")]
const GROUP_ROWS: usize = 16;

thread_local! {
    /// Score block of the current task (reused across tasks and calls).
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `softmax(q k^T * scale + mask) v` for f32 CPU tensors `q [b, h, s, d]`,
/// `k [b, hk, t, d]`, `v [b, hk, t, dv]` (any strides; `hk` divides `h`),
/// an optional additive `mask` broadcastable to `[b, h, s, t]`, and an
/// end-aligned causal mask (query `i` sees keys `0..=i + t - s`). Returns a
/// contiguous `[b, h, s, dv]` tensor, or None when an input is not an f32
/// CPU tensor (the caller then takes the unfused path). Shapes must have
/// been checked by the caller.
pub(crate) fn attention(
    q: &CTensor,
    k: &CTensor,
    v: &CTensor,
    mask: Option<&CTensor>,
    scale: f64,
    causal: bool,
) -> Result<Option<CTensor>> {
    let (b, h, s, d) = q.dims4()?;
    let (_, hk, t, _) = k.dims4()?;
    let dv = v.dims4()?.3;
    if let Some(m) = mask {
        // Broadcast shape check: each of the mask's trailing dims is 1 or
        // the matching dim of [b, h, s, t].
        let want = [b, h, s, t];
        let md = m.dims();
        if md.len() > 4
            || md
                .iter()
                .rev()
                .zip(want.iter().rev())
                .any(|(&a, &w)| a != 1 && a != w)
        {
            return Ok(None);
        }
    }
    let rep = h / hk;
    let mut out = vec![0f32; b * h * s * dv];
    let done = with_view(q, |qv| {
        with_view(k, |kv| {
            with_view(v, |vv| {
                let mut run = |mv: Option<View<'_>>| {
                    let unit = |x: &View<'_>| x.dims[3] == 1 || x.stride[3] == 1;
                    if (s <= SMALL_ROWS || causal) && unit(&qv) && unit(&kv) && unit(&vv) {
                        // Decoder steps: a few query rows per head; direct
                        // loops beat two GEMM calls with their packing.
                        // Causal attention (a decoder's prefill) takes them
                        // for any number of rows: each query row is computed
                        // on its own, in the same order as a one-row step,
                        // so a prefill's rows equal decode's bit for bit
                        // (the GEMMs below sum in an order that depends on
                        // the block's shape).
                        let shape = Shape {
                            h,
                            rep,
                            s,
                            t,
                            d,
                            dv,
                            scale: scale as f32,
                            causal,
                        };
                        #[cfg(target_arch = "x86_64")]
                        if group::fits(&shape) {
                            // Tasks of (query heads sharing a key / value
                            // head, block of GROUP_ROWS query rows), with
                            // those heads' output blocks. With one block
                            // (decoder steps) each group is halved, so both
                            // of two threads start at once.
                            let part = if s <= GROUP_ROWS {
                                rep.div_ceil(2)
                            } else {
                                rep
                            };
                            let mut tasks = Vec::new();
                            for (gi, o) in out.chunks_mut(rep * s * dv).enumerate() {
                                let mut heads: Vec<_> = o
                                    .chunks_mut(s * dv)
                                    .map(|o| o.chunks_mut(GROUP_ROWS * dv))
                                    .collect();
                                for blk in 0..s.div_ceil(GROUP_ROWS) {
                                    // Each head has this block (s rows each).
                                    let outs: Vec<&mut [f32]> =
                                        heads.iter_mut().filter_map(|h| h.next()).collect();
                                    let mut outs = outs.into_iter().peekable();
                                    let mut g0 = 0;
                                    while outs.peek().is_some() {
                                        let p: Vec<&mut [f32]> = outs.by_ref().take(part).collect();
                                        let at = (gi / hk, (gi % hk) * rep + g0);
                                        g0 += p.len();
                                        tasks.push((at, blk * GROUP_ROWS, p));
                                    }
                                }
                            }
                            tasks.into_par_iter().for_each(|(at, r0, mut outs)| {
                                SCORES.with(|buf| {
                                    let mut buf = buf.borrow_mut();
                                    let n = outs.len().min(8) * t;
                                    if buf.len() < n {
                                        buf.resize(n, 0.0);
                                    }
                                    // SAFETY: `fits` held; the views have
                                    // unit last-dim strides (checked above)
                                    // and the shapes `shape` gives.
                                    unsafe {
                                        group::group_rows(
                                            &shape,
                                            at,
                                            r0,
                                            (&qv, &kv, &vv),
                                            mv.as_ref(),
                                            &mut outs,
                                            &mut buf[..n],
                                        )
                                    };
                                })
                            });
                            return;
                        }
                        // Tasks of (head, block of ROWS query rows).
                        out.par_chunks_mut(s * dv)
                            .enumerate()
                            .flat_map(|(bh, o)| {
                                o.par_chunks_mut(ROWS * dv)
                                    .enumerate()
                                    .map(move |(blk, ob)| (bh, blk * ROWS, ob))
                            })
                            .for_each(|(bh, r0, ob)| {
                                SCORES.with(|buf| {
                                    let mut buf = buf.borrow_mut();
                                    if buf.len() < t {
                                        buf.resize(t, 0.0);
                                    }
                                    small_head(
                                        &shape,
                                        bh,
                                        r0,
                                        &qv,
                                        &kv,
                                        &vv,
                                        mv.as_ref(),
                                        ob,
                                        &mut buf[..t],
                                    );
                                })
                            });
                        return;
                    }
                    let blocks = s.div_ceil(ROWS);
                    let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new();
                    for (bh, o) in out.chunks_mut(s * dv).enumerate() {
                        for (blk, ob) in o.chunks_mut(ROWS * dv).enumerate() {
                            tasks.push((bh, blk, ob));
                        }
                    }
                    debug_assert_eq!(tasks.len(), b * h * blocks);
                    tasks.into_par_iter().for_each(|(bh, blk, ob)| {
                        let (bi, hi) = (bh / h, bh % h);
                        let hki = hi / rep;
                        let r0 = blk * ROWS;
                        let rows = ob.len() / dv;
                        SCORES.with(|buf| {
                            let mut buf = buf.borrow_mut();
                            if buf.len() < rows * t {
                                buf.resize(rows * t, 0.0);
                            }
                            let sc = &mut buf[..rows * t];
                            let qo = qv.at(bi, hi, r0, 0);
                            let ko = kv.at(bi, hki, 0, 0);
                            // SAFETY: `sc` is a live `rows x t` buffer written
                            // with row stride t, column stride 1. The q block
                            // reads elements qo + i*qs2 + p*qs3 for i < rows,
                            // p < d, and k reads ko + j*ks2 + p*ks3 for j < t,
                            // p < d: all inside the views' storage, which
                            // `with_view` checked reaches no further than the
                            // slice's end. gemm reads nothing else when
                            // read_dst is false.
                            unsafe {
                                gemm::gemm(
                                    rows,
                                    t,
                                    d,
                                    sc.as_mut_ptr(),
                                    1,
                                    t as isize,
                                    false,
                                    qv.data.as_ptr().add(qo),
                                    qv.stride[3],
                                    qv.stride[2],
                                    kv.data.as_ptr().add(ko),
                                    kv.stride[2],
                                    kv.stride[3],
                                    0.0,
                                    scale as f32,
                                    false,
                                    false,
                                    false,
                                    Parallelism::None,
                                );
                            }
                            for (i, row) in sc.chunks_exact_mut(t).enumerate() {
                                if let Some(m) = &mv {
                                    let mi = if m.dims[2] == 1 { 0 } else { r0 + i };
                                    let mo = m.at(
                                        if m.dims[0] == 1 { 0 } else { bi },
                                        if m.dims[1] == 1 { 0 } else { hi },
                                        mi,
                                        0,
                                    );
                                    let ms = m.stride[3];
                                    for (j, x) in row.iter_mut().enumerate() {
                                        *x += m.data[(mo as isize + j as isize * ms) as usize];
                                    }
                                }
                                // Keys past `r0 + i + t - s` are masked out.
                                let visible = if causal {
                                    (r0 + i + t - s + 1).min(t)
                                } else {
                                    t
                                };
                                softmax_row(&mut row[..visible]);
                                row[visible..].fill(0.0);
                            }
                            let vo = vv.at(bi, hki, 0, 0);
                            // SAFETY: `ob` is this task's own `rows x dv`
                            // output block (row stride dv). The scores are
                            // the `rows x t` buffer above; v reads
                            // vo + j*vs2 + c*vs3 for j < t, c < dv, inside
                            // its checked view.
                            unsafe {
                                gemm::gemm(
                                    rows,
                                    dv,
                                    t,
                                    ob.as_mut_ptr(),
                                    1,
                                    dv as isize,
                                    false,
                                    sc.as_ptr(),
                                    1,
                                    t as isize,
                                    vv.data.as_ptr().add(vo),
                                    vv.stride[3],
                                    vv.stride[2],
                                    0.0,
                                    1.0,
                                    false,
                                    false,
                                    false,
                                    Parallelism::None,
                                );
                            }
                        });
                    });
                };
                match mask {
                    Some(m) => with_view(m, |mv| run(Some(mv))).is_some(),
                    None => {
                        run(None);
                        true
                    }
                }
            })
        })
    });
    if done != Some(Some(Some(true))) {
        return Ok(None);
    }
    Ok(Some(CTensor::from_vec(
        out,
        (b, h, s, dv),
        &candle_core::Device::Cpu,
    )?))
}

/// Query rows per head up to which [`small_head`] is used.
const SMALL_ROWS: usize = 4;

/// Sizes for [`small_head`].
struct Shape {
    h: usize,
    rep: usize,
    s: usize,
    t: usize,
    d: usize,
    dv: usize,
    scale: f32,
    causal: bool,
}

/// Attention of head `bh` (`batch * h + head`) for query rows `r0..` (as
/// many as `ob` holds), with unit last-dim strides: per row, scores by dot
/// products, softmax, weighted sum of value rows into `ob` (`rows x dv`).
/// `sc` holds `t` scores. A row's result depends only on its query, the
/// keys and values it sees and the mask, not on the other rows.
#[allow(clippy::too_many_arguments)]
fn small_head(
    sh: &Shape,
    bh: usize,
    r0: usize,
    qv: &View<'_>,
    kv: &View<'_>,
    vv: &View<'_>,
    mv: Option<&View<'_>>,
    ob: &mut [f32],
    sc: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { small_head_avx2(sh, bh, r0, qv, kv, vv, mv, ob, sc) };
        }
    }
    small_head_portable(sh, bh, r0, qv, kv, vv, mv, ob, sc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
fn small_head_avx2(
    sh: &Shape,
    bh: usize,
    r0: usize,
    qv: &View<'_>,
    kv: &View<'_>,
    vv: &View<'_>,
    mv: Option<&View<'_>>,
    ob: &mut [f32],
    sc: &mut [f32],
) {
    small_head_portable(sh, bh, r0, qv, kv, vv, mv, ob, sc)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn small_head_portable(
    sh: &Shape,
    bh: usize,
    r0: usize,
    qv: &View<'_>,
    kv: &View<'_>,
    vv: &View<'_>,
    mv: Option<&View<'_>>,
    ob: &mut [f32],
    sc: &mut [f32],
) {
    let (bi, hi) = (bh / sh.h, bh % sh.h);
    let hki = hi / sh.rep;
    let (t, d, dv) = (sh.t, sh.d, sh.dv);
    for (r, o) in ob.chunks_exact_mut(dv).enumerate() {
        let i = r0 + r;
        let q = &qv.data[qv.at(bi, hi, i, 0)..][..d];
        let visible = if sh.causal {
            (i + t - sh.s + 1).min(t)
        } else {
            t
        };
        let row = &mut sc[..visible];
        for (j, x) in row.iter_mut().enumerate() {
            let k = &kv.data[kv.at(bi, hki, j, 0)..][..d];
            *x = dot(q, k) * sh.scale;
        }
        if let Some(m) = mv {
            for (j, x) in row.iter_mut().enumerate() {
                *x += m.data[m.at(bi, hi, i, j)];
            }
        }
        softmax_row(row);
        weighted_sum(row, vv, (bi, hki), o);
    }
}

/// `o = Σ_j p_j v_j` over the value rows `j` of head `(batch, kv head)`
/// (unit last-dim stride): per element, one FMA per key in key order from
/// zero. On AVX-512 the outputs stay in registers across the keys (they
/// were loaded and stored once per key); the same FMAs in the same order,
/// so the same bits.
#[inline(always)]
fn weighted_sum(p: &[f32], vv: &View<'_>, (bi, hki): (usize, usize), o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if o.len().is_multiple_of(16) && std::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected just above.
        return unsafe { weighted_sum_avx512(p, vv, (bi, hki), o) };
    }
    o.fill(0.0);
    for (j, &p) in p.iter().enumerate() {
        let v = &vv.data[vv.at(bi, hki, j, 0)..][..o.len()];
        for (a, &b) in o.iter_mut().zip(v) {
            *a = p.mul_add(b, *a);
        }
    }
}

/// [`weighted_sum`] with up to 128 outputs at a time in eight registers.
///
/// # Safety
/// AVX-512F available; `o.len()` a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn weighted_sum_avx512(p: &[f32], vv: &View<'_>, (bi, hki): (usize, usize), o: &mut [f32]) {
    use std::arch::x86_64::*;
    let dv = o.len();
    for c0 in (0..dv).step_by(128) {
        let w = (dv - c0).min(128) / 16;
        let mut acc = [_mm512_setzero_ps(); 8];
        for (j, &p) in p.iter().enumerate() {
            let v = &vv.data[vv.at(bi, hki, j, 0) + c0..][..16 * w];
            let pv = _mm512_set1_ps(p);
            for (i, a) in acc.iter_mut().take(w).enumerate() {
                // SAFETY: `v` holds 16 w values (the slice above).
                *a = _mm512_fmadd_ps(pv, unsafe { _mm512_loadu_ps(v.as_ptr().add(16 * i)) }, *a);
            }
        }
        for (i, a) in acc.iter().take(w).enumerate() {
            // SAFETY: c0 + 16 i + 16 <= dv = o.len().
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(c0 + 16 * i), *a) };
        }
    }
}

/// Dot product in 8 independent lanes (vectorizable).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    lane_sum(&acc, ta, tb)
}

/// [`dot`]'s end: the eight lanes summed in order, plus the products of
/// the tails `ta`, `tb` (what is left past the last whole eight).
#[inline(always)]
fn lane_sum(acc: &[f32; 8], ta: &[f32], tb: &[f32]) -> f32 {
    let tail: f32 = ta.iter().zip(tb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// In-place softmax of one row (a fully masked row, all `-inf`, becomes
/// zeros rather than NaN... as long as at least one key is visible, which
/// the causal mask guarantees; an additive mask of all `-inf` gives NaN
/// like the unfused path).
fn softmax_row(row: &mut [f32]) {
    if row.is_empty() {
        return;
    }
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = exp_sub_sum(row, max);
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|x| *x *= inv);
}

/// `x = exp(x - max)` over the row; returns the sum.
fn exp_sub_sum(row: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { exp_sub_sum_avx2(row, max) };
        }
    }
    exp_sub_sum_portable(row, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_sub_sum_avx2(row: &mut [f32], max: f32) -> f32 {
    exp_sub_sum_portable(row, max)
}

/// Written as independent lanes of 8 so the compiler vectorizes it (with
/// AVX2 + FMA when inlined into [`exp_sub_sum_avx2`]).
#[inline(always)]
fn exp_sub_sum_portable(row: &mut [f32], max: f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = row.chunks_exact_mut(8);
    for c in &mut chunks {
        for (x, a) in c.iter_mut().zip(acc.iter_mut()) {
            *x = exp_approx(*x - max);
            *a += *x;
        }
    }
    let mut sum: f32 = 0.0;
    for x in chunks.into_remainder() {
        *x = exp_approx(*x - max);
        sum += *x;
    }
    sum + acc.iter().sum::<f32>()
}

/// `e^x` for `x <= 0` (the softmax's shifted scores), within about 2 ulp:
/// Cephes' `expf` (range reduction by ln 2 in two parts and a degree-7
/// polynomial) in branch-free form. Inputs below -87.3 give about 1e-38
/// instead of a denormal or 0, and -inf gives the same.
#[inline(always)]
fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.3, 88.3);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * C1 - n * C2;
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 0.166_666_65);
    p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // 2^n without a float -> int conversion (which blocks vectorization):
    // n + 127 + 2^23 holds n + 127 in its low mantissa bits; shifting them
    // into the exponent field drops the rest. n + 127 is in 1..=254 here.
    let biased = (n + (127.0 + 8_388_608.0)).to_bits();
    y * f32::from_bits(biased << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_approx_is_close_to_exp() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = x.exp();
            let got = exp_approx(x);
            worst = worst.max(((got - want) / want).abs());
            x += 0.013;
        }
        assert!(worst < 1e-6, "worst relative error {worst}");
        assert!(exp_approx(f32::NEG_INFINITY) < 1e-37);
        assert_eq!(exp_approx(0.0), 1.0);
    }

    /// The weighted sum of value rows gives the plain loop's bits (one FMA
    /// per key, in key order) on every width, register kernel or not.
    #[test]
    fn weighted_sum_gives_the_plain_loops_bits() {
        for dv in [16usize, 20, 128, 160, 256] {
            let t = 37;
            // Two kv heads, rows of dv + 3 values (a row stride past dv).
            let data: Vec<f32> = (0..2 * t * (dv + 3))
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let vv = View {
                data: &data,
                dims: [1, 2, t, dv],
                stride: [
                    (2 * t * (dv + 3)) as isize,
                    (t * (dv + 3)) as isize,
                    (dv + 3) as isize,
                    1,
                ],
            };
            let p: Vec<f32> = (0..t).map(|j| ((j * 13 % 17) as f32) / 31.0).collect();
            let mut got = vec![f32::NAN; dv];
            weighted_sum(&p, &vv, (0, 1), &mut got);
            let mut want = vec![0f32; dv];
            for (j, &pj) in p.iter().enumerate() {
                let row = &data[(t + j) * (dv + 3)..][..dv];
                for (a, &b) in want.iter_mut().zip(row) {
                    *a = pj.mul_add(b, *a);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "dv {dv}");
        }
    }

    #[test]
    fn softmax_row_sums_to_one() {
        let mut r: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 5.0).collect();
        let want: Vec<f32> = {
            let m = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = r.iter().map(|x| (x - m).exp()).collect();
            let s: f32 = e.iter().sum();
            e.iter().map(|x| x / s).collect()
        };
        softmax_row(&mut r);
        for (a, b) in r.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}

#[cfg(test)]
mod block_tests {
    use super::*;
    use candle_core::{Device, Tensor as T};

    /// The unfused formula (the bench's raw-candle baseline) on contiguous copies.
    fn reference(q: &T, k: &T, v: &T, scale: f64, causal: bool) -> T {
        let c = |t: &T| t.contiguous().unwrap();
        crate::candle_attention(&c(q), &c(k), &c(v), scale, causal).unwrap()
    }

    #[test]
    fn strided_multi_block_matches_unfused() {
        // Several query blocks (150 rows), heads interleaved in memory as
        // Whisper's [1, s, h, d] -> [1, h, s, d] permute leaves them.
        let dev = Device::Cpu;
        for &(s, t, causal) in &[
            (150, 150, false),
            (70, 130, true),
            (1, 1500, false),
            (3, 9, true),
            (4, 4, false),
        ] {
            let q = T::randn(0f32, 1.0, (1, s, 3, 16), &dev).unwrap();
            let k = T::randn(0f32, 1.0, (1, t, 3, 16), &dev).unwrap();
            let v = T::randn(0f32, 1.0, (1, t, 3, 16), &dev).unwrap();
            let (q, k, v) = (
                q.permute((0, 2, 1, 3)).unwrap(),
                k.permute((0, 2, 1, 3)).unwrap(),
                v.permute((0, 2, 1, 3)).unwrap(),
            );
            let got = attention(&q, &k, &v, None, 0.25, causal)
                .unwrap()
                .expect("f32 tensors take the fused path");
            let want = reference(&q, &k, &v, 0.25, causal);
            let diff = (got - want)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff < 1e-5, "s{s} t{t} causal={causal}: max diff {diff}");
        }
    }

    #[test]
    fn other_dtypes_are_left_to_the_caller() {
        let q = T::zeros((1, 1, 2, 4), candle_core::DType::F16, &Device::Cpu).unwrap();
        assert!(attention(&q, &q, &q, None, 1.0, false).unwrap().is_none());
    }
}
