//! The keep-awake pool: workers of rayon's pool held spinning while
//! batches run (see [`keep_workers_awake`]), polling the team's jobs
//! ([`super::team::help`]) between their rayon polls.

use super::spinners::{claim_spinner, release_spinner};
use super::team;

/// [`Backend::run_batch`](edgeflow_runtime::Backend::run_batch) of the CPU backend.
pub(crate) fn run_batch(f: &mut (dyn FnMut() + Send)) {
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
            release_spinner();
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

std::thread_local! {
    /// This thread is a spinner holding a spinner slot ([`super::spinners`]).
    static SPINNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Batches running now (all stages).
static BATCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

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

/// One shift of a spinner holding a spinner slot ([`super::spinners`]) (see
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
            release_spinner();
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
        if team::help() {
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
    release_spinner();
    // A batch that started as this one was leaving found no free slot:
    // take the slot back for it.
    if BATCHES.load(Ordering::Acquire) > 0 && claim_spinner(want) {
        rayon::spawn(move || spin(want));
    }
}
