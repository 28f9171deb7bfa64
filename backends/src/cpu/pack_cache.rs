//! Packed convolution weights, cached per weight tensor.

use super::conv;
use super::tensors::with_f32_slice;
use candle_core::Tensor as CTensor;
use edgeflow_runtime::Result;
use std::sync::Arc;

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

/// `w` packed for the direct kernel by `pack` (given its values), from the
/// cache when it was packed for `kind` before; None when it is not a f32
/// host tensor or `pack` refuses it.
pub(crate) fn packed_weights(
    w: &CTensor,
    kind: PackKind,
    pack: impl FnOnce(&[f32]) -> Option<conv::PackedWeights>,
) -> Result<Option<Arc<conv::PackedWeights>>> {
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
