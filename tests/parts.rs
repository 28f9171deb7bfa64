//! One pipeline split into parts, each part its own `edgeflow run --part`
//! process: end of stream and lossless `block` edges across processes on
//! 127.0.0.1, a part started from another file refused, and the robot loop
//! split across two network namespaces joined by a veth pair (real IP
//! between two test hosts, no multicast), with the policy's part killed
//! and restarted mid-run; across the same kind of link with 5 % of the
//! packets dropped, slowed to 128 kbit/s with a queue that delays and
//! overflows, or 50 ms long each way and lossy, a `block` edge loses
//! nothing and a `latest` edge still delivers the newest message, also to
//! a part that comes after the last one was published.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::{edgeflow, repo, Hosts, Proc};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The scenarios share two cores: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn part(file: &Path, name: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(edgeflow());
    c.args(["run"])
        .arg(file)
        .args(["--part", name, "--quiet"])
        .args(extra);
    c
}

/// A text source of `count` numbered lines in part `a`, printed by part `b`.
fn finite_yaml(port: u16, count: u32) -> String {
    let lines: Vec<String> = (0..count).map(|i| format!("line {i}")).collect();
    format!(
        r#"name: finite
parts:
  a: {{ listen: ["tcp/127.0.0.1:{port}"] }}
  b: {{ connect: ["tcp/127.0.0.1:{port}"] }}
stages:
  - {{ id: lines, kind: text, part: a, params: {{ whole: false, text: {text} }} }}
  - {{ id: show, kind: stdout, part: b }}
edges:
  - {{ from: lines.out, to: show.in, capacity: 4 }}
"#,
        text = serde_json::to_string(&lines.join("\n")).unwrap()
    )
}

#[test]
fn a_finite_split_pipeline_ends_in_every_part_and_its_block_edge_loses_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("finite.yaml");
    std::fs::write(&file, finite_yaml(free_port(), 400)).unwrap();
    // The consumer starts second: the producer's credit window waits for it
    // instead of publishing into the void.
    let (ma, mb) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let a = Proc::spawn(part(&file, "a", &["--metrics-out", ma.to_str().unwrap()]));
    std::thread::sleep(Duration::from_millis(300));
    let b = Proc::spawn(part(&file, "b", &["--metrics-out", mb.to_str().unwrap()]));
    let (code_b, out_b) = b.finish(Duration::from_secs(60));
    let (code_a, _) = a.finish(Duration::from_secs(30));
    assert_eq!(
        (code_a, code_b),
        (Some(0), Some(0)),
        "both parts end with exit 0"
    );
    let want: Vec<String> = (0..400).map(|i| format!("line {i}")).collect();
    let got: Vec<&str> = out_b.lines().filter(|l| l.starts_with("line ")).collect();
    assert_eq!(
        got.len(),
        400,
        "every line crossed the block edge: {} of 400",
        got.len()
    );
    assert_eq!(got, want, "in order");
    // Each part's metrics hold the other part's too: one run, one summary.
    for (path, me, other, stage) in [(&ma, "a", "b", "show"), (&mb, "b", "a", "lines")] {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(v["part"], me);
        let theirs = &v["parts"][other];
        assert_eq!(
            theirs["part"], other,
            "{me} gathered {other}'s metrics: {v}"
        );
        let st = theirs["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == stage)
            .unwrap_or_else(|| panic!("{other}'s stage {stage} in {me}'s metrics: {v}"));
        if stage == "show" {
            assert!(st["processed"].as_u64().unwrap() >= 400, "{st}");
        }
    }
}

#[test]
fn a_part_that_comes_after_the_last_tick_still_gets_the_newest_on_a_latest_edge() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("late.yaml");
    let port = free_port();
    std::fs::write(
        &file,
        format!(
            r#"name: late
parts:
  a: {{ listen: ["tcp/127.0.0.1:{port}"] }}
  b: {{ connect: ["tcp/127.0.0.1:{port}"] }}
stages:
  - {{ id: ticks, kind: timer, part: a, params: {{ rate_hz: 100, count: 20 }} }}
  - {{ id: fresh, kind: stdout, part: b }}
edges:
  - {{ from: ticks.out, to: fresh.in, policy: latest, capacity: 1 }}
"#
        ),
    )
    .unwrap();
    // Part a's ticks (0.2 s) are over before part b starts: zenoh routes
    // a publication only to a subscriber already declared, so the edge
    // itself must keep its newest message for the part that comes.
    let mut a = Proc::spawn(part(&file, "a", &[]));
    assert!(
        a.wait_line("part `a` of `late`", Duration::from_secs(20))
            .is_some(),
        "part a started"
    );
    std::thread::sleep(Duration::from_millis(1200));
    let b = Proc::spawn(part(&file, "b", &["--timeout", "30"]));
    let (code_b, out_b) = b.finish(Duration::from_secs(30));
    let (code_a, _) = a.finish(Duration::from_secs(30));
    assert_eq!((code_a, code_b), (Some(0), Some(0)), "both parts end");
    let ticks: Vec<&str> = out_b.lines().filter(|l| l.contains("index: ")).collect();
    assert!(
        ticks.last().is_some_and(|l| l.contains("index: 19")),
        "part b got the newest tick, 19: {ticks:?}"
    );
}

#[test]
fn a_part_started_from_another_file_is_refused_naming_both_hashes() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let one = dir.path().join("one.yaml");
    let two = dir.path().join("two.yaml");
    std::fs::write(&one, finite_yaml(port, 50)).unwrap();
    std::fs::write(&two, format!("# edited\n{}", finite_yaml(port, 50))).unwrap();
    let mut a = Proc::spawn(part(&one, "a", &["--timeout", "8"]));
    assert!(
        a.wait_line("part `a` of `finite`", Duration::from_secs(20))
            .is_some(),
        "part a started"
    );
    let b = Proc::spawn(part(&two, "b", &["--timeout", "30"]));
    let (code_b, _) = b.finish(Duration::from_secs(30));
    assert_ne!(code_b, Some(0), "the part from another file must not run");
    // The refused part never declared itself: the first one goes on
    // waiting for its consumer until its own --timeout (exit 124).
    let (code_a, _) = a.finish(Duration::from_secs(30));
    assert_eq!(code_a, Some(124));
}

// ------------------------------------------------------- two network hosts

/// Lines on a `block` edge and timer ticks on a `latest` edge from part
/// `a` on host A to part `b` on host B.
fn lossy_yaml(h: &Hosts, lines: u32, ticks: u32) -> String {
    let text: Vec<String> = (0..lines).map(|i| format!("line {i}")).collect();
    format!(
        r#"name: lossy
parts:
  a: {{ listen: ["tcp/{a}:7451"] }}
  b: {{ connect: ["tcp/{a}:7451"], listen: ["tcp/{b}:0"] }}
stages:
  - {{ id: lines, kind: text, part: a, params: {{ whole: false, text: {text} }} }}
  - {{ id: ticks, kind: timer, part: a, params: {{ rate_hz: 100, count: {ticks} }} }}
  - {{ id: show, kind: stdout, part: b }}
  - {{ id: fresh, kind: stdout, part: b }}
edges:
  - {{ from: lines.out, to: show.in, capacity: 4 }}
  - {{ from: ticks.out, to: fresh.in, policy: latest, capacity: 1 }}
"#,
        a = h.ip_a,
        b = h.ip_b,
        text = serde_json::to_string(&text.join("\n")).unwrap()
    )
}

/// Runs [`lossy_yaml`]'s two parts on `hosts` and checks that the `block`
/// edge delivered every line in order and the `latest` edge its newest tick.
fn block_is_lossless_and_latest_is_fresh(hosts: &Hosts, n_lines: u32) {
    lossless_and_fresh_through(hosts, n_lines, 300, |_| {});
}

/// [`block_is_lossless_and_latest_is_fresh`] with `n_ticks` on the latest
/// edge and `meanwhile` run on part b's process once both parts run.
fn lossless_and_fresh_through(
    hosts: &Hosts,
    n_lines: u32,
    n_ticks: u32,
    meanwhile: impl FnOnce(&mut Proc),
) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lossy.yaml");
    std::fs::write(&file, lossy_yaml(hosts, n_lines, n_ticks)).unwrap();
    let f = file.to_str().unwrap();
    let mut b = Proc::spawn(hosts.cmd(&hosts.b, &["run", f, "--part", "b", "--quiet"]));
    std::thread::sleep(Duration::from_millis(300));
    let a = Proc::spawn(hosts.cmd(&hosts.a, &["run", f, "--part", "a", "--quiet"]));
    meanwhile(&mut b);
    let (code_b, out_b) = b.finish(Duration::from_secs(120));
    let (code_a, _) = a.finish(Duration::from_secs(30));
    assert_eq!(
        (code_a, code_b),
        (Some(0), Some(0)),
        "both parts end with exit 0"
    );
    let want: Vec<String> = (0..n_lines).map(|i| format!("line {i}")).collect();
    let got: Vec<&str> = out_b.lines().filter(|l| l.starts_with("line ")).collect();
    assert_eq!(got.len(), want.len(), "the block edge lost lines");
    assert_eq!(got, want, "in order");
    let ticks: Vec<u64> = out_b
        .lines()
        .filter_map(|l| {
            let rest = l.split("index: ").nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    eprintln!(
        "latest edge: {} of {n_ticks} ticks delivered, the last {:?}",
        ticks.len(),
        ticks.last()
    );
    assert!(!ticks.is_empty(), "no tick crossed the latest edge");
    assert!(ticks.windows(2).all(|w| w[0] < w[1]), "ticks in order");
    assert_eq!(
        ticks.last(),
        Some(&(u64::from(n_ticks) - 1)),
        "the newest tick arrives: the latest edge stays fresh"
    );
}

#[test]
fn under_5_percent_packet_loss_a_block_edge_loses_nothing_and_latest_stays_fresh() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let hosts = Hosts::new("efl", 233);
    hosts.drop_packets(0.05);
    block_is_lossless_and_latest_is_fresh(&hosts, 1000);
    let dropped = hosts.dropped_packets();
    eprintln!("packets dropped on the link: {dropped}");
    assert!(
        dropped > 0,
        "the loss rule dropped nothing: the test tested nothing"
    );
}

#[test]
fn on_a_slow_queueing_link_a_block_edge_loses_nothing_and_latest_stays_fresh() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let hosts = Hosts::new("efs", 234);
    // 128 kbit/s each way, 200 ms of queue: the block edge's burst fills
    // the link, so every packet waits its turn and the overflow is dropped.
    hosts.limit_rate(128, 200);
    let t0 = Instant::now();
    block_is_lossless_and_latest_is_fresh(&hosts, 1000);
    let (held, dropped) = hosts.throttled_packets();
    eprintln!(
        "slow link: {held} packets held back, {dropped} dropped by the queue, run took {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        held > 0,
        "the rate limit held nothing back: the test tested nothing"
    );
}

#[test]
fn over_a_long_lossy_link_a_block_edge_loses_nothing_and_latest_stays_fresh() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // 50 ms each way (a 100 ms round trip, a slow WAN) and 5 % of the
    // packets dropped: the block edge's credit window (its capacity, 4)
    // then allows about 40 lines per second, so 200 lines.
    let delay = Duration::from_millis(50);
    let hosts = Hosts::delayed("efd", 235, delay);
    hosts.drop_packets(0.05);
    let t0 = Instant::now();
    block_is_lossless_and_latest_is_fresh(&hosts, 200);
    let (carried, full) = hosts.wire_packets();
    let dropped = hosts.dropped_packets();
    eprintln!(
        "long link ({delay:?} each way): {carried} packets carried, {dropped} dropped by the loss rule, {full} by a full delay line, run took {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(carried > 0, "nothing crossed the delayed link");
    assert!(
        dropped > 0,
        "the loss rule dropped nothing: the test tested nothing"
    );
}

#[test]
fn a_link_outage_mid_stream_loses_nothing_on_a_block_edge_and_both_parts_end() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A slow WAN (50 ms each way) so the stream is still flowing when the
    // link goes silent for 3 s: three times the link lease, so both parts
    // see each other gone and zenoh drops the connection; the block edge's
    // messages in flight and its acknowledgements are lost with it.
    let hosts = Hosts::delayed("efo", 236, Duration::from_millis(50));
    let t0 = Instant::now();
    lossless_and_fresh_through(&hosts, 200, 800, |b| {
        assert!(
            b.wait_out_line("line 30", Duration::from_secs(60))
                .is_some(),
            "the stream never started"
        );
        // Lines arrive a window at a time, one round trip apart: the next
        // window is on the wire from 50 to 100 ms after this one landed.
        std::thread::sleep(Duration::from_millis(75));
        hosts.cut_link(true);
        let gone = b.wait_line("part `a` is gone", Duration::from_secs(10));
        assert!(
            gone.is_some(),
            "part b never noticed the outage: the test tested nothing"
        );
        std::thread::sleep(Duration::from_secs(2));
        hosts.cut_link(false);
        let back = b.wait_line_after("part `a` is here", gone, Duration::from_secs(30));
        assert!(
            back.is_some(),
            "the parts did not find each other again after the link came back"
        );
    });
    eprintln!(
        "outage of 3 s mid-stream: run took {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

fn split_file(dir: &Path, h: &Hosts) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("pipelines/robot-split.yaml")).unwrap();
    let text = text
        .replace(
            r#"robot: { listen: ["tcp/127.0.0.1:7450"] }"#,
            &format!(r#"robot: {{ listen: ["tcp/{}:7450"] }}"#, h.ip_a),
        )
        .replace(
            r#"brain: { connect: ["tcp/127.0.0.1:7450"] }"#,
            &format!(
                r#"brain: {{ connect: ["tcp/{}:7450"], listen: ["tcp/{}:0"] }}"#,
                h.ip_a, h.ip_b
            ),
        );
    assert!(text.contains(&h.ip_a), "the parts section moved");
    let f = dir.join("robot-split.yaml");
    std::fs::write(&f, text).unwrap();
    f
}

#[test]
fn robot_loop_split_across_two_hosts_survives_losing_the_policy_part() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let hosts = Hosts::new("ef", 231);
    let dir = tempfile::tempdir().unwrap();
    let file = split_file(dir.path(), &hosts);
    let f = file.to_str().unwrap();
    let episodes = 4;
    // Host A: the simulator and the robot part; host B: the policy.
    let sim = hosts
        .cmd(&hosts.a, &["sim", "push", "--listen", "tcp/127.0.0.1:7447"])
        .args(["--episodes", &episodes.to_string(), "--seed", "2000"])
        .args(["--wait-for", "edgeflow/alive/cmd"])
        .current_dir(repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut robot = Proc::spawn({
        let mut c = hosts.cmd(
            &hosts.a,
            &[
                "run",
                f,
                "--part",
                "robot",
                "--quiet",
                "--set",
                "ctl.rt_priority=0",
            ],
        );
        c.args(["--timeout", "150"]);
        c
    });
    let brain_cmd = || hosts.cmd(&hosts.b, &["run", f, "--part", "brain", "--quiet"]);
    let mut brain = Proc::spawn(brain_cmd());
    assert!(
        robot
            .wait_line("part `brain` is here", Duration::from_secs(30))
            .is_some(),
        "the robot part sees the brain across the veth"
    );
    // Read the simulator's episode lines.
    let out = {
        let mut sim = sim;
        let o = sim.stdout.take().unwrap();
        let (tx, rx) = channel::<String>();
        std::thread::spawn(move || {
            for l in BufReader::new(o).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        (sim, rx)
    };
    let (mut sim, eps_rx) = out;
    let mut results = Vec::new();
    let mut killed = false;
    let end = Instant::now() + Duration::from_secs(140);
    while results.len() < episodes {
        let line = eps_rx
            .recv_timeout(end.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("episodes so far: {results:?}"));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v.get("summary").is_some() {
            break;
        }
        eprintln!("episode: {line}");
        results.push(v);
        if results.len() == 1 && !killed {
            // Kill the policy's part: the robot part must notice within a
            // second and its controller hold safe; then restart it.
            killed = true;
            brain.child.kill().unwrap();
            let t_kill = Instant::now();
            let _ = brain.child.wait();
            let seen = robot
                .wait_line_after("part `brain` is gone", Some(t_kill), Duration::from_secs(5))
                .expect("the lost part is reported");
            let detect = seen.saturating_duration_since(t_kill);
            eprintln!(
                "lost part detected after {:.0} ms",
                detect.as_secs_f64() * 1e3
            );
            assert!(detect < Duration::from_secs(1), "detected after {detect:?}");
            assert!(
                robot
                    .wait_line_after("safe hold", Some(t_kill), Duration::from_secs(3))
                    .is_some(),
                "the controller holds safe without its policy"
            );
            std::thread::sleep(Duration::from_millis(500));
            let t_restart = Instant::now();
            brain = Proc::spawn(brain_cmd());
            assert!(
                robot
                    .wait_line_after(
                        "part `brain` is here",
                        Some(t_restart),
                        Duration::from_secs(30)
                    )
                    .is_some(),
                "the restarted part rejoins"
            );
        }
    }
    let _ = sim.wait();
    let solved = results.iter().filter(|e| e["success"] == true).count();
    eprintln!("split across hosts: {solved}/{episodes} solved (one policy restart)");
    assert!(
        solved + 1 >= episodes,
        "the split loop solved {solved}/{episodes}: {results:?}"
    );
    drop(brain);
    drop(robot);
}
