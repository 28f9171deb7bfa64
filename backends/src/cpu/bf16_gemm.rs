//! `y = x W^T (+ b)` for bf16 linear-layer weights on CPUs with
//! AVX512_BF16 (AMD Zen 4 and later, Intel Cooper Lake, Sapphire Rapids
//! and later): the weights packed once in the layout of the bf16
//! dot-product instruction, the activations rounded to bf16 per call, the
//! products summed in f32.
//!
//! ## Why
//! A bf16 checkpoint (Qwen2.5-Omni ships its token2wav DiT in bf16) used to
//! run its linear layers on the CPU by widening the whole weight matrix to
//! f32 on every call, then a f32 GEMM: a copy of the weights per call and
//! twice their bytes streamed. `vdpbf16ps` multiplies two pairs of bf16
//! values per f32 lane, twice the multiply-adds of a f32 FMA per
//! instruction: on two Zen 4 cores a `14 x 32` tile ran about 2x the
//! multiply-adds per second of the f32 tile of [`super::sgemm`], with the
//! weights at half the bytes.
//!
//! ## Arithmetic
//! The weights are used as stored (exact). Each activation is rounded to
//! the nearest bf16 (ties to even), as in a model run in bf16; the product
//! of two bf16 values is exact in f32 and every output is its seed (the
//! bias or 0) plus one dot product of two pairs per pair of `k`, summed in
//! f32 (`k` padded to even with a zero). Against f32 arithmetic on the same
//! weights the difference is that of the rounded activations, a relative
//! 2^-9 per value at most (the test bounds it). The instruction treats
//! denormal inputs and results as zero; the portable path (CPUs without
//! the instruction, used by the tests) keeps them, which is a difference
//! below 1e-38.
//!
//! ## Layout and blocking
//! [`PairsPacked`] is `[n_pad / 32][k_pad / 2][32]` u32, each u32 the pair
//! `(w[j][2p], w[j][2p + 1])` of output `j`, so one 64-byte load gives 16
//! outputs' pair for one step. The activations become `[m][k_pad / 2]`
//! pairs once per call; a task copies a panel's slice of them (`R` rows, R =
//! 14, or 1 / 2 / 4 / 8 for fewer rows) into a small `[slice][R]` buffer and
//! runs it over every 32-lane block of the weights' slice: per pair of `k`,
//! 2 loads, `R` broadcasts and `2 R` dot products into `2 R` accumulators.
//! Tasks are cut as [`super::sgemm`]'s ([`for_each_share`]: row blocks,
//! or lane groups for a single row block).

use super::sgemm::{for_each_share, OutPtr, Share};
use half::bf16;
use rayon::prelude::*;
use std::sync::OnceLock;

/// Outputs per packed block (two AVX-512 vectors of 16 f32 lanes).
const LANES: usize = 32;
/// Pairs of `k` per slice (512 bytes of a panel row, 4 KB of each block).
const SLICE: usize = 128;
/// Rows of a full panel.
const R_FULL: usize = 14;

/// Whether this CPU has the bf16 dot product (AVX-512F and AVX512_BF16).
pub(crate) fn available() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// `(lo, hi)` as one u32 of two bf16 values, `lo` in the low half.
#[inline(always)]
fn pair(lo: bf16, hi: bf16) -> u32 {
    lo.to_bits() as u32 | (hi.to_bits() as u32) << 16
}

/// The two values of a pair, widened (exactly) to f32.
#[inline(always)]
fn halves(p: u32) -> (f32, f32) {
    (f32::from_bits(p << 16), f32::from_bits(p & 0xffff_0000))
}

/// Linear weights `w [n, k]` (bf16) packed once in pairs of `k` as the
/// lanes of the product (`[n_pad / 32][k_pad / 2][32]`, zeros in the
/// padding).
#[derive(Debug)]
pub(crate) struct PairsPacked {
    n: usize,
    k: usize,
    data: Vec<u32>,
}

impl PairsPacked {
    /// Pack the row-major `w [n, k]` (None when `w` is not `n * k` values).
    pub(crate) fn new(w: &[bf16], n: usize, k: usize) -> Option<PairsPacked> {
        if n == 0 || k == 0 || w.len() != n.checked_mul(k)? {
            return None;
        }
        let kp = k.div_ceil(2);
        let mut data = vec![0u32; n.div_ceil(LANES) * kp * LANES];
        data.par_chunks_mut(kp * LANES)
            .enumerate()
            .for_each(|(lb, block)| {
                for (l, row) in w[lb * LANES * k..].chunks(k).take(LANES).enumerate() {
                    for (p, two) in row.chunks(2).enumerate() {
                        block[p * LANES + l] =
                            pair(two[0], two.get(1).copied().unwrap_or(bf16::ZERO));
                    }
                }
            });
        Some(PairsPacked { n, k, data })
    }

    /// Bytes held.
    pub(crate) fn size_bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<u32>()
    }

    /// The plain row-major `[n, k]` values.
    pub(crate) fn unpack(&self) -> Vec<bf16> {
        let kp = self.k.div_ceil(2);
        let mut w = vec![bf16::ZERO; self.n * self.k];
        for (j, row) in w.chunks_exact_mut(self.k).enumerate() {
            let block = &self.data[(j / LANES) * kp * LANES..];
            for (i, v) in row.iter_mut().enumerate() {
                let p = block[(i / 2) * LANES + j % LANES];
                *v = bf16::from_bits(if i % 2 == 0 {
                    p as u16
                } else {
                    (p >> 16) as u16
                });
            }
        }
        w
    }
}

/// Panel rows for a product of `m` rows: 14, or the fewest of 1, 2, 4, 8
/// that hold `m`.
fn panel_rows(m: usize) -> usize {
    match m {
        0..=1 => 1,
        2 => 2,
        3..=4 => 4,
        5..=8 => 8,
        _ => R_FULL,
    }
}

/// `c [m, n] = x [m, k] @ w^T (+ bias [n] on every row)`, `x` row-major
/// and contiguous, `c` written whole. `parallel`: split over rayon's pool.
pub(crate) fn linear(
    m: usize,
    x: &[f32],
    w: &PairsPacked,
    bias: Option<&[f32]>,
    c: &mut [f32],
    parallel: bool,
) {
    linear_with(available(), m, x, w, bias, c, parallel);
}

/// [`linear`] on the instruction (`fast`, where [`available`]) or on the
/// portable path.
fn linear_with(
    fast: bool,
    m: usize,
    x: &[f32],
    w: &PairsPacked,
    bias: Option<&[f32]>,
    c: &mut [f32],
    parallel: bool,
) {
    let fast = fast && available();
    let (n, k) = (w.n, w.k);
    assert!(x.len() >= m * k && c.len() >= m * n && bias.is_none_or(|b| b.len() == n));
    if m == 0 {
        return;
    }
    let kp = k.div_ceil(2);
    // The activations as bf16 pairs, `[m][kp]`.
    let mut xp = vec![0u32; m * kp];
    for (dst, row) in xp.chunks_exact_mut(kp).zip(x.chunks_exact(k)) {
        to_pairs(fast, row, dst);
    }
    let r = panel_rows(m);
    let out = OutPtr(c.as_mut_ptr());
    let out_len = c.len();
    for_each_share(m, r, n, parallel, |sh| {
        let Share {
            p0,
            p1,
            r0,
            lb0,
            lb1,
            lw,
            ..
        } = sh;
        // Sums of this task's rows and lanes, seeded.
        let mut ct = sh.seeded(r, bias);
        let mut sp = vec![0u32; SLICE * r];
        for q0 in (0..kp).step_by(SLICE) {
            let qc = SLICE.min(kp - q0);
            for pi in 0..p1 - p0 {
                let pr0 = r0 + pi * r;
                // This panel's slice, `[qc][r]`, zero rows past the end.
                let spq = &mut sp[..qc * r];
                for i in 0..r {
                    if pr0 + i >= m {
                        spq.chunks_exact_mut(r).for_each(|d| d[i] = 0);
                    } else {
                        let src = &xp[(pr0 + i) * kp + q0..(pr0 + i) * kp + q0 + qc];
                        for (d, &v) in spq.chunks_exact_mut(r).zip(src) {
                            d[i] = v;
                        }
                    }
                }
                let acc = &mut ct[pi * r * lw..(pi + 1) * r * lw];
                for lb in lb0..lb1 {
                    let vs = &w.data[(lb * kp + q0) * LANES..(lb * kp + q0 + qc) * LANES];
                    let half = n - lb * LANES <= LANES / 2;
                    tile(fast, r, spq, vs, qc, acc, lw, (lb - lb0) * LANES, half);
                }
            }
        }
        sh.write_rows(&ct, out, n, out_len);
    });
}

/// `row` rounded to bf16 (to nearest, ties to even) as pairs into `dst`
/// (`row.len().div_ceil(2)` values, a zero after an odd count). `fast`: 16
/// at a time on the instruction (the caller checked [`available`]), which
/// flushes denormal inputs to zero.
fn to_pairs(fast: bool, row: &[f32], dst: &mut [u32]) {
    assert!(dst.len() >= row.len().div_ceil(2));
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if fast {
        done = row.len() / 16 * 16;
        // SAFETY: the instruction set was checked; 16 values are read from
        // row[i..i + 16] (i + 16 <= done <= len) and 8 pairs written to
        // dst[i / 2..i / 2 + 8] (asserted above).
        unsafe { to_pairs_avx512(row.as_ptr(), dst.as_mut_ptr(), done) };
    }
    for (d, two) in dst[done / 2..].iter_mut().zip(row[done..].chunks(2)) {
        let hi = two.get(1).copied().unwrap_or(0.0);
        *d = pair(bf16::from_f32(two[0]), bf16::from_f32(hi));
    }
}

/// The first `len` (a multiple of 16) values of `row` as bf16 pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn to_pairs_avx512(row: *const f32, dst: *mut u32, len: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller bounds row[..len] and dst[..len / 2].
    unsafe {
        for i in (0..len).step_by(16) {
            let h = _mm512_cvtneps_pbh(_mm512_loadu_ps(row.add(i)));
            let h = std::mem::transmute::<__m256bh, __m256i>(h);
            _mm256_storeu_si256(dst.add(i / 2) as *mut __m256i, h);
        }
    }
}

/// Accumulate `qc` pairs of `k` into the `r x 32` tile at lane `l0` of
/// `acc` (row stride `ld`): `sp` is `[qc][r]` pairs, `vs` `[qc][32]`.
/// `half`: only the first 16 lanes are wanted (the others are padding).
/// `fast`: on the instruction (the caller checked [`available`]).
#[allow(clippy::too_many_arguments)]
fn tile(
    fast: bool,
    r: usize,
    sp: &[u32],
    vs: &[u32],
    qc: usize,
    acc: &mut [f32],
    ld: usize,
    l0: usize,
    half: bool,
) {
    assert!(sp.len() >= qc * r && vs.len() >= qc * LANES);
    assert!(acc.len() >= (r - 1) * ld + l0 + LANES);
    #[cfg(target_arch = "x86_64")]
    if fast {
        let (s, v, a) = (sp.as_ptr(), vs.as_ptr(), acc[l0..].as_mut_ptr());
        // SAFETY: AVX-512F and AVX512_BF16 were detected; the assertions
        // above bound every read of sp / vs and every access of the tile.
        unsafe {
            match (r, half) {
                (1, false) => kern::<1, 2>(s, v, qc, a, ld),
                (1, true) => kern::<1, 1>(s, v, qc, a, ld),
                (2, false) => kern::<2, 2>(s, v, qc, a, ld),
                (2, true) => kern::<2, 1>(s, v, qc, a, ld),
                (4, false) => kern::<4, 2>(s, v, qc, a, ld),
                (4, true) => kern::<4, 1>(s, v, qc, a, ld),
                (8, false) => kern::<8, 2>(s, v, qc, a, ld),
                (8, true) => kern::<8, 1>(s, v, qc, a, ld),
                (_, false) => kern::<R_FULL, 2>(s, v, qc, a, ld),
                (_, true) => kern::<R_FULL, 1>(s, v, qc, a, ld),
            }
        }
        return;
    }
    let _ = half;
    for p in 0..qc {
        let v = &vs[p * LANES..(p + 1) * LANES];
        for i in 0..r {
            let (xlo, xhi) = halves(sp[p * r + i]);
            let row = &mut acc[i * ld + l0..i * ld + l0 + LANES];
            for (a, &wp) in row.iter_mut().zip(v) {
                let (wlo, whi) = halves(wp);
                *a = xlo.mul_add(wlo, xhi.mul_add(whi, *a));
            }
        }
    }
}

/// `R x (16 V)` tile: per pair of `k`, `V` loads, `R` broadcasts, `R V`
/// bf16 dot products.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kern<const R: usize, const V: usize>(
    sp: *const u32,
    vs: *const u32,
    qc: usize,
    acc: *mut f32,
    ld: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller bounds sp ([qc][R]), vs ([qc][32]) and the tile
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
        for _ in 0..qc {
            let mut b = [_mm512_setzero_si512(); V];
            for (v, bv) in b.iter_mut().enumerate() {
                *bv = _mm512_loadu_si512(x.add(16 * v) as *const __m512i);
            }
            for (i, row) in a.iter_mut().enumerate() {
                let w = _mm512_set1_epi32(*s.add(i) as i32);
                let w = std::mem::transmute::<__m512i, __m512bh>(w);
                for (reg, bv) in row.iter_mut().zip(b) {
                    let bv = std::mem::transmute::<__m512i, __m512bh>(bv);
                    *reg = _mm512_dpbf16_ps(*reg, w, bv);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Every shape class (1, 2, 3, 5, 9, 14, 31 rows; odd `k`; `n` with a
    /// half block and with several blocks; one and two threads; the
    /// instruction where the CPU has it, and the portable path): each
    /// output within `2^-8` of the sum of absolute products of the f64
    /// product of the f32 activations and the bf16 weights (the rounding of
    /// each activation to bf16, 2^-9 relative, plus f32 sums), and within
    /// f32 rounding of the f64 product of the rounded activations. The
    /// pack round-trips.
    #[test]
    fn matches_f64_on_rounded_activations() {
        for &(m, n, k) in &[
            (1, 40, 33),
            (2, 64, 300),
            (3, 16, 7),
            (5, 97, 256),
            (9, 32, 257),
            (14, 48, 64),
            (31, 200, 129),
        ] {
            let x = rand(m * k, (m * 31 + k) as u64);
            let w: Vec<bf16> = rand(n * k, (n * 17 + k) as u64)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            let bias = rand(n, 5);
            let pack = PairsPacked::new(&w, n, k).expect("pack");
            assert_eq!(pack.unpack(), w);
            for (fast, parallel) in [(false, false), (false, true), (true, false), (true, true)] {
                let mut c = vec![f32::NAN; m * n];
                linear_with(fast, m, &x, &pack, Some(&bias), &mut c, parallel);
                for i in 0..m {
                    for j in 0..n {
                        let (mut exact, mut rounded, mut abs) =
                            (bias[j] as f64, bias[j] as f64, bias[j].abs() as f64);
                        for p in 0..k {
                            let wv = w[j * k + p].to_f64();
                            exact += x[i * k + p] as f64 * wv;
                            rounded += bf16::from_f32(x[i * k + p]).to_f64() * wv;
                            abs += (x[i * k + p] as f64 * wv).abs();
                        }
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - exact).abs() <= abs / 256.0,
                            "{m}x{n}x{k} ({i},{j}): {got} vs {exact}"
                        );
                        assert!(
                            (got - rounded).abs() <= abs * 1e-5,
                            "{m}x{n}x{k} ({i},{j}): {got} vs {rounded}"
                        );
                    }
                }
            }
        }
        assert!(PairsPacked::new(&[bf16::ONE; 5], 2, 3).is_none());
    }

    /// The DiT's linear shapes on bf16 weights against the f32 GEMM on the
    /// same weights packed (`cargo test -p edgeflow-backends --lib
    /// bf16_gemm::tests::timing -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn timing() {
        use crate::cpu::sgemm::{linear_packed, LanesPacked, Strided};
        for &(m, n, k) in &[
            (96, 1024, 1024),
            (96, 2048, 1024),
            (96, 1024, 2048),
            (200, 1024, 1024),
            (1, 1024, 1024),
        ] {
            let x = rand(m * k, 1);
            let w32: Vec<f32> = rand(n * k, 2);
            let w: Vec<bf16> = w32.iter().copied().map(bf16::from_f32).collect();
            let wide: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
            let (pb, pf) = (
                PairsPacked::new(&w, n, k).expect("pack"),
                LanesPacked::new(&wide, n, k).expect("pack"),
            );
            let mut c = vec![0f32; m * n];
            let xv = Strided {
                data: &x,
                off: 0,
                rs: k as isize,
                cs: 1,
            };
            let best = |f: &mut dyn FnMut()| {
                (0..20)
                    .map(|_| {
                        let t0 = std::time::Instant::now();
                        f();
                        t0.elapsed().as_secs_f64()
                    })
                    .fold(f64::INFINITY, f64::min)
            };
            let (mut tb, mut tf) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..3 {
                tb = tb.min(best(&mut || linear(m, &x, &pb, None, &mut c, true)));
                tf = tf.min(best(&mut || linear_packed(m, xv, &pf, None, &mut c, true)));
            }
            // Cold: round-robin over copies that do not fit in the cache
            // together (a model's layers in turn).
            let copies = (96 << 20) / (n * k * 4);
            let pbs: Vec<PairsPacked> = (0..copies)
                .map(|_| PairsPacked::new(&w, n, k).expect("pack"))
                .collect();
            let pfs: Vec<LanesPacked> = (0..copies)
                .map(|_| LanesPacked::new(&wide, n, k).expect("pack"))
                .collect();
            let (mut cb, mut cf) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..3 {
                let t0 = std::time::Instant::now();
                pbs.iter()
                    .for_each(|p| linear(m, &x, p, None, &mut c, true));
                cb = cb.min(t0.elapsed().as_secs_f64() / copies as f64);
                let t0 = std::time::Instant::now();
                pfs.iter()
                    .for_each(|p| linear_packed(m, xv, p, None, &mut c, true));
                cf = cf.min(t0.elapsed().as_secs_f64() / copies as f64);
            }
            let macs = (m * n * k) as f64;
            eprintln!(
                "{m:>4} x {n:>4} x {k:>4}: bf16 {:>7.1} us {:>6.1} GMAC/s | f32 {:>7.1} us {:>6.1} GMAC/s | {:.2}x; cold: bf16 {:>7.1} us | f32 {:>7.1} us | {:.2}x",
                tb * 1e6,
                macs / tb / 1e9,
                tf * 1e6,
                macs / tf / 1e9,
                tf / tb,
                cb * 1e6,
                cf * 1e6,
                cf / cb
            );
        }
    }
}
