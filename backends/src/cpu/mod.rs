//! CPU backend: every [`Op`] on candle-core / candle-nn kernels, except
//! [`Op::Linear`] with f32 activations and Q8_0 / Q4_0 / Q4_1 / Q5_0 weights
//! (any number of rows), f32 weights (one row) or f16 weights (a few rows),
//! which runs this crate's kernels ([`gemv`], [`gemv_f16`]), and with Q4_K /
//! Q5_K / Q6_K weights, which run [`kquants`];
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
//! Placing a f32 tensor of rank 3 (a convolution's weights) keeps it as a
//! [`PlacedConv`], which holds the direct kernel's packs of it from their
//! first use for as long as the weights live; every other op reads its
//! plain values. Placing a f32 tensor of rank 2 (a linear layer's weights)
//! keeps it as a `PlacedLinear`: plain until a product of five rows or
//! more packs it for the GEMM (on AVX2-only CPUs, a product that GEMM
//! already ran in place), then held packed only (other ops get its plain
//! values rebuilt, once). A bf16 tensor of rank 2 is kept as a
//! `PlacedBf16`: plain until its first product packs it, on a CPU with the
//! bf16 dot product (AVX512_BF16) for that instruction (activations
//! rounded to bf16, f32 sums), elsewhere widened to f32 for the f32 GEMM
//! (the products of f32 weights).

mod act;
#[cfg(target_arch = "x86_64")]
mod amx;
mod attn;
mod bf16_gemm;
mod conv;
mod conv_ops;
mod ew;
mod gemm;
mod gemv;
mod gemv_f16;
pub(crate) mod huge_pages;
mod kquants;
mod linear;
mod math;
mod norm;
mod ops;
mod pack_cache;
mod placed;
mod placed_linear;
mod plain;
mod pool;
mod resampled_snake;
mod sgemm;
mod spinners;
mod team;
mod tensors;
#[cfg(test)]
mod tests;

use candle_core::Tensor as CTensor;
use conv_ops::{conv1d_depthwise, conv1d_direct, conv_transpose1d_direct};
use edgeflow_runtime::{rng, Backend, DeviceKind, Error, Op, Result, Storage, Tensor};
use linear::linear;
use ops::{attention, binary, binary_own, pad, quantized_rows, reduce, unary, unary_own};
use pack_cache::PlacedConv;
use placed::PackedWeights;
use placed_linear::{PlacedBf16, PlacedLinear};
use plain::{add_channel_bias, cast, f32_values, plain};
use std::sync::{Arc, OnceLock};
use tensors::{arity, check_dim, dense, index_tensor, with_f32_slice, wrap};

/// The process-wide CPU backend (stateless; shared by every device as the fallback).
pub fn cpu_backend() -> Arc<dyn Backend> {
    static CPU: OnceLock<Arc<dyn Backend>> = OnceLock::new();
    CPU.get_or_init(|| {
        // Before any weights load: how they get onto 2 MB pages.
        crate::huge_page_policy();
        Arc::new(CpuBackend::new())
    })
    .clone()
}

/// Whether this is an AMD CPU with AVX-512 VNNI (Zen 4 and later), where
/// some kernel choices and prefetch distances tuned on Intel's cores
/// measured slower. Read once (CPUID leaves the guest in a VM).
pub(crate) fn amd_avx512() -> bool {
    static AMD: OnceLock<bool> = OnceLock::new();
    *AMD.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // CPUID leaf 0: the vendor "AuthenticAMD" in EBX, EDX, ECX.
            let id = std::arch::x86_64::__cpuid(0);
            (id.ebx, id.edx, id.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163)
                && kquants::has_vnni()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// The CPU backend (candle kernels on the host).
#[derive(Debug, Default, Clone)]
pub struct CpuBackend;

impl CpuBackend {
    /// A CPU backend. Thread count follows candle / rayon (`RAYON_NUM_THREADS`).
    pub fn new() -> Self {
        CpuBackend
    }
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
                if let Some(y) = gemm::matmul(&a, &b, None)? {
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
                        PlacedConv::of(inputs[1]),
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
                if *stride > 1 || *groups > 1 {
                    if let Some(y) = conv1d_depthwise(
                        &x,
                        &w,
                        inputs.get(2).copied(),
                        *stride,
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
                        PlacedConv::of(inputs[1]),
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
                    PlacedConv::of(inputs[1]),
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
                if let Some(y) = norm::layer_norm(&x, &g, &b, *eps as f32)? {
                    return wrap(y);
                }
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
            Op::SwiGlu => {
                arity(op, inputs, 1, 2)?;
                let up = match inputs.get(1) {
                    Some(_) => Some(p(1)?),
                    None => None,
                };
                wrap(ops::swiglu(&p(0)?, up.as_ref())?)
            }
            Op::Snake => {
                arity(op, inputs, 2, 3)?;
                let x = p(0)?;
                let a = p(1)?.to_dtype(x.dtype())?;
                let g = match inputs.get(2) {
                    Some(_) => Some(p(2)?.to_dtype(x.dtype())?),
                    None => None,
                };
                let (_, c, _) = x.dims3()?;
                for (what, t) in [("alpha", Some(&a)), ("gain", g.as_ref())] {
                    if let Some(t) = t.filter(|t| t.elem_count() != c) {
                        return Err(Error::bad_input(
                            name,
                            format!("{what} has {} values for {c} channels", t.elem_count()),
                        ));
                    }
                }
                if let Some(y) = act::snake(&x, &a, g.as_ref())? {
                    return wrap(y);
                }
                let a = a.reshape((1, c, 1))?;
                let s = x.broadcast_mul(&a)?.sin()?.sqr()?;
                wrap(match g {
                    Some(g) => (&x + s.broadcast_mul(&g.reshape((1, c, 1))?)?)?,
                    None => (&x + s.broadcast_div(&a)?)?,
                })
            }
            Op::ResampledSnake(rs) => {
                arity(op, inputs, 6, 6)?;
                let x = p(0)?;
                let (b, c, t) = x.dims3()?;
                let vals = |i: usize| -> Result<Vec<f32>> {
                    Ok(f32_values(Some(inputs[i]), name)?.unwrap_or_default())
                };
                let (freq, gain) = (vals(1)?, vals(2)?);
                for (what, v) in [("freq", &freq), ("gain", &gain)] {
                    if v.len() != c {
                        return Err(Error::bad_input(
                            name,
                            format!("{what} has {} values for {c} channels", v.len()),
                        ));
                    }
                }
                let (up, up_bias, down) = (vals(3)?, vals(4)?, vals(5)?);
                let plan = resampled_snake::Plan::new(*rs, (&up, &up_bias, &down), t)
                    .map_err(|e| Error::bad_input(name, e))?;
                let xf = dense(&x.to_dtype(candle_core::DType::F32)?)?;
                let y = with_f32_slice(&xf, |xs| {
                    resampled_snake::resampled_snake(xs, c, &freq, &gain, &plan)
                })?
                .ok_or_else(|| Error::bad_input(name, "x is not f32 after conversion"))?;
                let y = CTensor::from_vec(y, (b, c, plan.t_out()), &tensors::cdev())?;
                wrap(y.to_dtype(x.dtype())?)
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
        t.is_host()
            || PackedWeights::of(t).is_some()
            || PlacedConv::of(t).is_some()
            || PlacedLinear::of(t).is_some()
            || PlacedBf16::of(t).is_some()
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
        if let Some(p) = PackedWeights::of(t) {
            return Tensor::from_quantized(Arc::new(p.to_qtensor()?));
        }
        if let Some(p) = PlacedConv::of(t) {
            return wrap(p.plain.clone());
        }
        if let Some(p) = PlacedLinear::of(t) {
            return wrap(p.plain()?);
        }
        if let Some(p) = PlacedBf16::of(t) {
            return wrap(p.plain()?);
        }
        self.upload(t)
    }

    fn execute(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
        self.exec(op, inputs)
    }

    fn make_resident(&self, t: &Tensor) -> Result<Tensor> {
        if let Some(p) = PackedWeights::pack(t)? {
            return Ok(p);
        }
        huge_pages::advise_later(t);
        Ok(PlacedConv::place(t)
            .or_else(|| PlacedLinear::place(t))
            .or_else(|| PlacedBf16::place(t))
            .unwrap_or_else(|| t.clone()))
    }

    fn run_batch(&self, f: &mut (dyn FnMut() + Send)) {
        pool::run_batch(f)
    }

    fn release_load_memory(&self) {
        crate::release_freed_memory();
        huge_pages::loading_done();
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
