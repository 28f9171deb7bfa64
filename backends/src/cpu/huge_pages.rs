//! Huge pages for weights. Decode streams every weight once per token; on
//! 4 KB pages each page is a TLB miss, and in a virtual machine (nested
//! page tables) those misses cost a large share of the streaming rate: the
//! Q4_1 GEMV kernel read 256 MB of weights at 9.3-10.7 GB/s on one thread
//! with 4 KB pages and 14.8-15.5 GB/s on 2 MB pages (this machine, a VM,
//! same run). Transparent huge pages are usually enabled for `madvise`d
//! memory only, and weights are written before we see them, so
//! `MADV_COLLAPSE` (Linux 6.1+) rebuilds their pages in place; with
//! `MADV_HUGEPAGE` set first, khugepaged does it later where collapse is
//! unavailable. Best effort: errors are ignored.
//!
//! Collapsing copies every weight once more, in the kernel: it was 48 % of
//! a first load of a 469 MiB GGUF (`perf record` over `edgeflow bench
//! thinker --model qwen2.5-0.5b`, 2-core Zen 4). Weights placed by the
//! backend are therefore queued ([`advise_later`], [`advise_range_later`])
//! and collapsed by one background thread while the model is already
//! usable: loading returns without it, and decode speeds up as regions
//! land on 2 MB pages. The collapse changes how pages are backed, never
//! their contents, so a region freed or reused meanwhile is no hazard.
//!
//! A binary that installs [`crate::HugePageAlloc`] (the `edgeflow` CLI
//! does) gets most weights on 2 MB pages as they are first written, which
//! leaves the background thread little to copy: on a 2-core Zen 3 VM the
//! move after loading Qwen2.5-1.5B took 0.5-2.1 s instead of 3.9-5.9 s.
//! Except where the host takes free 2 MB blocks back: there 2 MB faults
//! made the load itself 5-6x slower, so the allocator leaves the weights
//! on 4 KB pages and this thread moves all of them
//! ([`crate::HugePagePolicy::AfterLoad`]).
//!
//! The thread starts collapsing only once loading is over ([`loading_done`],
//! or no weight placed for [`quiet`]): a collapse takes the process's
//! memory-map lock for writing, so run beside a load it stalls every page
//! fault of the loader's copies, and on two cores it takes the loader's
//! second core as well.

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
/// take in neighbouring heap memory; only the page size changes), now.
pub(crate) fn advise(t: &Tensor) {
    let Some((start, len)) = byte_range(t) else {
        return;
    };
    if len >= MIN_BYTES {
        advise_range(start, len);
    }
}

/// [`advise`] on the background thread: returns at once.
pub(crate) fn advise_later(t: &Tensor) {
    let Some((start, len)) = byte_range(t) else {
        return;
    };
    if len >= MIN_BYTES {
        advise_range_later(start, len);
    }
}

/// Ranges queued for the background thread and not yet collapsed.
static PENDING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How long after the last weight was placed the background thread takes
/// loading to be over, where nobody said so ([`loading_done`]).
/// One second; ten where the weights load on 4 KB pages
/// ([`crate::HugePagePolicy::AfterLoad`]): there a large tensor's copy
/// faults in slowly enough to place nothing for over a second (the
/// 1.5B's embedding), and a collapse started then held the loader's page
/// faults back for 1.5 s.
fn quiet() -> std::time::Duration {
    match crate::huge_page_policy() {
        crate::HugePagePolicy::AtAllocation => std::time::Duration::from_secs(1),
        crate::HugePagePolicy::AfterLoad => std::time::Duration::from_secs(10),
    }
}

/// When the last range was queued, in milliseconds since [`epoch`] (0:
/// loading is over).
static LAST_QUEUED_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn epoch() -> std::time::Instant {
    static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *T0.get_or_init(std::time::Instant::now)
}

/// Milliseconds since [`epoch`], at least 1 (0 marks "loading is over").
fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).map_or(u64::MAX, |m| m.max(1))
}

/// Loading is over (the backend's `release_load_memory`): queued ranges
/// are collapsed from now on, without waiting for [`quiet`].
pub(crate) fn loading_done() {
    LAST_QUEUED_MS.store(0, std::sync::atomic::Ordering::Release);
}

/// Blocks the background thread while a load is placing weights: until
/// [`loading_done`] or [`quiet`] without a new range.
fn wait_for_quiet() {
    let quiet = quiet();
    while let Some(left) = quiet_left(
        quiet,
        LAST_QUEUED_MS.load(std::sync::atomic::Ordering::Acquire),
        now_ms(),
    ) {
        // In short naps, so `loading_done` is seen within 20 ms.
        std::thread::sleep(left.min(std::time::Duration::from_millis(20)));
    }
}

/// How much longer to wait when the last range was queued at `last` ms
/// (0: loading is over) and it is now `now` ms; None: go.
fn quiet_left(quiet: std::time::Duration, last: u64, now: u64) -> Option<std::time::Duration> {
    let since = std::time::Duration::from_millis(now.saturating_sub(last));
    (last != 0 && since < quiet).then(|| quiet - since)
}

/// Waits until the background thread has collapsed every range queued so
/// far, or `timeout` has passed; whether it finished. What a benchmark
/// calls before timing decode, so the one-off copy (a second or more for
/// a 1 GB model on two cores) does not share the cores with the timed
/// runs, and the weights are read from the pages a long run has.
pub(crate) fn wait_idle(timeout: std::time::Duration) -> bool {
    use std::sync::atomic::Ordering;
    let end = std::time::Instant::now() + timeout;
    while PENDING.load(Ordering::Acquire) > 0 {
        if std::time::Instant::now() >= end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    true
}

/// [`advise_range`] on the background thread: returns at once. Regions are
/// collapsed in the order they were queued.
pub(crate) fn advise_range_later(start: usize, len: usize) {
    use std::sync::atomic::Ordering;
    use std::sync::mpsc::{channel, Sender};
    use std::sync::{Mutex, OnceLock};
    /// The background thread's queue of (start, len); `None` when the
    /// thread could not be started.
    type Queue = Option<Mutex<Sender<(usize, usize)>>>;
    static QUEUE: OnceLock<Queue> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = channel::<(usize, usize)>();
        std::thread::Builder::new()
            .name("edgeflow-huge-pages".into())
            .spawn(move || {
                for (start, len) in rx {
                    collapse(start, len, wait_for_quiet);
                    PENDING.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    PENDING.fetch_add(1, Ordering::AcqRel);
    LAST_QUEUED_MS.store(now_ms(), Ordering::Release);
    let sent = queue
        .as_ref()
        .and_then(|q| q.lock().ok())
        .is_some_and(|tx| tx.send((start, len)).is_ok());
    if !sent {
        PENDING.fetch_sub(1, Ordering::AcqRel);
        // No thread (it could not be started): collapse here.
        advise_range(start, len);
    }
}

/// [`advise`] for the bytes `start..start + len` of a live allocation.
pub(crate) fn advise_range(start: usize, len: usize) {
    collapse(start, len, || {});
}

/// [`advise_range`], calling `before` ahead of each 2 MB region (the
/// background thread waits there while a load runs).
fn collapse(start: usize, len: usize, before: impl Fn()) {
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
            before();
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
    let _ = (start, len, before);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The background thread waits while ranges keep coming and goes once
    /// loading is said to be over or has been quiet for [`quiet`].
    #[test]
    fn collapse_waits_for_the_load_to_end() {
        let quiet = std::time::Duration::from_secs(1);
        let q = quiet.as_millis() as u64;
        assert_eq!(
            quiet_left(quiet, 1000, 1200),
            Some(std::time::Duration::from_millis(q - 200))
        );
        assert_eq!(quiet_left(quiet, 1000, 1000 + q), None);
        assert_eq!(quiet_left(quiet, 0, 1200), None, "loading_done");
        assert_eq!(
            quiet_left(quiet, 1000, 900),
            Some(quiet),
            "a clock read early"
        );
    }

    /// Queued collapses leave the bytes as they were (whether this kernel
    /// collapses them or not), also beside a buffer freed before the
    /// background thread reaches it.
    #[test]
    fn background_collapse_keeps_the_contents() {
        let n = 6 << 20;
        let v: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let gone: Vec<u8> = vec![7; n];
        advise_range_later(gone.as_ptr() as usize, gone.len());
        drop(gone);
        advise_range_later(v.as_ptr() as usize, v.len());
        // A later synchronous call on the same bytes; then wait for the
        // thread to reach the queued ones.
        advise_range(v.as_ptr() as usize, v.len());
        loading_done();
        assert!(
            wait_idle(std::time::Duration::from_secs(30)),
            "queue drained"
        );
        assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }
}
