//! CPU backend: every [`Op`] on candle-core / candle-nn kernels, except
//! [`Op::Linear`] with f32 activations and Q8_0 / Q4_0 / Q4_1 weights (any
//! number of rows), f32 weights (one row) or f16 weights (a few rows), which
//! runs this crate's kernels ([`crate::cpu_gemv`], [`crate::cpu_gemv_f16`]);
//! stride-1 single-group f32 [`Op::Conv1d`] / [`Op::Conv1dFused`], which run
//! the direct convolution kernel (weights packed once per weight tensor); and
//! element-wise f32 ops on contiguous same-shape tensors (add/sub/mul/div,
//! affine, leaky ReLU, tanh, sigmoid, exp, neg), which run plain loops on
//! rayon's pool.
//!
//! ## Design
//! The host representation of a [`Tensor`] *is* a candle tensor, so this
//! backend is a thin translation from [`Op`] to candle calls; the bench
//! (`edgeflow bench ops`) measures that the translation costs nothing
//! measurable against calling candle directly. Kernels that need contiguous
//! inputs (candle-nn's fused softmax / norms / rope, quantized matmul,
//! candle's `gather` and `index_select`) get them here, so callers may pass
//! any strided view (a narrowed or transposed tensor). Quantized tensors given to
//! ops other than [`Op::Linear`], [`Op::IndexSelect`] and [`Op::Cast`] are
//! dequantized to f32 first.
//!
//! Placing a Q8_0 / Q4_0 / Q4_1 matrix ([`Backend::make_resident`]) packs it into
//! the int8 kernels' tile layout where they read one ([`PackedWeights`]):
//! a buffer of this backend, of the same size, that every op still takes.

use crate::cpu_act;
use crate::cpu_conv;
use crate::cpu_gemm;
use crate::cpu_gemv::{self, WeightFormat};
use crate::cpu_gemv_f16;
use crate::cpu_math;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType as CDType, Module, Tensor as CTensor};
use edgeflow_runtime::{
    rng, Backend, BinaryOp, DType, DeviceKind, Error, Op, PadMode, ReduceOp, Result, Storage,
    Tensor, UnaryOp,
};
use std::sync::Arc;

/// The CPU backend (candle kernels on the host).
#[derive(Debug, Default, Clone)]
pub struct CpuBackend;

impl CpuBackend {
    /// A CPU backend. Thread count follows candle / rayon (`RAYON_NUM_THREADS`).
    pub fn new() -> Self {
        CpuBackend
    }
}

fn cdev() -> candle_core::Device {
    candle_core::Device::Cpu
}

/// Map a runtime dtype to candle's (quantized dtypes have no plain form).
pub(crate) fn to_candle_dtype(op: &'static str, d: DType) -> Result<CDType> {
    Ok(match d {
        DType::F32 => CDType::F32,
        DType::F16 => CDType::F16,
        DType::BF16 => CDType::BF16,
        DType::I64 => CDType::I64,
        DType::I32 => CDType::I32,
        DType::U8 => CDType::U8,
        DType::Q4_0 | DType::Q4_1 | DType::Q8_0 => {
            return Err(Error::bad_input(
                op,
                format!("{d} is a block format with no plain candle dtype"),
            ))
        }
    })
}

fn ggml_dtype(d: DType) -> Option<GgmlDType> {
    match d {
        DType::Q4_0 => Some(GgmlDType::Q4_0),
        DType::Q4_1 => Some(GgmlDType::Q4_1),
        DType::Q8_0 => Some(GgmlDType::Q8_0),
        _ => None,
    }
}

/// The input as a plain host candle tensor (dequantizing block formats).
fn plain(t: &Tensor, op: &'static str) -> Result<CTensor> {
    match t.storage() {
        Storage::Host(c) => Ok(c.clone()),
        Storage::Quantized(q) => Ok(q.dequantize(&cdev())?),
        Storage::Device(_) => match PackedWeights::of(t) {
            Some(p) => Ok(p.to_qtensor()?.dequantize(&cdev())?),
            None => Err(Error::bad_input(
                op,
                "CPU backend got a device tensor; Device::run moves it to the host first",
            )),
        },
    }
}

/// Q8_0 / Q4_0 / Q4_1 weights in the tile layout of the 256-bit int8 kernels
/// ([`cpu_gemv::pack`]), made by [`Backend::make_resident`] when a stage
/// places a matrix on the CPU. [`Op::Linear`] streams it (the same bits as
/// GGML's layout, faster); [`Op::IndexSelect`] reads its rows in place;
/// any other op gets it back in GGML's layout first, as does
/// [`Backend::download`]. Same size as the GGML bytes it replaces.
#[derive(Debug)]
pub(crate) struct PackedWeights {
    fmt: WeightFormat,
    dtype: GgmlDType,
    /// Rows and values per row.
    n: usize,
    k: usize,
    bytes: Vec<u8>,
}

impl edgeflow_runtime::DeviceBuffer for PackedWeights {
    fn backend(&self) -> &str {
        "cpu"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn size_bytes(&self) -> usize {
        self.bytes.len()
    }
}

impl PackedWeights {
    /// `t`'s packed weights, if it holds some.
    fn of(t: &Tensor) -> Option<&PackedWeights> {
        match t.storage() {
            Storage::Device(b) => b.as_any().downcast_ref(),
            _ => None,
        }
    }

    /// `t` packed, when it is a block-quantized matrix of at least one tile that this
    /// machine's kernels read packed ([`cpu_gemv::packs`]).
    fn pack(t: &Tensor) -> Result<Option<Tensor>> {
        let Storage::Quantized(q) = t.storage() else {
            return Ok(None);
        };
        let Some(fmt) = WeightFormat::of_ggml(q.dtype()) else {
            return Ok(None);
        };
        let &[n, k] = t.dims() else { return Ok(None) };
        if n < cpu_gemv::PACK_ROWS || !cpu_gemv::packs(fmt) {
            return Ok(None);
        }
        let Some(bytes) = cpu_gemv::pack(fmt, &q.data()?, n, k) else {
            return Ok(None);
        };
        huge_pages::advise_range(bytes.as_ptr() as usize, bytes.len());
        let p = PackedWeights {
            fmt,
            dtype: q.dtype(),
            n,
            k,
            bytes,
        };
        Ok(Some(Tensor::from_device(Arc::new(p), t.dims(), t.dtype())))
    }

    /// The weights in GGML's layout again.
    fn to_qtensor(&self) -> Result<QTensor> {
        let ggml = cpu_gemv::unpack(self.fmt, &self.bytes, self.n, self.k).ok_or_else(|| {
            Error::bad_input("packed weights", "the packed bytes do not fit their shape")
        })?;
        Ok(candle_core::quantized::ggml_file::qtensor_from_ggml(
            self.dtype,
            &ggml,
            vec![self.n, self.k],
            &cdev(),
        )?)
    }

    /// Rows `idx` (1-D indices) dequantized, read in place.
    fn rows(&self, idx: &CTensor) -> Result<CTensor> {
        let ids = index_tensor(idx)?.to_dtype(CDType::I64)?.to_vec1::<i64>()?;
        let n = self.n;
        let ids: Vec<usize> = ids
            .into_iter()
            .map(|i| {
                usize::try_from(i).ok().filter(|&i| i < n).ok_or_else(|| {
                    Error::bad_input(
                        "index_select",
                        format!("index {i} out of range for {n} rows"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        let raw =
            cpu_gemv::packed_rows(self.fmt, &self.bytes, n, self.k, &ids).ok_or_else(|| {
                Error::bad_input("index_select", "packed rows do not fit their shape")
            })?;
        let sub = candle_core::quantized::ggml_file::qtensor_from_ggml(
            self.dtype,
            &raw,
            vec![ids.len(), self.k],
            &cdev(),
        )?;
        Ok(sub.dequantize(&cdev())?)
    }
}

fn wrap(t: CTensor) -> Result<Tensor> {
    Tensor::from_candle(t)
}

fn arity(op: &Op, inputs: &[&Tensor], min: usize, max: usize) -> Result<()> {
    if inputs.len() < min || inputs.len() > max {
        let want = if min == max {
            format!("{min}")
        } else {
            format!("{min} to {max}")
        };
        return Err(Error::bad_input(
            op.name(),
            format!("expected {want} inputs, got {}", inputs.len()),
        ));
    }
    Ok(())
}

fn check_dim(op: &'static str, dim: usize, rank: usize) -> Result<()> {
    if dim >= rank {
        return Err(Error::bad_input(
            op,
            format!("dim {dim} out of range for a rank-{rank} tensor"),
        ));
    }
    Ok(())
}

/// Indices as a candle integer dtype its gather / index_select accept.
fn index_tensor(t: &CTensor) -> Result<CTensor> {
    Ok(match t.dtype() {
        CDType::U8 | CDType::U32 | CDType::I64 => t.clone(),
        CDType::I32 | CDType::I16 => t.to_dtype(CDType::I64)?,
        other => {
            return Err(Error::bad_input(
                "index",
                format!("indices must be an integer tensor, got {other:?}"),
            ))
        }
    })
}

/// Add a per-channel bias `[c]` to `[b, c, ...]`.
fn add_channel_bias(y: CTensor, bias: Option<&Tensor>, op: &'static str) -> Result<CTensor> {
    let Some(b) = bias else { return Ok(y) };
    let b = plain(b, op)?.to_dtype(y.dtype())?;
    let mut shape = vec![1usize; y.rank()];
    shape[1] = b.elem_count();
    Ok(y.broadcast_add(&b.reshape(shape)?)?)
}

/// `x[..., k] @ w[n, k]^T (+ b)` with a plain (f32/f16/bf16) or quantized `w`.
pub(crate) fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<CTensor> {
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
    if let Some(y) = own_kernels(&x, w, rows)? {
        let y = match bias {
            Some(b) => y.broadcast_add(&plain(b, "linear")?.to_dtype(y.dtype())?)?,
            None => y,
        };
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
            if let Some(y) = cpu_gemm::matmul(&x2, &wc.t()?, b.as_deref())? {
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

/// The values of a contiguous host tensor of element type `T`, without
/// copying; None when it is not contiguous.
fn with_host_slice<T: candle_core::WithDType, R>(
    t: &CTensor,
    f: impl FnOnce(&[T]) -> R,
) -> Result<Option<R>> {
    let (st, layout) = t.storage_and_layout();
    let (candle_core::Storage::Cpu(cpu), Some((s, e))) = (&*st, layout.contiguous_offsets()) else {
        return Ok(None);
    };
    let all = cpu.as_slice::<T>()?;
    Ok(Some(f(&all[s..e])))
}

/// `t` laid out contiguously. A host f32 tensor that is a view with its
/// last two dims swapped (what `transpose(x, -1, -2)` of a contiguous
/// tensor gives: channel-major <-> time-major activations) is copied by a
/// blocked transpose; candle's strided copy walks such a view element by
/// element, and its element-wise ops on views take the same slow path.
fn dense(t: &CTensor) -> Result<CTensor> {
    if t.is_contiguous() {
        return Ok(t.clone());
    }
    let dims = t.dims();
    let r = dims.len();
    if t.dtype() != CDType::F32 || r < 2 {
        return Ok(t.contiguous()?);
    }
    let (m, n) = (dims[r - 2], dims[r - 1]);
    let stride = t.stride();
    let leading_ok = (0..r - 2).all(|i| stride[i] == dims[i + 1..].iter().product::<usize>());
    if stride[r - 2] != 1 || stride[r - 1] != m || !leading_ok {
        return Ok(t.contiguous()?);
    }
    let (st, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*st else {
        return Ok(t.contiguous()?);
    };
    let batch: usize = dims[..r - 2].iter().product();
    let all = cpu.as_slice::<f32>()?;
    let src = &all[layout.start_offset()..][..batch * m * n];
    let mut y = vec![0f32; batch * m * n];
    // View element (b, i, j) is src[b][j][i] of a contiguous [batch, n, m].
    let transpose = |(b, out): (usize, &mut [f32])| {
        cpu_math::transpose(&src[b * m * n..][..m * n], n, m, out);
    };
    if batch * m * n >= 1 << 16 && batch > 1 {
        use rayon::prelude::*;
        y.par_chunks_mut(m * n).enumerate().for_each(transpose);
    } else {
        y.chunks_mut(m * n).enumerate().for_each(transpose);
    }
    drop(st);
    Ok(CTensor::from_vec(y, dims, &cdev())?)
}

/// The f32 values of a contiguous host tensor, without copying.
fn with_f32_slice<R>(t: &CTensor, f: impl FnOnce(&[f32]) -> R) -> Result<Option<R>> {
    if t.dtype() != CDType::F32 {
        return Ok(None);
    }
    with_host_slice(t, f)
}

/// Stride-1, single-group f32 `conv1d` on the direct kernel
/// ([`cpu_conv`]), optionally with a leaky ReLU on `x`, a residual added
/// and the output written as `phases` interleaved phases
/// ([`Op::Conv1dFused`]); None for shapes it does not take (candle runs
/// those).
#[allow(clippy::too_many_arguments)]
fn conv1d_direct(
    x: &CTensor,
    w: &CTensor,
    bias: Option<&Tensor>,
    padding: usize,
    dilation: usize,
    pre_slope: Option<f64>,
    residual: Option<&CTensor>,
    phases: usize,
) -> Result<Option<CTensor>> {
    let (&[batch, c_in, t_in], &[c_out, wc, k]) = (x.dims(), w.dims()) else {
        return Ok(None);
    };
    let phases = phases.max(1);
    if wc != c_in || x.dtype() != CDType::F32 || !c_out.is_multiple_of(phases) {
        return Ok(None);
    }
    let shape = cpu_conv::Conv1dShape {
        batch,
        c_in,
        t_in,
        c_out,
        k,
        padding,
        dilation,
    };
    let Some(t_out) = shape.t_out() else {
        return Ok(None);
    };
    let b = f32_values(bias, "conv1d")?;
    // [batch, c_out, t_out], or interleaved [batch, c_out / phases, t_out * phases].
    let out_dims = [batch, c_out / phases, t_out * phases];
    let r = match residual {
        Some(r) if r.dims() == out_dims && r.dtype() == CDType::F32 => Some(dense(r)?),
        Some(_) => return Ok(None),
        None => None,
    };
    let Some(pw) = packed_weights(w, PackKind::Conv { phases }, |ws| {
        cpu_conv::PackedWeights::new(c_out, c_in, k, ws, phases)
    })?
    else {
        return Ok(None);
    };
    let x = dense(x)?;
    let run = |xs: &[f32], rs: Option<&[f32]>| {
        let fused = cpu_conv::Fused {
            pre_slope: pre_slope.map(|a| a as f32),
            residual: rs,
            phases,
        };
        cpu_conv::conv1d_packed(shape, xs, &pw, b.as_deref(), fused)
    };
    // Each layer: Result<Option<inner>> -> Option<Vec<f32>>.
    let y = with_f32_slice(&x, |xs| -> Result<Option<Vec<f32>>> {
        Ok(match &r {
            Some(r) => with_f32_slice(r, |rs| run(xs, Some(rs)))?.flatten(),
            None => run(xs, None),
        })
    })?;
    let Some(y) = y.transpose()?.flatten() else {
        return Ok(None);
    };
    Ok(Some(CTensor::from_vec(y, &out_dims[..], &cdev())?))
}

/// f32 `conv_transpose1d` (one group, no dilation) on the direct kernel,
/// in its polyphase form: output `n = q * s + r` only sees the inputs the
/// taps `j = (r + p) mod s + i * s` reach, so the `s` phases are one
/// ordinary convolution with `s * c_out` output channels over a few taps
/// ([`edgeflow_runtime::Polyphase`], rearranged once per weight tensor and cached), written
/// interleaved in time by the kernel. candle scatters every input through
/// all `k` taps instead (31 GFLOP/s on the bench shape, against ~140 for
/// the direct kernel on the same machine). None for shapes it does not take.
#[allow(clippy::too_many_arguments)]
fn conv_transpose1d_direct(
    x: &CTensor,
    w: &CTensor,
    bias: Option<&Tensor>,
    stride: usize,
    padding: usize,
    output_padding: usize,
    dilation: usize,
    groups: usize,
) -> Result<Option<CTensor>> {
    let (&[batch, c_in, l], &[wc, c_out, k]) = (x.dims(), w.dims()) else {
        return Ok(None);
    };
    if wc != c_in || groups != 1 || dilation != 1 || stride == 0 || x.dtype() != CDType::F32 {
        return Ok(None);
    }
    let Some(t_out) = ((l.saturating_sub(1)) * stride + k + output_padding)
        .checked_sub(2 * padding)
        .filter(|&t| t > 0 && l > 0)
    else {
        return Ok(None);
    };
    let cfg = edgeflow_runtime::ConvTransposeCfg {
        stride,
        padding,
        output_padding,
        dilation,
        groups,
    };
    let Some(poly) = cfg.polyphase(c_in, c_out, k) else {
        return Ok(None);
    };
    let kind = PackKind::Transposed {
        stride,
        padding,
        output_padding,
    };
    let Some(pw) = packed_weights(w, kind, |ws| {
        let wp = poly.rearrange(ws)?;
        cpu_conv::PackedWeights::new(stride * c_out, c_in, poly.taps, &wp, stride)
    })?
    else {
        return Ok(None);
    };
    let shape = cpu_conv::Conv1dShape {
        batch,
        c_in,
        t_in: l,
        c_out: stride * c_out,
        k: poly.taps,
        padding: poly.padding,
        dilation: 1,
    };
    let Some(q_len) = shape.t_out().filter(|&q| q * stride >= t_out) else {
        return Ok(None);
    };
    // Every phase carries the bias of its output channel.
    let b = f32_values(bias, "conv_transpose1d")?;
    if b.as_ref().is_some_and(|b| b.len() != c_out) {
        return Ok(None);
    }
    let b = b.map(|b| poly.bias(&b));
    let x = dense(x)?;
    let fused = cpu_conv::Fused {
        phases: stride,
        ..Default::default()
    };
    let y = with_f32_slice(&x, |xs| {
        cpu_conv::conv1d_packed(shape, xs, &pw, b.as_deref(), fused)
    })?
    .flatten();
    let Some(y) = y else {
        return Ok(None);
    };
    let y = CTensor::from_vec(y, (batch, c_out, q_len * stride), &cdev())?;
    // The phases run whole steps; the last may overshoot the output.
    Ok(Some(if q_len * stride == t_out {
        y
    } else {
        y.narrow(2, 0, t_out)?.contiguous()?
    }))
}

/// The values of an optional host tensor (a bias) as f32, flattened.
fn f32_values(t: Option<&Tensor>, op: &'static str) -> Result<Option<Vec<f32>>> {
    Ok(match t {
        Some(t) => Some(
            plain(t, op)?
                .to_dtype(CDType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        ),
        None => None,
    })
}

/// Stride-1 f32 depthwise `conv1d` (`groups == c_in == c_out`) on
/// [`cpu_conv::depthwise`]; None for other shapes (candle runs those).
fn conv1d_depthwise(
    x: &CTensor,
    w: &CTensor,
    bias: Option<&Tensor>,
    padding: usize,
    dilation: usize,
    groups: usize,
) -> Result<Option<CTensor>> {
    let (&[batch, c_in, t_in], &[c_out, 1, k]) = (x.dims(), w.dims()) else {
        return Ok(None);
    };
    if groups != c_in || c_out != c_in || x.dtype() != CDType::F32 {
        return Ok(None);
    }
    let shape = cpu_conv::Conv1dShape {
        batch,
        c_in,
        t_in,
        c_out,
        k,
        padding,
        dilation,
    };
    let Some(t_out) = shape.t_out() else {
        return Ok(None);
    };
    let b = f32_values(bias, "conv1d")?;
    let (x, w) = (dense(x)?, w.contiguous()?);
    let y = with_f32_slice(&x, |xs| {
        with_f32_slice(&w, |ws| cpu_conv::depthwise(shape, xs, ws, b.as_deref()))
    })?
    .transpose()?
    .flatten()
    .flatten();
    Ok(match y {
        Some(y) => Some(CTensor::from_vec(y, (batch, c_out, t_out), &cdev())?),
        None => None,
    })
}

/// Convolution weights packed for [`cpu_conv`], by candle tensor id: a
/// model convolves with the same weight tensors on every call, and
/// repacking them each time was ~7% of `bench tts`. Candle never reuses a
/// tensor id and weights are never written in place (only the KV cache
/// writes into its own buffers), so an id always names the same values. Entries of dropped tensors are not
/// noticed; the cache empties itself when it would exceed
/// [`PACK_CACHE_BYTES`] (weights used once then cost one extra pack).
static PACK_CACHE: std::sync::Mutex<Option<PackCache>> = std::sync::Mutex::new(None);

/// Most bytes of packed weights kept (a Piper medium voice needs ~60 MB).
const PACK_CACHE_BYTES: usize = 256 << 20;

#[derive(Debug, Default)]
struct PackCache {
    /// By tensor id and what the pack was made for.
    map: std::collections::HashMap<(candle_core::TensorId, PackKind), Arc<cpu_conv::PackedWeights>>,
    bytes: usize,
}

/// What a cached pack was made from a weight tensor for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PackKind {
    /// A convolution's `[c_out, c_in, k]` with `phases` output phases
    /// (which order the packed rows).
    Conv { phases: usize },
    /// A transposed convolution's `[c_in, c_out, k]` in its polyphase form
    /// ([`edgeflow_runtime::Polyphase`]), which these parameters fix.
    Transposed {
        stride: usize,
        padding: usize,
        output_padding: usize,
    },
}

/// `w` packed for the direct kernel by `pack` (given its values), from the
/// cache when it was packed for `kind` before; None when it is not a f32
/// host tensor or `pack` refuses it.
fn packed_weights(
    w: &CTensor,
    kind: PackKind,
    pack: impl FnOnce(&[f32]) -> Option<cpu_conv::PackedWeights>,
) -> Result<Option<Arc<cpu_conv::PackedWeights>>> {
    let id = (w.id(), kind);
    if let Some(pw) = PACK_CACHE
        .lock()
        .ok()
        .and_then(|c| c.as_ref().and_then(|c| c.map.get(&id).cloned()))
    {
        return Ok(Some(pw));
    }
    let w = w.contiguous()?;
    let Some(pw) = with_f32_slice(&w, pack)?.flatten() else {
        return Ok(None);
    };
    let pw = Arc::new(pw);
    if let Ok(mut guard) = PACK_CACHE.lock() {
        let cache = guard.get_or_insert_with(PackCache::default);
        if cache.bytes + pw.size_bytes() > PACK_CACHE_BYTES {
            cache.map.clear();
            cache.bytes = 0;
        }
        if pw.size_bytes() <= PACK_CACHE_BYTES {
            cache.bytes += pw.size_bytes();
            if let Some(old) = cache.map.insert(id, Arc::clone(&pw)) {
                // Another thread packed the same tensor meanwhile.
                cache.bytes -= old.size_bytes();
            }
        }
    }
    Ok(Some(pw))
}

/// Activation rows up to which f16 weights run the f16 GEMV kernel; more
/// rows go through candle's GEMM on the weights cast to f32.
const F16_GEMV_ROWS: usize = 8;

/// Activation rows up to which f32 weights take the streaming GEMV
/// ([`cpu_gemv::gemv_f32_rows`]) instead of candle's GEMM, whose packing
/// costs more than the product for a few rows (the VAD's 4 STFT frames).
const F32_GEMV_ROWS: usize = 4;

/// f32 activations through this crate's kernels ([`crate::cpu_gemv`],
/// [`crate::cpu_gemv_f16`]): Q8_0 / Q4_0 / Q4_1 weights for any number of
/// rows (int8 activations, one arithmetic for decode and prefill), f32
/// weights for one row, f16 weights (converted in registers, f32
/// products and sums) for up to [`F16_GEMV_ROWS`] rows; None when another
/// path applies.
fn own_kernels(x: &CTensor, w: &Tensor, rows: usize) -> Result<Option<CTensor>> {
    if x.dtype() != CDType::F32 {
        return Ok(None);
    }
    let n = w.dims()[0];
    let y = match w.storage() {
        Storage::Quantized(q) => {
            let Some(fmt) = WeightFormat::of_ggml(q.dtype()) else {
                return Ok(None);
            };
            let xv = x.flatten_all()?.to_vec1::<f32>()?;
            let data = q.data()?;
            cpu_gemv::matmul(fmt, &data, n, &xv, rows)
        }
        Storage::Device(_) => {
            let Some(p) = PackedWeights::of(w) else {
                return Ok(None);
            };
            let xv = x.flatten_all()?.to_vec1::<f32>()?;
            cpu_gemv::matmul_packed(p.fmt, &p.bytes, n, &xv, rows)
        }
        Storage::Host(c) if c.dtype() == CDType::F32 && rows <= F32_GEMV_ROWS => {
            let xv = x.flatten_all()?.to_vec1::<f32>()?;
            with_host_slice::<f32, _>(c, |w| cpu_gemv::gemv_f32_rows(w, &xv, rows, n))?.flatten()
        }
        Storage::Host(c) if c.dtype() == CDType::F16 && rows <= F16_GEMV_ROWS => {
            let xv = x.flatten_all()?.to_vec1::<f32>()?;
            with_host_slice::<half::f16, _>(c, |w| cpu_gemv_f16::matmul(w, n, &xv, rows))?.flatten()
        }
        _ => None,
    };
    Ok(match y {
        Some(y) => Some(CTensor::from_vec(y, (rows, n), &cdev())?),
        None => None,
    })
}

/// Element-wise work on contiguous f32 host tensors with this crate's
/// loops and rayon's pool instead of candle's. Candle splits every
/// element-wise op over 64K elements across its spinning barrier pool; on
/// a loaded machine the caller then spins while a descheduled worker holds
/// its share (perf: up to 19% of `bench tts` samples at load 6). Rayon's
/// idle workers sleep, and busy ones take a straggler's remaining chunks.
/// Same arithmetic per element as candle's kernels, except tanh and
/// sigmoid ([`crate::cpu_math`]: vectorized, within 1e-6 relative).
mod ew {
    use super::{cdev, with_f32_slice, CTensor, Result};
    use rayon::prelude::*;
    use std::mem::MaybeUninit;

    /// Below this many elements one thread does it all (as candle does).
    const PAR_MIN: usize = 1 << 16;
    /// Elements per parallel chunk.
    const CHUNK: usize = 1 << 14;

    fn run<S: Sync>(
        n: usize,
        src: S,
        f: impl Fn(&S, usize, &mut [MaybeUninit<f32>]) + Sync,
    ) -> Vec<f32> {
        let mut y: Vec<f32> = Vec::with_capacity(n);
        let dst = &mut y.spare_capacity_mut()[..n];
        if n >= PAR_MIN {
            dst.par_chunks_mut(CHUNK)
                .enumerate()
                .for_each(|(i, d)| f(&src, i * CHUNK, d));
        } else {
            f(&src, 0, dst);
        }
        // SAFETY: `f` wrote every element of `dst` (each chunk in full).
        unsafe { y.set_len(n) };
        y
    }

    /// `f(x)` per element; None unless `x` is a contiguous f32 host tensor.
    pub(super) fn map(x: &CTensor, f: impl Fn(f32) -> f32 + Sync) -> Result<Option<CTensor>> {
        let y = with_f32_slice(x, |xs| {
            run(xs.len(), xs, |xs, at, d| {
                for (d, &v) in d.iter_mut().zip(&xs[at..]) {
                    d.write(f(v));
                }
            })
        })?;
        Ok(match y {
            Some(y) => Some(CTensor::from_vec(y, x.shape(), &cdev())?),
            None => None,
        })
    }

    /// [`map`] with `f` applied by [`crate::cpu_math::map`] (vectorized).
    pub(super) fn map_vec(
        x: &CTensor,
        f: impl Fn(f32) -> f32 + Copy + Sync,
    ) -> Result<Option<CTensor>> {
        let y = with_f32_slice(x, |xs| {
            run(xs.len(), xs, |xs, at, d| {
                crate::cpu_math::map(&xs[at..], d, f);
            })
        })?;
        Ok(match y {
            Some(y) => Some(CTensor::from_vec(y, x.shape(), &cdev())?),
            None => None,
        })
    }

    /// `f(a, b)` per element of two same-shape tensors; None unless both are
    /// contiguous f32 host tensors of one shape.
    pub(super) fn zip(
        a: &CTensor,
        b: &CTensor,
        f: impl Fn(f32, f32) -> f32 + Sync,
    ) -> Result<Option<CTensor>> {
        if a.dims() != b.dims() {
            return Ok(None);
        }
        let y = with_f32_slice(a, |xa| {
            with_f32_slice(b, |xb| {
                run(xa.len(), (xa, xb), |(xa, xb), at, d| {
                    for ((d, &u), &v) in d.iter_mut().zip(&xa[at..]).zip(&xb[at..]) {
                        d.write(f(u, v));
                    }
                })
            })
        })?;
        Ok(match y.transpose()?.flatten() {
            Some(y) => Some(CTensor::from_vec(y, a.shape(), &cdev())?),
            None => None,
        })
    }
}

/// [`unary`] on [`ew`] for the ops of vocoders and flows.
fn unary_own(u: UnaryOp, x: &CTensor) -> Result<Option<CTensor>> {
    if !matches!(
        u,
        UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Exp
            | UnaryOp::Neg
            | UnaryOp::Relu
            | UnaryOp::GeluErf
    ) {
        return Ok(None);
    }
    let x = &dense(x)?;
    match u {
        UnaryOp::Relu => ew::map(x, |v| v.max(0.0)),
        UnaryOp::GeluErf => Ok(with_f32_slice(x, cpu_act::gelu_erf)?
            .flatten()
            .map(|y| CTensor::from_vec(y, x.shape(), &cdev()))
            .transpose()?),
        // Vectorized, within 1e-6 relative of libm's (crate::cpu_math).
        UnaryOp::Tanh => ew::map_vec(x, crate::cpu_math::tanh),
        UnaryOp::Sigmoid => ew::map_vec(x, crate::cpu_math::sigmoid),
        UnaryOp::Exp => ew::map(x, f32::exp),
        UnaryOp::Neg => ew::map(x, |v| -v),
        _ => Ok(None),
    }
}

/// [`binary`] on [`ew`] for same-shape operands.
fn binary_own(b: BinaryOp, x: &CTensor, y: &CTensor) -> Result<Option<CTensor>> {
    if x.dims() != y.dims() {
        return Ok(None);
    }
    let (x, y) = (&dense(x)?, &dense(y)?);
    match b {
        BinaryOp::Add => ew::zip(x, y, |a, b| a + b),
        BinaryOp::Sub => ew::zip(x, y, |a, b| a - b),
        BinaryOp::Mul => ew::zip(x, y, |a, b| a * b),
        BinaryOp::Div => ew::zip(x, y, |a, b| a / b),
        _ => Ok(None),
    }
}

fn unary(u: UnaryOp, x: &CTensor) -> Result<CTensor> {
    Ok(match u {
        UnaryOp::Neg => x.neg()?,
        UnaryOp::Abs => x.abs()?,
        UnaryOp::Exp => x.exp()?,
        UnaryOp::Log => x.log()?,
        UnaryOp::Sqrt => x.sqrt()?,
        UnaryOp::Sqr => x.sqr()?,
        UnaryOp::Recip => x.recip()?,
        UnaryOp::Sin => x.sin()?,
        UnaryOp::Cos => x.cos()?,
        UnaryOp::Tanh => x.tanh()?,
        UnaryOp::Sigmoid => match with_f32_slice(x, cpu_act::sigmoid)?.flatten() {
            Some(y) => CTensor::from_vec(y, x.shape(), &cdev())?,
            None => candle_nn::ops::sigmoid(x)?,
        },
        UnaryOp::Relu => x.relu()?,
        UnaryOp::Gelu => x.gelu()?,
        UnaryOp::GeluErf => match with_f32_slice(x, cpu_act::gelu_erf)?.flatten() {
            Some(y) => CTensor::from_vec(y, x.shape(), &cdev())?,
            None => x.gelu_erf()?,
        },
        UnaryOp::Silu => match with_f32_slice(x, cpu_act::silu)?.flatten() {
            Some(y) => CTensor::from_vec(y, x.shape(), &cdev())?,
            None => x.silu()?,
        },
        // log(1 + e^x) = relu(x) + log(1 + e^-|x|): no overflow for large |x|.
        UnaryOp::Softplus => (x.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?)?,
    })
}

fn binary(b: BinaryOp, x: &CTensor, y: &CTensor) -> Result<CTensor> {
    let y = if y.dtype() != x.dtype() {
        y.to_dtype(x.dtype())?
    } else {
        y.clone()
    };
    Ok(match b {
        BinaryOp::Add => x.broadcast_add(&y)?,
        BinaryOp::Sub => x.broadcast_sub(&y)?,
        BinaryOp::Mul => x.broadcast_mul(&y)?,
        BinaryOp::Div => x.broadcast_div(&y)?,
        BinaryOp::Max => x.broadcast_maximum(&y)?,
        BinaryOp::Min => x.broadcast_minimum(&y)?,
        BinaryOp::Pow => x.broadcast_pow(&y)?,
    })
}

fn reduce(r: ReduceOp, x: &CTensor, dim: usize, keepdim: bool) -> Result<CTensor> {
    check_dim("reduce", dim, x.rank())?;
    let y = match r {
        ReduceOp::Sum => x.sum_keepdim(dim)?,
        ReduceOp::Mean => x.mean_keepdim(dim)?,
        ReduceOp::Max => x.max_keepdim(dim)?,
        ReduceOp::Min => x.min_keepdim(dim)?,
        ReduceOp::ArgMax => x.argmax_keepdim(dim)?,
    };
    Ok(if keepdim { y } else { y.squeeze(dim)? })
}

fn pad(x: &CTensor, dim: usize, before: usize, after: usize, mode: PadMode) -> Result<CTensor> {
    check_dim("pad", dim, x.rank())?;
    Ok(match mode {
        PadMode::Zeros => x.pad_with_zeros(dim, before, after)?,
        PadMode::Replicate => x.pad_with_same(dim, before, after)?,
        PadMode::Reflect => {
            let n = x.dim(dim)?;
            if before >= n || after >= n {
                return Err(Error::bad_input(
                    "pad",
                    format!(
                        "reflect padding ({before}, {after}) needs a dim longer than both, got {n}"
                    ),
                ));
            }
            // torch.nn.functional.pad(mode="reflect"): the edge is not repeated.
            let idx: Vec<u32> = (0..before)
                .map(|i| (before - i) as u32)
                .chain((0..n).map(|i| i as u32))
                .chain((0..after).map(|i| (n - 2 - i) as u32))
                .collect();
            let len = idx.len();
            let idx = CTensor::from_vec(idx, len, &cdev())?;
            x.index_select(&idx, dim)?
        }
    })
}

/// Scaled dot-product attention with grouped-query heads, an additive mask
/// and an end-aligned causal mask, computed as softmax(q k^T * scale + m) v.
fn attention(
    q: &CTensor,
    k: &CTensor,
    v: &CTensor,
    mask: Option<&CTensor>,
    scale: f64,
    causal: bool,
) -> Result<CTensor> {
    let (b, h, s, d) = q.dims4()?;
    let (kb, hk, t, kd) = k.dims4()?;
    let (vb, vh, vt, dv) = v.dims4()?;
    if kb != b || vb != b || kd != d || vh != hk || vt != t || hk == 0 || h % hk != 0 {
        return Err(Error::bad_input(
            "attention",
            format!(
                "q {:?}, k {:?}, v {:?}: need q[b,h,s,d], k/v[b,hk,t,d] with hk dividing h",
                q.dims(),
                k.dims(),
                v.dims()
            ),
        ));
    }
    if causal && s > t {
        return Err(Error::bad_input(
            "attention",
            format!("causal attention needs at least as many keys ({t}) as queries ({s})"),
        ));
    }
    // f32 on the host (the common case): the fused, blocked kernel.
    if let Some(y) = crate::cpu_attn::attention(q, k, v, mask, scale, causal)? {
        return Ok(y);
    }
    let rep = h / hk;
    let k = k.to_dtype(q.dtype())?;
    let v = v.to_dtype(q.dtype())?;
    // Query head i uses kv head i / rep: fold the rep query heads of a group
    // into the row dim so keys and values are never copied.
    let qg = q.contiguous()?.reshape((b, hk, rep * s, d))?;
    let scores = (qg.matmul(&k.t()?)? * scale)?.reshape((b, h, s, t))?;
    let scores = match mask {
        Some(m) => scores.broadcast_add(&m.to_dtype(scores.dtype())?)?,
        None => scores,
    };
    let scores = if causal {
        let off = t - s;
        let m: Vec<f32> = (0..s)
            .flat_map(|i| (0..t).map(move |j| if j > i + off { f32::NEG_INFINITY } else { 0.0 }))
            .collect();
        let m = CTensor::from_vec(m, (s, t), &cdev())?.to_dtype(scores.dtype())?;
        scores.broadcast_add(&m)?
    } else {
        scores
    };
    let p = candle_nn::ops::softmax_last_dim(&scores.contiguous()?)?;
    let p = p.reshape((b, hk, rep * s, t))?;
    Ok(p.matmul(&v)?.reshape((b, h, s, dv))?)
}

/// Rows `idx` of a quantized `[n, k]` matrix, dequantized, without
/// dequantizing the rest (embedding lookup in a GGUF model).
fn quantized_rows(q: &QTensor, idx: &CTensor) -> Result<CTensor> {
    let (n, k) = q.shape().dims2()?;
    let dt = q.dtype();
    let row_bytes = k / dt.block_size() * dt.type_size();
    let data = q.data()?;
    let ids = index_tensor(idx)?.to_dtype(CDType::I64)?.to_vec1::<i64>()?;
    let mut raw = Vec::with_capacity(ids.len() * row_bytes);
    for &i in &ids {
        if i < 0 || i as usize >= n {
            return Err(Error::bad_input(
                "index_select",
                format!("index {i} out of range for {n} rows"),
            ));
        }
        let i = i as usize;
        raw.extend_from_slice(&data[i * row_bytes..(i + 1) * row_bytes]);
    }
    let sub = candle_core::quantized::ggml_file::qtensor_from_ggml(
        dt,
        &raw,
        vec![ids.len(), k],
        &cdev(),
    )?;
    Ok(sub.dequantize(&cdev())?)
}

fn cast(x: &Tensor, to: DType) -> Result<Tensor> {
    if let Some(g) = ggml_dtype(to) {
        let f = plain(x, "cast")?.to_dtype(CDType::F32)?;
        if f.dims().last().is_none_or(|&k| k % g.block_size() != 0) {
            return Err(Error::bad_input(
                "cast",
                format!(
                    "quantizing to {to} needs the last dim divisible by {}, got {:?}",
                    g.block_size(),
                    f.dims()
                ),
            ));
        }
        return Tensor::from_quantized(Arc::new(QTensor::quantize(&f, g)?));
    }
    let c = plain(x, "cast")?;
    wrap(c.to_dtype(to_candle_dtype("cast", to)?)?)
}

impl CpuBackend {
    fn exec(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
        let name = op.name();
        let p = |i: usize| plain(inputs[i], name);
        match op {
            Op::MatMul => {
                arity(op, inputs, 2, 2)?;
                let (a, b) = (p(0)?, p(1)?);
                let b = b.to_dtype(a.dtype())?;
                if let Some(y) = cpu_gemm::matmul(&a, &b, None)? {
                    return wrap(y);
                }
                if a.rank() == 2 && b.rank() == 2 {
                    wrap(a.matmul(&b)?)
                } else {
                    wrap(a.broadcast_matmul(&b)?)
                }
            }
            Op::Linear => {
                arity(op, inputs, 2, 3)?;
                wrap(linear(inputs[0], inputs[1], inputs.get(2).copied())?)
            }
            Op::Conv1d {
                stride,
                padding,
                dilation,
                groups,
            } => {
                arity(op, inputs, 2, 3)?;
                let x = p(0)?;
                let w = p(1)?.to_dtype(x.dtype())?;
                if *stride == 1 && *groups == 1 {
                    let direct = conv1d_direct(
                        &x,
                        &w,
                        inputs.get(2).copied(),
                        *padding,
                        *dilation,
                        None,
                        None,
                        1,
                    )?;
                    if let Some(y) = direct {
                        return wrap(y);
                    }
                }
                if *stride == 1 && *groups > 1 {
                    if let Some(y) = conv1d_depthwise(
                        &x,
                        &w,
                        inputs.get(2).copied(),
                        *padding,
                        *dilation,
                        *groups,
                    )? {
                        return wrap(y);
                    }
                }
                let y = x.conv1d(&w, *padding, *stride, *dilation, *groups)?;
                wrap(add_channel_bias(y, inputs.get(2).copied(), name)?)
            }
            Op::Conv1dFused {
                stride,
                padding,
                dilation,
                groups,
                pre_slope,
                residual,
                phases,
            } => {
                let n = if *residual { 4 } else { 3 };
                arity(op, inputs, n, n)?;
                let x = p(0)?;
                let w = p(1)?.to_dtype(x.dtype())?;
                let res = if *residual { Some(p(3)?) } else { None };
                if *stride == 1 && *groups == 1 {
                    let direct = conv1d_direct(
                        &x,
                        &w,
                        Some(inputs[2]),
                        *padding,
                        *dilation,
                        *pre_slope,
                        res.as_ref(),
                        *phases,
                    )?;
                    if let Some(y) = direct {
                        return wrap(y);
                    }
                }
                // Composed from candle ops for the shapes the kernel does not take.
                let xa = match pre_slope {
                    Some(a) => {
                        let neg = (x.minimum(0f64)? * *a)?;
                        (x.relu()? + neg)?
                    }
                    None => x,
                };
                let y = xa.conv1d(&w, *padding, *stride, *dilation, *groups)?;
                let y = add_channel_bias(y, Some(inputs[2]), name)?;
                let ph = (*phases).max(1);
                let y = if ph > 1 {
                    let (b, c, l) = y.dims3()?;
                    if !c.is_multiple_of(ph) {
                        return Err(Error::bad_input(
                            name,
                            format!("{ph} phases do not divide {c} output channels"),
                        ));
                    }
                    y.reshape((b, ph, c / ph, l))?
                        .permute((0, 2, 3, 1))?
                        .reshape((b, c / ph, l * ph))?
                } else {
                    y
                };
                wrap(match res {
                    Some(r) => y.broadcast_add(&r.to_dtype(y.dtype())?)?,
                    None => y,
                })
            }
            Op::Conv2d {
                stride,
                padding,
                dilation,
                groups,
            } => {
                arity(op, inputs, 2, 3)?;
                let x = p(0)?;
                let w = p(1)?.to_dtype(x.dtype())?;
                let y = x.conv2d(&w, *padding, *stride, *dilation, *groups)?;
                wrap(add_channel_bias(y, inputs.get(2).copied(), name)?)
            }
            Op::ConvTranspose1d {
                stride,
                padding,
                output_padding,
                dilation,
                groups,
            } => {
                arity(op, inputs, 2, 3)?;
                let x = p(0)?;
                let w = p(1)?.to_dtype(x.dtype())?;
                if let Some(y) = conv_transpose1d_direct(
                    &x,
                    &w,
                    inputs.get(2).copied(),
                    *stride,
                    *padding,
                    *output_padding,
                    *dilation,
                    *groups,
                )? {
                    return wrap(y);
                }
                let y =
                    x.conv_transpose1d(&w, *padding, *output_padding, *stride, *dilation, *groups)?;
                wrap(add_channel_bias(y, inputs.get(2).copied(), name)?)
            }
            Op::LayerNorm { eps } => {
                arity(op, inputs, 2, 3)?;
                let x = dense(&p(0)?)?;
                let g = p(1)?.to_dtype(x.dtype())?.contiguous()?;
                let b = match inputs.get(2) {
                    Some(b) => plain(b, name)?.to_dtype(x.dtype())?.contiguous()?,
                    None => g.zeros_like()?,
                };
                wrap(candle_nn::ops::layer_norm(&x, &g, &b, *eps as f32)?)
            }
            Op::RmsNorm { eps } => {
                arity(op, inputs, 2, 2)?;
                let x = p(0)?.contiguous()?;
                let g = p(1)?.to_dtype(x.dtype())?.contiguous()?;
                wrap(candle_nn::ops::rms_norm(&x, &g, *eps as f32)?)
            }
            Op::Softmax { dim } => {
                arity(op, inputs, 1, 1)?;
                let x = p(0)?;
                check_dim(name, *dim, x.rank())?;
                if *dim + 1 == x.rank() {
                    wrap(candle_nn::ops::softmax_last_dim(&x.contiguous()?)?)
                } else {
                    wrap(candle_nn::ops::softmax(&x, *dim)?)
                }
            }
            Op::Attention { scale, causal } => {
                arity(op, inputs, 3, 4)?;
                let mask = match inputs.get(3) {
                    Some(m) => Some(plain(m, name)?),
                    None => None,
                };
                wrap(attention(
                    &p(0)?,
                    &p(1)?,
                    &p(2)?,
                    mask.as_ref(),
                    *scale,
                    *causal,
                )?)
            }
            Op::Rope { interleaved } => {
                arity(op, inputs, 3, 3)?;
                let x = p(0)?.contiguous()?;
                let cos = p(1)?.to_dtype(x.dtype())?.contiguous()?;
                let sin = p(2)?.to_dtype(x.dtype())?.contiguous()?;
                if *interleaved {
                    wrap(candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?)
                } else {
                    wrap(candle_nn::rotary_emb::rope(&x, &cos, &sin)?)
                }
            }
            Op::Unary(u) => {
                arity(op, inputs, 1, 1)?;
                let x = p(0)?;
                if let Some(y) = unary_own(*u, &x)? {
                    return wrap(y);
                }
                wrap(unary(*u, &x)?)
            }
            Op::LeakyRelu { slope } => {
                arity(op, inputs, 1, 1)?;
                let x = p(0)?;
                let a = *slope as f32;
                if let Some(y) = ew::map(&dense(&x)?, |v| v.max(v * a))? {
                    return wrap(y);
                }
                wrap(x.maximum(&(&x * *slope)?)?)
            }
            Op::Snake => {
                arity(op, inputs, 2, 2)?;
                let x = p(0)?;
                let a = p(1)?.to_dtype(x.dtype())?;
                let (_, c, _) = x.dims3()?;
                if a.elem_count() != c {
                    return Err(Error::bad_input(
                        name,
                        format!("alpha has {} values for {c} channels", a.elem_count()),
                    ));
                }
                let a = a.reshape((1, c, 1))?;
                let s = x.broadcast_mul(&a)?.sin()?.sqr()?;
                wrap((&x + s.broadcast_div(&a)?)?)
            }
            Op::Binary(b) => {
                arity(op, inputs, 2, 2)?;
                let (x, y) = (p(0)?, p(1)?);
                if let Some(z) = binary_own(*b, &x, &y)? {
                    return wrap(z);
                }
                wrap(binary(*b, &x, &y)?)
            }
            Op::Affine { mul, add } => {
                arity(op, inputs, 1, 1)?;
                let x = p(0)?;
                let (m, a) = (*mul as f32, *add as f32);
                if let Some(y) = ew::map(&dense(&x)?, |v| v * m + a)? {
                    return wrap(y);
                }
                wrap(x.affine(*mul, *add)?)
            }
            Op::Reduce {
                op: r,
                dim,
                keepdim,
            } => {
                arity(op, inputs, 1, 1)?;
                wrap(reduce(*r, &p(0)?, *dim, *keepdim)?)
            }
            Op::Cumsum { dim } => {
                arity(op, inputs, 1, 1)?;
                let x = p(0)?;
                check_dim(name, *dim, x.rank())?;
                wrap(x.cumsum(*dim)?)
            }
            Op::Reshape { shape } => {
                arity(op, inputs, 1, 1)?;
                wrap(p(0)?.reshape(shape.as_slice())?)
            }
            Op::Permute { dims } => {
                arity(op, inputs, 1, 1)?;
                wrap(p(0)?.permute(dims.as_slice())?)
            }
            Op::Concat { dim } => {
                if inputs.is_empty() {
                    return Err(Error::bad_input(name, "nothing to concatenate"));
                }
                let xs = inputs
                    .iter()
                    .map(|t| plain(t, name))
                    .collect::<Result<Vec<_>>>()?;
                check_dim(name, *dim, xs[0].rank())?;
                wrap(CTensor::cat(&xs, *dim)?)
            }
            Op::Narrow { dim, start, len } => {
                arity(op, inputs, 1, 1)?;
                let x = p(0)?;
                check_dim(name, *dim, x.rank())?;
                wrap(x.narrow(*dim, *start, *len)?)
            }
            Op::Pad {
                dim,
                before,
                after,
                mode,
            } => {
                arity(op, inputs, 1, 1)?;
                wrap(pad(&p(0)?, *dim, *before, *after, *mode)?)
            }
            Op::Gather { dim } => {
                arity(op, inputs, 2, 2)?;
                // candle's CPU gather reads both operands as contiguous.
                let x = p(0)?.contiguous()?;
                check_dim(name, *dim, x.rank())?;
                let idx = index_tensor(&p(1)?)?.contiguous()?;
                wrap(x.gather(&idx, *dim)?)
            }
            Op::IndexSelect { dim } => {
                arity(op, inputs, 2, 2)?;
                let idx = p(1)?;
                if idx.rank() != 1 {
                    return Err(Error::bad_input(
                        name,
                        format!("indices must be 1-D, got {:?}", idx.dims()),
                    ));
                }
                if let (Storage::Quantized(q), 0) = (inputs[0].storage(), *dim) {
                    if q.shape().rank() == 2 {
                        return wrap(quantized_rows(q, &idx)?);
                    }
                }
                if let (Some(w), 0) = (PackedWeights::of(inputs[0]), *dim) {
                    return wrap(w.rows(&idx)?);
                }
                // candle's CPU index_select reads its source as contiguous
                // (the indices may be strided); a no-op when it already is.
                let x = p(0)?.contiguous()?;
                check_dim(name, *dim, x.rank())?;
                wrap(x.index_select(&index_tensor(&idx)?, *dim)?)
            }
            Op::Cast { dtype } => {
                arity(op, inputs, 1, 1)?;
                cast(inputs[0], *dtype)
            }
            Op::RandNormal {
                shape,
                mean,
                std,
                seed,
            } => {
                arity(op, inputs, 0, 0)?;
                rng::rand_normal_host(shape, *mean, *std, *seed)
            }
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn adapter(&self) -> String {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        format!("host CPU ({threads} threads, candle {})", candle_features())
    }

    fn supports(&self, _op: &Op, inputs: &[&Tensor]) -> bool {
        inputs.iter().all(|t| self.holds(t))
    }

    fn holds(&self, t: &Tensor) -> bool {
        t.is_host() || PackedWeights::of(t).is_some()
    }

    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        if t.is_host() {
            Ok(t.clone())
        } else {
            Err(Error::bad_input(
                "upload",
                "the CPU backend cannot read another backend's buffer; download it with its own backend",
            ))
        }
    }

    fn download(&self, t: &Tensor) -> Result<Tensor> {
        match PackedWeights::of(t) {
            Some(p) => Tensor::from_quantized(Arc::new(p.to_qtensor()?)),
            None => self.upload(t),
        }
    }

    fn execute(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
        self.exec(op, inputs)
    }

    fn make_resident(&self, t: &Tensor) -> Result<Tensor> {
        if let Some(p) = PackedWeights::pack(t)? {
            return Ok(p);
        }
        huge_pages::advise(t);
        Ok(t.clone())
    }

    fn run_batch(&self, f: &mut (dyn FnMut() + Send)) {
        use std::sync::atomic::Ordering;
        // On a worker of rayon's pool (where the kernels fork): each op's
        // split runs half on this thread and joins without a sleep/wake
        // of the caller. Already on a worker, this runs inline. The other
        // workers are kept awake meanwhile (see `keep_workers_awake`).
        BATCHES.fetch_add(1, Ordering::AcqRel);
        rayon::scope(|_| {
            // A spinner that picked this batch up (a stage's batch is
            // injected into the pool, and a lingering spinner runs pool
            // work) stops counting as one while it runs it, so the batch
            // gets a spinner of its own; after, the spinner takes a slot
            // again if one is free. (Found in `bench ops`: a spinner ran
            // whole 40 ms blocks of GEMVs with the other core idle.)
            if SPINNING.replace(false) {
                SPINNERS.fetch_sub(1, Ordering::AcqRel);
            }
            // Started from the worker that runs the batch: spawned from
            // outside the pool, the spinner could itself pick the batch up
            // (it runs pending work) and nobody would spin (a `rayon::join`
            // of two 30 us halves after 30 us of serial work: 80 us either
            // way; started from inside: 33 us).
            keep_workers_awake();
            IN_BATCH.set(IN_BATCH.get() + 1);
            // Restored even if f unwinds (a spinner would otherwise see
            // this thread as inside a batch for good).
            struct Leave;
            impl Drop for Leave {
                fn drop(&mut self) {
                    IN_BATCH.set(IN_BATCH.get() - 1);
                }
            }
            let _leave = Leave;
            f();
        });
        BATCHES.fetch_sub(1, Ordering::AcqRel);
    }
}

std::thread_local! {
    /// This thread is a spinner holding a slot of [`SPINNERS`].
    static SPINNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Batches running now (all stages).
static BATCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Workers held awake by [`keep_workers_awake`].
static SPINNERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// How long a spinner outlives the last batch: the gap between two
/// forward passes of a loop (a token's sampling, the next audio window).
const LINGER: std::time::Duration = std::time::Duration::from_micros(500);

/// Occupy up to `threads - 1` other workers of rayon's pool with a task
/// that runs pending pool work as soon as it appears and spins between,
/// while any batch runs and [`LINGER`] after the last one ends.
///
/// Why: a batch is a forward pass, hundreds of ops whose parallel parts
/// are a few to a few hundred microseconds apart. An idle rayon worker
/// sleeps after a short spin, and waking a sleeping thread took ~50 us on
/// the build machine (a VM: the wake-up crosses the hypervisor; measured
/// with `rayon::join` of two 30 us halves after 30 us of serial work: 84 us
/// against 36 us back to back). For a small op the caller had then done
/// all the work itself before the other worker arrived.
///
/// The spinner is a detached task, not part of a batch's scope: the work
/// it picks up may belong to any stage's batch, and no batch waits for it.
/// It calls `std::thread::yield_now` between polls, so other runnable
/// threads on its core (another stage, the audio callback) still get it.
fn keep_workers_awake() {
    let want = rayon::current_num_threads().saturating_sub(1);
    while claim_spinner(want) {
        rayon::spawn(move || spin(want));
    }
}

/// The longest a spinner runs before it hands its thread back and
/// respawns itself (keeping its slot).
///
/// Why: a spinner is a rayon job, and a worker waiting in a join runs
/// pending jobs, so a spinner can start nested inside a wait (the batch's
/// own thread popping the spinner it just spawned, or a worker running a
/// stolen part of a batch). Spinning there while any batch runs would hold
/// that wait, and so that batch, forever (it happened: the voice loop's
/// barge-in test hung with the TTS batch queued behind a spinner nested in
/// a join). Ended shifts bound such a stall; a spinner nested inside a
/// batch on its own thread leaves at once.
const SHIFT: std::time::Duration = std::time::Duration::from_millis(1);

std::thread_local! {
    /// Batches this thread is running now (nested ones included).
    static IN_BATCH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// One shift of a spinner holding a slot of [`SPINNERS`] (see
/// [`keep_workers_awake`]).
fn spin(want: usize) {
    use std::sync::atomic::Ordering;
    SPINNING.set(true);
    let shift = std::time::Instant::now();
    let mut idle = 0u32;
    let mut last_batch = shift;
    loop {
        if IN_BATCH.get() > 0 {
            // Nested inside a batch this thread runs: spinning would
            // hold that batch.
            SPINNING.set(false);
            SPINNERS.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let now = std::time::Instant::now();
        if BATCHES.load(Ordering::Acquire) > 0 {
            last_batch = now;
        } else if now - last_batch > LINGER {
            break;
        }
        if now - shift > SHIFT {
            SPINNING.set(false);
            rayon::spawn(move || spin(want));
            return;
        }
        if crate::cpu_team::help() {
            idle = 0;
            continue;
        }
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle = 0;
            // The work was a batch, which took this thread's slot (see
            // run_batch): spin on only if a slot is free.
            if !SPINNING.get() {
                if !claim_spinner(want) {
                    return;
                }
                SPINNING.set(true);
            }
            continue;
        }
        idle = idle.wrapping_add(1);
        if idle.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    SPINNING.set(false);
    SPINNERS.fetch_sub(1, Ordering::AcqRel);
    // A batch that started as this one was leaving found no free slot:
    // take the slot back for it.
    if BATCHES.load(Ordering::Acquire) > 0 && claim_spinner(want) {
        rayon::spawn(move || spin(want));
    }
}

/// Workers held spinning by [`keep_workers_awake`] now (the team
/// `cpu_team::run` hands work to).
pub(crate) fn spinners() -> usize {
    SPINNERS.load(std::sync::atomic::Ordering::Acquire)
}

/// Take one of `want` spinner slots; false when all are taken.
fn claim_spinner(want: usize) -> bool {
    use std::sync::atomic::Ordering;
    let mut now = SPINNERS.load(Ordering::Acquire);
    while now < want {
        match SPINNERS.compare_exchange(now, now + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(v) => now = v,
        }
    }
    false
}

/// Huge pages for weights. Decode streams every weight once per token; on
/// 4 KB pages each page is a TLB miss, and in a virtual machine (nested
/// page tables) those misses cost a large share of the streaming rate: the
/// Q4_1 GEMV kernel read 256 MB of weights at 9.3-10.7 GB/s on one thread
/// with 4 KB pages and 14.8-15.5 GB/s on 2 MB pages (this machine, a VM,
/// same run). Transparent huge pages are usually enabled for `madvise`d
/// memory only, and weights are written before we see them, so
/// `MADV_COLLAPSE` (Linux 6.1+) rebuilds their pages in place; with
/// `MADV_HUGEPAGE` set first, khugepaged does it later where collapse is
/// unavailable. Best effort: errors are ignored.
pub(crate) mod huge_pages {
    use edgeflow_runtime::{Storage, Tensor};

    /// Weights smaller than this are not worth a system call (the 2 MB
    /// region around a smaller one is advised with its neighbours').
    const MIN_BYTES: usize = 128 << 10;

    /// The bytes of a host or quantized tensor's storage.
    fn byte_range(t: &Tensor) -> Option<(usize, usize)> {
        match t.storage() {
            Storage::Quantized(q) => {
                let d = q.data().ok()?;
                Some((d.as_ptr() as usize, d.len()))
            }
            Storage::Host(c) => {
                let (st, layout) = c.storage_and_layout();
                let candle_core::Storage::Cpu(cpu) = &*st else {
                    return None;
                };
                let (s, e) = layout.contiguous_offsets()?;
                let size = c.dtype().size_in_bytes();
                let base = match cpu {
                    candle_core::CpuStorage::F32(v) => v.as_ptr() as usize,
                    candle_core::CpuStorage::F16(v) => v.as_ptr() as usize,
                    candle_core::CpuStorage::BF16(v) => v.as_ptr() as usize,
                    _ => return None,
                };
                Some((base + s * size, (e - s) * size))
            }
            Storage::Device(_) => None,
        }
    }

    /// Advise the 2 MB-aligned regions that cover `t`'s bytes (they may
    /// take in neighbouring heap memory; only the page size changes).
    pub(crate) fn advise(t: &Tensor) {
        let Some((start, len)) = byte_range(t) else {
            return;
        };
        if len >= MIN_BYTES {
            advise_range(start, len);
        }
    }

    /// [`advise`] for the bytes `start..start + len` of a live allocation.
    pub(crate) fn advise_range(start: usize, len: usize) {
        #[cfg(target_os = "linux")]
        {
            const HUGE: usize = 2 << 20;
            let lo = start & !(HUGE - 1);
            let hi = (start + len).next_multiple_of(HUGE);
            // One 2 MB region at a time, collapsed first and marked
            // MADV_HUGEPAGE only once that worked. Weights loaded on the
            // main thread live in the brk heap, and the region holding a
            // tensor's tail usually runs past the heap's end while it
            // loads: a single call over every region failed as a whole,
            // and MADV_HUGEPAGE on that partly mapped region flagged its
            // mapped part, which then never merged with the heap's later
            // growth, so the region spanned two mappings and every later
            // collapse of it was refused (EINVAL; strace of `bench ops`:
            // 1199 of 1237 refused, AnonHugePages 0 kB). Unflagged, the
            // region is collapsed when the next tensor's (outward-rounded)
            // range covers it.
            for region in (lo..hi).step_by(HUGE) {
                // SAFETY: madvise with these advices changes how the pages
                // of our own mapping are backed, never their contents; a
                // region with unmapped parts only makes the call fail.
                unsafe {
                    let p = region as *mut libc::c_void;
                    if libc::madvise(p, HUGE, libc::MADV_COLLAPSE) == 0 {
                        libc::madvise(p, HUGE, libc::MADV_HUGEPAGE);
                    }
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = start;
    }
}

fn candle_features() -> &'static str {
    if candle_core::utils::with_avx() {
        "avx"
    } else if candle_core::utils::with_neon() {
        "neon"
    } else {
        "scalar"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeflow_runtime::Device;

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec_f32()
            .expect("host f32")
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    /// A quantized matrix placed on the CPU (packed into the kernels' tiles where
    /// this machine reads them packed) gives what the GGML-layout tensor
    /// gives, bit for bit: linear (decode, prefill, bias), embedding rows,
    /// dequantization, any other op, and the bytes it downloads to.
    #[test]
    fn placed_quantized_weights_give_the_ggml_layout_results() {
        let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
        let dev = Device::new(cpu.clone(), cpu);
        for dt in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
            // 13 rows: three whole tiles and a tail row; 96 values: an odd
            // block count.
            let w = dev
                .cast(
                    &rng::rand_normal_host(&[13, 96], 0.0, 0.3, 7).expect("w"),
                    dt,
                )
                .expect("quantize");
            let placed = dev.place(&w).expect("place");
            let packed = PackedWeights::of(&placed).is_some();
            let fmt =
                WeightFormat::of_ggml(ggml_dtype(dt).expect("block format")).expect("block format");
            assert_eq!(
                packed,
                cpu_gemv::packs(fmt),
                "{dt}: packed where the kernels read it"
            );
            assert_eq!(placed.size_bytes(), w.size_bytes());
            assert_eq!(placed.dtype(), dt);
            // Placing again keeps it as it is.
            let again = dev.place(&placed).expect("place again");
            assert_eq!(PackedWeights::of(&again).is_some(), packed);
            let b = rng::rand_normal_host(&[13], 0.0, 1.0, 8).expect("b");
            for rows in [1usize, 3, 6] {
                let x = rng::rand_normal_host(&[rows, 96], 0.0, 1.0, rows as u64).expect("x");
                let want = dev.linear(&x, &w, Some(&b)).expect("ggml layout");
                let got = dev.linear(&x, &placed, Some(&b)).expect("placed");
                assert_eq!(bits(&got), bits(&want), "{dt} linear, {rows} rows");
            }
            let idx = Tensor::from_i64(vec![12, 0, 5, 3, 12], &[5]).expect("idx");
            let want = dev.index_select(&w, &idx, 0).expect("ggml rows");
            let got = dev.index_select(&placed, &idx, 0).expect("placed rows");
            assert_eq!(bits(&got), bits(&want), "{dt} index_select");
            let bad = Tensor::from_i64(vec![13], &[1]).expect("idx");
            let e = dev
                .index_select(&placed, &bad, 0)
                .expect_err("out of range");
            assert!(e.to_string().contains("out of range"), "{e}");
            let want = dev.cast(&w, DType::F32).expect("dequantize");
            let got = dev.cast(&placed, DType::F32).expect("dequantize placed");
            assert_eq!(bits(&got), bits(&want), "{dt} cast");
            let got = dev.transpose(&placed, 0, 1).expect("another op");
            let want = dev.transpose(&w, 0, 1).expect("another op");
            assert_eq!(bits(&got), bits(&want), "{dt} transpose");
            let back = dev.to_host(&placed).expect("download");
            let (Storage::Quantized(a), Storage::Quantized(o)) = (back.storage(), w.storage())
            else {
                panic!("{dt}: downloads as a quantized host tensor");
            };
            assert_eq!(
                a.data().expect("bytes").as_ref(),
                o.data().expect("bytes").as_ref()
            );
        }
    }

    /// `conv_transpose1d` on the polyphase direct kernel agrees with
    /// candle's scatter form (plus the bias) over upsampling shapes and
    /// the odd ones: kernel shorter than the stride, stride 1, padding
    /// past the kernel, output padding, a long input (spans padded inside
    /// the tasks), one output channel, batch 2. Dilation and groups fall
    /// back to candle. Tolerance: 1e-4 of the output's largest value (f32
    /// sums in a different order over up to 256 x 3 products).
    #[test]
    fn transposed_convolution_in_polyphase_form_matches_candle() {
        let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
        let dev = Device::new(cpu.clone(), cpu);
        // (batch, c_in, c_out, l, k, stride, padding, output_padding, dilation, groups, direct)
        let cases = [
            (1, 256, 128, 200, 16, 8, 4, 0, 1, 1, true),
            (1, 64, 32, 37, 10, 5, 3, 0, 1, 1, true),
            (2, 5, 3, 7, 4, 2, 1, 0, 1, 1, true),
            (1, 6, 5, 13, 3, 5, 0, 0, 1, 1, true),
            (1, 4, 4, 9, 5, 3, 1, 2, 1, 1, true),
            (1, 7, 9, 20, 7, 1, 3, 0, 1, 1, true),
            (1, 3, 2, 11, 1, 2, 0, 1, 1, 1, true),
            (1, 8, 4, 25, 5, 2, 6, 0, 1, 1, true),
            (2, 16, 1, 3000, 8, 4, 2, 0, 1, 1, true),
            (1, 3, 2, 9, 3, 2, 0, 0, 2, 1, false),
            (1, 4, 4, 9, 4, 2, 1, 0, 1, 2, false),
        ];
        for (i, &(batch, c_in, c_out, l, k, stride, padding, op, dil, groups, direct)) in
            cases.iter().enumerate()
        {
            let seed = 100 + 3 * i as u64;
            let x = rng::rand_normal_host(&[batch, c_in, l], 0.0, 1.0, seed).expect("x");
            let w =
                rng::rand_normal_host(&[c_in, c_out / groups, k], 0.0, 0.3, seed + 1).expect("w");
            let b = rng::rand_normal_host(&[c_out], 0.0, 1.0, seed + 2).expect("b");
            let cfg = edgeflow_runtime::ConvTransposeCfg {
                stride,
                padding,
                output_padding: op,
                dilation: dil,
                groups,
            };
            let got = dev.conv_transpose1d(&x, &w, Some(&b), cfg).expect("ours");
            let (cx, cw) = (x.candle("x").expect("x"), w.candle("w").expect("w"));
            let cb = b.candle("b").expect("b").reshape((1, c_out, 1)).expect("b");
            let want = cx
                .conv_transpose1d(cw, padding, op, stride, dil, groups)
                .and_then(|y| y.broadcast_add(&cb))
                .expect("candle");
            let name = format!("case {i}: {:?}", cases[i]);
            assert_eq!(got.dims(), want.dims(), "{name}");
            let took = conv_transpose1d_direct(cx, cw, Some(&b), stride, padding, op, dil, groups)
                .expect("direct");
            assert_eq!(took.is_some(), direct, "{name}: direct kernel taken");
            let got = got.to_vec_f32().expect("f32");
            let want = want
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("f32");
            let top = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= 1e-4 * top,
                "{name}: off by {worst} (largest {top})"
            );
        }
    }
}
