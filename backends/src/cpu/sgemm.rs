//! This crate's f32 GEMM for products with many rows (prefill-shaped
//! linear layers and matmuls): one operand packed into 32-lane panels per
//! call, the other read in place, a register-blocked micro-kernel per
//! instruction set, parallel over row blocks on rayon's pool.
//!
//! ## Why
//! The `gemm` crate (candle's f32 matmul) ran the DiT's 200 x 1024 x 1024
//! linears at ~36 G multiply-adds/s on two Zen 4 cores, and packs the weight
//! matrix on every call. Here the weights are never copied: a linear layer
//! `x [m, k] @ w [n, k]^T` is computed as its transpose, `w` (rows `n`,
//! contiguous along `k`) times the activations packed as `[m / 32][k][32]`,
//! so each weight value is broadcast once per 32 activation rows. Products
//! whose right operand is not `k`-contiguous (a plain matmul) run the other
//! way round: the left operand's rows are broadcast over the right
//! operand packed as `[n / 32][k][32]`.
//!
//! ## Blocking
//! The broadcast operand ("rows") is cut into panels of `R` rows (14 on
//! AVX-512, 6 on AVX2, 4 portable). A task owns a block of panels and, per
//! slice of [`KC`] steps of `k`, copies each panel's slice into a small
//! `[KC][R]` buffer (L1; the next panel's rows meanwhile prefetched into
//! L2) and runs it over every 32-lane block of the packed
//! operand's slice (`KC x lanes`, L2). Sums stay in a per-task `[rows][lanes]`
//! buffer between slices and are written to the output once at the end
//! (transposed back for a linear layer). The AVX-512 tile is `14 x 32`:
//! 28 accumulators, 2 loads and 14 broadcasts per 28 fused multiply-adds.
//! AVX2 runs the same panels 16 lanes at a time (`6 x 16`, 12 accumulators).
//!
//! A task owns a block of panels and all lanes, except where the panels
//! make one block (a few dozen activation rows): then tasks split the
//! lanes, two groups per thread, and each transposes the same rows.
//!
//! Weights placed on the CPU are packed once ([`LanesPacked`], kept by
//! the backend's placed linear weights) as the lanes of the product, and
//! [`linear_packed`] broadcasts the activation rows over them: no weights
//! are copied per call, they are read as one contiguous stream, and the
//! rows' panels pad less than 32-lane blocks of them would (65 rows: 70
//! against 80). Each output element gets the same sums in the same order,
//! so the bits are those of [`gemm()`] on the plain weights.
//!
//! ## Results across instruction sets
//! Every output element is its seed (the bias or 0) followed by one fused
//! multiply-add per step of `k`, in order `0, 1, .., k - 1`, on f32; between
//! slices the running sum is stored and reloaded as f32, which is exact.
//! The AVX-512, AVX2 and portable paths (`f32::mul_add`) therefore give
//! bit-identical results, whatever the panel height or thread count. They
//! differ from candle's / the `gemm` crate's results by f32 rounding
//! (another summation order).

use rayon::prelude::*;

/// Lanes of one packed block (two AVX-512 vectors).
const LANES: usize = 32;
/// Steps of `k` per slice.
const KC: usize = 256;
/// Most panels in one task's block (bounds the per-task sum buffer).
const MAX_BLOCK_PANELS: usize = 8;

/// A strided f32 matrix: element `(i, j)` at `data[off + i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a> {
    pub data: &'a [f32],
    pub off: usize,
    pub rs: isize,
    pub cs: isize,
}

impl Strided<'_> {
    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> usize {
        (self.off as isize + i as isize * self.rs + j as isize * self.cs) as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Portable,
    Avx2,
    Avx512,
}

fn isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// Whether this CPU runs the AVX-512 tiles (`14 x 32`).
pub(crate) fn wide() -> bool {
    isa() == Isa::Avx512
}

/// Rows per panel for an instruction set.
fn panel_rows(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => 14,
        Isa::Avx2 => 6,
        Isa::Portable => 4,
    }
}

/// `c [m, n] = a [m, k] @ b [k, n] (+ bias [n] on every row)`, written to
/// the contiguous `c` (`m * n` values). `parallel`: split over rayon's pool.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    bias: Option<&[f32]>,
    c: &mut [f32],
    parallel: bool,
) {
    gemm_with(isa(), m, n, k, a, b, bias, c, parallel);
}

/// Which way round a product runs.
struct Plan<'a> {
    /// The broadcast operand, `rows x k`.
    s: Strided<'a>,
    rows: usize,
    /// The packed operand, `k x lanes`.
    v: Strided<'a>,
    lanes: usize,
    /// The bias runs along the rows (a transposed product) or the lanes.
    bias_on_rows: bool,
    /// Output strides of a row and a lane.
    out_rs: usize,
    out_ls: usize,
}

#[allow(clippy::too_many_arguments)]
fn gemm_with(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    bias: Option<&[f32]>,
    c: &mut [f32],
    parallel: bool,
) {
    assert!(c.len() >= m * n && bias.is_none_or(|bs| bs.len() == n));
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for row in c[..m * n].chunks_exact_mut(n) {
            match bias {
                Some(bs) => row.copy_from_slice(bs),
                None => row.fill(0.0),
            }
        }
        return;
    }
    // b contiguous along k (a linear layer's transposed weights): compute
    // c^T = b^T a^T with b^T's rows broadcast, a packed.
    let plan = if b.rs == 1 && b.cs != 1 {
        Plan {
            s: Strided {
                data: b.data,
                off: b.off,
                rs: b.cs,
                cs: b.rs,
            },
            rows: n,
            v: Strided {
                data: a.data,
                off: a.off,
                rs: a.cs,
                cs: a.rs,
            },
            lanes: m,
            bias_on_rows: true,
            out_rs: 1,
            out_ls: n,
        }
    } else {
        Plan {
            s: a,
            rows: m,
            v: b,
            lanes: n,
            bias_on_rows: false,
            out_rs: n,
            out_ls: 1,
        }
    };
    run(isa, &plan, k, bias, c, parallel);
}

/// The packed operand: `[lanes_pad / 32][k][32]`, zeros past `lanes`.
fn pack_lanes(v: &Strided<'_>, k: usize, lanes: usize, parallel: bool) -> Vec<f32> {
    let blocks = lanes.div_ceil(LANES);
    let mut vp = vec![0f32; blocks * k * LANES];
    let one = |(lb, dst): (usize, &mut [f32])| {
        let l0 = lb * LANES;
        let nl = LANES.min(lanes - l0);
        if v.cs == 1 {
            for (p, d) in dst.chunks_exact_mut(LANES).enumerate() {
                let s = v.at(p, l0);
                d[..nl].copy_from_slice(&v.data[s..s + nl]);
            }
        } else if v.rs == 1 {
            // The lanes are a's rows, each contiguous along k: transposed
            // in tiles of TK steps, whose destination stays in L1.
            const TK: usize = 64;
            for (t, dt) in dst.chunks_mut(TK * LANES).enumerate() {
                let p0 = t * TK;
                let tk = dt.len() / LANES;
                for l in 0..nl {
                    let s = v.at(p0, l0 + l);
                    for (d, &x) in dt.chunks_exact_mut(LANES).zip(&v.data[s..s + tk]) {
                        d[l] = x;
                    }
                }
            }
        } else {
            for l in 0..nl {
                for (p, d) in dst.chunks_exact_mut(LANES).enumerate() {
                    d[l] = v.data[v.at(p, l0 + l)];
                }
            }
        }
    };
    if parallel {
        vp.par_chunks_mut(k * LANES).enumerate().for_each(one);
    } else {
        vp.chunks_mut(k * LANES).enumerate().for_each(one);
    }
    vp
}

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: every task writes the output elements of its own rows only, and
// the buffer outlives the parallel loop.
unsafe impl Send for OutPtr {}
// SAFETY: as for Send.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

fn run(isa: Isa, plan: &Plan<'_>, k: usize, bias: Option<&[f32]>, c: &mut [f32], parallel: bool) {
    let vp = pack_lanes(&plan.v, k, plan.lanes, parallel);
    run_packed(isa, plan, &vp, k, bias, c, parallel);
}

/// A linear layer's weights `w [n, k]` packed once as the lanes of the
/// product (`[n_pad / 32][k][32]`, zeros past `n`), so that a call
/// broadcasts its activation rows over them and copies no weights.
#[derive(Debug)]
pub(crate) struct LanesPacked {
    n: usize,
    k: usize,
    data: Vec<f32>,
}

impl LanesPacked {
    /// Pack the row-major `w [n, k]` (None when `w` is not `n * k` values).
    pub(crate) fn new(w: &[f32], n: usize, k: usize) -> Option<LanesPacked> {
        if n == 0 || k == 0 || w.len() != n.checked_mul(k)? {
            return None;
        }
        let v = Strided {
            data: w,
            off: 0,
            rs: 1,
            cs: k as isize,
        };
        Some(LanesPacked {
            n,
            k,
            data: pack_lanes(&v, k, n, true),
        })
    }

    /// Bytes held.
    pub(crate) fn size_bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }

    /// The plain row-major `[n, k]` values.
    pub(crate) fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.n * self.k];
        for (j, row) in w.chunks_exact_mut(self.k).enumerate() {
            let block = &self.data[(j / LANES) * self.k * LANES..];
            for (p, v) in row.iter_mut().enumerate() {
                *v = block[p * LANES + j % LANES];
            }
        }
        w
    }
}

/// `c [m, n] = x [m, k] @ w [n, k]^T (+ bias [n] on every row)` with `w`
/// packed ([`LanesPacked`]); the same bits as [`gemm()`] on the plain `w`.
pub(crate) fn linear_packed(
    m: usize,
    x: Strided<'_>,
    w: &LanesPacked,
    bias: Option<&[f32]>,
    c: &mut [f32],
    parallel: bool,
) {
    assert!(c.len() >= m * w.n && bias.is_none_or(|bs| bs.len() == w.n));
    if m == 0 {
        return;
    }
    let plan = Plan {
        s: x,
        rows: m,
        v: x,
        lanes: w.n,
        bias_on_rows: false,
        out_rs: w.n,
        out_ls: 1,
    };
    run_packed(isa(), &plan, &w.data, w.k, bias, c, parallel);
}

/// How a product's work is cut into tasks: row blocks (of whole panels)
/// times lane groups (of whole 32-lane blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Split {
    row_blocks: usize,
    groups: usize,
}

impl Split {
    /// Row blocks of at most [`MAX_BLOCK_PANELS`] panels, as many as a
    /// multiple of the thread count (as even as whole panels allow). A
    /// product of one row block (a few activation rows broadcast over
    /// packed weights) is cut along its lanes instead, into twice as many
    /// groups as threads, so that each thread gets a share.
    fn new(panels: usize, lane_blocks: usize, threads: usize) -> Split {
        let row_blocks = panels.div_ceil(MAX_BLOCK_PANELS).max(1);
        if threads <= 1 {
            return Split {
                row_blocks,
                groups: 1,
            };
        }
        if row_blocks == 1 && lane_blocks > 1 {
            return Split {
                row_blocks,
                groups: (2 * threads).min(lane_blocks),
            };
        }
        Split {
            row_blocks: (row_blocks.div_ceil(threads) * threads).min(panels),
            groups: 1,
        }
    }
}

/// `plan`'s product with its packed operand already in `vp`
/// (`[lanes_pad / 32][k][32]`, as [`pack_lanes`] makes it).
fn run_packed(
    isa: Isa,
    plan: &Plan<'_>,
    vp: &[f32],
    k: usize,
    bias: Option<&[f32]>,
    c: &mut [f32],
    parallel: bool,
) {
    let r = panel_rows(isa);
    let lanes = plan.lanes;
    assert!(vp.len() >= lanes.div_ceil(LANES) * k * LANES);
    let out = OutPtr(c.as_mut_ptr());
    let out_len = c.len();
    for_each_share(plan.rows, r, lanes, parallel, |sh| {
        let Share {
            p0,
            p1,
            r0,
            r1,
            lb0,
            lb1,
            l0,
            l1,
            lw,
        } = sh;
        // Sums of this task's rows and lanes, seeded.
        let mut ct = sh.seeded(r, bias.filter(|_| !plan.bias_on_rows));
        if let (Some(bs), true) = (bias, plan.bias_on_rows) {
            for (i, row) in ct.chunks_exact_mut(lw).enumerate() {
                if r0 + i < plan.rows {
                    row.fill(bs[r0 + i]);
                }
            }
        }
        let mut sp = vec![0f32; KC * r];
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            for pi in 0..p1 - p0 {
                let pr0 = r0 + pi * r;
                // This panel's slice, `[kc][r]`, zero rows past the end.
                let spk = &mut sp[..kc * r];
                for i in 0..r {
                    if pr0 + i >= plan.rows {
                        for d in spk.chunks_exact_mut(r) {
                            d[i] = 0.0;
                        }
                    } else if plan.s.cs == 1 {
                        let s0 = plan.s.at(pr0 + i, k0);
                        for (d, &x) in spk.chunks_exact_mut(r).zip(&plan.s.data[s0..s0 + kc]) {
                            d[i] = x;
                        }
                    } else {
                        for (p, d) in spk.chunks_exact_mut(r).enumerate() {
                            d[i] = plan.s.data[plan.s.at(pr0 + i, k0 + p)];
                        }
                    }
                }
                // The next panel slice's rows, fetched while this one
                // computes (a cold weight row is a short stream the
                // hardware prefetcher barely starts on).
                if pi + 1 < p1 - p0 {
                    fetch_slice(&plan.s, pr0 + r..(pr0 + 2 * r).min(plan.rows), k0, kc);
                } else if k0 + KC < k {
                    fetch_slice(
                        &plan.s,
                        r0..(r0 + r).min(plan.rows),
                        k0 + KC,
                        KC.min(k - k0 - KC),
                    );
                }
                let acc = &mut ct[pi * r * lw..(pi + 1) * r * lw];
                for lb in lb0..lb1 {
                    let vs = &vp[(lb * k + k0) * LANES..(lb * k + k0 + kc) * LANES];
                    let half = lanes - lb * LANES <= LANES / 2;
                    tile(
                        isa,
                        r,
                        &sp[..kc * r],
                        vs,
                        kc,
                        acc,
                        lw,
                        (lb - lb0) * LANES,
                        half,
                    );
                }
            }
        }
        // Write the valid rows and lanes out: rows r0..r1, lanes l0..l1
        // of the output (a row's lanes contiguous), or columns r0..r1 of
        // its rows l0..l1 (a transposed product).
        if plan.out_ls == 1 {
            sh.write_rows(&ct, out, plan.out_rs, out_len);
            return;
        }
        let o = out.get();
        let nr = r1.saturating_sub(r0);
        assert!(plan.out_rs == 1 && (l1 - 1) * plan.out_ls + r1 <= out_len);
        // In groups of 16 lanes: each row of ct gives one 64-byte read.
        for g0 in (l0..l1).step_by(16) {
            for l in g0..l1.min(g0 + 16) {
                // SAFETY: inside `c` (asserted); columns r0..r1 of rows
                // l0..l1 are this task's alone.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(o.add(l * plan.out_ls + r0), nr) };
                for (d, row) in dst.iter_mut().zip(ct.chunks_exact(lw)) {
                    *d = row[l - l0];
                }
            }
        }
    });
}

/// One task's share of a product: panels `p0..p1` of the broadcast rows
/// (rows `r0..r1`, the last panel cut at the rows' end) and 32-lane blocks
/// `lb0..lb1` (lanes `l0..l1`, `lw` wide in its sum buffer).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Share {
    pub p0: usize,
    pub p1: usize,
    pub r0: usize,
    pub r1: usize,
    pub lb0: usize,
    pub lb1: usize,
    pub l0: usize,
    pub l1: usize,
    pub lw: usize,
}

impl Share {
    /// The share's sum buffer for panels of `r` rows (`(p1 - p0) r` rows
    /// of `lw`), each row seeded with `bias`'s values of its lanes, or 0.
    pub(crate) fn seeded(&self, r: usize, bias: Option<&[f32]>) -> Vec<f32> {
        let mut ct = vec![0f32; (self.p1 - self.p0) * r * self.lw];
        if let Some(bs) = bias {
            for row in ct.chunks_exact_mut(self.lw) {
                row[..self.l1 - self.l0].copy_from_slice(&bs[self.l0..self.l1]);
            }
        }
        ct
    }

    /// The valid rows and lanes of the sum buffer `ct` into the output
    /// `out` (`len` values, row `i` at `i * rs`, its lanes contiguous).
    pub(crate) fn write_rows(&self, ct: &[f32], out: OutPtr, rs: usize, len: usize) {
        let (r0, r1, l0, l1) = (self.r0, self.r1, self.l0, self.l1);
        assert!(r1 > r0 && (r1 - 1) * rs + l1 <= len && ct.len() >= (r1 - r0) * self.lw);
        for i in 0..r1 - r0 {
            // SAFETY: inside the output (asserted); rows r0..r1 x lanes
            // l0..l1 are this share's alone.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(out.get().add((r0 + i) * rs + l0), l1 - l0)
            };
            dst.copy_from_slice(&ct[i * self.lw..i * self.lw + l1 - l0]);
        }
    }
}

/// Run `task` on every share of a product of `rows` broadcast rows (in
/// panels of `r`) and `lanes` lanes, cut by [`Split`] for rayon's threads
/// (`parallel`) or one; shares with no rows or lanes are skipped.
pub(crate) fn for_each_share(
    rows: usize,
    r: usize,
    lanes: usize,
    parallel: bool,
    task: impl Fn(Share) + Sync + Send,
) {
    let nlb = lanes.div_ceil(LANES);
    let panels = rows.div_ceil(r);
    let threads = if parallel {
        rayon::current_num_threads().max(1)
    } else {
        1
    };
    let split = Split::new(panels, nlb, threads);
    let run = |t: usize| {
        let (bi, g) = (t / split.groups, t % split.groups);
        let (p0, p1) = (
            bi * panels / split.row_blocks,
            (bi + 1) * panels / split.row_blocks,
        );
        let (lb0, lb1) = (g * nlb / split.groups, (g + 1) * nlb / split.groups);
        if p0 == p1 || lb0 == lb1 {
            return;
        }
        task(Share {
            p0,
            p1,
            r0: p0 * r,
            r1: (p1 * r).min(rows),
            lb0,
            lb1,
            l0: lb0 * LANES,
            l1: (lb1 * LANES).min(lanes),
            lw: (lb1 - lb0) * LANES,
        });
    };
    let tasks = split.row_blocks * split.groups;
    if tasks > 1 && parallel {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        (0..tasks).for_each(run);
    }
}

/// Prefetch steps `k0..k0 + kc` of rows `rows` of `s` into L2, when its
/// rows are contiguous along `k` (a linear layer's weights).
fn fetch_slice(s: &Strided<'_>, rows: std::ops::Range<usize>, k0: usize, kc: usize) {
    if s.cs != 1 || kc == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    for i in rows {
        let p = s.data.as_ptr().wrapping_add(s.at(i, k0));
        for off in (0..kc).step_by(16).chain([kc - 1]) {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
            // SAFETY: a prefetch never faults; the address is only a hint.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off) as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, rows, k0);
}

/// Accumulate `kc` steps into the `r x 32` tile at lane `l0` of `acc`
/// (row stride `ld`): `sp` is `[kc][r]`, `vs` `[kc][32]`. `half`: only the
/// first 16 lanes are wanted (the others are padding).
#[allow(clippy::too_many_arguments)]
fn tile(
    isa: Isa,
    r: usize,
    sp: &[f32],
    vs: &[f32],
    kc: usize,
    acc: &mut [f32],
    ld: usize,
    l0: usize,
    half: bool,
) {
    assert!(sp.len() >= kc * r && vs.len() >= kc * LANES);
    assert!(acc.len() >= (r - 1) * ld + l0 + LANES);
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 => {
            debug_assert_eq!(r, 14);
            let a = acc[l0..].as_mut_ptr();
            // SAFETY: AVX-512F was detected; the assertions above bound
            // every read of sp / vs and every access of the tile.
            unsafe {
                if half {
                    kern_avx512::<14, 1>(sp.as_ptr(), vs.as_ptr(), kc, a, ld);
                } else {
                    kern_avx512::<14, 2>(sp.as_ptr(), vs.as_ptr(), kc, a, ld);
                }
            }
            return;
        }
        Isa::Avx2 => {
            debug_assert_eq!(r, 6);
            // SAFETY: AVX2 and FMA were detected; as above, each call
            // covers 16 of the 32 lanes.
            unsafe {
                for h in 0..if half { 1 } else { 2 } {
                    let a = acc[l0 + 16 * h..].as_mut_ptr();
                    kern_avx2::<6>(sp.as_ptr(), vs.as_ptr().add(16 * h), kc, a, ld);
                }
            }
            return;
        }
        Isa::Portable => {}
    }
    let _ = half;
    for p in 0..kc {
        let v = &vs[p * LANES..(p + 1) * LANES];
        for i in 0..r {
            let s = sp[p * r + i];
            let row = &mut acc[i * ld + l0..i * ld + l0 + LANES];
            for (a, &x) in row.iter_mut().zip(v) {
                *a = s.mul_add(x, *a);
            }
        }
    }
}

/// `R x (16 V)` AVX-512 tile: per step `V` loads, `R` broadcasts, `R V` FMAs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kern_avx512<const R: usize, const V: usize>(
    sp: *const f32,
    vs: *const f32,
    kc: usize,
    acc: *mut f32,
    ld: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller bounds sp ([kc][R]), vs ([kc][32]) and the tile
    // (R rows of stride ld, 16 V lanes).
    unsafe {
        let mut a = [[_mm512_setzero_ps(); V]; R];
        for (i, row) in a.iter_mut().enumerate() {
            for (v, reg) in row.iter_mut().enumerate() {
                *reg = _mm512_loadu_ps(acc.add(i * ld + 16 * v));
            }
        }
        let mut s = sp;
        let mut x = vs;
        for _ in 0..kc {
            let mut b = [_mm512_setzero_ps(); V];
            for (v, bv) in b.iter_mut().enumerate() {
                *bv = _mm512_loadu_ps(x.add(16 * v));
            }
            for (i, row) in a.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*s.add(i));
                for (reg, bv) in row.iter_mut().zip(b) {
                    *reg = _mm512_fmadd_ps(w, bv, *reg);
                }
            }
            s = s.add(R);
            x = x.add(LANES);
        }
        for (i, row) in a.iter().enumerate() {
            for (v, reg) in row.iter().enumerate() {
                _mm512_storeu_ps(acc.add(i * ld + 16 * v), *reg);
            }
        }
    }
}

/// `R x 16` AVX2 tile (two vectors of 8): per step 2 loads, `R`
/// broadcasts, `2 R` FMAs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kern_avx2<const R: usize>(
    sp: *const f32,
    vs: *const f32,
    kc: usize,
    acc: *mut f32,
    ld: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: as for kern_avx512, over 16 lanes.
    unsafe {
        let mut a = [[_mm256_setzero_ps(); 2]; R];
        for (i, row) in a.iter_mut().enumerate() {
            for (v, reg) in row.iter_mut().enumerate() {
                *reg = _mm256_loadu_ps(acc.add(i * ld + 8 * v));
            }
        }
        let mut s = sp;
        let mut x = vs;
        for _ in 0..kc {
            let b = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8))];
            for (i, row) in a.iter_mut().enumerate() {
                let w = _mm256_set1_ps(*s.add(i));
                for (reg, bv) in row.iter_mut().zip(b) {
                    *reg = _mm256_fmadd_ps(w, bv, *reg);
                }
            }
            s = s.add(R);
            x = x.add(LANES);
        }
        for (i, row) in a.iter().enumerate() {
            for (v, reg) in row.iter().enumerate() {
                _mm256_storeu_ps(acc.add(i * ld + 8 * v), *reg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn isas() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2);
            }
            if std::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    /// Every path against an f64 loop, and bit-identical to each other, for
    /// odd shapes, both plans (k-contiguous b and not), strided a, bias,
    /// and more than one k slice.
    #[test]
    fn matches_f64_and_is_identical_across_isas() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (5, 3, 7),
            (33, 17, 300),
            (47, 45, 513),
            (64, 70, 31),
            (100, 29, 257),
        ] {
            let a = rand(m * k, 1);
            let bt = rand(n * k, 2); // [n, k]
            let bias = rand(n, 3);
            let b_nk: Vec<f32> = (0..k * n).map(|i| bt[(i % n) * k + i / n]).collect(); // [k, n]
            for (bi, use_bias) in [false, true].into_iter().enumerate() {
                let mut want = vec![0f64; m * n];
                for i in 0..m {
                    for j in 0..n {
                        let mut s = if use_bias { bias[j] as f64 } else { 0.0 };
                        for p in 0..k {
                            s += a[i * k + p] as f64 * bt[j * k + p] as f64;
                        }
                        want[i * n + j] = s;
                    }
                }
                let bs = use_bias.then_some(&bias[..]);
                let mut first: Option<Vec<f32>> = None;
                for isa in isas() {
                    for par in [false, true] {
                        // b as the transposed [n, k] (a linear layer) and as [k, n].
                        let bviews = [
                            Strided {
                                data: &bt,
                                off: 0,
                                rs: 1,
                                cs: k as isize,
                            },
                            Strided {
                                data: &b_nk,
                                off: 0,
                                rs: n as isize,
                                cs: 1,
                            },
                        ];
                        for (vi, bv) in bviews.into_iter().enumerate() {
                            let av = Strided {
                                data: &a,
                                off: 0,
                                rs: k as isize,
                                cs: 1,
                            };
                            let mut c = vec![f32::NAN; m * n];
                            gemm_with(isa, m, n, k, av, bv, bs, &mut c, par);
                            // The weights packed once: the in-place bits.
                            if vi == 0 {
                                let p = LanesPacked::new(&bt, n, k).expect("pack");
                                assert_eq!(p.unpack(), bt, "{m}x{n}x{k}: unpacked");
                                let mut cp = vec![f32::NAN; m * n];
                                linear_packed(m, av, &p, bs, &mut cp, par);
                                assert!(
                                    cp.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()),
                                    "{isa:?} {m}x{n}x{k} bias {bi}: packed bits differ"
                                );
                            }
                            for (idx, (&g, &w)) in c.iter().zip(&want).enumerate() {
                                let tol = 1e-5 * (k as f64).sqrt() * (1.0 + w.abs());
                                assert!(
                                    (g as f64 - w).abs() <= tol,
                                    "{isa:?} {m}x{n}x{k} bias {bi} view {vi} [{idx}]: {g} vs {w}"
                                );
                            }
                            // Same plan, same bits across ISAs and threads.
                            if vi == 0 {
                                match &first {
                                    None => first = Some(c),
                                    Some(f) => assert!(
                                        f.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()),
                                        "{isa:?} {m}x{n}x{k}: bits differ"
                                    ),
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Work is cut along the rows while they fill a block per thread, else
    /// along the lanes (two groups per thread, at most one per 32-lane
    /// block).
    #[test]
    fn split_cuts_lanes_only_for_one_row_block() {
        let s = |p, l, t| {
            let s = Split::new(p, l, t);
            (s.row_blocks, s.groups)
        };
        assert_eq!(s(74, 7, 2), (10, 1), "a linear's 1024 weight rows");
        assert_eq!(s(9, 48, 2), (2, 1));
        assert_eq!(s(5, 48, 2), (1, 4), "65 activation rows");
        assert_eq!(s(5, 3, 2), (1, 3));
        assert_eq!(s(5, 1, 2), (2, 1), "one lane block: cut the rows");
        assert_eq!(s(5, 48, 1), (1, 1), "one thread");
    }

    /// A transposed (column-major) left operand.
    #[test]
    fn strided_left_operand() {
        let (m, n, k) = (37, 21, 19);
        let at = rand(m * k, 4); // [k, m]
        let b = rand(k * n, 5); // [k, n]
        let mut c = vec![0f32; m * n];
        let av = Strided {
            data: &at,
            off: 0,
            rs: 1,
            cs: m as isize,
        };
        let bv = Strided {
            data: &b,
            off: 0,
            rs: n as isize,
            cs: 1,
        };
        gemm(m, n, k, av, bv, None, &mut c, true);
        for i in 0..m {
            for j in 0..n {
                let w: f64 = (0..k)
                    .map(|p| at[p * m + i] as f64 * b[p * n + j] as f64)
                    .sum();
                assert!((c[i * n + j] as f64 - w).abs() < 1e-4, "[{i},{j}]");
            }
        }
    }

    /// Timing of the DiT's and DINOv2's linear shapes against the `gemm`
    /// crate (`cargo test -p edgeflow-backends --lib sgemm::tests::timing
    /// -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn timing() {
        let shapes = [
            (200, 1024, 1024),
            (200, 2048, 1024),
            (200, 1024, 2048),
            (257, 768, 768),
            (257, 3072, 768),
            (257, 768, 3072),
            (400, 1024, 1024),
            (48, 1024, 1024),
            (24, 1024, 1024),
            (16, 1024, 1024),
            (8, 1024, 1024),
            (65, 384, 384),
            (65, 1536, 384),
            (65, 384, 1536),
            (65, 1152, 384),
            (257, 384, 384),
            (257, 1536, 384),
            (257, 384, 1536),
        ];
        let threads = rayon::current_num_threads();
        for &(m, n, k) in &shapes {
            let a = rand(m * k, 1);
            let w = rand(n * k, 2);
            let bias = rand(n, 3);
            let mut c = vec![0f32; m * n];
            let macs = (m * n * k) as f64;
            let ours = |c: &mut [f32]| {
                let av = Strided {
                    data: &a,
                    off: 0,
                    rs: k as isize,
                    cs: 1,
                };
                let bv = Strided {
                    data: &w,
                    off: 0,
                    rs: 1,
                    cs: k as isize,
                };
                gemm(m, n, k, av, bv, Some(&bias), c, true);
            };
            let theirs = |c: &mut [f32]| {
                for row in c.chunks_exact_mut(n) {
                    row.copy_from_slice(&bias);
                }
                // SAFETY: all strides and sizes within a, w, c.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        c.as_mut_ptr(),
                        1,
                        n as isize,
                        true,
                        a.as_ptr(),
                        1,
                        k as isize,
                        w.as_ptr(),
                        k as isize,
                        1,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::Rayon(threads),
                    );
                }
            };
            let time = |f: &dyn Fn(&mut [f32]), c: &mut [f32]| {
                let mut best = f64::INFINITY;
                for _ in 0..5 {
                    let t0 = std::time::Instant::now();
                    f(c);
                    best = best.min(t0.elapsed().as_secs_f64());
                }
                best
            };
            let (mut to, mut tt) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..6 {
                to = to.min(time(&ours, &mut c));
                tt = tt.min(time(&theirs, &mut c));
            }
            eprintln!(
                "{m:>4} x {n:>4} x {k:>4}: ours {:>7.1} us {:>6.1} GMAC/s | gemm crate {:>7.1} us {:>6.1} GMAC/s | {:.2}x",
                to * 1e6,
                macs / to / 1e9,
                tt * 1e6,
                macs / tt / 1e9,
                tt / to
            );
        }
    }
}
