//! The register-blocked output tile, one kernel body per instruction set.

use super::{Isa, TT};

/// Geometry a tile needs.
pub(super) struct Geo {
    /// Input channels of this sweep.
    pub(super) c_lo: usize,
    pub(super) c_hi: usize,
    pub(super) k: usize,
    /// Taps `lo..hi` of `0..k` to run (the others' weights are zero).
    pub(super) taps: (usize, usize),
    pub(super) dilation: usize,
    /// Length of one padded input row.
    pub(super) row: usize,
}

/// Add input channels `c_lo..c_hi` to one `N` x 48 output tile starting at
/// time `t0`, of which the first `cols` columns are output (AVX2 skips the
/// thirds past them: a 193-step output is 5 tiles, the last with 1).
pub(super) fn tile<const N: usize>(
    isa: Isa,
    g: &Geo,
    xp: &[f32],
    wb: &[f32],
    t0: usize,
    cols: usize,
    acc: &mut [[f32; TT]; N],
) {
    // Every index either kernel reads.
    assert!(g.c_lo < g.c_hi && g.c_hi * g.k * N <= wb.len());
    assert!(g.taps.0 <= g.taps.1 && g.taps.1 <= g.k);
    assert!((g.c_hi - 1) * g.row + t0 + (g.k - 1) * g.dilation + TT <= xp.len());
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 => {
            // SAFETY: AVX-512F was detected at run time; the assertions
            // above bound every read.
            unsafe { tile_avx512(g, xp, wb, t0, acc, 0) };
            return;
        }
        Isa::Avx2 => {
            // SAFETY: AVX2 and FMA were detected at run time; the assertions
            // above bound every read; each call covers a third of the tile.
            unsafe {
                for col in (0..cols.min(TT)).step_by(TT / 3) {
                    tile_avx2(g, xp, wb, t0, acc, col);
                }
            }
            return;
        }
        Isa::Portable => {}
    }
    let _ = isa;
    for c in g.c_lo..g.c_hi {
        for j in g.taps.0..g.taps.1 {
            let xs = &xp[c * g.row + t0 + j * g.dilation..][..TT];
            let ws = &wb[(c * g.k + j) * N..][..N];
            for (a, &wv) in acc.iter_mut().zip(ws) {
                for (av, &xv) in a.iter_mut().zip(xs) {
                    *av += wv * xv;
                }
            }
        }
    }
}

/// One register-blocked kernel body per instruction set: `N` output
/// channels x `$v` vectors of `$w` lanes starting at column `col` of the
/// tile, accumulating input channels `c_lo..c_hi` (`$v` loads and `N`
/// broadcasts per `$v N` FMAs).
///
/// AVX2 takes 6 x 2 where padding the output channels to a multiple of 6
/// costs at most 4 % (see `PackedWeights`), else 4 x 2. Six
/// rows give 12 accumulators, half again the 8 that just cover the FMA
/// latency of two pipes, so a late load no longer stalls both pipes, and
/// 2 input loads and 6 broadcasts feed 12 FMAs; with the 2 inputs and a
/// broadcast they use 15 of 16 registers. BigVGAN's 768 x 768 x 11
/// convolution over 250 steps went from 76-81 to 86 GFLOP/s on one Zen 3
/// thread (`conv_speed`, alternating builds), its 3-tap one from 68 to 75.
/// The 4 x 3 block (also 12 accumulators, but 3 inputs: all 16 registers)
/// made LLVM spill one and shuffle the rest through moves each step:
/// 40-43 GFLOP/s on a Zen 3 core in L1, against 94 for 4 x 2.
macro_rules! tile_kernel {
    ($name:ident, $feat:literal, $w:literal, $v:literal, $vec:ty, $load:ident, $store:ident, $set1:ident, $fma:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name<const N: usize>(
            g: &Geo,
            xp: &[f32],
            wb: &[f32],
            t0: usize,
            acc: &mut [[f32; TT]; N],
            col: usize,
        ) {
            use std::arch::x86_64::*;
            // SAFETY: the caller checked the CPU features; every pointer stays
            // inside `xp` / `wb` (see the assertions in `tile`) and `acc` is a
            // local array with `col + $v * $w <= TT`.
            unsafe {
                let mut a: [[$vec; $v]; N] = [[$set1(0.0); $v]; N];
                for (r, row) in a.iter_mut().enumerate() {
                    for (v, reg) in row.iter_mut().enumerate() {
                        *reg = $load(acc[r].as_ptr().add(col + v * $w));
                    }
                }
                let (j_lo, j_hi) = g.taps;
                // Row and weight pointers step per channel (no index
                // arithmetic inside the channel loop).
                let mut xc = xp
                    .as_ptr()
                    .add(g.c_lo * g.row + t0 + col + j_lo * g.dilation);
                let mut wc = wb.as_ptr().add((g.c_lo * g.k + j_lo) * N);
                for _ in g.c_lo..g.c_hi {
                    let mut xr = xc;
                    let mut wq = wc;
                    xc = xc.wrapping_add(g.row);
                    wc = wc.wrapping_add(g.k * N);
                    for _ in j_lo..j_hi {
                        let mut x = [$set1(0.0); $v];
                        for (i, xv) in x.iter_mut().enumerate() {
                            *xv = $load(xr.add(i * $w));
                        }
                        for (r, row) in a.iter_mut().enumerate() {
                            let wv = $set1(*wq.add(r));
                            for (reg, xv) in row.iter_mut().zip(x) {
                                *reg = $fma(wv, xv, *reg);
                            }
                        }
                        xr = xr.add(g.dilation);
                        wq = wq.add(N);
                    }
                }
                for (r, row) in a.iter().enumerate() {
                    for (v, reg) in row.iter().enumerate() {
                        $store(acc[r].as_mut_ptr().add(col + v * $w), *reg);
                    }
                }
            }
        }
    };
}

tile_kernel!(
    tile_avx2,
    "avx2,fma",
    8,
    2,
    __m256,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps
);
tile_kernel!(
    tile_avx512,
    "avx512f",
    16,
    3,
    __m512,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps
);
