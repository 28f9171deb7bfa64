//! Real-time helpers for the control thread: absolute-deadline sleeps on
//! `CLOCK_MONOTONIC`, SCHED_FIFO priority and locked memory when permitted.

use crate::wire::mono_ns;

/// Sleep until `deadline_ns` on `CLOCK_MONOTONIC` with
/// `clock_nanosleep(TIMER_ABSTIME)`: no drift accumulates across periods,
/// and a signal restarts the same absolute sleep.
pub fn sleep_until_ns(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remainder pointer may be
        // null with TIMER_ABSTIME.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if r != libc::EINTR {
            break;
        }
    }
}

/// What real-time setup the control thread got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtStatus {
    /// SCHED_FIFO priority in effect, or why not.
    pub fifo: Result<i32, String>,
    /// `mlockall` succeeded, or why not.
    pub mlock: Result<(), String>,
}

impl RtStatus {
    /// One log line.
    pub fn describe(&self) -> String {
        let f = match &self.fifo {
            Ok(p) => format!("SCHED_FIFO priority {p}"),
            Err(e) => format!("normal scheduling (SCHED_FIFO refused: {e}; grant CAP_SYS_NICE or an rtprio limit)"),
        };
        let m = match &self.mlock {
            Ok(()) => "memory locked".to_string(),
            Err(e) => format!("memory not locked (mlockall refused: {e}; raise RLIMIT_MEMLOCK)"),
        };
        format!("{f}; {m}")
    }
}

/// Try SCHED_FIFO at `priority` for the calling thread (0 = skip) and, when
/// `lock` is set, `mlockall(MCL_CURRENT | MCL_FUTURE)`.
pub fn try_realtime(priority: i32, lock: bool) -> RtStatus {
    let fifo = if priority <= 0 {
        Err("not requested (rt_priority 0)".into())
    } else {
        let p = libc::sched_param {
            sched_priority: priority,
        };
        // SAFETY: plain syscall on the current thread with a valid param.
        let r = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &p) };
        if r == 0 {
            Ok(priority)
        } else {
            Err(std::io::Error::from_raw_os_error(r).to_string())
        }
    };
    let mlock = if !lock {
        Err("not requested (lock_memory false)".into())
    } else {
        // SAFETY: plain syscall.
        let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().to_string())
        }
    };
    RtStatus { fifo, mlock }
}

/// Percentiles of a set of nanosecond samples: (p50, p99, max) in µs.
pub fn percentiles_us(samples: &mut [u64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    samples.sort_unstable();
    let q = |f: f64| {
        let i = ((samples.len() as f64 - 1.0) * f).round() as usize;
        samples[i.min(samples.len() - 1)] as f64 / 1e3
    };
    (q(0.5), q(0.99), samples[samples.len() - 1] as f64 / 1e3)
}

/// A fixed-rate clock: period `k` is due at `start + k * period`.
#[derive(Debug, Clone)]
pub struct Metronome {
    start_ns: u64,
    period_ns: u64,
    next: u64,
}

/// One wake-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    /// Period index.
    pub index: u64,
    /// When it was due (ns, CLOCK_MONOTONIC).
    pub due_ns: u64,
    /// Actual minus scheduled wake time.
    pub jitter_ns: u64,
    /// Periods skipped because the previous one overran.
    pub missed: u64,
}

impl Metronome {
    /// A clock whose period 0 is due one period from now.
    pub fn new(period_ns: u64) -> Self {
        Metronome {
            start_ns: mono_ns() + period_ns,
            period_ns: period_ns.max(1),
            next: 0,
        }
    }

    /// Sleep until the next period is due. A period whose deadline already
    /// passed by more than a whole period is skipped (counted as missed) so
    /// the loop never runs a burst of late periods.
    pub fn wait(&mut self) -> Wake {
        let due = self.start_ns + self.next * self.period_ns;
        let now = mono_ns();
        let mut missed = 0;
        let mut due = due;
        if now > due + self.period_ns {
            missed = (now - due) / self.period_ns;
            self.next += missed;
            due = self.start_ns + self.next * self.period_ns;
        }
        sleep_until_ns(due);
        let woke = mono_ns();
        let w = Wake {
            index: self.next,
            due_ns: due,
            jitter_ns: woke.saturating_sub(due),
            missed,
        };
        self.next += 1;
        w
    }
}
