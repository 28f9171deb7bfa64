//! zenoh_sub / zenoh_pub over real zenoh on 127.0.0.1: round trip, malformed
//! observations counted and rejected, liveliness loss reported.

mod common;

use common::{free_port, registry};
use edgeflow_control::session::{SessionConfig, SharedSession};
use edgeflow_control::wire::{self, Body, Header, TensorData};
use edgeflow_graph::{Event, Payload, Pipeline};
use std::time::{Duration, Instant};
use zenoh::Wait;

fn state_msg(seq: u64, values: Vec<f32>) -> Vec<u8> {
    wire::encode(
        &Header {
            epoch: 1,
            seq,
            capture_ns: wire::mono_ns(),
            deadline_ns: None,
        },
        &Body::RobotState { step: seq, values },
    )
    .expect("encode")
}

/// Wait until `f` returns Some, up to `t`.
fn until<T>(t: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + t;
    while Instant::now() < end {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn malformed_observations_are_counted_and_rejected() {
    let port = free_port();
    let yaml = format!(
        r#"
stages:
  - {{ id: obs, kind: zenoh_sub, params: {{ key: robot/obs, type: robot_state, dim: 4, policy: drop_oldest, listen: ["tcp/127.0.0.1:{port}"] }} }}
  - {{ id: out, kind: host_out, params: {{ type: tensor }} }}
edges:
  - {{ from: obs.out, to: out.in }}
"#
    );
    let running = Pipeline::from_yaml(&yaml, &registry())
        .expect("valid")
        .start()
        .expect("start");
    // A separate raw zenoh session plays the robot.
    let robot = SharedSession::open(&SessionConfig::peer(
        &[],
        &[&format!("tcp/127.0.0.1:{port}")],
    ))
    .expect("robot session");
    let publisher = robot
        .session()
        .declare_publisher("robot/obs")
        .wait()
        .expect("publisher");
    // Wait until the link is up: resend a valid state until one arrives.
    let first = until(Duration::from_secs(10), || {
        publisher
            .put(state_msg(1, vec![1.0, 2.0, 3.0, 4.0]))
            .wait()
            .expect("put");
        running
            .pull("out", Duration::from_millis(50))
            .ok()
            .flatten()
    })
    .expect("a valid observation arrives");
    match &first.payload {
        Payload::Tensor(t) => assert_eq!(t.to_vec_f32().expect("f32"), vec![1.0, 2.0, 3.0, 4.0]),
        p => panic!("expected a tensor, got {p:?}"),
    }
    while running
        .pull("out", Duration::from_millis(100))
        .ok()
        .flatten()
        .is_some()
    {}
    let before = running.metrics();
    let base = before
        .stages
        .iter()
        .find(|s| s.id == "obs")
        .and_then(|s| s.values.get("malformed"))
        .map_or(0, |v| v.last as u64);
    // Wrong size, wrong kind (a tensor), wrong dtype, random bytes, newer
    // version, truncated.
    let wrong_size = state_msg(2, vec![1.0, 2.0, 3.0]);
    let tensor = wire::encode(
        &Header::default(),
        &Body::Tensor {
            dims: vec![4],
            data: TensorData::F32(vec![0.0; 4]),
        },
    )
    .expect("encode");
    let mut bad_dtype = tensor.clone();
    bad_dtype[3] = wire::Kind::RobotState as u8; // a tensor body under a state header
    let random: Vec<u8> = (0..97u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut newer = state_msg(3, vec![0.0; 4]);
    newer[2] = wire::VERSION + 1;
    let truncated = state_msg(4, vec![0.0; 4])[..50].to_vec();
    let bad = [wrong_size, tensor, bad_dtype, random, newer, truncated];
    for b in &bad {
        publisher.put(b.clone()).wait().expect("put");
    }
    publisher
        .put(state_msg(5, vec![5.0, 6.0, 7.0, 8.0]))
        .wait()
        .expect("put");
    let good = until(Duration::from_secs(5), || {
        running
            .pull("out", Duration::from_millis(50))
            .ok()
            .flatten()
    })
    .expect("the valid one after the bad ones");
    match &good.payload {
        Payload::Tensor(t) => assert_eq!(t.to_vec_f32().expect("f32"), vec![5.0, 6.0, 7.0, 8.0]),
        p => panic!("expected a tensor, got {p:?}"),
    }
    let m = until(Duration::from_secs(2), || {
        let m = running.metrics();
        let n = m
            .stages
            .iter()
            .find(|s| s.id == "obs")?
            .values
            .get("malformed")?
            .last as u64;
        (n >= base + bad.len() as u64).then_some(n)
    })
    .expect("malformed counted");
    assert_eq!(m, base + bad.len() as u64, "every bad message counted once");
    assert!(
        running
            .pull("out", Duration::from_millis(100))
            .ok()
            .flatten()
            .is_none(),
        "no bad message got through"
    );
    running.stop();
    drop(publisher);
    drop(robot);
}

#[test]
fn pub_to_sub_round_trip_keeps_payload_and_capture_time() {
    let port = free_port();
    let yaml = format!(
        r#"
stages:
  - {{ id: src, kind: host_in, params: {{ type: actions }} }}
  - {{ id: pub, kind: zenoh_pub, params: {{ key: t/act, priority: real_time, express: true, congestion_control: drop, listen: ["tcp/127.0.0.1:{port}"] }} }}
  - {{ id: sub, kind: zenoh_sub, params: {{ key: t/act, type: actions, connect: ["tcp/127.0.0.1:{port}"], listen: [] }} }}
  - {{ id: out, kind: host_out, params: {{ type: actions }} }}
edges:
  - {{ from: src.out, to: pub.in }}
  - {{ from: sub.out, to: out.in }}
"#
    );
    let running = Pipeline::from_yaml(&yaml, &registry())
        .expect("valid")
        .start()
        .expect("start");
    let chunk = edgeflow_graph::ActionChunk {
        start_step: 7,
        dt: Duration::from_millis(20),
        dim: 2,
        actions: vec![1.0, 2.0, 3.0, 4.0],
    };
    let got = until(Duration::from_secs(10), || {
        running
            .push("src", Payload::Actions(std::sync::Arc::new(chunk.clone())))
            .expect("push");
        running
            .pull("out", Duration::from_millis(50))
            .ok()
            .flatten()
    })
    .expect("the chunk comes back over zenoh");
    match &got.payload {
        Payload::Actions(a) => assert_eq!(**a, chunk),
        p => panic!("expected actions, got {p:?}"),
    }
    assert!(
        got.timestamp.elapsed() < Duration::from_secs(1),
        "capture time survives the trip"
    );
    running.stop();
}

#[test]
fn lost_peer_is_reported_within_a_second() {
    let port = free_port();
    let yaml = format!(
        r#"
stages:
  - {{ id: sub, kind: zenoh_sub, params: {{ key: robot/state, type: robot_state, watch: "edgeflow/alive/sim", listen: ["tcp/127.0.0.1:{port}"] }} }}
  - {{ id: peer, kind: host_out, params: {{ type: control }} }}
  - {{ id: sink, kind: discard }}
edges:
  - {{ from: sub.peer, to: peer.in }}
  - {{ from: sub.out, to: sink.in }}
"#
    );
    let running = Pipeline::from_yaml(&yaml, &registry())
        .expect("valid")
        .start()
        .expect("start");
    let sim = SharedSession::open(&SessionConfig::peer(
        &[],
        &[&format!("tcp/127.0.0.1:{port}")],
    ))
    .expect("sim session");
    let token = sim
        .session()
        .liveliness()
        .declare_token("edgeflow/alive/sim")
        .wait()
        .expect("token");
    let name = |m: &edgeflow_graph::Message| match m.payload.as_event() {
        Some(Event::Named(n, _)) => n.clone(),
        _ => String::new(),
    };
    let alive = until(Duration::from_secs(10), || {
        running
            .pull("peer", Duration::from_millis(50))
            .ok()
            .flatten()
    })
    .expect("peer_alive");
    assert_eq!(name(&alive), "peer_alive");
    let t0 = Instant::now();
    drop(token);
    drop(sim);
    let lost = until(Duration::from_secs(3), || {
        running
            .pull("peer", Duration::from_millis(20))
            .ok()
            .flatten()
    })
    .expect("peer_lost");
    assert_eq!(name(&lost), "peer_lost");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "peer loss took {:?}",
        t0.elapsed()
    );
    running.stop();
}

/// A `block` edge over zenoh as the parts bridge makes it (inline
/// publisher with a credit window, subscriber delivering from zenoh's
/// callback and acknowledging every other message) behind a slow consumer:
/// the callback holds what it cannot deliver at once, the stage's thread
/// delivers it in order, the window stalls the producer; nothing is lost,
/// nothing overtakes.
#[test]
fn a_windowed_block_edge_behind_a_slow_consumer_is_lossless_and_in_order() {
    let port = free_port();
    let yaml = format!(
        r#"
stages:
  - {{ id: src, kind: host_in, params: {{ type: text }} }}
  - {{ id: pub, kind: zenoh_pub, inline: true, params: {{ key: t/blk, policy: block, express: true, window: 4, watch: "edgeflow/alive/sub", listen: ["tcp/127.0.0.1:{port}"] }} }}
  - {{ id: sub, kind: zenoh_sub, params: {{ key: t/blk, type: text, policy: block, capacity: 4, ack: true, ack_every: 2, connect: ["tcp/127.0.0.1:{port}"], listen: [] }} }}
  - {{ id: out, kind: host_out, params: {{ type: text, capacity: 1 }} }}
edges:
  - {{ from: src.out, to: pub.in, capacity: 4 }}
  - {{ from: sub.out, to: out.in, capacity: 2 }}
"#
    );
    let running = Pipeline::from_yaml(&yaml, &registry())
        .expect("valid")
        .start()
        .expect("start");
    let n = 300;
    std::thread::scope(|s| {
        let r = &running;
        s.spawn(move || {
            for i in 0..n {
                r.push("src", Payload::text(format!("m{i}"))).expect("push");
            }
        });
        for i in 0..n {
            if i < 40 {
                // Slow at first: the edge, the callback and the window fill.
                std::thread::sleep(Duration::from_millis(3));
            }
            let m = running
                .pull("out", Duration::from_secs(10))
                .expect("no message lost")
                .expect("stream open");
            assert_eq!(m.payload.as_text(), Some(format!("m{i}").as_str()));
        }
    });
    let m = running.metrics();
    let sub = m.stages.iter().find(|s| s.id == "sub").expect("sub");
    let direct = sub.values.get("direct").map(|d| d.last);
    assert_eq!(direct, Some(1.0), "delivered from the callback: {sub:?}");
    assert!(
        !sub.values.contains_key("dropped"),
        "nothing dropped: {sub:?}"
    );
    let edge = m
        .edges
        .iter()
        .find(|e| e.edge.starts_with("sub.out"))
        .expect("sub.out edge");
    assert!(
        edge.blocked > 0,
        "the stage's thread delivered held messages into the full edge: {edge:?}"
    );
    assert_eq!(edge.dropped_total, 0, "{edge:?}");
    running.stop();
}

#[test]
fn a_latest_publisher_sends_its_newest_message_to_a_subscriber_that_comes_late() {
    let port = free_port();
    let producer = format!(
        r#"
stages:
  - {{ id: src, kind: host_in, params: {{ type: text }} }}
  - {{ id: pub, kind: zenoh_pub, params: {{ key: t/late, policy: latest, express: true, listen: ["tcp/127.0.0.1:{port}"] }} }}
edges:
  - {{ from: src.out, to: pub.in }}
"#
    );
    let consumer = format!(
        r#"
stages:
  - {{ id: sub, kind: zenoh_sub, params: {{ key: t/late, type: text, connect: ["tcp/127.0.0.1:{port}"], listen: [] }} }}
  - {{ id: out, kind: host_out, params: {{ type: text }} }}
edges:
  - {{ from: sub.out, to: out.in }}
"#
    );
    let producing = Pipeline::from_yaml(&producer, &registry())
        .expect("valid")
        .start()
        .expect("start");
    // Published while nobody subscribes: zenoh routes them nowhere.
    for i in 0..5 {
        producing
            .push("src", Payload::text(format!("m{i}")))
            .expect("push");
    }
    let published = until(Duration::from_secs(10), || {
        let m = producing.metrics();
        let p = m.stages.iter().find(|s| s.id == "pub")?;
        (p.processed == 5).then_some(())
    });
    assert!(published.is_some(), "the publisher took all five");
    let consuming = Pipeline::from_yaml(&consumer, &registry())
        .expect("valid")
        .start()
        .expect("start");
    let first = consuming
        .pull("out", Duration::from_secs(10))
        .expect("pull")
        .expect("the newest message reaches the late subscriber");
    assert_eq!(
        first.payload.as_text(),
        Some("m4"),
        "the newest, not an older one"
    );
    // Once both are there, messages flow as usual and nothing comes twice.
    producing.push("src", Payload::text("m5")).expect("push");
    let next = consuming
        .pull("out", Duration::from_secs(10))
        .expect("pull")
        .expect("the next message");
    assert_eq!(next.payload.as_text(), Some("m5"));
    assert!(
        consuming
            .pull("out", Duration::from_millis(300))
            .ok()
            .flatten()
            .is_none(),
        "no duplicate"
    );
    consuming.stop();
    producing.stop();
}
