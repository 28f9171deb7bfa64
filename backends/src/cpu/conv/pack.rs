//! Convolution weights repacked into the kernel's output-channel blocks.

use super::{isa, Isa};
use rayon::prelude::*;

/// Weights `[c_out, c_in, k]` repacked for the kernel of one instruction
/// set: `[c_out / n][c_in][k][n]` in output-channel blocks of `n` (zero
/// rows pad `c_out` to a multiple of `n`). Packing costs a pass over the
/// weights, so callers that convolve with the same weights again keep it.
#[derive(Debug)]
pub(crate) struct PackedWeights {
    pub(super) isa: Isa,
    pub(super) n: usize,
    pub(super) c_out: usize,
    pub(super) c_in: usize,
    pub(super) k: usize,
    /// Output phases the rows are ordered for (see [`Fused::phases`]).
    pub(super) phases: usize,
    pub(super) data: Vec<f32>,
    /// Per block, the taps `lo..hi` outside which all its weights are
    /// zero (a transposed convolution's phases use 2 of 3): the kernel
    /// skips the rest.
    pub(super) taps: Vec<(usize, usize)>,
}

impl PackedWeights {
    /// Pack `w` as `[c_out, c_in, k]` for this machine and an output of
    /// `phases` interleaved phases (1: none); None when a size is zero,
    /// `phases` does not divide `c_out` or `w` does not match.
    pub(crate) fn new(
        c_out: usize,
        c_in: usize,
        k: usize,
        w: &[f32],
        phases: usize,
    ) -> Option<Self> {
        Self::on(isa(), c_out, c_in, k, w, phases)
    }

    pub(super) fn on(
        isa: Isa,
        c_out: usize,
        c_in: usize,
        k: usize,
        w: &[f32],
        phases: usize,
    ) -> Option<Self> {
        let phases = phases.max(1);
        if c_out == 0
            || c_in == 0
            || k == 0
            || w.len() != c_out * c_in * k
            || !c_out.is_multiple_of(phases)
        {
            return None;
        }
        // AVX-512's 32 registers hold 8 output channels x 3 vectors; AVX2's
        // 16 hold 6 x 2 where the zero rows that pad c_out to a multiple of
        // 6 add at most 4 % (every width from 48 up; 32 would add 12.5 %),
        // the other paths 4 x 2. A single output channel (a vocoder's last
        // layer) takes blocks of 1 rather than computing zero rows.
        let n = if c_out == 1 {
            1
        } else if isa == Isa::Avx512 && c_out > 4 {
            8
        } else if isa == Isa::Avx2 && c_out.div_ceil(6) * 6 * 25 <= c_out * 26 {
            6
        } else {
            4
        };
        let blocks = c_out.div_ceil(n);
        let per_block = c_in * k * n;
        let mut data = vec![0f32; blocks * per_block];
        let pack = |blk: usize, dst: &mut [f32]| {
            for r in 0..n.min(c_out - blk * n) {
                let ch = source_channel(blk * n + r, c_out, phases);
                let src = &w[ch * c_in * k..][..c_in * k];
                for (i, &v) in src.iter().enumerate() {
                    dst[i * n + r] = v;
                }
            }
        };
        if data.len() * 4 > 1 << 20 {
            data.par_chunks_mut(per_block)
                .enumerate()
                .for_each(|(blk, dst)| pack(blk, dst));
        } else {
            for (blk, dst) in data.chunks_mut(per_block).enumerate() {
                pack(blk, dst);
            }
        }
        let taps = data
            .chunks(per_block)
            .map(|blk| {
                let used = |j: &usize| {
                    (0..c_in).any(|c| blk[(c * k + j) * n..][..n].iter().any(|&v| v != 0.0))
                };
                let lo = (0..k).find(used).unwrap_or(0);
                let hi = (lo..k).rev().find(used).map_or(lo, |j| j + 1);
                (lo, hi)
            })
            .collect();
        Some(PackedWeights {
            isa,
            n,
            c_out,
            c_in,
            k,
            phases,
            data,
            taps,
        })
    }

    /// Bytes held.
    pub(crate) fn size_bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }
}

/// The weight row (output channel `p * c + o`, `c = c_out / phases`) that
/// packed row `q` holds: with phases the rows are ordered `q = o * phases +
/// p`, so a block's rows land next to each other in the interleaved output.
pub(super) fn source_channel(q: usize, c_out: usize, phases: usize) -> usize {
    if phases > 1 {
        (q % phases) * (c_out / phases) + q / phases
    } else {
        q
    }
}
