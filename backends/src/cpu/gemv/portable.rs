//! The portable (plain Rust) kernels: the int8 arithmetic of the x86
//! kernels block by block (the same bits), and the f32 GEMV row.

use super::activations::code_index;
use super::{QuantRows, WeightFormat};

pub(super) fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

pub(super) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut rc = row.chunks_exact(32);
    let mut xc = x.chunks_exact(8);
    for (r, xs) in (&mut rc).zip(&mut xc) {
        for l in 0..8 {
            let w = f32::from_le_bytes([r[4 * l], r[4 * l + 1], r[4 * l + 2], r[4 * l + 3]]);
            acc[l] += w * xs[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (r, xv) in rc.remainder().chunks_exact(4).zip(xc.remainder()) {
        s += f32::from_le_bytes([r[0], r[1], r[2], r[3]]) * xv;
    }
    s
}

/// One weight row against activation row `r`: the module's arithmetic
/// (exact block sums, chains `b % 4`), so the x86 kernels' bits.
pub(super) fn dot(fmt: WeightFormat, row: &[u8], xq: &QuantRows, r: usize) -> f32 {
    let nb = xq.k / 32;
    let (codes, scales) = (xq.codes(r), xq.scales(r));
    let bb = fmt.row_bytes(32);
    let mut c = [0f32; 4];
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let lo = &codes[code_index(b, 0, nb)..code_index(b, 0, nb) + 16];
        let hi = &codes[code_index(b, 16, nb)..code_index(b, 16, nb) + 16];
        let d = f16_at(blk);
        let (isum, m_w) = match fmt {
            WeightFormat::Q8_0 => {
                let q = &blk[2..34];
                let dot = |w: &[u8], x: &[i8]| -> i32 {
                    w.iter()
                        .zip(x)
                        .map(|(a, b)| i32::from(*a as i8) * i32::from(*b))
                        .sum()
                };
                (dot(&q[..16], lo) + dot(&q[16..], hi), 0.0)
            }
            _ => {
                let (q, m_w, off) = match fmt {
                    WeightFormat::Q4_1 => (&blk[4..20], f16_at(&blk[2..]), 0),
                    WeightFormat::Q5_0 => (&blk[6..22], 0.0, 16),
                    _ => (&blk[2..18], 0.0, 8),
                };
                // Q5_0's fifth bits: bit j of `qh` for element j.
                let qh = match fmt {
                    WeightFormat::Q5_0 => u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]),
                    _ => 0,
                };
                let fifth = |e: usize| ((qh >> e) & 1) as i32 * 16;
                let isum: i32 = q
                    .iter()
                    .zip(lo.iter().zip(hi))
                    .enumerate()
                    .map(|(j, (w, (a, b)))| {
                        (i32::from(w & 15) + fifth(j) - off) * i32::from(*a)
                            + (i32::from(w >> 4) + fifth(j + 16) - off) * i32::from(*b)
                    })
                    .sum();
                (isum, m_w)
            }
        };
        let mut v = (isum as f32).mul_add(d * scales[2 * b], c[b % 4]);
        if fmt == WeightFormat::Q4_1 {
            v += m_w * scales[2 * b + 1];
        }
        c[b % 4] = v;
    }
    (c[0] + c[2]) + (c[1] + c[3])
}

/// All activation rows against the weight rows in `w` (`rb` bytes each);
/// `out[j * m + r]` = weight row j . activation row r.
pub(super) fn rows(fmt: WeightFormat, w: &[u8], rb: usize, xq: &QuantRows, out: &mut [f32]) {
    for (row, o) in w.chunks_exact(rb).zip(out.chunks_exact_mut(xq.m)) {
        for (r, v) in o.iter_mut().enumerate() {
            *v = dot(fmt, row, xq, r);
        }
    }
}
