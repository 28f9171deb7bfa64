//! The spinner slots: how many workers the keep-awake pool
//! ([`super::pool`]) holds spinning now. The team ([`super::team`]) reads
//! the count; the pool takes and gives back slots.

/// Workers held awake by the keep-awake pool ([`super::pool`]).
static SPINNERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Workers held spinning by the keep-awake pool now (the team
/// [`super::team::run`] hands work to).
pub(crate) fn spinners() -> usize {
    SPINNERS.load(std::sync::atomic::Ordering::Acquire)
}

/// Take one of `want` spinner slots; false when all are taken.
pub(crate) fn claim_spinner(want: usize) -> bool {
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

/// Give back a slot taken by [`claim_spinner`].
pub(crate) fn release_spinner() {
    SPINNERS.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
}
