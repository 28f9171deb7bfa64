//! A memory read-bandwidth probe: how fast this machine streams a buffer
//! the size of a model's weights, on the pages weights get.
//!
//! Decode-shaped GEMVs are bound by this rate, so it is the ceiling their
//! GB/s read against (`edgeflow bench ops` prints both). The probe is a
//! multi-threaded f32 sum over a buffer on huge pages (read-only, like a
//! GEMV), on rayon's pool (where candle's kernels and ours run); a full
//! probe is the best of 8 passes that alternate a plain loop and one that
//! prefetches ahead in software, as the GEMV kernels do.

use rayon::prelude::*;
use std::time::Instant;

/// A read-bandwidth probe over one buffer (allocated once, so repeated
/// probes read the same pages).
#[derive(Debug)]
pub struct BandwidthProbe {
    buf: Vec<f32>,
    threads: usize,
    passes: usize,
}

impl BandwidthProbe {
    /// A probe over `mb` MB of f32 (at least 1 MB) on the pages weights get
    /// (`Device::place`: huge pages on Linux), read in `threads` parts.
    pub fn new(mb: usize, threads: usize) -> Self {
        let n = mb.max(1) * (1 << 20) / 4;
        let buf: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        crate::cpu::huge_pages::advise_range(buf.as_ptr() as usize, 4 * n);
        BandwidthProbe {
            buf,
            threads: threads.max(1),
            passes: 0,
        }
    }

    /// A full probe: best of eight passes (plain and prefetching loops in
    /// turn), in GB/s.
    pub fn probe(&self) -> f64 {
        stream(&self.buf, self.threads, 0, 8)
    }

    /// One pass (the two loops in turn from call to call), in GB/s: a
    /// single sample of the machine at this moment, for readings taken
    /// between other measurements.
    pub fn pass(&mut self) -> f64 {
        self.passes += 1;
        stream(&self.buf, self.threads, self.passes, 1)
    }
}

/// Read bandwidth: `threads` threads summing disjoint parts of an `mb` MB
/// f32 buffer; best of eight passes (plain and prefetching loops in
/// turn), in GB/s.
pub fn bandwidth_gbs(mb: usize, threads: usize) -> f64 {
    BandwidthProbe::new(mb, threads).probe()
}

/// The bandwidth over `buf`: best of `passes` (from pass number `first`,
/// which picks the loops). A pass reads at least 64 MB: a smaller buffer
/// (`--working-set-mb 1`, weights in cache) is read over several times, so
/// dispatching the pass does not dominate it.
fn stream(buf: &[f32], threads: usize, first: usize, passes: usize) -> f64 {
    let n = buf.len();
    let threads = threads.max(1);
    let chunk = n.div_ceil(threads).max(1);
    let reps = (64usize << 20).div_ceil((4 * n).max(1));
    let mut best = f64::INFINITY;
    let mut sink = 0.0f32;
    for pass in first..first + passes {
        let prefetch = pass % 2 == 1;
        let t = Instant::now();
        // On rayon's warm workers (threads spawned per pass read 1-2 GB/s
        // less at the run's ends, same runs).
        let total: f32 = buf
            .par_chunks(chunk)
            .map(|part| (0..reps).map(|_| sum(part, prefetch)).sum::<f32>())
            .sum();
        best = best.min(t.elapsed().as_secs_f64());
        sink += total;
    }
    std::hint::black_box(sink);
    (n * 4 * reps) as f64 / best / 1e9
}

/// The sum of `part`, prefetching ahead in software where asked and the
/// machine has AVX2.
fn sum(part: &[f32], prefetch: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if prefetch && std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        return unsafe { sum_prefetching(part) };
    }
    let _ = prefetch;
    let mut acc = [0f32; 16];
    let mut it = part.chunks_exact(16);
    for c in &mut it {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += *x;
        }
    }
    acc.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
}

/// [`sum`] in 128-byte steps, each prefetching the two lines 512 bytes
/// ahead (the GEMV kernels prefetch two tiles, a few hundred bytes, ahead
/// of each row stream).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_prefetching(part: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    const AHEAD: usize = 512;
    let mut it = part.chunks_exact(32);
    // SAFETY: each chunk holds 32 floats, read as 4 unaligned vectors;
    // prefetches never fault.
    unsafe {
        let mut a = [_mm256_setzero_ps(); 4];
        for c in &mut it {
            let p = c.as_ptr();
            let b = p.cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(AHEAD));
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(AHEAD + 64));
            for (v, acc) in a.iter_mut().enumerate() {
                *acc = _mm256_add_ps(*acc, _mm256_loadu_ps(p.add(8 * v)));
            }
        }
        let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), s);
        lanes.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both loops add up the same buffer (a wrong sum would mean the
    /// prefetching loop skips or repeats bytes, and its GB/s would lie).
    #[test]
    fn both_loops_sum_the_whole_buffer() {
        let v: Vec<f32> = (0..1000).map(|i| (i % 7) as f32).collect();
        let want: f32 = v.iter().sum();
        assert_eq!(sum(&v, false), want);
        assert_eq!(sum(&v, true), want);
    }

    #[test]
    fn a_probe_reads_a_positive_rate() {
        let mut p = BandwidthProbe::new(1, 2);
        assert!(p.probe() > 0.0);
        assert!(p.pass() > 0.0);
    }
}
