//! Process-wide memory settings for programs that load large models: keep
//! freed tensor memory for reuse ([`keep_freed_memory`], undone once per
//! load by [`release_freed_memory`]) and fault large allocations in on
//! 2 MB pages ([`HugePageAlloc`]) where that is cheap.
//!
//! ## When 2 MB faults are not cheap
//! A virtual machine whose balloon device reports free guest memory to the
//! host (virtio-balloon free page reporting, as Firecracker and many cloud
//! hypervisors enable it) hands the host back every free 2 MB block. A
//! 2 MB fault takes one of exactly those blocks, and the host then faults
//! it in again 4 KB at a time; 4 KB faults are served from blocks the guest
//! split earlier, which the host still backs. On a 2-core Zen 3 Firecracker
//! guest, first touches of 1 GB ran at 0.13-0.29 GB/s on 2 MB pages and
//! 1.35-2.0 GB/s on 4 KB pages, and loading Qwen2.5-0.5B (469 MiB of GGUF)
//! took 4.8-5.6 s with the advice and 0.85-0.88 s without it. There the
//! weights load on 4 KB pages and the CPU backend's background thread moves
//! them onto 2 MB pages after the load (a few seconds, while the model is
//! already usable; decode then runs at the same speed either way).
//! The choice is [`HugePagePolicy`], made once when the CPU backend is
//! first opened; `EDGEFLOW_HUGE_PAGES=alloc` or `after-load` overrides it.

use std::sync::atomic::{AtomicU8, Ordering};

/// Keep freed tensor memory in the process (glibc: `M_MMAP_THRESHOLD`
/// 1 GB, `M_TRIM_THRESHOLD` 256 MB). With glibc's defaults, buffers over a
/// few MB are mmapped and handed back to the kernel when freed, then
/// page-faulted and zeroed again by the next op: a Whisper encode took about
/// 5x the page faults (speech_profile: 397 K vs 73 K), and a vocoder chunk
/// faulted its tens of MB of activations in again (page-fault and zeroing
/// work was about a tenth of `bench tts`'s samples). Served from the heap,
/// weights also share 2 MB regions that the CPU backend can back with huge
/// pages (see `Backend::make_resident`). The cost is that up to 256 MB of
/// freed memory stays resident, as with onnxruntime's arena. No-op on other
/// C libraries.
///
/// Call it first thing in `main` (the settings apply to the whole process).
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's thresholds; both are
    // valid parameters with in-range values (a refused one keeps glibc's).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// A global allocator for binaries: the system's, plus `MADV_HUGEPAGE`
/// on the 2 MB-aligned interior of every allocation of 4 MB or more
/// before anything is written there, so those pages fault in as 2 MB
/// pages. Without it a model's weights fault in 4 KB at a time when the
/// loader copies them out of the file, and are then copied once more onto
/// 2 MB pages in the background (`MADV_COLLAPSE`). Only whole 2 MB regions
/// inside the allocation are advised, so every mapping split falls on a
/// 2 MB boundary. Where the host takes free 2 MB blocks back (see the
/// module docs) it gives no advice ([`HugePagePolicy::AfterLoad`]).
/// Install it with `#[global_allocator]` in a binary.
#[derive(Debug, Clone, Copy, Default)]
pub struct HugePageAlloc;

/// Allocations from this size get [`HugePageAlloc`]'s advice.
const HUGE_ALLOC_MIN: usize = 4 << 20;

impl HugePageAlloc {
    fn advise(p: *mut u8, len: usize) {
        #[cfg(target_os = "linux")]
        if !p.is_null()
            && len >= HUGE_ALLOC_MIN
            && POLICY.load(Ordering::Relaxed) != HugePagePolicy::AfterLoad as u8
        {
            const HUGE: usize = 2 << 20;
            let lo = (p as usize).next_multiple_of(HUGE);
            let hi = (p as usize + len) & !(HUGE - 1);
            if hi > lo {
                // SAFETY: madvise(MADV_HUGEPAGE) on whole pages of our own
                // live allocation changes how they are backed, never their
                // contents; a failure changes nothing.
                unsafe {
                    libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
                }
            }
        }
    }
}

// SAFETY: every call goes to `System` with the caller's layout; the
// advice only changes page backing.
unsafe impl std::alloc::GlobalAlloc for HugePageAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.alloc(layout) };
        Self::advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        Self::advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new) };
        Self::advise(p, new);
        p
    }
}

/// Hand freed heap memory back to the OS now (glibc `malloc_trim`: the
/// free pages of every arena), undoing [`keep_freed_memory`]'s hold once:
/// the CPU backend calls it when loading is over
/// ([`edgeflow_runtime::Backend::release_load_memory`]), so a model's load
/// temporaries do not stay resident. No-op on other C libraries.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages to the kernel; it takes
    // the allocator's own locks and leaves every live allocation alone.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How weights get onto 2 MB pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum HugePagePolicy {
    /// [`HugePageAlloc`] advises large allocations as they are made, so
    /// weights fault in on 2 MB pages while they load.
    AtAllocation = 1,
    /// Weights load on 4 KB pages and move to 2 MB pages in the background
    /// once the load is over: where 2 MB faults are slow (a host that takes
    /// free memory back, see the module docs).
    AfterLoad = 2,
}

/// [`HugePagePolicy`] as a number (0: not chosen yet, advise as
/// [`HugePagePolicy::AtAllocation`] does). The allocator reads it, so it
/// is an atomic rather than anything that allocates.
static POLICY: AtomicU8 = AtomicU8::new(0);

/// The policy in force, choosing it first if nobody has (from
/// `EDGEFLOW_HUGE_PAGES` when it says `alloc` or `after-load`, else from
/// whether the host reclaims free guest memory). The CPU backend calls it
/// when it is first opened, before any weights load.
pub fn huge_page_policy() -> HugePagePolicy {
    static CHOSEN: std::sync::OnceLock<HugePagePolicy> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let p = match std::env::var("EDGEFLOW_HUGE_PAGES").as_deref() {
            Ok("alloc") => HugePagePolicy::AtAllocation,
            Ok("after-load") => HugePagePolicy::AfterLoad,
            Ok(other) if !other.is_empty() => {
                eprintln!(
                    "warning: EDGEFLOW_HUGE_PAGES={other:?} is neither `alloc` nor \
                     `after-load`; choosing from this machine"
                );
                auto()
            }
            _ => auto(),
        };
        POLICY.store(p as u8, Ordering::Relaxed);
        p
    })
}

/// [`HugePagePolicy::AfterLoad`] where the host reclaims free guest
/// memory, else [`HugePagePolicy::AtAllocation`].
fn auto() -> HugePagePolicy {
    if host_reclaims_free_memory() {
        HugePagePolicy::AfterLoad
    } else {
        HugePagePolicy::AtAllocation
    }
}

/// Whether a virtio balloon reports free guest pages to the host
/// (`VIRTIO_BALLOON_F_REPORTING`, feature bit 5 in sysfs' feature string).
fn host_reclaims_free_memory() -> bool {
    let Ok(dir) = std::fs::read_dir("/sys/bus/virtio/drivers/virtio_balloon") else {
        return false;
    };
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("virtio"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("features")).ok())
        .any(|f| reports_free_pages(&f))
}

/// Whether a virtio feature string (one `0` / `1` per bit, bit 0 first)
/// has free page reporting (bit 5).
fn reports_free_pages(features: &str) -> bool {
    features.as_bytes().get(5) == Some(&b'1')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_page_reporting_is_bit_five() {
        // A Firecracker balloon: stats, deflate on OOM, reporting, version 1.
        let fc = "0110010100000000000000000000000010000000";
        assert!(reports_free_pages(fc));
        assert!(!reports_free_pages("0110000100000000"));
        assert!(!reports_free_pages("0110"));
        assert!(!reports_free_pages(""));
    }
}
