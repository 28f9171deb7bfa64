//! Linear-layer weights placed on the CPU: f32 ones packed once for the
//! GEMM on their first prefill-shaped use, and then kept only packed; bf16
//! ones packed at their first product for the bf16 dot product where the
//! CPU has it, else widened to f32 for the f32 GEMM ([`PlacedBf16`]).
//!
//! ## Why
//! A linear layer's GEMM on plain `w [n, k]` either copies the weights into
//! panels on every call ([`sgemm`] reads `w`'s rows in place but
//! transposes a slice of them per panel; the `gemm` crate packs all of
//! `w`) or streams them from memory in short strided runs. With a few
//! dozen activation rows (a ViT's 65 tokens at 112 px, a streamed DiT
//! chunk) that per-call work and those cold, strided reads cost a third
//! of the product: two Zen 4 threads with the weights out of cache ran
//! 65 x 1536 x 384 in 718 us on the crate and 536 us packed, 65 x 384 x
//! 1536 in 865 us in place and 568 us packed. Packed weights
//! ([`LanesPacked`]) are read as one contiguous stream and each call
//! only transposes its own activations. The packed form is a permutation
//! of the plain one, so the plain values are dropped once packed (the
//! memory stays what the weights take); an op that reads the plain values
//! after that (a tied embedding) gets them rebuilt once and both forms
//! are kept from then on.
//!
//! Packing costs the first product on each weight a copy into fresh
//! memory: 50 matrices of 1024 x 1024 (200 MB) added 137 ms to their first
//! products on two Zen 4 threads (about 0.7 s per GB, mostly page faults),
//! and left the process's resident memory where it was (205 -> 206 MiB).

use super::bf16_gemm::{self, PairsPacked};
use super::gemm;
use super::sgemm::{self, LanesPacked, Strided};
use super::tensors::{device_buffer, placeable_f32, with_f32_slice, with_host_slice};
use candle_core::{DType as CDType, Tensor as CTensor};
use edgeflow_runtime::{Result, Storage, Tensor};
use half::bf16;
use std::sync::{Arc, Mutex};

/// Smallest weight placed (elements): smaller ones stay plain host tensors.
const PLACED_MIN_ELEMENTS: usize = 4096;

/// A packed form of `[n, k]` linear weights.
trait WeightPack: std::fmt::Debug {
    /// Bytes held.
    fn size_bytes(&self) -> usize;
    /// The plain `[n, k]` values, in the weights' own dtype.
    fn unpack(&self, n: usize, k: usize) -> Result<CTensor>;
}

impl WeightPack for LanesPacked {
    fn size_bytes(&self) -> usize {
        LanesPacked::size_bytes(self)
    }

    fn unpack(&self, n: usize, k: usize) -> Result<CTensor> {
        Ok(CTensor::from_vec(
            LanesPacked::unpack(self),
            (n, k),
            &candle_core::Device::Cpu,
        )?)
    }
}

/// Which forms of the weights are held.
#[derive(Debug)]
enum Form<P> {
    Plain(CTensor),
    Packed(Arc<P>),
    Both(CTensor, Arc<P>),
}

/// Placed weights' forms: plain until a product packs them (then the
/// plain values are let go), both once an op reads the plain values after
/// that (rebuilt once from the pack).
#[derive(Debug)]
struct Forms<P> {
    n: usize,
    k: usize,
    /// Bytes of the plain values.
    plain_bytes: usize,
    form: Mutex<Form<P>>,
}

impl<P: WeightPack> Forms<P> {
    /// The plain `c` (`[n, k]`).
    fn new(c: &CTensor) -> Forms<P> {
        Forms {
            n: c.dims()[0],
            k: c.dims()[1],
            plain_bytes: c.elem_count() * c.dtype().size_in_bytes(),
            form: Mutex::new(Form::Plain(c.clone())),
        }
    }

    /// A panic elsewhere leaves the form whole (it is replaced whole).
    fn lock(&self) -> std::sync::MutexGuard<'_, Form<P>> {
        self.form.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn size_bytes(&self) -> usize {
        match &*self.lock() {
            Form::Plain(_) => self.plain_bytes,
            Form::Packed(p) => p.size_bytes(),
            Form::Both(_, p) => self.plain_bytes + p.size_bytes(),
        }
    }

    /// The plain values (rebuilt from the pack once, if only the pack is
    /// held).
    fn plain(&self) -> Result<CTensor> {
        let mut form = self.lock();
        let p = match &*form {
            Form::Plain(c) | Form::Both(c, _) => return Ok(c.clone()),
            Form::Packed(p) => Arc::clone(p),
        };
        let c = p.unpack(self.n, self.k)?;
        *form = Form::Both(c.clone(), p);
        Ok(c)
    }

    /// The pack; while only plain, `make`'s pack of the contiguous plain
    /// values, kept in their place (None: not packed now).
    fn packed(&self, make: impl FnOnce(&CTensor) -> Result<Option<P>>) -> Result<Option<Arc<P>>> {
        let mut form = self.lock();
        let c = match &*form {
            Form::Packed(p) | Form::Both(_, p) => return Ok(Some(Arc::clone(p))),
            Form::Plain(c) => c.contiguous()?,
        };
        let Some(p) = make(&c)? else {
            return Ok(None);
        };
        let p = Arc::new(p);
        *form = Form::Packed(Arc::clone(&p));
        Ok(Some(p))
    }
}

/// `x [rows, k]` (f32) as the left operand of a linear product: its rows,
/// contiguous; None when `x` is not f32 or not `rows * k` values.
fn with_rows<R>(
    x: &CTensor,
    rows: usize,
    k: usize,
    f: impl FnOnce(&[f32]) -> R,
) -> Result<Option<R>> {
    let x = x.contiguous()?;
    Ok(with_f32_slice(&x, |xs| (xs.len() == rows * k).then(|| f(xs)))?.flatten())
}

/// f32 weights of rank 2 placed on the CPU (by the backend's
/// `make_resident`), plain until a product that runs on packed weights
/// (`gemm::packs_weights`: five rows or more, and on AVX2-only CPUs only
/// where the in-place GEMM would run too) packs them.
#[derive(Debug)]
pub(crate) struct PlacedLinear {
    forms: Forms<LanesPacked>,
}

impl edgeflow_runtime::DeviceBuffer for PlacedLinear {
    fn backend(&self) -> &str {
        "cpu"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn size_bytes(&self) -> usize {
        self.forms.size_bytes()
    }
}

impl PlacedLinear {
    /// `t`'s placed linear weights, if it holds some.
    pub(crate) fn of(t: &Tensor) -> Option<&PlacedLinear> {
        device_buffer(t)
    }

    /// `t` as placed linear weights, when it is a f32 host tensor of rank 2
    /// and at least [`PLACED_MIN_ELEMENTS`] elements.
    pub(crate) fn place(t: &Tensor) -> Option<Tensor> {
        let c = placeable_f32(t, 2, PLACED_MIN_ELEMENTS)?;
        let p = PlacedLinear {
            forms: Forms::new(c),
        };
        Some(Tensor::from_device(Arc::new(p), t.dims(), t.dtype()))
    }

    /// The plain `[n, k]` values (rebuilt from the pack once, if only the
    /// pack is held).
    pub(crate) fn plain(&self) -> Result<CTensor> {
        self.forms.plain()
    }

    /// `x [rows, k] @ w^T (+ bias)` on the packed weights (packing them
    /// first where such a product runs on a pack), the rows `rows x n`;
    /// None while the weights are plain and it does not, or `x` is not f32.
    pub(crate) fn linear(
        &self,
        x: &CTensor,
        rows: usize,
        bias: Option<&[f32]>,
        parallel: bool,
    ) -> Result<Option<Vec<f32>>> {
        let (n, k) = (self.forms.n, self.forms.k);
        if x.dtype() != CDType::F32 || bias.is_some_and(|b| b.len() != n) {
            return Ok(None);
        }
        let Some(p) = self.forms.packed(|c| {
            if !gemm::packs_weights(rows, n, k) {
                return Ok(None);
            }
            Ok(with_f32_slice(c, |w| LanesPacked::new(w, n, k))?.flatten())
        })?
        else {
            return Ok(None);
        };
        let mut y = vec![0f32; rows * n];
        let done = with_rows(x, rows, k, |xs| {
            let xv = Strided {
                data: xs,
                off: 0,
                rs: k as isize,
                cs: 1,
            };
            sgemm::linear_packed(rows, xv, &p, bias, &mut y, parallel);
        })?;
        Ok(done.map(|()| y))
    }
}

/// How placed bf16 weights are packed.
#[derive(Debug)]
enum Bf16Pack {
    /// For the bf16 dot product (CPUs with AVX512_BF16).
    Pairs(PairsPacked),
    /// Widened to f32 (exact) for the f32 GEMM, on other CPUs: twice the
    /// bytes, the products of the f32 path.
    Wide(LanesPacked),
}

impl WeightPack for Bf16Pack {
    fn size_bytes(&self) -> usize {
        match self {
            Bf16Pack::Pairs(p) => p.size_bytes(),
            Bf16Pack::Wide(p) => p.size_bytes(),
        }
    }

    fn unpack(&self, n: usize, k: usize) -> Result<CTensor> {
        let values = match self {
            Bf16Pack::Pairs(p) => p.unpack(),
            // Widened from bf16: narrowing gives the values back exactly.
            Bf16Pack::Wide(p) => p.unpack().into_iter().map(bf16::from_f32).collect(),
        };
        Ok(CTensor::from_vec(
            values,
            (n, k),
            &candle_core::Device::Cpu,
        )?)
    }
}

/// bf16 weights of rank 2 placed on the CPU: plain until their first
/// product, which packs them (for the bf16 dot product,
/// [`bf16_gemm::linear`], where the CPU has it, [`bf16_gemm::available`];
/// else widened to f32 for the f32 GEMM, [`sgemm::linear_packed`]) and
/// lets the plain values go; whatever the rows. An op that reads the
/// plain values after that (a tied embedding) gets them rebuilt once and
/// both forms are kept; a table only looked up is never packed.
#[derive(Debug)]
pub(crate) struct PlacedBf16 {
    /// Pack for the dot product (else widened).
    pairs: bool,
    forms: Forms<Bf16Pack>,
}

impl edgeflow_runtime::DeviceBuffer for PlacedBf16 {
    fn backend(&self) -> &str {
        "cpu"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn size_bytes(&self) -> usize {
        self.forms.size_bytes()
    }
}

impl PlacedBf16 {
    /// `t`'s placed bf16 linear weights, if it holds some.
    pub(crate) fn of(t: &Tensor) -> Option<&PlacedBf16> {
        device_buffer(t)
    }

    /// `t` placed, when it is a bf16 host tensor of rank 2 and at least
    /// [`PLACED_MIN_ELEMENTS`] values: packed at its first product in
    /// pairs where the CPU has the bf16 dot product, else widened.
    pub(crate) fn place(t: &Tensor) -> Option<Tensor> {
        Self::place_as(t, bf16_gemm::available())
    }

    /// [`Self::place`], to be packed in pairs (`pairs`, where the CPU has
    /// the bf16 dot product) or widened.
    pub(crate) fn place_as(t: &Tensor, pairs: bool) -> Option<Tensor> {
        let Storage::Host(c) = t.storage() else {
            return None;
        };
        if c.rank() != 2 || c.dtype() != CDType::BF16 || c.elem_count() < PLACED_MIN_ELEMENTS {
            return None;
        }
        let p = PlacedBf16 {
            pairs: pairs && bf16_gemm::available(),
            forms: Forms::new(c),
        };
        Some(Tensor::from_device(Arc::new(p), t.dims(), t.dtype()))
    }

    /// Whether the weights are packed for the bf16 dot product (once
    /// packed).
    #[cfg(test)]
    pub(crate) fn pairs(&self) -> bool {
        self.pairs
    }

    /// The plain bf16 `[n, k]` values (rebuilt from the pack once, if only
    /// the pack is held).
    pub(crate) fn plain(&self) -> Result<CTensor> {
        self.forms.plain()
    }

    /// `x [rows, k] @ w^T (+ bias)` on the pack (packing the weights
    /// first), the rows `rows x n`; None when `x` is not f32.
    pub(crate) fn linear(
        &self,
        x: &CTensor,
        rows: usize,
        bias: Option<&[f32]>,
        parallel: bool,
    ) -> Result<Option<Vec<f32>>> {
        let (n, k) = (self.forms.n, self.forms.k);
        if x.dtype() != CDType::F32 || bias.is_some_and(|b| b.len() != n) {
            return Ok(None);
        }
        let Some(pack) = self.forms.packed(|c| {
            Ok(with_host_slice::<bf16, _>(c, |w| {
                if self.pairs {
                    PairsPacked::new(w, n, k).map(Bf16Pack::Pairs)
                } else {
                    let wide: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
                    LanesPacked::new(&wide, n, k).map(Bf16Pack::Wide)
                }
            })?
            .flatten())
        })?
        else {
            return Ok(None);
        };
        let mut y = vec![0f32; rows * n];
        let done = with_rows(x, rows, k, |xs| match &*pack {
            Bf16Pack::Pairs(p) => bf16_gemm::linear(rows, xs, p, bias, &mut y, parallel),
            Bf16Pack::Wide(p) => {
                let xv = Strided {
                    data: xs,
                    off: 0,
                    rs: k as isize,
                    cs: 1,
                };
                sgemm::linear_packed(rows, xv, p, bias, &mut y, parallel);
            }
        })?;
        Ok(done.map(|()| y))
    }
}
