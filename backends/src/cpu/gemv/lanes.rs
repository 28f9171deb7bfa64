//! Q5_0 prefill on plain AVX2 with one lane per activation row: each
//! weight row is unpacked once to one byte per code, each 4 of its codes
//! are broadcast to the eight lanes and multiplied with 4 codes of each of
//! eight activation rows ([`Lanes8`]), so a lane accumulates its own row's
//! block sum and no horizontal sum is left to do. The `maddubs` pair sums
//! of each 16 codes are added in i16 (at most 4 x 2 x 31 x 127 = 31,496:
//! no overflow) and widened by one `madd`; Q5_0's offset of 16 comes off
//! as `16 * Σ q_x` per block and row, exactly. The f32 steps are the
//! module's (chains `b % 4`, `fma(s, d_w * d_x, c)`, then `(c0 + c2) +
//! (c1 + c3)`), one lane per row: the other paths' bits. Rows come in
//! GGML's layout or in [`super::pack::pack`]'s tiles (the decode kernel's
//! layout, where weights are placed on the CPU).
//!
//! Why: the 4 x 2 tile kernel reduces its lanes per block and output and
//! expands every weight block's fifth bits once per four activation rows;
//! Qwen2.5-0.5B's Q5_0 gate / up projections ran at 21 GMAC/s a core on
//! Zen 3 there, well below the K-quant lane kernel's rate.
//!
//! On AMD's AVX-512 CPUs ([`kernel16`]) two groups of eight rows share a
//! 512-bit register and each 4 codes' products go straight into i32 with
//! `vpdpbusd`.

use super::activations::code_index;
use super::portable::f16_at;
use super::QuantRows;
use std::arch::x86_64::*;

/// Q5_0 block bytes: f16 `d`, 4 bytes of fifth bits, 16 of nibbles.
const BLOCK_BYTES: usize = 22;

/// Eight activation rows of [`QuantRows`] in the lane layout: codes
/// `[k / 4][lane][4]` in element order, and per block and lane the scale
/// `d_x` and the offset term `16 * Σ q_x` (rows past the end repeat the
/// last row; their lanes are dropped).
pub(super) struct Lanes8 {
    r0: usize,
    rows: usize,
    codes: Vec<i8>,
    dx: Vec<f32>,
    off: Vec<i32>,
}

impl Lanes8 {
    /// Rows `r0..r0 + 8` (clamped to `xq.m`) of `xq`, quantized for Q5_0.
    pub(super) fn new(xq: &QuantRows, r0: usize) -> Self {
        let (k, nb) = (xq.k, xq.k / 32);
        let rows = (xq.m - r0).min(8);
        let mut codes = vec![0i8; 8 * k];
        let mut dx = vec![0f32; 8 * nb];
        let mut off = vec![0i32; 8 * nb];
        for lane in 0..8 {
            let r = r0 + lane.min(rows - 1);
            let (c, s) = (xq.codes(r), xq.scales(r));
            for b in 0..nb {
                let mut sum = 0i32;
                for e in (0..32).step_by(4) {
                    let at = code_index(b, e, nb);
                    let q = 32 * b + e;
                    codes[8 * q + 4 * lane..8 * q + 4 * lane + 4].copy_from_slice(&c[at..at + 4]);
                    sum += c[at..at + 4].iter().map(|&v| i32::from(v)).sum::<i32>();
                }
                dx[8 * b + lane] = s[2 * b];
                off[8 * b + lane] = 16 * sum;
            }
        }
        Lanes8 {
            r0,
            rows,
            codes,
            dx,
            off,
        }
    }
}

/// One Q5_0 weight row unpacked: its codes (0..32) in element order and
/// each block's `d` (reused buffers).
#[derive(Default)]
pub(super) struct Row {
    codes: Vec<u8>,
    d: Vec<f32>,
}

impl Row {
    /// Unpack `row` (whole Q5_0 blocks in GGML's layout).
    ///
    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2")]
    unsafe fn fill(&mut self, row: &[u8]) {
        let nb = row.len() / BLOCK_BYTES;
        self.start(nb);
        for (b, blk) in row.chunks_exact(BLOCK_BYTES).enumerate() {
            // SAFETY: AVX2; b < nb; bytes 2..6 of a block are its fifth
            // bits, 6..22 its nibbles.
            unsafe { self.block(b, f16_at(blk), &blk[2..6], &blk[6..22]) };
        }
    }

    /// Unpack row `r` of a whole packed tile `tile` of `nb` blocks a row
    /// ([`super::pack::pack`]'s layout: per pair of blocks the 4 rows'
    /// 32 nibble bytes, their 8 bytes of fifth bits, 8 scales; an odd last
    /// block likewise with 16, 4 and 4).
    ///
    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2")]
    unsafe fn fill_packed(&mut self, tile: &[u8], r: usize, nb: usize) {
        self.start(nb);
        for b in 0..nb {
            // Its group (a pair, or the odd last block), the group's
            // blocks and which of them this is.
            let (group, per, which) = if b < nb / 2 * 2 {
                (b / 2 * 8 * BLOCK_BYTES, 2, b % 2)
            } else {
                (nb / 2 * 8 * BLOCK_BYTES, 1, 0)
            };
            let nib = group + 16 * (per * r + which);
            let qh = group + 64 * per + 4 * (per * r + which);
            let d = group + 80 * per + 2 * (4 * which + r);
            // SAFETY: AVX2; b < nb.
            unsafe {
                self.block(
                    b,
                    f16_at(&tile[d..d + 2]),
                    &tile[qh..qh + 4],
                    &tile[nib..nib + 16],
                )
            };
        }
    }

    /// Room for `nb` blocks.
    fn start(&mut self, nb: usize) {
        self.codes.resize(32 * nb, 0);
        self.d.clear();
        self.d.reserve(nb);
    }

    /// Block `b` (the next after those pushed) from its scale, 4 bytes of
    /// fifth bits and 16 of nibbles.
    ///
    /// # Safety
    /// AVX2 must be available; `32 b + 32 <= codes.len()`.
    #[target_feature(enable = "avx2")]
    unsafe fn block(&mut self, b: usize, d: f32, qh: &[u8], nib: &[u8]) {
        // Byte e of a register takes byte e / 8 of the fifth bits (both
        // 128-bit lanes hold all four), then tests bit e % 8.
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let low = _mm_set1_epi8(0x0f);
        debug_assert!(self.d.len() == b && 32 * b + 32 <= self.codes.len());
        self.d.push(d);
        let qh = i32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        // SAFETY: `nib` holds 16 bytes (sliced by the callers).
        let v = unsafe { _mm_loadu_si128(nib[..16].as_ptr() as *const __m128i) };
        let lo = _mm_and_si128(v, low);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), low);
        let fifth = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread);
        let fifth = _mm256_cmpeq_epi8(_mm256_and_si256(fifth, bit), bit);
        let c = _mm256_or_si256(
            _mm256_set_m128i(hi, lo),
            _mm256_and_si256(fifth, _mm256_set1_epi8(16)),
        );
        // SAFETY: 32 b + 32 <= the length of `codes` (the contract).
        unsafe { _mm256_storeu_si256(self.codes.as_mut_ptr().add(32 * b) as *mut __m256i, c) };
    }
}

/// Weight rows per kernel call: each activation load serves this many.
const W: usize = 2;

/// `W` unpacked weight rows against the eight activation rows of `g`:
/// `out[w][lane]`, the module's arithmetic.
///
/// # Safety
/// AVX2 + FMA must be available; each row and `g` hold the same k.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel(u: [&Row; W], g: &Lanes8) -> [[f32; 8]; W] {
    let nb = g.dx.len() / 8;
    debug_assert!(u
        .iter()
        .all(|u| u.codes.len() == 32 * nb && u.d.len() == nb));
    let xs = g.codes.as_ptr() as *const u8;
    let c: [*const u8; W] = std::array::from_fn(|w| u[w].codes.as_ptr());
    let ones = _mm256_set1_epi16(1);
    let mut ch = [[_mm256_setzero_ps(); 4]; W];
    for b4 in (0..nb).step_by(4) {
        for (j, b) in (b4..(b4 + 4).min(nb)).enumerate() {
            let mut raw = [_mm256_setzero_si256(); W];
            for half in 0..2 {
                let mut s16 = [_mm256_setzero_si256(); W];
                for step in 0..4 {
                    let q = 32 * b + 16 * half + 4 * step;
                    // SAFETY: q + 4 <= k: the lane layout keeps codes
                    // q..q + 4 of the eight rows as the 32 bytes at 8 q,
                    // and each weight row has k codes.
                    let xv = unsafe { _mm256_loadu_si256(xs.add(8 * q) as *const __m256i) };
                    for w in 0..W {
                        // SAFETY: as above.
                        let wv = unsafe {
                            _mm256_set1_epi32((c[w].add(q) as *const i32).read_unaligned())
                        };
                        s16[w] = _mm256_add_epi16(s16[w], _mm256_maddubs_epi16(wv, xv));
                    }
                }
                for w in 0..W {
                    raw[w] = _mm256_add_epi32(raw[w], _mm256_madd_epi16(s16[w], ones));
                }
            }
            // SAFETY: 8 b + 8 <= 8 nb, the lengths of `dx` and `off`.
            let (dx, off) = unsafe {
                (
                    _mm256_loadu_ps(g.dx.as_ptr().add(8 * b)),
                    _mm256_loadu_si256(g.off.as_ptr().add(8 * b) as *const __m256i),
                )
            };
            for w in 0..W {
                let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(raw[w], off));
                let dd = _mm256_mul_ps(_mm256_set1_ps(u[w].d[b]), dx);
                ch[w][j] = _mm256_fmadd_ps(s, dd, ch[w][j]);
            }
        }
    }
    std::array::from_fn(|w| {
        let c = &ch[w];
        let y = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
        let mut o = [0f32; 8];
        // SAFETY: `o` holds 8 floats.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), y) };
        o
    })
}

/// [`kernel`] with the two groups' rows in one 512-bit register (sixteen
/// lanes), on AVX-512 VNNI: each 4 codes of a weight row are broadcast and
/// meet the sixteen rows' 4 codes in one `vpdpbusd`, which sums the four
/// products straight into i32 (a block's sum is at most 32 x 31 x 127: no
/// overflow), so the `maddubs`, the i16 adds and the widening `madd` of
/// [`kernel`] become one instruction. The block sums are the same integers
/// and the f32 steps [`kernel`]'s per group: the same bits.
///
/// # Safety
/// AVX2, FMA and AVX-512 F, BW and VNNI must be available; each row and
/// both groups hold the same k.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
unsafe fn kernel16(u: [&Row; W], g: [&Lanes8; 2]) -> [[[f32; 8]; W]; 2] {
    let nb = g[0].dx.len() / 8;
    debug_assert!(g[1].dx.len() == 8 * nb);
    debug_assert!(u
        .iter()
        .all(|u| u.codes.len() == 32 * nb && u.d.len() == nb));
    let xs = g.map(|g| g.codes.as_ptr() as *const u8);
    let c: [*const u8; W] = std::array::from_fn(|w| u[w].codes.as_ptr());
    let mut ch = [[[_mm256_setzero_ps(); 4]; W]; 2];
    for b4 in (0..nb).step_by(4) {
        for (j, b) in (b4..(b4 + 4).min(nb)).enumerate() {
            let mut raw = [_mm512_setzero_si512(); W];
            for step in 0..8 {
                let q = 32 * b + 4 * step;
                // SAFETY: as in `kernel`, for both groups.
                let xv = unsafe {
                    let lo = _mm256_loadu_si256(xs[0].add(8 * q) as *const __m256i);
                    let hi = _mm256_loadu_si256(xs[1].add(8 * q) as *const __m256i);
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                };
                for w in 0..W {
                    // SAFETY: as above.
                    let wv =
                        unsafe { _mm512_set1_epi32((c[w].add(q) as *const i32).read_unaligned()) };
                    raw[w] = _mm512_dpbusd_epi32(raw[w], wv, xv);
                }
            }
            for (i, g) in g.iter().enumerate() {
                // SAFETY: 8 b + 8 <= 8 nb, the lengths of `dx` and `off`.
                let (dx, off) = unsafe {
                    (
                        _mm256_loadu_ps(g.dx.as_ptr().add(8 * b)),
                        _mm256_loadu_si256(g.off.as_ptr().add(8 * b) as *const __m256i),
                    )
                };
                for w in 0..W {
                    let r = if i == 0 {
                        _mm512_castsi512_si256(raw[w])
                    } else {
                        _mm512_extracti64x4_epi64::<1>(raw[w])
                    };
                    let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(r, off));
                    let dd = _mm256_mul_ps(_mm256_set1_ps(u[w].d[b]), dx);
                    ch[i][w][j] = _mm256_fmadd_ps(s, dd, ch[i][w][j]);
                }
            }
        }
    }
    std::array::from_fn(|i| {
        std::array::from_fn(|w| {
            let c = &ch[i][w];
            let y = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
            let mut o = [0f32; 8];
            // SAFETY: `o` holds 8 floats.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), y) };
            o
        })
    })
}

/// Q5_0 weight rows `w` (`rb` bytes each; when `packed`, whole tiles
/// of [`super::pack::pack`]'s layout first, any rows after them in GGML's)
/// against every activation row of the groups: `out[j * m + r]` (weight
/// row j, activation row r), as the other kernels write it. With `wide`,
/// pairs of groups run on [`kernel16`].
///
/// # Safety
/// AVX2 + FMA + F16C must be available, and AVX-512 F, BW and VNNI with
/// `wide`; `w` holds whole rows of the groups' k values and `out`
/// `rows * m` floats.
pub(super) unsafe fn rows(
    w: &[u8],
    rb: usize,
    groups: &[Lanes8],
    m: usize,
    out: &mut [f32],
    packed: bool,
    wide: bool,
) {
    const T: usize = super::PACK_ROWS;
    let n_all = w.len() / rb;
    let tiled = if packed { n_all / T * T } else { 0 };
    let mut us: [Row; W] = Default::default();
    for (c, o) in out.chunks_mut(W * m).enumerate() {
        let j0 = c * W;
        let n = (n_all - j0).min(W);
        for (i, u) in us.iter_mut().enumerate().take(n) {
            let j = j0 + i;
            // SAFETY: AVX2 (the caller's promise).
            unsafe {
                if j < tiled {
                    u.fill_packed(
                        &w[j / T * T * rb..(j / T + 1) * T * rb],
                        j % T,
                        rb / BLOCK_BYTES,
                    )
                } else {
                    u.fill(&w[j * rb..(j + 1) * rb])
                }
            };
        }
        // With one row left it runs twice, the second result dropped.
        let pair = if n == W {
            [&us[0], &us[1]]
        } else {
            [&us[0], &us[0]]
        };
        for gs in groups.chunks(if wide { 2 } else { 1 }) {
            let mut ys = [[[0f32; 8]; W]; 2];
            if let [g0, g1] = gs {
                // SAFETY: AVX2, FMA and AVX-512 F, BW, VNNI with `wide`
                // (the caller's promise); the rows and groups hold k values.
                ys = unsafe { kernel16(pair, [g0, g1]) };
            } else {
                // SAFETY: AVX2 + FMA (the caller's promise); the rows and
                // `gs[0]` hold k values.
                ys[0] = unsafe { kernel(pair, &gs[0]) };
            }
            for (g, y) in gs.iter().zip(&ys) {
                for (wi, yw) in y.iter().enumerate().take(n) {
                    o[wi * m + g.r0..wi * m + g.r0 + g.rows].copy_from_slice(&yw[..g.rows]);
                }
            }
        }
    }
}
