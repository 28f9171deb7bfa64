//! The prefill kernel for the 32-weight formats (Q8_0, Q4_0, Q4_1, Q5_0)
//! on Intel AMX: sixteen weight rows against sixteen activation rows per
//! tile multiply, one block (32 codes) per step.
//!
//! Once per sixteen weight rows their codes are unpacked to bytes, one
//! block of the sixteen rows per A tile (16 rows x 32 bytes, [`Weights16`]):
//! signed `q - offset` for Q4_0 and Q5_0 (Q8_0's are signed already),
//! unsigned for Q4_1, whose minimum is a separate term. Each sixteen
//! activation rows' int8 codes are laid out once per call as B tiles (per
//! block 8 tile rows of 16 lanes x 4 codes, [`Acts16`]). A block is then
//! one `tdpbssd` (Q4_1: `tdpbusd`) per group of sixteen activation rows:
//! the exact block sums of 256 outputs, which AVX-512 adds into the
//! chains of the module's arithmetic (`c[b % 4] = fma(s, d_w · d_x, c)`,
//! then Q4_1's `+ m_w · Σx`; finally `(c0 + c2) + (c1 + c3)`), one lane
//! per activation row: the bits of every other path. Each weight tile
//! serves two groups of activation rows.

use super::activations::{code_index, QuantRows};
use super::avx512::avx512vbmi::{block_bytes, unpack_one, Q4_0, Q4_1, Q5_0, Q8_0};
use super::WeightFormat;
use crate::cpu::amx::{transpose16, Tiles};
use std::arch::asm;
use std::arch::x86_64::*;

/// Whether the kernel takes `fmt` (every quantized 32-weight format).
pub(super) fn takes(fmt: WeightFormat) -> bool {
    fmt != WeightFormat::F32
}

/// The tile shapes: 0, 1 and 6, 7 accumulators (16 x 16 i32; even and
/// odd blocks), 2 and 3 the weights (16 rows x 32 codes; even and odd
/// blocks), 4, 5 the activations (8 rows of 16 lanes x 4 codes).
pub(super) fn tiles() -> [(u8, u16); 8] {
    [
        (16, 64),
        (16, 64),
        (16, 32),
        (16, 32),
        (8, 64),
        (8, 64),
        (16, 64),
        (16, 64),
    ]
}

/// Sixteen activation rows of a [`QuantRows`] laid out as B tiles (rows
/// past the end repeat the last row; their lanes are dropped).
pub(super) struct Acts16 {
    /// Per block, 8 tile rows of 16 lanes x 4 codes (512 bytes): codes
    /// `4t..4t + 4` of the block of lane `l` at `64t + 4l`.
    tiles: Vec<i8>,
    /// `[block][lane]` activation scales `d_x`.
    dx: Vec<f32>,
    /// `[block][lane]` block sums (Q4_1; else empty).
    sx: Vec<f32>,
}

impl Acts16 {
    /// Rows `r0..r0 + 16` of `xq` (those below `xq.m`).
    pub(super) fn new(xq: &QuantRows, r0: usize, q4_1: bool) -> Self {
        let nb = xq.k / 32;
        let rows = (xq.m - r0).min(16);
        let mut tiles = vec![0i8; 512 * nb];
        let mut dx = vec![0f32; 16 * nb];
        let mut sx = vec![0f32; if q4_1 { 16 * nb } else { 0 }];
        for lane in 0..16 {
            let r = r0 + lane.min(rows - 1);
            let (codes, scales) = (xq.codes(r), xq.scales(r));
            for b in 0..nb {
                for t in 0..8 {
                    // Codes 4t..4t + 4 lie in one half of the block's
                    // stored order (16 contiguous codes).
                    let at = code_index(b, 4 * t, nb);
                    let to = 512 * b + 64 * t + 4 * lane;
                    tiles[to..to + 4].copy_from_slice(&codes[at..at + 4]);
                }
                dx[16 * b + lane] = scales[2 * b];
                if q4_1 {
                    sx[16 * b + lane] = scales[2 * b + 1];
                }
            }
        }
        Acts16 { tiles, dx, sx }
    }
}

/// Sixteen weight rows laid out as A tiles: per block the sixteen rows'
/// 32 codes (512 bytes), their scales and (Q4_1) minima.
#[derive(Default)]
pub(super) struct Weights16 {
    codes: Vec<u8>,
    d: Vec<f32>,
    m: Vec<f32>,
    /// `d` and `m` as the blocks store them (f16), converted together.
    d16: Vec<u16>,
    m16: Vec<u16>,
}

impl Weights16 {
    /// Lays out `rows` (16 rows of `nb` blocks of `fmt`) in the buffers
    /// already here (no allocation once they have grown).
    pub(super) fn fill(&mut self, fmt: WeightFormat, rows: &[&[u8]; 16], nb: usize) {
        let q4_1 = fmt == WeightFormat::Q4_1;
        self.codes.resize(512 * nb, 0);
        self.d.resize(16 * nb, 0.0);
        self.m.resize(if q4_1 { 16 * nb } else { 0 }, 0.0);
        self.d16.resize(16 * nb, 0);
        self.m16.resize(if q4_1 { 16 * nb } else { 0 }, 0);
        let (d16, m16) = (&mut self.d16, &mut self.m16);
        let w = &mut self.codes;
        for (r, row) in rows.iter().enumerate() {
            // SAFETY: the AVX-512 VBMI kernels' features are here (the AMX
            // kernel is only offered with them); `row` holds nb whole
            // blocks (asserted inside), the buffers 512 nb, 16 nb values.
            unsafe {
                match fmt {
                    WeightFormat::Q8_0 => fill_row::<Q8_0>(w, row, r, nb, d16, m16),
                    WeightFormat::Q4_0 => fill_row::<Q4_0>(w, row, r, nb, d16, m16),
                    WeightFormat::Q4_1 => fill_row::<Q4_1>(w, row, r, nb, d16, m16),
                    WeightFormat::Q5_0 => fill_row::<Q5_0>(w, row, r, nb, d16, m16),
                    WeightFormat::F32 => unreachable!("takes() refuses f32"),
                }
            }
        }
        // SAFETY: AVX-512 F (as above); equal lengths, multiples of 16.
        unsafe {
            f16_to_f32(&self.d16, &mut self.d);
            f16_to_f32(&self.m16, &mut self.m);
        }
    }
}

/// Row `r` of every tile of `w` from its `nb` raw blocks (the f16
/// scales, and Q4_1 minima, into `d16` and `m16`: `[block][row]`).
///
/// # Safety
/// The features of the AVX-512 VBMI kernels (whose unpacking this
/// inlines) available.
#[target_feature(
    enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg"
)]
unsafe fn fill_row<const F: u8>(
    codes: &mut [u8],
    row: &[u8],
    r: usize,
    nb: usize,
    d16: &mut [u16],
    m16: &mut [u16],
) {
    let bb = block_bytes(F);
    assert!(row.len() == nb * bb && codes.len() == 512 * nb && d16.len() == 16 * nb);
    let offset = _mm256_set1_epi8(match F {
        Q4_0 => 8,
        Q5_0 => 16,
        _ => 0,
    });
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        // SAFETY: `blk` is one whole block; 32 bytes at 512 b + 32 r are
        // inside `codes` (asserted above).
        unsafe {
            let v = _mm256_sub_epi8(unpack_one::<F>(blk.as_ptr()), offset);
            let to = codes.as_mut_ptr().add(512 * b + 32 * r);
            _mm256_storeu_si256(to as *mut __m256i, v);
        }
        d16[16 * b + r] = u16::from_le_bytes([blk[0], blk[1]]);
        if F == Q4_1 {
            m16[16 * b + r] = u16::from_le_bytes([blk[2], blk[3]]);
        }
    }
}

/// `out[i] = f32(h[i])` for f16 bit patterns, 16 at a time (lengths
/// multiples of 16).
///
/// # Safety
/// AVX-512 F.
#[target_feature(enable = "avx512f")]
unsafe fn f16_to_f32(h: &[u16], out: &mut [f32]) {
    assert!(h.len() == out.len() && h.len().is_multiple_of(16));
    for (h, o) in h.chunks_exact(16).zip(out.chunks_exact_mut(16)) {
        // SAFETY: 16 values each side.
        unsafe {
            let v = _mm256_loadu_si256(h.as_ptr() as *const __m256i);
            _mm512_storeu_ps(o.as_mut_ptr(), _mm512_cvtph_ps(v));
        }
    }
}

/// One 16 x 16 tile of i32 block sums, as the tile store writes it.
#[repr(C, align(64))]
struct Sums([[[i32; 16]; 16]; 2]);

/// The kernel's scratch, made once per run of weight-row groups: the
/// chains of 16 weight rows x 16 activation rows (lanes) for two groups
/// of activation rows (`[group][chain][weight row]`), and two slots of
/// tile sums.
#[repr(C, align(64))]
pub(super) struct Chains([[[[f32; 16]; 16]; 4]; 2], [Sums; 2]);

impl Chains {
    pub(super) fn zero() -> Box<Chains> {
        let sums = || Sums([[[0; 16]; 16]; 2]);
        Box::new(Chains([[[[0.0; 16]; 16]; 4]; 2], [sums(), sums()]))
    }
}

/// One block's products for two groups of activation rows: `$op` (the
/// signed or unsigned tile multiply) into accumulator tiles `$c0`, `$c1`
/// from weight tile `$a` (B tiles: tmm4, tmm5), stored to `$c` (2 KB).
macro_rules! block_products {
    ($op:literal, $c0:literal, $c1:literal, $a:literal, $w:expr, $x0:expr, $x1:expr, $c:expr) => {
        asm!(
            concat!("tilezero ", $c0),
            concat!("tilezero ", $c1),
            concat!("tileloadd ", $a, ", [{w} + {s32}*1]"),
            "tileloadd tmm4, [{x0} + {s64}*1]",
            concat!($op, " ", $c0, ", ", $a, ", tmm4"),
            "tileloadd tmm5, [{x1} + {s64}*1]",
            concat!($op, " ", $c1, ", ", $a, ", tmm5"),
            concat!("tilestored [{c} + {s64}*1], ", $c0),
            concat!("tilestored [{c} + {s64}*1 + 1024], ", $c1),
            w = in(reg) $w,
            x0 = in(reg) $x0,
            x1 = in(reg) $x1,
            c = in(reg) $c,
            s32 = in(reg) 32usize,
            s64 = in(reg) 64usize,
            options(nostack),
        )
    };
}

/// Sixteen weight rows `w` against one or two groups of sixteen
/// activation rows `x`: `out[g][lane][r]` = weight row `r` . activation
/// row `lane` of group `g` (`chains` is scratch).
///
/// # Safety
/// The tile configuration [`tiles`] is loaded on this thread (`_tiles`);
/// AVX-512 F + BW + VL; `w` and every `x` laid out for the same `nb`
/// blocks of format `F`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn rows16<const F: u8>(
    _tiles: &Tiles,
    nb: usize,
    w: &Weights16,
    x: &[&Acts16],
    chains: &mut Chains,
    out: &mut [[[f32; 16]; 16]],
) {
    let groups = x.len();
    assert!((1..=2).contains(&groups) && out.len() == groups);
    assert!(w.codes.len() == 512 * nb && w.d.len() == 16 * nb);
    assert!(x
        .iter()
        .all(|x| x.tiles.len() == 512 * nb && x.dx.len() == 16 * nb));
    if F == Q4_1 {
        assert!(w.m.len() == 16 * nb && x.iter().all(|x| x.sx.len() == 16 * nb));
    }
    // Two slots: block b + 1's tile products run while AVX-512 adds block
    // b's sums (the tiles and the vector units overlap).
    let Chains(chains, sums) = chains;
    // The second group's tiles read the first's when there is one group
    // (its sums are not used).
    let x1 = x[groups - 1];
    let products = |b: usize, c: &mut Sums| {
        let (wp, x0p, x1p) = (
            w.codes.as_ptr().wrapping_add(512 * b),
            x[0].tiles.as_ptr().wrapping_add(512 * b),
            x1.tiles.as_ptr().wrapping_add(512 * b),
        );
        let c = c.0.as_mut_ptr();
        // SAFETY: the tiles are configured (the caller's promise); each
        // load reads 512 bytes of block b < nb (asserted lengths), the
        // stores write `c` (2 KB). Even and odd blocks use different
        // accumulator and weight tiles, so one block's products need not
        // wait for the previous block's stores.
        unsafe {
            match (F == Q4_1, b.is_multiple_of(2)) {
                (false, true) => {
                    block_products!("tdpbssd", "tmm0", "tmm1", "tmm2", wp, x0p, x1p, c)
                }
                (false, false) => {
                    block_products!("tdpbssd", "tmm6", "tmm7", "tmm3", wp, x0p, x1p, c)
                }
                (true, true) => block_products!("tdpbusd", "tmm0", "tmm1", "tmm2", wp, x0p, x1p, c),
                (true, false) => {
                    block_products!("tdpbusd", "tmm6", "tmm7", "tmm3", wp, x0p, x1p, c)
                }
            }
        }
    };
    products(0, &mut sums[0]);
    for b in 0..nb {
        let (now, next) = sums.split_at_mut(1);
        let (now, next) = if b % 2 == 0 {
            (&now[0], &mut next[0])
        } else {
            (&next[0], &mut now[0])
        };
        if b + 1 < nb {
            products(b + 1, next);
        }
        let sums = now;
        for (g, xg) in x.iter().enumerate() {
            // SAFETY: 16 floats at 16 b of `dx` / `sx` (asserted lengths).
            let dx = unsafe { _mm512_loadu_ps(xg.dx.as_ptr().add(16 * b)) };
            let sx = if F == Q4_1 {
                // SAFETY: as above.
                unsafe { _mm512_loadu_ps(xg.sx.as_ptr().add(16 * b)) }
            } else {
                _mm512_setzero_ps()
            };
            let chain = &mut chains[g][b % 4];
            for (r, c) in chain.iter_mut().enumerate() {
                // SAFETY: whole 16-lane rows of `sums` and `chains`.
                unsafe {
                    let s = _mm512_cvtepi32_ps(_mm512_load_si512(
                        sums.0[g][r].as_ptr() as *const __m512i
                    ));
                    let sc = _mm512_mul_ps(_mm512_set1_ps(w.d[16 * b + r]), dx);
                    // Each chain starts at +0 (its first block: no
                    // load, so the scratch needs no clearing).
                    let c0 = if b < 4 {
                        _mm512_setzero_ps()
                    } else {
                        _mm512_load_ps(c.as_ptr())
                    };
                    let mut v = _mm512_fmadd_ps(s, sc, c0);
                    if F == Q4_1 {
                        let m = _mm512_mul_ps(_mm512_set1_ps(w.m[16 * b + r]), sx);
                        v = _mm512_add_ps(v, m);
                    }
                    _mm512_store_ps(c.as_mut_ptr(), v);
                }
            }
        }
    }
    for (g, o) in out.iter_mut().enumerate() {
        let ch = &chains[g];
        // SAFETY: whole 16-lane rows; AVX-512 F.
        unsafe {
            let y: [__m512; 16] = std::array::from_fn(|r| {
                // A chain no block reached (nb < 4) is +0.
                let l = |c: usize| {
                    if c < nb {
                        _mm512_load_ps(ch[c][r].as_ptr())
                    } else {
                        _mm512_setzero_ps()
                    }
                };
                _mm512_add_ps(_mm512_add_ps(l(0), l(2)), _mm512_add_ps(l(1), l(3)))
            });
            for (o, v) in o.iter_mut().zip(transpose16(&y)) {
                _mm512_storeu_ps(o.as_mut_ptr(), v);
            }
        }
    }
}

/// [`rows16`] for `fmt`.
///
/// # Safety
/// As [`rows16`], with `w` and `x` laid out for `fmt`.
pub(super) unsafe fn rows16_for(
    tiles: &Tiles,
    fmt: WeightFormat,
    nb: usize,
    w: &Weights16,
    x: &[&Acts16],
    chains: &mut Chains,
    out: &mut [[[f32; 16]; 16]],
) {
    // SAFETY: the caller's contract.
    unsafe {
        match fmt {
            WeightFormat::Q8_0 => rows16::<Q8_0>(tiles, nb, w, x, chains, out),
            WeightFormat::Q4_0 => rows16::<Q4_0>(tiles, nb, w, x, chains, out),
            WeightFormat::Q4_1 => rows16::<Q4_1>(tiles, nb, w, x, chains, out),
            WeightFormat::Q5_0 => rows16::<Q5_0>(tiles, nb, w, x, chains, out),
            WeightFormat::F32 => unreachable!("takes() refuses f32"),
        }
    }
}
