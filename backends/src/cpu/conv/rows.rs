//! Per-tile output stores and per-row input fills, for each instruction
//! set.

use super::{Isa, TT};

/// Write the first `n` values of `rows` accumulator rows to `dst`, row `r`
/// at `dst + r * stride`, adding `res` (laid out as `dst`, from its start)
/// when given. Vector code where the instruction set has it: this runs once
/// per output tile, and as scalar code it cost a tenth of a vocoder's time.
///
/// # Safety
/// `dst + r * stride .. + n` must be valid for writes for every `r < rows`
/// and written by nobody else meanwhile; `rows <= N`, `n <= TT`, and `res`
/// (when given) holds at least `(rows - 1) * stride + n` values.
pub(super) unsafe fn store_rows<const N: usize>(
    isa: Isa,
    acc: &[[f32; TT]; N],
    rows: usize,
    n: usize,
    dst: *mut f32,
    stride: usize,
    res: Option<&[f32]>,
) {
    debug_assert!(rows <= N && n <= TT);
    debug_assert!(res.is_none_or(|r| rows == 0 || r.len() >= (rows - 1) * stride + n));
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F was detected (the isa came from `isa()`); the
        // caller's contract bounds every access.
        Isa::Avx512 => unsafe { store_rows_avx512(acc, rows, n, dst, stride, res) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2.
        Isa::Avx2 => unsafe { store_rows_avx2(acc, rows, n, dst, stride, res) },
        // SAFETY: the caller's contract.
        _ => unsafe { store_rows_portable(acc, rows, n, dst, stride, res) },
    }
}

/// [`store_rows`] as plain loops (auto-vectorized in the wrappers below).
///
/// # Safety
/// As [`store_rows`].
#[inline(always)]
unsafe fn store_rows_portable<const N: usize>(
    acc: &[[f32; TT]; N],
    rows: usize,
    n: usize,
    dst: *mut f32,
    stride: usize,
    res: Option<&[f32]>,
) {
    for (r, v) in acc.iter().enumerate().take(rows) {
        // SAFETY: the caller's contract.
        let d = unsafe { std::slice::from_raw_parts_mut(dst.add(r * stride), n) };
        match res {
            Some(res) => {
                for ((d, &a), &b) in d.iter_mut().zip(&v[..n]).zip(&res[r * stride..][..n]) {
                    *d = a + b;
                }
            }
            None => d.copy_from_slice(&v[..n]),
        }
    }
}

/// [`store_rows`] compiled for AVX2.
///
/// # Safety
/// As [`store_rows`], on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn store_rows_avx2<const N: usize>(
    acc: &[[f32; TT]; N],
    rows: usize,
    n: usize,
    dst: *mut f32,
    stride: usize,
    res: Option<&[f32]>,
) {
    // SAFETY: forwarded contract.
    unsafe { store_rows_portable(acc, rows, n, dst, stride, res) }
}

/// [`store_rows`] with AVX-512 masked loads and stores (no scalar tail).
///
/// # Safety
/// As [`store_rows`], on a CPU with AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_rows_avx512<const N: usize>(
    acc: &[[f32; TT]; N],
    rows: usize,
    n: usize,
    dst: *mut f32,
    stride: usize,
    res: Option<&[f32]>,
) {
    use std::arch::x86_64::*;
    // SAFETY: lanes past `n` are masked off; the caller's contract bounds
    // the rest.
    unsafe {
        for (r, v) in acc.iter().enumerate().take(rows) {
            let d = dst.add(r * stride);
            let mut lo = 0;
            while lo < n {
                let lanes = (n - lo).min(16);
                let m: __mmask16 = if lanes == 16 { !0 } else { (1u16 << lanes) - 1 };
                let mut a = _mm512_loadu_ps(v.as_ptr().add(lo));
                if let Some(res) = res {
                    let b = _mm512_maskz_loadu_ps(m, res.as_ptr().add(r * stride + lo));
                    a = _mm512_add_ps(a, b);
                }
                _mm512_mask_storeu_ps(d.add(lo), m, a);
                lo += 16;
            }
        }
    }
}

/// Append padded positions `q0 .. q0 + len` of one input row — `padding`
/// zeros, `src` (through leaky ReLU with `slope`), then zeros — to `dst`.
pub(super) fn fill_row(
    isa: Isa,
    dst: &mut Vec<f32>,
    src: &[f32],
    q0: usize,
    len: usize,
    padding: usize,
    slope: Option<f32>,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F was detected (the isa came from `isa()`).
        Isa::Avx512 => unsafe { fill_row_avx512(dst, src, q0, len, padding, slope) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 was detected.
        Isa::Avx2 => unsafe { fill_row_avx2(dst, src, q0, len, padding, slope) },
        _ => fill_row_portable(dst, src, q0, len, padding, slope),
    }
}

/// [`fill_row`] compiled for AVX-512F.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fill_row_avx512(
    dst: &mut Vec<f32>,
    src: &[f32],
    q0: usize,
    len: usize,
    padding: usize,
    slope: Option<f32>,
) {
    fill_row_portable(dst, src, q0, len, padding, slope)
}

/// [`fill_row`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_row_avx2(
    dst: &mut Vec<f32>,
    src: &[f32],
    q0: usize,
    len: usize,
    padding: usize,
    slope: Option<f32>,
) {
    fill_row_portable(dst, src, q0, len, padding, slope)
}

/// [`fill_row`] as plain slice loops (written once each, no zero fill
/// first), which the wrappers above vectorize.
#[inline(always)]
fn fill_row_portable(
    dst: &mut Vec<f32>,
    src: &[f32],
    q0: usize,
    len: usize,
    padding: usize,
    slope: Option<f32>,
) {
    use std::mem::MaybeUninit;
    let end = q0 + len;
    // The part of q0..end that holds src, as padded positions (hi >= lo).
    let lo = padding.clamp(q0, end);
    let hi = (padding + src.len()).clamp(q0, end);
    // (lo < padding only when the range ends before src starts: empty.)
    let part: &[f32] = if hi > lo {
        &src[lo - padding..hi - padding]
    } else {
        &[]
    };
    let start = dst.len();
    dst.reserve(len);
    let spare = &mut dst.spare_capacity_mut()[..len];
    let (head, rest) = spare.split_at_mut(lo - q0);
    let (mid, tail) = rest.split_at_mut(part.len());
    head.fill(MaybeUninit::new(0.0));
    tail.fill(MaybeUninit::new(0.0));
    match slope {
        Some(a) => {
            for (d, &v) in mid.iter_mut().zip(part) {
                d.write(if v >= 0.0 { v } else { a * v });
            }
        }
        None => {
            for (d, &v) in mid.iter_mut().zip(part) {
                d.write(v);
            }
        }
    }
    // SAFETY: head, mid and tail cover the `len` reserved values, all written.
    unsafe { dst.set_len(start + len) };
}
