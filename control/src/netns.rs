//! Two hosts on one machine: network namespaces joined by a veth pair (or
//! by a link with a fixed added delay, see [`VethPair::create_delayed`]),
//! with real IP between them and no route anywhere else. What the
//! cross-host tests and `edgeflow bench control --veth` run parts and zenoh
//! peers in. Needs root (or CAP_NET_ADMIN) and the `ip` tool (iproute2),
//! as CI has.

use crate::{tun_wire, Error, Result};
use std::process::Command;
use std::time::Duration;

/// Namespaces `a` (`ip_a`) and `b` (`ip_b`), addresses `10.<net>.<n>.1`
/// and `.2` on a /24, loopback up in both. Deleted on drop (the veth pair
/// goes with them).
#[derive(Debug)]
pub struct VethPair {
    /// The first namespace's name.
    pub a: String,
    /// The second namespace's name.
    pub b: String,
    /// The first host's address.
    pub ip_a: String,
    /// The second host's address.
    pub ip_b: String,
    /// The veth end in namespace `a`.
    pub dev_a: String,
    /// The veth end in namespace `b`.
    pub dev_b: String,
    /// The user-space delayed link, when the ends are TUN devices.
    wire: Option<tun_wire::Wire>,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        Error::Host(format!(
            "cannot run `ip` ({e}): install iproute2 to make test hosts"
        ))
    })?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::Host(format!(
        "`ip {}` failed: {}; network namespaces need root or CAP_NET_ADMIN",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

impl VethPair {
    /// Namespaces `<prefix>a<n>` and `<prefix>b<n>` (leftovers of the same
    /// names are removed first), `n` from 1 to 250, `net` from 0 to 255:
    /// callers that may run at once pick different prefixes or nets.
    pub fn create(prefix: &str, net: u8, n: u32) -> Result<VethPair> {
        let pair = Self::namespaces(prefix, net, n, "v")?;
        let (va, vb) = (&pair.dev_a, &pair.dev_b);
        ip(&["link", "add", va, "type", "veth", "peer", "name", vb])?;
        ip(&["link", "set", va, "netns", &pair.a])?;
        ip(&["link", "set", vb, "netns", &pair.b])?;
        pair.address()?;
        Ok(pair)
    }

    /// The same two hosts joined instead by a link that holds every packet
    /// `delay` in each direction (a round trip gains twice that): a TUN
    /// device in each namespace and a user-space wire between them. What a
    /// test uses for a long link where the kernel has no netem qdisc;
    /// [`Self::drop_packets`] and [`Self::limit_rate`] apply to it too.
    pub fn create_delayed(prefix: &str, net: u8, n: u32, delay: Duration) -> Result<VethPair> {
        let mut pair = Self::namespaces(prefix, net, n, "t")?;
        // Each device is made here, in this process's namespace, then moved
        // into its host; its queue stays with this process.
        let ta = tun_wire::open(&pair.dev_a)?;
        ip(&["link", "set", &pair.dev_a, "netns", &pair.a])?;
        let tb = tun_wire::open(&pair.dev_b)?;
        ip(&["link", "set", &pair.dev_b, "netns", &pair.b])?;
        pair.address()?;
        pair.wire = Some(tun_wire::Wire::start(ta, tb, delay)?);
        Ok(pair)
    }

    /// Makes the two namespaces (loopback up) and names the link's ends
    /// `<dev><prefix>a<n>` and `<dev><prefix>b<n>`.
    fn namespaces(prefix: &str, net: u8, n: u32, dev: &str) -> Result<VethPair> {
        if !(1..=250).contains(&n) {
            return Err(Error::Host(format!("host pair number {n}: choose 1..=250")));
        }
        let (a, b) = (format!("{prefix}a{n}"), format!("{prefix}b{n}"));
        for ns in [&a, &b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        ip(&["netns", "add", &a])?;
        // From here on, drop removes what exists.
        let pair = VethPair {
            ip_a: format!("10.{net}.{n}.1"),
            ip_b: format!("10.{net}.{n}.2"),
            dev_a: format!("{dev}{a}"),
            dev_b: format!("{dev}{b}"),
            a,
            b,
            wire: None,
        };
        ip(&["netns", "add", &pair.b])?;
        for ns in [&pair.a, &pair.b] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }

    /// Gives each end, now in its namespace, its address on the /24 and
    /// brings it up.
    fn address(&self) -> Result<()> {
        for (ns, dev, addr) in [
            (&self.a, &self.dev_a, &self.ip_a),
            (&self.b, &self.dev_b, &self.ip_b),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// Packets the delayed link ([`Self::create_delayed`]) carried so far
    /// and dropped for want of room in its delay line, both directions;
    /// `None` for a veth pair.
    pub fn wire_packets(&self) -> Option<(u64, u64)> {
        self.wire.as_ref().map(|w| (w.carried(), w.dropped()))
    }

    /// The delay [`Self::create_delayed`] adds each way; zero for a veth pair.
    pub fn added_delay(&self) -> Duration {
        self.wire.as_ref().map_or(Duration::ZERO, |w| w.delay())
    }

    /// Drop each packet arriving in either namespace with `probability`
    /// (0..1), independently: random loss on the link in both directions,
    /// by an iptables `statistic` rule on each namespace's INPUT chain
    /// (the kernel's netem qdisc is often not built; iptables is, and the
    /// `iptables` package provides the tool). Cleared with the namespaces.
    pub fn drop_packets(&self, probability: f64) -> Result<()> {
        if !(0.0..1.0).contains(&probability) {
            return Err(Error::Host(format!(
                "drop probability {probability}: choose a value in [0, 1)"
            )));
        }
        let p = format!("{probability}");
        for ns in [&self.a, &self.b] {
            let rule = ["-A", "INPUT", "-m", "statistic", "--mode", "random"];
            let args = [&rule[..], &["--probability", &p, "-j", "DROP"]].concat();
            self.run_in(ns, "iptables", &args, "refused the loss rule")
                .map_err(|e| {
                    Error::Host(format!(
                        "{e} (install the `iptables` package; the kernel needs netfilter's statistic match)"
                    ))
                })?;
        }
        Ok(())
    }

    /// Cut the link (`true`: every packet arriving over it, both ways, is
    /// dropped) or mend it (`false`): an outage, as a pulled cable or a
    /// radio out of range. The hosts' TCP stacks only see silence, so the
    /// link's end is noticed by zenoh's lease, and mending it lets the
    /// connecting side's retries through.
    pub fn cut_link(&self, cut: bool) -> Result<()> {
        let op = if cut { "-I" } else { "-D" };
        for (ns, dev) in [(&self.a, &self.dev_a), (&self.b, &self.dev_b)] {
            let args = [op, "INPUT", "-i", dev.as_str(), "-j", "DROP"];
            self.run_in(ns, "iptables", &args, "refused the outage rule")?;
        }
        Ok(())
    }

    /// Packets the [`Self::drop_packets`] rules dropped so far, both
    /// namespaces together.
    pub fn dropped_packets(&self) -> Result<u64> {
        let mut total = 0;
        for ns in [&self.a, &self.b] {
            let args = ["-L", "INPUT", "-v", "-x", "-n"];
            total += self
                .run_in(ns, "iptables", &args, "cannot list its rules")?
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.get(2) == Some(&"DROP") && l.contains("statistic"))
                        .then(|| f.first().and_then(|n| n.parse::<u64>().ok()))
                        .flatten()
                })
                .sum::<u64>();
        }
        Ok(total)
    }

    /// Slow the link to `kbit` kilobits per second in each direction, with
    /// up to `queue_ms` of queueing before the kernel drops: a token-bucket
    /// (`tbf`) qdisc on both veth ends. Every packet then waits its
    /// serialisation time and bursts wait in the queue, so the link adds
    /// delay under load and drops what overflows, as a slow radio link does
    /// (the kernel's netem qdisc, which adds a fixed delay, is often not
    /// built; tbf is). Cleared with the namespaces.
    pub fn limit_rate(&self, kbit: u32, queue_ms: u32) -> Result<()> {
        if kbit == 0 || queue_ms == 0 {
            return Err(Error::Host(format!(
                "rate limit {kbit} kbit/s with {queue_ms} ms of queue: choose both above 0"
            )));
        }
        let (rate, latency) = (format!("{kbit}kbit"), format!("{queue_ms}ms"));
        for (ns, dev) in [(&self.a, &self.dev_a), (&self.b, &self.dev_b)] {
            ip(&[
                "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                &rate, "burst", "4kb", "latency", &latency,
            ])
            .map_err(|e| {
                Error::Host(format!(
                    "{e} (the `tc` tool comes with iproute2; the kernel needs the tbf qdisc)"
                ))
            })?;
        }
        Ok(())
    }

    /// Packets the [`Self::limit_rate`] qdiscs held back for want of
    /// tokens (`overlimits`) and dropped for want of queue, both veth ends
    /// together: proof that the limit shaped the traffic.
    pub fn throttled_packets(&self) -> Result<(u64, u64)> {
        let (mut held, mut dropped) = (0, 0);
        for (ns, dev) in [(&self.a, &self.dev_a), (&self.b, &self.dev_b)] {
            let args = ["-s", "qdisc", "show", "dev", dev];
            let text = self.run_in(ns, "tc", &args, "cannot show its qdisc")?;
            let field = |name: &str| -> u64 {
                text.split_whitespace()
                    .skip_while(|w| *w != name)
                    .nth(1)
                    .and_then(|v| v.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
                    .unwrap_or(0)
            };
            held += field("overlimits");
            dropped += field("(dropped");
        }
        Ok((held, dropped))
    }

    /// Runs `program args` inside namespace `ns` and returns its standard
    /// output; a failure names the program, the namespace and `what` went
    /// wrong, with the program's own message.
    fn run_in(&self, ns: &str, program: &str, args: &[&str], what: &str) -> Result<String> {
        let out = self
            .command(ns, program)
            .args(args)
            .output()
            .map_err(|e| Error::Host(format!("cannot run `ip netns exec` ({e})")))?;
        if !out.status.success() {
            return Err(Error::Host(format!(
                "{program} in `{ns}` {what}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `program` to run inside namespace `ns` (`ip netns exec`); add its
    /// arguments to the returned command.
    pub fn command(&self, ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // Stop the wire first: closing its queues removes the TUN devices.
        self.wire = None;
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_out_of_range_pair_number_is_refused_before_touching_anything() {
        let e = VethPair::create("efx", 1, 0).unwrap_err().to_string();
        assert!(e.contains("choose 1..=250"), "{e}");
        let e = VethPair::create("efx", 1, 251).unwrap_err().to_string();
        assert!(e.contains("choose 1..=250"), "{e}");
    }

    #[test]
    fn a_loss_probability_outside_0_1_or_a_zero_rate_is_refused() {
        let pair = VethPair {
            a: "efx-none-a".into(),
            b: "efx-none-b".into(),
            ip_a: String::new(),
            ip_b: String::new(),
            dev_a: String::new(),
            dev_b: String::new(),
            wire: None,
        };
        for p in [-0.1, 1.0, f64::NAN] {
            let e = pair.drop_packets(p).unwrap_err().to_string();
            assert!(e.contains("choose a value in [0, 1)"), "{p}: {e}");
        }
        for (kbit, ms) in [(0, 200), (128, 0)] {
            let e = pair.limit_rate(kbit, ms).unwrap_err().to_string();
            assert!(e.contains("choose both above 0"), "{kbit} {ms}: {e}");
        }
    }

    /// Runs `f` on a thread that has entered network namespace `ns`.
    fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        use std::os::fd::AsRawFd;
        let path = format!("/var/run/netns/{ns}");
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("namespace file");
            // SAFETY: a valid namespace descriptor; setns only changes
            // this thread's network namespace.
            let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("namespace thread")
    }

    #[test]
    fn a_delayed_link_adds_its_delay_to_every_round_trip_and_carries_tcp() {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        use std::time::Instant;
        let delay = Duration::from_millis(40);
        let n = std::process::id() % 250 + 1;
        let pair = VethPair::create_delayed("efw", 236, n, delay)
            .unwrap_or_else(|e| panic!("{e} (this test needs root, as CI has)"));
        assert_eq!(pair.added_delay(), delay);
        let addr = format!("{}:7460", pair.ip_b);
        let listener = in_ns(&pair.b, {
            let addr = addr.clone();
            move || TcpListener::bind(addr).expect("bind on host b")
        });
        // Host b echoes what it reads.
        let echo = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 64];
            while let Ok(k) = s.read(&mut buf) {
                if k == 0 || s.write_all(&buf[..k]).is_err() {
                    break;
                }
            }
        });
        let rtts = in_ns(&pair.a, move || {
            let t = Instant::now();
            let mut s = TcpStream::connect(&addr).expect("connect from host a");
            s.set_nodelay(true).expect("nodelay");
            let mut rtts = vec![t.elapsed()];
            for i in 0..5u8 {
                let t = Instant::now();
                s.write_all(&[i; 8]).expect("send");
                let mut back = [0u8; 8];
                s.read_exact(&mut back).expect("echo");
                assert_eq!(back, [i; 8]);
                rtts.push(t.elapsed());
            }
            rtts
        });
        echo.join().expect("echo thread");
        // The connect (SYN, SYN-ACK) and every echo cross the link twice.
        // A floor only: a loaded machine can only make them slower.
        for (i, rtt) in rtts.iter().enumerate() {
            assert!(
                *rtt >= 2 * delay,
                "round trip {i}: {rtt:?} < {:?}",
                2 * delay
            );
        }
        let (carried, dropped) = pair.wire_packets().expect("a wire");
        assert!(carried >= 12, "the wire carried {carried} packets");
        assert_eq!(dropped, 0);
        eprintln!("round trips over a {delay:?} link: {rtts:?}; {carried} packets carried");
    }
}
