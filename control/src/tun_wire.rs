//! A link with a fixed added delay, in user space: two TUN devices (one
//! per test host) and a thread per direction that reads each IP packet off
//! one, holds it for the delay and writes it into the other. The kernels
//! the tests run on have no netem qdisc, so this is how a test host pair
//! gets a long link: the hosts' own TCP stacks see the round trip grow by
//! twice the delay, retransmit on their own timers, and the loss and rate
//! rules (`iptables`, `tbf`) still apply on top.

use crate::{Error, Result};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Packets a direction holds at most (the delay line's length); more are
/// dropped and counted, as a full router queue would.
const QUEUE_PACKETS: usize = 4096;
/// How often the threads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// Largest packet a TUN device hands over (its MTU is 1500; GSO is off).
const MAX_PACKET: usize = 65536;

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Creates TUN device `name` (raw IP packets, no packet-info header) in
/// this process's network namespace and returns its queue. The device
/// lives as long as the file: closing it removes the device.
pub(crate) fn open(name: &str) -> Result<File> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(Error::Host(format!(
            "TUN device name {name:?}: use 1 to {} bytes",
            libc::IFNAMSIZ - 1
        )));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| {
            Error::Host(format!(
                "cannot open /dev/net/tun ({e}): the delayed link needs the tun driver and root"
            ))
        })?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `f` is an open /dev/net/tun descriptor and `req` a valid,
    // writable `struct ifreq` that outlives the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) };
    if r != 0 {
        return Err(Error::Host(format!(
            "TUNSETIFF {name}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(f)
}

/// Waits up to [`POLL`] for a packet on `f`; true when one is ready.
fn readable(f: &File) -> bool {
    let mut p = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the duration of the call.
    let r = unsafe { libc::poll(&mut p, 1, POLL.as_millis() as libc::c_int) };
    r > 0 && p.revents & libc::POLLIN != 0
}

/// Counters of one [`Wire`], both directions together.
#[derive(Debug, Default)]
struct Counts {
    carried: AtomicU64,
    dropped: AtomicU64,
}

/// The running wire: dropping it stops its threads and closes both
/// devices (which removes them).
#[derive(Debug)]
pub(crate) struct Wire {
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
    threads: Vec<JoinHandle<()>>,
    delay: Duration,
}

impl Wire {
    /// Carries packets between the TUN queues `a` and `b`, each held
    /// `delay` (in both directions, so a round trip gains twice that).
    pub(crate) fn start(a: File, b: File, delay: Duration) -> Result<Wire> {
        let clone = |f: &File| {
            f.try_clone()
                .map_err(|e| Error::Host(format!("cannot share a TUN queue: {e}")))
        };
        let (a2, b2) = (clone(&a)?, clone(&b)?);
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let mut threads = Vec::new();
        for (from, to, dir) in [(a, b2, "a->b"), (b, a2, "b->a")] {
            let (tx, rx) = bounded(QUEUE_PACKETS);
            let (s, c) = (stop.clone(), counts.clone());
            threads.push(spawn(format!("wire-in {dir}"), move || {
                take(from, tx, delay, &s, &c)
            })?);
            let (s, c) = (stop.clone(), counts.clone());
            threads.push(spawn(format!("wire-out {dir}"), move || {
                give(to, rx, &s, &c)
            })?);
        }
        Ok(Wire {
            stop,
            counts,
            threads,
            delay,
        })
    }

    /// Packets delivered so far, both directions.
    pub(crate) fn carried(&self) -> u64 {
        self.counts.carried.load(Ordering::Relaxed)
    }

    /// Packets dropped because a direction's delay line was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.counts.dropped.load(Ordering::Relaxed)
    }

    /// The delay each packet is held.
    pub(crate) fn delay(&self) -> Duration {
        self.delay
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(|e| Error::Host(format!("cannot start the wire's thread: {e}")))
}

/// Reads packets off `from` and queues each with the instant it is due.
fn take(
    mut from: File,
    tx: Sender<(Instant, Vec<u8>)>,
    delay: Duration,
    stop: &AtomicBool,
    counts: &Counts,
) {
    let mut buf = vec![0u8; MAX_PACKET];
    while !stop.load(Ordering::Relaxed) {
        if !readable(&from) {
            continue;
        }
        let n = match from.read(&mut buf) {
            Ok(n) if n > 0 => n,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // The device is gone (its namespace was deleted): stop.
            Err(_) => return,
        };
        match tx.try_send((Instant::now() + delay, buf[..n].to_vec())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// Writes each queued packet into `to` once it is due; the delay is the
/// same for every packet, so the queue is already in due order.
fn give(mut to: File, rx: Receiver<(Instant, Vec<u8>)>, stop: &AtomicBool, counts: &Counts) {
    while !stop.load(Ordering::Relaxed) {
        let (due, packet) = match rx.recv_timeout(POLL) {
            Ok(p) => p,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        // A write the kernel refuses (the device just went down) loses
        // that packet, as the wire would.
        if to.write(&packet).is_ok() {
            counts.carried.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_name_that_does_not_fit_is_refused_before_opening_anything() {
        for name in ["", "sixteen-bytes-xx"] {
            let e = open(name).unwrap_err().to_string();
            assert!(e.contains("use 1 to 15 bytes"), "{name:?}: {e}");
        }
    }
}
