//! Splitting a memory-bound kernel over the CPU's threads so that every
//! thread streams one contiguous run of memory and all finish together
//! ([`for_ranges`]), run on a hot team: the workers a batch keeps awake
//! ([`run`], [`help`]).
//!
//! ## Why
//! A decode GEMV of a 0.5 MB weight matrix takes ~25 us on two threads.
//! As rayon tasks (`par_chunks_mut`) it lost several microseconds a call
//! (traced on the build machine, Q4_1 1 x 576 x 1536): 0.6 us of
//! splitting before the first task, the other worker starting ~0.6 us
//! after that (it steals from a poll loop), 1.5 us of imbalance at the end
//! (tasks of ~6 us: smaller ones from a shared counter were worse, 40-55%
//! of the bandwidth instead of 60%, because every task starts a new
//! stream whose first tiles miss in DRAM) and ~2 us from the last task's
//! end to the join's return. Walking memory backwards is no way out: a
//! second thread streaming its half downwards read at half the rate
//! (`bench ops`, 14 vs 23 GB/s).
//!
//! ## How
//! - The units (tiles of weight rows) are split into one region per
//!   thread. A thread claims from its own region's front, a quarter of
//!   what is left at a time (at least `min_claim` units), so it streams
//!   that region in order, its prefetches running on into its next claim;
//!   done, it claims from the other regions' fronts. Threads meet within
//!   a small claim, and a late thread's region is taken over rather than
//!   waited for. Each region's counter has its own cache line (sharing one
//!   cost 1-3 us a call).
//! - The team: the workers that `keep_workers_awake` holds spinning during
//!   a batch poll [`help`] between their rayon polls. [`run`] opens a job
//!   to them with one atomic store and runs its own part; a worker joins
//!   with one compare-and-swap (0.3-0.6 us after the open, measured),
//!   not a rayon steal. When the caller's part is done it closes the job,
//!   so no one joins any more, and waits only for the helpers that did
//!   join, which are within a claim of done. A helper that never came
//!   costs nothing. With no spinners, or the team busy with another
//!   stage's job, [`for_ranges`] runs the same parts as rayon tasks.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// The open job: `epoch << 32 | OPEN | helpers joined`.
static TEAM: AtomicU64 = AtomicU64::new(0);
const OPEN: u64 = 1 << 31;
const JOINED: u64 = OPEN - 1;
/// Set while a caller owns the team (one job at a time).
static BUSY: AtomicBool = AtomicBool::new(false);
/// The open job's function: a `*const &(dyn Fn(usize) + Sync)` on the
/// caller's stack, valid until the caller has seen every helper finish.
static JOB: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());
/// Helpers the open job takes.
static WANTED: AtomicUsize = AtomicUsize::new(0);
/// Helpers of the open job that have finished.
static FINISHED: AtomicUsize = AtomicUsize::new(0);
/// A helper's part panicked (the caller panics in turn).
static PANICKED: AtomicBool = AtomicBool::new(false);

type Job<'a> = &'a (dyn Fn(usize) + Sync);

/// Run `f(0)` on this thread and `f(1)`..`f(helpers)` on whichever
/// spinning workers join while `f(0)` runs (any of them may not run at
/// all: `f` must leave nothing undone for them). Returns false, running
/// nothing, when the team is busy with another job.
pub(crate) fn run(helpers: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
    if helpers == 0 {
        return false;
    }
    if BUSY
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return false;
    }
    let job: Job = f;
    JOB.store(&job as *const Job as *mut (), Ordering::Relaxed);
    WANTED.store(helpers, Ordering::Relaxed);
    FINISHED.store(0, Ordering::Relaxed);
    let epoch = ((TEAM.load(Ordering::Relaxed) >> 32) + 1) & 0xffff_ffff;
    // Release: a helper that joins sees JOB, WANTED and FINISHED above.
    TEAM.store(epoch << 32 | OPEN, Ordering::Release);
    // Closed and waited for even if f(0) unwinds: `job` lives on this
    // stack frame.
    struct Close(u64);
    impl Drop for Close {
        fn drop(&mut self) {
            let joined = (TEAM.swap(self.0 << 32, Ordering::AcqRel) & JOINED) as usize;
            while FINISHED.load(Ordering::Acquire) < joined {
                std::hint::spin_loop();
            }
            BUSY.store(false, Ordering::Release);
        }
    }
    {
        let _close = Close(epoch);
        f(0);
    }
    if PANICKED.swap(false, Ordering::AcqRel) {
        panic!("a CPU team worker panicked in a kernel");
    }
    true
}

/// Join the open job, if any and it takes another helper, and run this
/// helper's part. True when a part ran. Called by spinning workers.
pub(crate) fn help() -> bool {
    let t = TEAM.load(Ordering::Acquire);
    if t & OPEN == 0 || (t & JOINED) as usize >= WANTED.load(Ordering::Relaxed) {
        return false;
    }
    // The epoch in `t` makes this fail for a job closed (or replaced)
    // since the load; success means the caller will wait for us.
    if TEAM
        .compare_exchange(t, t + 1, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return false;
    }
    // SAFETY: we joined the open job, whose caller keeps `JOB`'s target
    // alive until FINISHED counts us.
    let job = unsafe { *(JOB.load(Ordering::Relaxed) as *const Job) };
    let part = (t & JOINED) as usize + 1;
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(part))).is_err() {
        PANICKED.store(true, Ordering::Release);
    }
    FINISHED.fetch_add(1, Ordering::Release);
    true
}

/// Claims on one region: `front << 32 | end`, the units not yet claimed.
/// Aligned so that no two regions' counters share a cache line.
#[repr(align(128))]
struct Region(AtomicU64);

impl Region {
    fn new(r: Range<usize>) -> Self {
        Region(AtomicU64::new((r.start as u64) << 32 | r.end as u64))
    }

    /// Claim a quarter of what is left, at least `min` units, from the
    /// front.
    fn claim(&self, min: usize) -> Option<Range<usize>> {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            let (lo, hi) = ((s >> 32) as usize, (s & 0xffff_ffff) as usize);
            if lo >= hi {
                return None;
            }
            let take = ((hi - lo) / 4).max(min).min(hi - lo);
            match self.0.compare_exchange_weak(
                s,
                s + ((take as u64) << 32),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(lo..lo + take),
                Err(v) => s = v,
            }
        }
    }
}

/// Run `f(range)` over disjoint ranges covering `0..units`, in parallel
/// (see the module docs), each thread taking consecutive ranges of one
/// region of memory. Every unit is in exactly one call. `min_claim` is the
/// smallest range worth a claim (a few microseconds of work).
pub(crate) fn for_ranges(units: usize, min_claim: usize, f: impl Fn(Range<usize>) + Sync) {
    let min_claim = min_claim.max(1);
    let parts = rayon::current_num_threads()
        .min(units.div_ceil(min_claim))
        .max(1);
    if parts == 1 {
        if units > 0 {
            f(0..units);
        }
        return;
    }
    let regions: Vec<Region> = (0..parts)
        .map(|r| Region::new(r * units / parts..(r + 1) * units / parts))
        .collect();
    let part = |p: usize| {
        for i in 0..parts {
            let region = &regions[(p + i) % parts];
            while let Some(r) = region.claim(min_claim) {
                f(r);
            }
        }
    };
    if super::spinners::spinners() == 0 || !run(parts - 1, &part) {
        use rayon::prelude::*;
        (0..parts).into_par_iter().for_each(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn ranges_cover_every_unit_once() {
        for units in [0, 1, 3, 7, 64, 385, 1216] {
            for min in [1, 4, 16, 1000] {
                let seen = Mutex::new(vec![0u32; units]);
                for_ranges(units, min, |r| {
                    assert!(r.start < r.end && r.end <= units);
                    let mut s = seen.lock().unwrap();
                    for u in r {
                        s[u] += 1;
                    }
                });
                assert!(
                    seen.into_inner().unwrap().iter().all(|&c| c == 1),
                    "units {units} min {min}"
                );
            }
        }
    }

    #[test]
    fn claims_shrink_with_what_is_left() {
        let r = Region::new(10..110);
        let mut got = Vec::new();
        while let Some(c) = r.claim(3) {
            got.push(c);
        }
        assert_eq!(got[0], 10..35);
        assert_eq!(got[1], 35..53);
        assert_eq!(got.last().unwrap().end, 110);
        assert!(got.windows(2).all(|w| w[0].end == w[1].start));
        assert!(got.iter().all(|c| c.len() >= 3 || c.end == 110));
        assert!(got.len() < 16, "{got:?}");
    }

    #[test]
    fn a_helper_joins_an_open_job_and_is_waited_for() {
        use std::time::{Duration, Instant};
        // The team is global: other tests' jobs may hold it for a moment,
        // and their spinners may run part 1 instead of this helper.
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let helper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    help();
                }
            })
        };
        let done = AtomicUsize::new(0);
        for _ in 0..20 {
            done.store(0, Ordering::Relaxed);
            let job = |p: usize| {
                if p == 0 {
                    // Wait (bounded) for part 1 to finish.
                    let t = Instant::now();
                    while done.load(Ordering::Acquire) == 0 && t.elapsed() < Duration::from_secs(10)
                    {
                        std::hint::spin_loop();
                    }
                } else {
                    // Slow: run must wait for it, not just see it start.
                    std::thread::sleep(Duration::from_millis(2));
                    done.fetch_add(1, Ordering::Release);
                }
            };
            let t = Instant::now();
            while !run(1, &job) {
                assert!(t.elapsed() < Duration::from_secs(10), "team never free");
                std::thread::yield_now();
            }
            assert_eq!(
                done.load(Ordering::Acquire),
                1,
                "part 1 ran once, before run returned"
            );
        }
        stop.store(true, Ordering::Relaxed);
        helper.join().unwrap();
    }
}
