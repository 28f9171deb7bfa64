//! [`Op::Linear`](edgeflow_runtime::Op::Linear) on the CPU: this crate's GEMV kernels where they
//! apply, candle's GEMM / quantized matmul otherwise.

use super::gemv::{self, WeightFormat};
use super::placed::PackedWeights;
use super::placed_linear::{PlacedBf16, PlacedLinear};
use super::plain::{f32_values, plain};
use super::tensors::{cdev, with_host_slice, wrap};
use super::{gemm, gemv_f16, kquants};
use candle_core::quantized::QMatMul;
use candle_core::{DType as CDType, Module, Tensor as CTensor};
use edgeflow_runtime::{Error, Result, Storage, Tensor};
use std::sync::Arc;

/// `x[..., k] @ w[n, k]^T (+ b)` with a plain (f32/f16/bf16) or quantized `w`.
pub(crate) fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<CTensor> {
    if let Some(p) = PlacedLinear::of(w) {
        return placed(
            x,
            w,
            bias,
            |xc, rows, b, par| p.linear(xc, rows, b, par),
            || p.plain(),
        );
    }
    if let Some(p) = PlacedBf16::of(w) {
        return placed(
            x,
            w,
            bias,
            |xc, rows, b, par| p.linear(xc, rows, b, par),
            || p.plain(),
        );
    }
    let x = plain(x, "linear")?;
    let dims = x.dims().to_vec();
    let (Some(&k), true) = (dims.last(), w.rank() == 2) else {
        return Err(Error::bad_input(
            "linear",
            format!(
                "x {:?} must have rank >= 1 and w {:?} rank 2",
                dims,
                w.dims()
            ),
        ));
    };
    let (n, wk) = (w.dims()[0], w.dims()[1]);
    if wk != k {
        return Err(Error::bad_input(
            "linear",
            format!(
                "x {:?} and w {:?}: inner dims differ ({k} vs {wk})",
                dims,
                w.dims()
            ),
        ));
    }
    let rows: usize = dims[..dims.len() - 1].iter().product();
    if let Some(y) = own_kernels(&x, w, rows, bias)? {
        let mut out = dims;
        if let Some(last) = out.last_mut() {
            *last = n;
        }
        return Ok(y.reshape(out)?);
    }
    let x2 = x.reshape((rows, k))?;
    if let (Storage::Host(wc), CDType::F32) = (w.storage(), x.dtype()) {
        if wc.dtype() == CDType::F32 {
            let b = f32_values(bias, "linear")?;
            if let Some(y) = gemm::matmul(&x2, &wc.t()?, b.as_deref())? {
                let mut out = dims;
                if let Some(last) = out.last_mut() {
                    *last = n;
                }
                return Ok(y.reshape(out)?);
            }
        }
    }
    let y = match w.storage() {
        Storage::Quantized(q) => {
            let mm = QMatMul::from_arc(Arc::clone(q))?;
            let xf = x2.to_dtype(CDType::F32)?.contiguous()?;
            mm.forward(&xf)?.to_dtype(x.dtype())?
        }
        _ => {
            let w = plain(w, "linear")?.to_dtype(x.dtype())?;
            x2.matmul(&w.t()?)?
        }
    };
    let y = match bias {
        Some(b) => y.broadcast_add(&plain(b, "linear")?.to_dtype(y.dtype())?)?,
        None => y,
    };
    let mut out = dims;
    if let Some(last) = out.last_mut() {
        *last = n;
    }
    Ok(y.reshape(out)?)
}

/// [`linear`] with placed weights (f32 or bf16): on their pack where
/// `packed` (f32 rows `[rows, k]`, bias, parallel) runs the product, else
/// on their plain values (`plain_w`) as a host weight.
fn placed(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    packed: impl Fn(&CTensor, usize, Option<&[f32]>, bool) -> Result<Option<Vec<f32>>>,
    plain_w: impl Fn() -> Result<CTensor>,
) -> Result<CTensor> {
    let xc = plain(x, "linear")?;
    let dims = xc.dims().to_vec();
    let (n, k) = (w.dims()[0], w.dims()[1]);
    if dims.last() == Some(&k) && xc.dtype() == CDType::F32 {
        let rows: usize = dims[..dims.len() - 1].iter().product();
        let b = f32_values(bias, "linear")?;
        let par = rows * n * k >= gemm::PAR_MACS && rayon::current_num_threads() > 1;
        if let Some(y) = packed(&xc, rows, b.as_deref(), par)? {
            let mut out = dims;
            if let Some(last) = out.last_mut() {
                *last = n;
            }
            return Ok(CTensor::from_vec(y, out, &cdev())?);
        }
    }
    linear(x, &wrap(plain_w()?)?, bias)
}

/// Activation rows up to which f16 weights run the f16 GEMV kernel; more
/// rows go through candle's GEMM on the weights cast to f32.
const F16_GEMV_ROWS: usize = 8;

/// Activation rows up to which f32 weights take the streaming GEMV
/// ([`gemv::gemv_f32_rows`]) instead of candle's GEMM, whose packing
/// costs more than the product for a few rows (the VAD's 4 STFT frames).
const F32_GEMV_ROWS: usize = 4;

/// f32 activations through this crate's kernels ([`crate::cpu::gemv`],
/// [`crate::cpu::gemv_f16`], [`crate::cpu::kquants`]): Q8_0 / Q4_0 / Q4_1 /
/// Q5_0 and Q4_K / Q5_K / Q6_K weights for any number of rows (int8
/// activations, one arithmetic for decode and prefill), f32
/// weights for one row, f16 weights (converted in registers, f32
/// products and sums) for up to [`F16_GEMV_ROWS`] rows; None when another
/// path applies. `x` is read in place when contiguous; the bias (one
/// value per output) is added to the result rows as they are.
pub(crate) fn own_kernels(
    x: &CTensor,
    w: &Tensor,
    rows: usize,
    bias: Option<&Tensor>,
) -> Result<Option<CTensor>> {
    if x.dtype() != CDType::F32 {
        return Ok(None);
    }
    let n = w.dims()[0];
    let run = |xv: &[f32]| -> Result<Option<Vec<f32>>> {
        Ok(match w.storage() {
            Storage::Quantized(q) => {
                let data = q.data()?;
                match kquants::KFormat::of_ggml(q.dtype()) {
                    Some(fmt) => kquants::matmul(fmt, &data, n, xv, rows),
                    None => match WeightFormat::of_ggml(q.dtype()) {
                        Some(fmt) => gemv::matmul(fmt, &data, n, xv, rows),
                        None => None,
                    },
                }
            }
            Storage::Device(_) => match PackedWeights::of(w) {
                Some(p) => gemv::matmul_packed(p.fmt, &p.bytes, n, xv, rows),
                None => None,
            },
            Storage::Host(c) if c.dtype() == CDType::F32 && rows <= F32_GEMV_ROWS => {
                with_host_slice::<f32, _>(c, |w| gemv::gemv_f32_rows(w, xv, rows, n))?.flatten()
            }
            Storage::Host(c) if c.dtype() == CDType::F16 && rows <= F16_GEMV_ROWS => {
                with_host_slice::<half::f16, _>(c, |w| gemv_f16::matmul(w, n, xv, rows))?.flatten()
            }
            _ => None,
        })
    };
    let y = match with_host_slice::<f32, _>(x, |xv| run(xv))? {
        Some(y) => y?,
        // Not contiguous: copied only where one of the kernels takes `w`.
        None if takes(w, rows) => run(&x.flatten_all()?.to_vec1::<f32>()?)?,
        None => None,
    };
    let Some(mut y) = y else { return Ok(None) };
    if let Some(b) = f32_values(bias, "linear")? {
        if b.len() != n {
            return Err(Error::bad_input(
                "linear",
                format!("the bias has {} values for {n} outputs", b.len()),
            ));
        }
        for row in y.chunks_exact_mut(n) {
            for (v, b) in row.iter_mut().zip(&b) {
                *v += b;
            }
        }
    }
    Ok(Some(CTensor::from_vec(y, (rows, n), &cdev())?))
}

/// Whether one of [`own_kernels`]' kernels takes `w` for `rows` activation
/// rows (the conditions of its arms).
fn takes(w: &Tensor, rows: usize) -> bool {
    match w.storage() {
        Storage::Quantized(q) => {
            kquants::KFormat::of_ggml(q.dtype()).is_some()
                || WeightFormat::of_ggml(q.dtype()).is_some()
        }
        Storage::Device(_) => PackedWeights::of(w).is_some(),
        Storage::Host(c) => {
            (c.dtype() == CDType::F32 && rows <= F32_GEMV_ROWS)
                || (c.dtype() == CDType::F16 && rows <= F16_GEMV_ROWS)
        }
    }
}
