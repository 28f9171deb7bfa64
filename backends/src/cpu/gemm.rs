//! f32 matrix products on the `gemm` crate with the thread count chosen by
//! size, reading operands in place through their strides.
//!
//! ## Why
//! candle hands every f32 matmul to `gemm` with all of rayon's threads. For
//! the small products of a TTS text encoder (193 x 192 x 192, 7 M
//! multiply-adds) two threads took 169 us where one takes 99 us: the split
//! and the wake-up cost more than the work. Below [`PAR_MACS`] a product
//! runs on the calling thread; batched products of that size run their
//! batch items in parallel instead. A linear layer's bias seeds the output
//! rather than being a second pass over it.
//!
//! Single products from [`SGEMM_MIN_ROWS`] rows run on this crate's packed
//! GEMM instead ([`sgemm`]), which never copies a linear layer's weights.
//! The routing below is for weights that are plain host tensors; weights
//! placed on the CPU run on their pack instead (`placed_linear`).

use super::sgemm;
use candle_core::{DType as CDType, Storage as CStorage, Tensor as CTensor};
use edgeflow_runtime::Result;
use gemm::Parallelism;
use rayon::prelude::*;

/// Multiply-adds from which one product is split across threads (the TTS
/// products above, 7 M, stay on one; DINOv2 ViT-S's 65 x 384 x 384
/// attention output, 9.6 M, took 0.30 ms on one Zen 3 thread and 0.14 ms
/// on two).
pub(super) const PAR_MACS: usize = 1 << 23;

/// Rows (and output columns) from which a single product runs on
/// [`sgemm`] rather than the `gemm` crate (prefill-shaped linear layers:
/// 2-3.5x faster at 48-400 rows x 1024 x 1024 on two Zen cores).
const SGEMM_MIN_ROWS: usize = 5;
const SGEMM_MIN_COLS: usize = 16;
/// From this many rows, short inner dimensions (below
/// [`SGEMM_SHORT_K`]) stay on the `gemm` crate: at 65-257 rows x K = 384
/// (DINOv2 ViT-S) it was 1.07-1.33x faster than [`sgemm`], whose tiles
/// win from K = 768 up (`cargo test -p edgeflow-backends --lib
/// sgemm::tests::timing -- --ignored --nocapture`, AMD EPYC Zen 4, 2
/// threads).
const SGEMM_SHORT_K_ROWS: usize = 64;
const SGEMM_SHORT_K: usize = 768;

/// Without AVX-512, from [`SGEMM_SHORT_K_ROWS`] rows a product also stays
/// on the `gemm` crate when either `n` or `k` is below this. On Zen 3 (AVX2
/// only, 2 threads; `sgemm::tests::timing`, four runs) the crate took
/// 0.72-0.86x [`sgemm`]'s time at 65 and 257 rows with `n` or `k` of 384
/// or 768 (DINOv2 ViT-S's MLP output, 65 x 384 x 1536: 0.74-0.82x), and
/// 0.87-1.14x at 257 x 3072 x 768; from 1024 the two were even (200-400
/// rows x 1024-2048: 0.90-1.11x). A 16-lane packing for the AVX2 tile
/// (contiguous 64-byte steps) did not change [`sgemm`]'s figures.
const SGEMM_AVX2_MIN_NK: usize = 1024;

/// Whether one `m x n x k` product runs on [`sgemm`].
fn use_sgemm(m: usize, n: usize, k: usize) -> bool {
    if m < SGEMM_MIN_ROWS || n < SGEMM_MIN_COLS {
        return false;
    }
    if m < SGEMM_SHORT_K_ROWS {
        return true;
    }
    k >= SGEMM_SHORT_K && (sgemm::wide() || n.min(k) >= SGEMM_AVX2_MIN_NK)
}

/// Whether an `m x n x k` product packs placed weights
/// (`placed_linear`) and runs on the pack. With AVX-512, from
/// [`SGEMM_MIN_ROWS`] rows: packed, the short inner dimensions that stay
/// on the crate above ran 1.3-1.6x faster than on it (DINOv2 ViT-S at
/// 65 rows, weights out of cache, AMD EPYC Zen 4, 2 threads). On AVX2
/// only where [`use_sgemm`] already picks this crate's GEMM: the crate
/// against packed weights there is not measured.
pub(super) fn packs_weights(m: usize, n: usize, k: usize) -> bool {
    m >= SGEMM_MIN_ROWS && n >= SGEMM_MIN_COLS && (sgemm::wide() || use_sgemm(m, n, k))
}

/// A 4-d f32 view into a candle CPU tensor: its storage, start offset and
/// strides (elements).
pub(crate) struct View<'a> {
    pub data: &'a [f32],
    pub dims: [usize; 4],
    pub stride: [isize; 4],
}

impl<'a> View<'a> {
    /// The matrix of the last two dims starting at element `off`.
    pub(super) fn matrix(&self, off: usize) -> sgemm::Strided<'a> {
        sgemm::Strided {
            data: self.data,
            off,
            rs: self.stride[2],
            cs: self.stride[3],
        }
    }

    /// Element offset of `[b, h, i, j]`.
    pub(super) fn at(&self, b: usize, h: usize, i: usize, j: usize) -> usize {
        (b as isize * self.stride[0]
            + h as isize * self.stride[1]
            + i as isize * self.stride[2]
            + j as isize * self.stride[3]) as usize
    }
}

/// Run `f` on the f32 storage and layout of `t` (rank 4 after left-padding
/// with unit dims), or return None when it is not an f32 CPU tensor.
pub(crate) fn with_view<R>(t: &CTensor, f: impl FnOnce(View<'_>) -> R) -> Option<R> {
    if t.dtype() != CDType::F32 || t.rank() > 4 {
        return None;
    }
    let (st, layout) = t.storage_and_layout();
    let CStorage::Cpu(cpu) = &*st else {
        return None;
    };
    let all = cpu.as_slice::<f32>().ok()?;
    let pad = 4 - t.rank();
    let mut dims = [1usize; 4];
    let mut stride = [0isize; 4];
    for (i, (&d, &s)) in layout.dims().iter().zip(layout.stride()).enumerate() {
        dims[pad + i] = d;
        // A unit dim is never stepped over; stride 0 keeps the bound check exact.
        stride[pad + i] = if d == 1 { 0 } else { s as isize };
    }
    let start = layout.start_offset();
    // The furthest element the view reaches must lie in the storage: the
    // GEMMs below read through raw pointers with these strides.
    let last: usize = dims
        .iter()
        .zip(&stride)
        .map(|(&d, &s)| (d.max(1) - 1) * s as usize)
        .sum();
    if dims.contains(&0) || start + last >= all.len() {
        return None;
    }
    Some(f(View {
        data: &all[start..],
        dims,
        stride,
    }))
}

/// `a [.., m, k] x b [.., k, n]` for f32 host tensors of rank 2 to 4 (any
/// strides), each leading dim of `b` equal to `a`'s or 1 (broadcast), plus
/// `bias [n]` on every row when given. Returns the contiguous product, or
/// None for other dtypes, ranks or broadcasts (the caller runs candle).
pub(crate) fn matmul(a: &CTensor, b: &CTensor, bias: Option<&[f32]>) -> Result<Option<CTensor>> {
    let (ra, rb) = (a.rank(), b.rank());
    if ra != rb || !(2..=4).contains(&ra) || a.dtype() != CDType::F32 || b.dtype() != CDType::F32 {
        return Ok(None);
    }
    let (m, k) = (a.dims()[ra - 2], a.dims()[ra - 1]);
    let (kb, n) = (b.dims()[rb - 2], b.dims()[rb - 1]);
    if k != kb || bias.is_some_and(|bs| bs.len() != n) {
        return Ok(None);
    }
    let lead_a = &a.dims()[..ra - 2];
    let lead_b = &b.dims()[..rb - 2];
    if lead_a.iter().zip(lead_b).any(|(&x, &y)| y != x && y != 1) {
        return Ok(None);
    }
    if m == 0 || n == 0 || k == 0 {
        return Ok(None);
    }
    let y = with_view(a, |av| {
        with_view(b, |bv| {
            let (b0, b1) = (av.dims[0], av.dims[1]);
            let items = b0 * b1;
            let mut y = vec![0f32; items * m * n];
            let threads = rayon::current_num_threads();
            let macs = m * n * k;
            let one = |(item, out): (usize, &mut [f32])| {
                let (i0, i1) = (item / b1, item % b1);
                let ao = av.at(i0, i1, 0, 0);
                let bo = bv.at(
                    if bv.dims[0] == 1 { 0 } else { i0 },
                    if bv.dims[1] == 1 { 0 } else { i1 },
                    0,
                    0,
                );
                if items == 1 && use_sgemm(m, n, k) {
                    let par = macs >= PAR_MACS && threads > 1;
                    sgemm::gemm(m, n, k, av.matrix(ao), bv.matrix(bo), bias, out, par);
                    return;
                }
                if let Some(bias) = bias {
                    for row in out.chunks_exact_mut(n) {
                        row.copy_from_slice(bias);
                    }
                }
                let par = if items == 1 && macs >= PAR_MACS && threads > 1 {
                    Parallelism::Rayon(threads)
                } else {
                    Parallelism::None
                };
                // SAFETY: `out` holds m * n values (row stride n, column
                // stride 1); a's block reads ao + i*s2 + p*s3 (i < m,
                // p < k) and b's bo + p*s2 + j*s3 (p < k, j < n), inside
                // the views' storage, which `with_view` checked reaches no
                // further than the slice's end. gemm reads `out` only when
                // a bias seeded it.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        out.as_mut_ptr(),
                        1,
                        n as isize,
                        bias.is_some(),
                        av.data.as_ptr().add(ao),
                        av.stride[3],
                        av.stride[2],
                        bv.data.as_ptr().add(bo),
                        bv.stride[3],
                        bv.stride[2],
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        par,
                    );
                }
            };
            if items > 1 && items * macs >= PAR_MACS && threads > 1 {
                y.par_chunks_mut(m * n).enumerate().for_each(one);
            } else {
                y.chunks_mut(m * n).enumerate().for_each(one);
            }
            y
        })
    })
    .flatten();
    let Some(y) = y else {
        return Ok(None);
    };
    let mut dims = a.dims().to_vec();
    dims[ra - 1] = n;
    Ok(Some(CTensor::from_vec(y, dims, &candle_core::Device::Cpu)?))
}
