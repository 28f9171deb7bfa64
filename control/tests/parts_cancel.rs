//! Two parts of one pipeline in one process (two zenoh sessions on
//! 127.0.0.1): messages keep their epoch across the split, and a cancel
//! raised in one part reaches the other, whose stages acknowledge it.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use edgeflow_control::parts::{OnLost, PartPresence, ZenohBridge};
use edgeflow_graph::parts::select_part;
use edgeflow_graph::{parse_spec, Payload, Pipeline, Registry};
use std::time::{Duration, Instant};

fn registry() -> Registry {
    let mut r = Registry::builtin();
    edgeflow_control::register(&mut r);
    r
}

#[test]
fn a_cancel_in_one_part_is_applied_and_acknowledged_in_the_other() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let yaml = format!(
        r#"name: cancel-demo
parts:
  a: {{ listen: ["tcp/127.0.0.1:{port}"] }}
  b: {{ connect: ["tcp/127.0.0.1:{port}"] }}
stages:
  - {{ id: src, kind: host_in, part: a, params: {{ type: text }} }}
  - {{ id: sink, kind: host_out, part: b, params: {{ type: text }} }}
edges:
  - {{ from: src.out, to: sink.in, capacity: 16 }}
"#
    );
    let reg = registry();
    let spec = parse_spec(&yaml, None).unwrap();
    let whole = Pipeline::from_yaml(&yaml, &reg).unwrap();
    let bridge = ZenohBridge::new(&spec, "cancel-demo", OnLost::Wait);
    let start = |part: &str| {
        let s = select_part(&spec, whole.plan(), part, &bridge).unwrap();
        let running = Pipeline::from_spec(&s, &reg).unwrap().start().unwrap();
        let mut p = PartPresence::join(&bridge.session(part), "cancel-demo", part, "h", |m| {
            panic!("{m}")
        })
        .unwrap();
        p.carry_cancels(&running).unwrap();
        (running, p)
    };
    let (b, pb) = start("b");
    let (a, pa) = start("a");
    let end = Instant::now() + Duration::from_secs(20);
    while pa.others().is_empty() || pb.others().is_empty() {
        assert!(Instant::now() < end, "the parts never met");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Messages cross with the epoch they were sent in.
    let e = a.new_epoch();
    for t in ["one", "two", "three"] {
        a.push("src", Payload::text(t)).unwrap();
    }
    let first = b.pull("sink", Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(first.epoch, e, "the epoch crossed the split");
    assert!(b.current_epoch() >= e, "part b adopted the epoch");
    // Cancel in part a: part b drops what it still holds of that epoch,
    // its stages acknowledge, and part a hears of it.
    let local = a.cancel(e, Duration::from_secs(5)).unwrap();
    assert_eq!(local.acked, local.stages);
    let end = Instant::now() + Duration::from_secs(10);
    let remote = loop {
        if let Some(r) = pa.remote_acks().into_iter().find(|r| r.epoch == e) {
            break r;
        }
        assert!(Instant::now() < end, "part b never acknowledged the cancel");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(remote.part, "b");
    assert!(
        remote.ack_ms.is_some() && remote.acked == remote.stages && remote.stages > 0,
        "{remote:?}"
    );
    if let Ok(Some(m)) = b.pull("sink", Duration::from_millis(300)) {
        assert_ne!(m.epoch, e, "a cancelled message was delivered");
    }
    // A new epoch flows again.
    let e2 = a.new_epoch();
    a.push("src", Payload::text("after")).unwrap();
    let m = b.pull("sink", Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(m.epoch, e2);
    a.stop();
    b.stop();
}
