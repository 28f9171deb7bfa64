//! Helpers shared by the tests that run parts of a pipeline as processes:
//! a process whose output lines arrive with the time they were read, and
//! two test hosts (network namespaces joined by a veth pair); the live
//! voice tests' PulseAudio helpers in [`voice`].
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test uses some

pub(crate) mod voice;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

pub(crate) fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

pub(crate) fn edgeflow() -> &'static str {
    env!("CARGO_BIN_EXE_edgeflow")
}

/// Lines of one stream, with the time each was read.
struct Lines {
    rx: Receiver<(Instant, String)>,
    seen: Vec<(Instant, String)>,
}

impl Lines {
    fn read(stream: impl std::io::Read + Send + 'static, echo: &'static str) -> Lines {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stream).lines().map_while(Result::ok) {
                if !echo.is_empty() {
                    eprintln!("  {echo} {l}");
                }
                if tx.send((Instant::now(), l)).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// Take what has arrived so far.
    fn gather(&mut self) {
        while let Ok(x) = self.rx.try_recv() {
            self.seen.push(x);
        }
    }

    fn wait_after(
        &mut self,
        needle: &str,
        since: Option<Instant>,
        timeout: Duration,
    ) -> Option<Instant> {
        let fresh = |t: &Instant| since.is_none_or(|s| *t >= s);
        if let Some((t, _)) = self
            .seen
            .iter()
            .find(|(t, l)| fresh(t) && l.contains(needle))
        {
            return Some(*t);
        }
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let (t, l) = self.rx.recv_timeout(left).ok()?;
            let hit = fresh(&t) && l.contains(needle);
            self.seen.push((t, l));
            if hit {
                return Some(t);
            }
        }
    }
}

/// A process whose stderr and stdout lines arrive with the time they were
/// read (both drained as they come: a full pipe would stall the process).
pub(crate) struct Proc {
    pub(crate) child: Child,
    err: Lines,
    out: Lines,
}

impl Proc {
    pub(crate) fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .current_dir(repo())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a process");
        let out = Lines::read(child.stdout.take().unwrap(), "");
        let err = Lines::read(child.stderr.take().unwrap(), "|");
        Proc { child, err, out }
    }

    /// Wait up to `timeout` for a stderr line containing `needle`; its time.
    pub(crate) fn wait_line(&mut self, needle: &str, timeout: Duration) -> Option<Instant> {
        self.err.wait_after(needle, None, timeout)
    }

    /// The same, counting only lines read at or after `since`.
    pub(crate) fn wait_line_after(
        &mut self,
        needle: &str,
        since: Option<Instant>,
        timeout: Duration,
    ) -> Option<Instant> {
        self.err.wait_after(needle, since, timeout)
    }

    /// Wait up to `timeout` for a stdout line containing `needle`; its time.
    pub(crate) fn wait_out_line(&mut self, needle: &str, timeout: Duration) -> Option<Instant> {
        self.out.wait_after(needle, None, timeout)
    }

    /// The stdout lines read at or after `since`, so far.
    pub(crate) fn out_lines_after(&mut self, since: Instant) -> Vec<(Instant, String)> {
        self.out.gather();
        self.out
            .seen
            .iter()
            .filter(|(t, _)| *t >= since)
            .cloned()
            .collect()
    }

    /// Wait for the exit; (status code, stdout).
    pub(crate) fn finish(mut self, timeout: Duration) -> (Option<i32>, String) {
        let end = Instant::now() + timeout;
        let code = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st.code();
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("a part did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader sees end of file once the process has exited.
        let mut text = String::new();
        while let Ok((t, l)) = self.out.rx.recv_timeout(Duration::from_secs(5)) {
            self.out.seen.push((t, l));
        }
        for (_, l) in &self.out.seen {
            text.push_str(l);
            text.push('\n');
        }
        (code, text)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two network namespaces joined by a veth pair or a delayed link
/// ([`edgeflow_control::netns::VethPair`]): the project's own test hosts,
/// `10.<net>.<n>.1` and `10.<net>.<n>.2`, named `<prefix>a<n>` and
/// `<prefix>b<n>` (each test file its own prefix and net, so they never
/// collide). Removed on drop.
pub(crate) struct Hosts {
    pair: edgeflow_control::netns::VethPair,
    pub(crate) a: String,
    pub(crate) b: String,
    pub(crate) ip_a: String,
    pub(crate) ip_b: String,
}

impl Hosts {
    pub(crate) fn new(prefix: &str, net: u8) -> Hosts {
        let n = std::process::id() % 250 + 1;
        Self::from(edgeflow_control::netns::VethPair::create(prefix, net, n))
    }

    /// The same hosts joined by a link that holds every packet `delay`
    /// each way (`VethPair::create_delayed`).
    pub(crate) fn delayed(prefix: &str, net: u8, delay: std::time::Duration) -> Hosts {
        let n = std::process::id() % 250 + 1;
        Self::from(edgeflow_control::netns::VethPair::create_delayed(
            prefix, net, n, delay,
        ))
    }

    fn from(pair: edgeflow_control::Result<edgeflow_control::netns::VethPair>) -> Hosts {
        let pair = pair.unwrap_or_else(|e| {
            panic!("{e} (these tests need root and network namespaces, as CI has)")
        });
        Hosts {
            a: pair.a.clone(),
            b: pair.b.clone(),
            ip_a: pair.ip_a.clone(),
            ip_b: pair.ip_b.clone(),
            pair,
        }
    }

    /// Drop packets on the link with `probability`, both directions.
    pub(crate) fn drop_packets(&self, probability: f64) {
        self.pair
            .drop_packets(probability)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Slow the link (see `VethPair::limit_rate`).
    pub(crate) fn limit_rate(&self, kbit: u32, queue_ms: u32) {
        self.pair
            .limit_rate(kbit, queue_ms)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Packets held back and dropped by [`Self::limit_rate`] so far.
    pub(crate) fn throttled_packets(&self) -> (u64, u64) {
        self.pair
            .throttled_packets()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Packets the delayed link carried and dropped so far.
    pub(crate) fn wire_packets(&self) -> (u64, u64) {
        self.pair.wire_packets().expect("a delayed link")
    }

    /// Cut (`true`) or mend the link (`VethPair::cut_link`).
    pub(crate) fn cut_link(&self, cut: bool) {
        self.pair.cut_link(cut).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Packets dropped by [`Self::drop_packets`] so far.
    pub(crate) fn dropped_packets(&self) -> u64 {
        self.pair
            .dropped_packets()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `edgeflow ARGS` on host `ns`.
    pub(crate) fn cmd(&self, ns: &str, args: &[&str]) -> Command {
        let mut c = self.pair.command(ns, edgeflow());
        c.args(args);
        c
    }
}
