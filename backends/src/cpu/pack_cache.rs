//! Packed convolution weights: kept with the weights they were made from
//! where those were placed on the CPU ([`PlacedConv`]), else cached per
//! weight tensor.

use super::conv;
use super::tensors::{device_buffer, placeable_f32, with_f32_slice};
use candle_core::Tensor as CTensor;
use edgeflow_runtime::{Result, Tensor};
use std::sync::{Arc, Mutex};

/// f32 weights of rank 3 placed on the CPU (by the backend's
/// `make_resident`), with their packs for the direct convolution kernel:
/// each made on its first use and dropped with the weights. A model
/// convolves with the same weights on every call; a pack per use kept
/// here costs nothing to find and needs no budget, where the shared
/// cache below thrashes once a model's packs outgrow it (Qwen2.5-Omni's
/// BigVGAN packs about 400 MB, and repacked all of it on every call).
/// Every other op reads [`PlacedConv::plain`].
#[derive(Debug)]
pub(crate) struct PlacedConv {
    /// The values as placed.
    pub(crate) plain: CTensor,
    /// The packs made so far, by what they were made for.
    packs: Mutex<Vec<(PackKind, Arc<conv::PackedWeights>)>>,
}

/// Smallest weight kept as a [`PlacedConv`] (elements): smaller ones pack
/// in no time and stay plain host tensors.
const PLACED_MIN_ELEMENTS: usize = 4096;

impl edgeflow_runtime::DeviceBuffer for PlacedConv {
    fn backend(&self) -> &str {
        "cpu"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn size_bytes(&self) -> usize {
        let packs: usize = (self.packs.lock().unwrap_or_else(|e| e.into_inner()))
            .iter()
            .map(|(_, w)| w.size_bytes())
            .sum();
        self.plain.elem_count() * self.plain.dtype().size_in_bytes() + packs
    }
}

impl PlacedConv {
    /// `t`'s placed convolution weights, if it holds some.
    pub(crate) fn of(t: &Tensor) -> Option<&PlacedConv> {
        device_buffer(t)
    }

    /// `t` as placed convolution weights, when it is a f32 host tensor of
    /// rank 3 and at least [`PLACED_MIN_ELEMENTS`] elements.
    pub(crate) fn place(t: &Tensor) -> Option<Tensor> {
        let c = placeable_f32(t, 3, PLACED_MIN_ELEMENTS)?;
        let p = PlacedConv {
            plain: c.clone(),
            packs: Mutex::new(Vec::new()),
        };
        Some(Tensor::from_device(Arc::new(p), t.dims(), t.dtype()))
    }
}

/// Convolution weights packed for [`conv`], by candle tensor id: a
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
    map: std::collections::HashMap<(candle_core::TensorId, PackKind), Arc<conv::PackedWeights>>,
    bytes: usize,
}

/// What a cached pack was made from a weight tensor for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum PackKind {
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

/// `w` packed for the direct kernel by `pack` (given its values): kept by
/// `placed` when the weights were placed ([`PlacedConv`], whose `plain`
/// `w` then is), else from the shared cache when packed for `kind` before;
/// None when `w` is not a f32 host tensor or `pack` refuses it.
pub(crate) fn packed_weights(
    placed: Option<&PlacedConv>,
    w: &CTensor,
    kind: PackKind,
    pack: impl FnOnce(&[f32]) -> Option<conv::PackedWeights>,
) -> Result<Option<Arc<conv::PackedWeights>>> {
    if let Some(p) = placed {
        // Packed under the lock: a second caller waits for the one pack.
        // A panic elsewhere leaves the list whole (entries go in complete).
        let mut packs = p.packs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, pw)) = packs.iter().find(|(k, _)| *k == kind) {
            return Ok(Some(Arc::clone(pw)));
        }
        let w = w.contiguous()?;
        let Some(pw) = with_f32_slice(&w, pack)?.flatten() else {
            return Ok(None);
        };
        let pw = Arc::new(pw);
        packs.push((kind, Arc::clone(&pw)));
        return Ok(Some(pw));
    }
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
