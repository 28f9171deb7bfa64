//! The tile layout the 256-bit decode kernels stream fastest ([`pack`]),
//! and reading GGML's bytes back out of it.

use super::{Isa, WeightFormat};
/// Weight rows per tile of the packed layout ([`pack`]).
pub(crate) const PACK_ROWS: usize = 4;

/// Whether this machine's kernels read `fmt` in [`pack`]'s layout:
/// Q8_0 / Q4_0 / Q4_1 where the 256-bit int8 kernels run (AVX2, AVX-VNNI,
/// AVX-512 VNNI on 256-bit registers); Q5_0 on plain AVX2, whose prefill
/// lane kernel ([`super::lanes`]) unpacks each packed row once. (On the
/// VNNI instances Q5_0's prefill runs the 4 x 2 tile kernel from GGML's
/// layout, which expands each block's fifth bits once for four activation
/// rows; read packed, it would expand them once per row.)
/// The 512-bit kernels gather a step's blocks with their own permutes and
/// read GGML's layout; portable code has no use for it.
pub(crate) fn packs(fmt: WeightFormat) -> bool {
    packs_on(fmt, Isa::detect())
}

pub(super) fn packs_on(fmt: WeightFormat, isa: Isa) -> bool {
    match fmt {
        WeightFormat::F32 => false,
        WeightFormat::Q5_0 => isa == Isa::Avx2,
        _ => matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni),
    }
}

/// Where a block keeps its quants (after `d`, and `m` for Q4_1, or
/// Q5_0's 4 bytes of fifth bits).
fn quant_offset(fmt: WeightFormat) -> usize {
    match fmt {
        WeightFormat::Q4_1 => 4,
        WeightFormat::Q5_0 => 6,
        _ => 2,
    }
}

/// Bytes of fifth bits per block (Q5_0's, at byte 2 of its block).
fn high_bits(fmt: WeightFormat) -> usize {
    if fmt == WeightFormat::Q5_0 {
        4
    } else {
        0
    }
}

/// Whether `len` bytes are `n` rows of `k` values of a format with a
/// packed layout ([`pack`]).
fn fits(fmt: WeightFormat, len: usize, n: usize, k: usize) -> bool {
    fmt != WeightFormat::F32 && k > 0 && k.is_multiple_of(32) && len == n * fmt.row_bytes(k)
}

/// The byte moves between GGML's row-major blocks and the packed tile
/// layout ([`pack`]): `f(ggml_offset, packed_offset, len)` for every run of
/// bytes that moves, covering both buffers once. None when the format has
/// no packed layout or the sizes do not fit.
fn pack_moves(
    fmt: WeightFormat,
    len: usize,
    n: usize,
    k: usize,
    mut f: impl FnMut(usize, usize, usize),
) -> Option<()> {
    if !fits(fmt, len, n, k) {
        return None;
    }
    for t in 0..n / PACK_ROWS {
        tile_moves(fmt, k, t, &mut f);
    }
    let tail = n / PACK_ROWS * PACK_ROWS * fmt.row_bytes(k);
    f(tail, tail, len - tail);
    Some(())
}

/// [`pack_moves`] of tile `t` (rows `4t..4t + 4`), a span of the same
/// bytes in both layouts.
fn tile_moves(fmt: WeightFormat, k: usize, t: usize, f: &mut impl FnMut(usize, usize, usize)) {
    let (bb, nb) = (fmt.row_bytes(32), k / 32);
    let rb = nb * bb;
    let off = quant_offset(fmt);
    // 16-byte runs of a block's quants: one of nibbles, or Q8_0's two
    // halves (stored half by half over the group's blocks: the activation
    // pair layout).
    let halves: &[usize] = if fmt == WeightFormat::Q8_0 {
        &[0, 16]
    } else {
        &[0]
    };
    // The f16 fields of a block: `d`, and `m` for Q4_1.
    let fields: &[usize] = if fmt == WeightFormat::Q4_1 {
        &[0, 2]
    } else {
        &[0]
    };
    let qh = high_bits(fmt);
    let mut o = t * PACK_ROWS * rb;
    let at = |r: usize, b: usize| (t * PACK_ROWS + r) * rb + b * bb;
    let mut group = |blocks: &[usize]| {
        for r in 0..PACK_ROWS {
            for &h in halves {
                for &b in blocks {
                    f(at(r, b) + off + h, o, 16);
                    o += 16;
                }
            }
        }
        if qh > 0 {
            for r in 0..PACK_ROWS {
                for &b in blocks {
                    f(at(r, b) + 2, o, qh);
                    o += qh;
                }
            }
        }
        for &field in fields {
            for &b in blocks {
                for r in 0..PACK_ROWS {
                    f(at(r, b) + field, o, 2);
                    o += 2;
                }
            }
        }
    };
    for p in 0..nb / 2 {
        group(&[2 * p, 2 * p + 1]);
    }
    if nb % 2 == 1 {
        group(&[nb - 1]);
    }
}

/// GGML Q4_0 / Q4_1 / Q5_0 / Q8_0 weights (`n` rows of `k` values, as the
/// file stores them) in the layout the 256-bit decode kernels stream
/// fastest. Rows go in tiles of [`PACK_ROWS`]; a tile holds, for each pair
/// of blocks `2p, 2p + 1`: each of its 4 rows' quants of the pair in the
/// activation pair layout (Q4 / Q5: the 16 nibble bytes of block `2p`,
/// then of `2p + 1`: one 32-byte load; Q8_0: `A[0..16] B[0..16] A[16..32]
/// B[16..32]`: two), then for Q5_0 each row's 4 + 4 bytes of fifth bits
/// (blocks `2p`, `2p + 1`: one 8-byte load), then the 8 f16 scales `d`
/// (block `2p` of rows 0-3, then block `2p + 1`), then for Q4_1 the 8
/// minimums `m` in the same order; an odd last block follows as each
/// row's quants in element order, each row's fifth bits (Q5_0), 4 `d`
/// (and 4 `m`). A tile is exactly its 4 rows' bytes, so row `j` of a whole tile
/// still starts its tile's span at `j * row_bytes`; rows after the last
/// whole tile stay in GGML's layout.
///
/// Why: in GGML's layout a tile's scales sit in 8 places per pair of
/// blocks, and gathering them cost as much as the dot products
/// (Q4_1 1 x 896 x 4864 on AVX2, Zen 3: 0.67x the time in cache, 0.75x
/// streamed from DRAM with the scales side by side).
///
/// Tiles are packed on the worker threads, about 1 MB each at a time: a
/// model's largest matrix (a 150 K-token vocabulary's output head, 144 MB
/// in Q8_0) took a third of its load in this copy on one thread.
pub(crate) fn pack(fmt: WeightFormat, w: &[u8], n: usize, k: usize) -> Option<Vec<u8>> {
    use rayon::prelude::*;
    if !fits(fmt, w.len(), n, k) {
        return None;
    }
    let mut out = vec![0u8; w.len()];
    let tile = PACK_ROWS * fmt.row_bytes(k);
    let whole = n / PACK_ROWS * tile;
    let per = (1 << 20) / tile + 1;
    let (tiles, tail) = out.split_at_mut(whole);
    tiles
        .par_chunks_mut(per * tile)
        .enumerate()
        .for_each(|(c, dst)| {
            let base = c * per * tile;
            for t in c * per..c * per + dst.len() / tile {
                tile_moves(fmt, k, t, &mut |g, p, len| {
                    dst[p - base..p - base + len].copy_from_slice(&w[g..g + len])
                });
            }
        });
    tail.copy_from_slice(&w[whole..]);
    Some(out)
}

/// GGML's layout back from [`pack`]'s.
pub(crate) fn unpack(fmt: WeightFormat, packed: &[u8], n: usize, k: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; packed.len()];
    pack_moves(fmt, packed.len(), n, k, |g, p, len| {
        out[g..g + len].copy_from_slice(&packed[p..p + len])
    })?;
    Some(out)
}

/// GGML's bytes of rows `ids` of [`pack`]ed weights (an embedding lookup
/// in a packed matrix), read in place. None when the sizes do not fit or an
/// id is out of range.
pub(crate) fn packed_rows(
    fmt: WeightFormat,
    packed: &[u8],
    n: usize,
    k: usize,
    ids: &[usize],
) -> Option<Vec<u8>> {
    if fmt == WeightFormat::F32
        || k == 0
        || !k.is_multiple_of(32)
        || packed.len() != n * fmt.row_bytes(k)
    {
        return None;
    }
    let (bb, nb) = (fmt.row_bytes(32), k / 32);
    let rb = nb * bb;
    let (off, pair) = (quant_offset(fmt), 8 * bb);
    let halves = if fmt == WeightFormat::Q8_0 { 2 } else { 1 };
    let qh = high_bits(fmt);
    let tiled = n / PACK_ROWS * PACK_ROWS;
    let mut out = Vec::with_capacity(ids.len() * rb);
    for &j in ids {
        if j >= n {
            return None;
        }
        if j >= tiled {
            out.extend_from_slice(&packed[j * rb..(j + 1) * rb]);
            continue;
        }
        let (base, r) = (j / PACK_ROWS * PACK_ROWS * rb, j % PACK_ROWS);
        for b in 0..nb {
            // A block of a pair (2 blocks a row) or the odd last one.
            let (group, which, per) = if b < nb / 2 * 2 {
                (base + b / 2 * pair, b % 2, 2)
            } else {
                (base + nb / 2 * pair, 0, 1)
            };
            // Bytes of quants, and of fifth bits, one row has in the group.
            let (row, hb) = (16 * per * halves, qh * per);
            let field = |f: usize| group + 4 * (row + hb) + 8 * per * f + 2 * (4 * which + r);
            let mut block = [0u8; 34];
            block[..2].copy_from_slice(&packed[field(0)..field(0) + 2]);
            if fmt == WeightFormat::Q4_1 {
                block[2..4].copy_from_slice(&packed[field(1)..field(1) + 2]);
            }
            if qh > 0 {
                let h = group + 4 * row + hb * r + qh * which;
                block[2..2 + qh].copy_from_slice(&packed[h..h + qh]);
            }
            for h in 0..halves {
                let q = group + row * r + 16 * (h * per + which);
                block[off + 16 * h..off + 16 * h + 16].copy_from_slice(&packed[q..q + 16]);
            }
            out.extend_from_slice(&block[..bb]);
        }
    }
    Some(out)
}
