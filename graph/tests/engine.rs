//! Executor semantics: policies, backpressure, cancellation, shutdown.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use edgeflow_graph::{
    BuildEnv, Input, Message, ParamInfo, ParamType, Params, Payload, PipelineBuilder, Policy, Poll,
    PortSpec, PortType, Ports, Registry, Stage, StageCtx, StageError, StageFactory, StageInfo,
    StageResult,
};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Run `f` on a thread and fail the test (instead of hanging) after `secs`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("test hung: the pipeline did not finish in time")
}

// A test stage kind built from closures.
type Build = Arc<dyn Fn(&Params) -> Box<dyn Stage> + Send + Sync>;

struct Kind {
    name: &'static str,
    ports: Ports,
    build: Build,
}

impl StageFactory for Kind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: self.name,
            doc: "test stage",
            params: vec![ParamInfo::optional("n", ParamType::Int, "count")],
            ports: self.ports.clone(),
            source: self.ports.inputs.is_empty(),
        }
    }
    fn build(&self, p: &Params, _e: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Ok((self.build)(p))
    }
}

fn ports(inputs: &[&str], outputs: &[&str]) -> Ports {
    Ports {
        inputs: inputs
            .iter()
            .map(|n| PortSpec::new(n, PortType::Any, ""))
            .collect(),
        outputs: outputs
            .iter()
            .map(|n| PortSpec::new(n, PortType::Any, ""))
            .collect(),
    }
}

fn kind(
    r: &mut Registry,
    name: &'static str,
    inputs: &[&str],
    outputs: &[&str],
    build: impl Fn(&Params) -> Box<dyn Stage> + Send + Sync + 'static,
) {
    r.register(Kind {
        name,
        ports: ports(inputs, outputs),
        build: Arc::new(build),
    });
}

/// Emits integers 0..n as text, as fast as it can, once `gate` opens.
struct Counter {
    n: u64,
    i: u64,
    done: Arc<AtomicBool>,
}

impl Stage for Counter {
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        if self.i == self.n {
            self.done.store(true, Ordering::SeqCst);
            return Ok(Poll::Done);
        }
        ctx.emit(0, Payload::text(self.i.to_string()))?;
        self.i += 1;
        Ok(Poll::Continue)
    }
}

/// Collects what it receives; optionally waits in `start` until `gate` is set.
struct Collect {
    got: Arc<Mutex<Vec<String>>>,
    gate: Option<Arc<AtomicBool>>,
    delay: Duration,
}

impl Stage for Collect {
    fn start(&mut self, _ctx: &mut StageCtx) -> StageResult {
        if let Some(g) = &self.gate {
            while !g.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Let the producer's last push land.
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
    fn process(&mut self, input: Input, _ctx: &mut StageCtx) -> StageResult {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        if let Some(t) = input.msg.payload.as_text() {
            self.got.lock().unwrap().push(t.to_string());
        }
        Ok(())
    }
}

fn policy_run(
    policy: Policy,
    n: u64,
    cap: usize,
) -> (Vec<String>, edgeflow_graph::MetricsSnapshot) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut r = Registry::builtin();
    let d = done.clone();
    kind(&mut r, "count", &[], &["out"], move |p| {
        Box::new(Counter {
            n: p.get_or("n", 0).unwrap(),
            i: 0,
            done: d.clone(),
        })
    });
    let (g, gate) = (got.clone(), done.clone());
    let gated = policy != Policy::Block;
    kind(&mut r, "collect", &["in"], &[], move |_| {
        Box::new(Collect {
            got: g.clone(),
            gate: gated.then(|| gate.clone()),
            delay: Duration::ZERO,
        })
    });
    let p = PipelineBuilder::new("policy")
        .stage("src", "count", json!({ "n": n }))
        .stage("sink", "collect", json!({}))
        .edge_with("src.out", "sink.in", cap, policy)
        .build(&r)
        .unwrap();
    let m = within(30, move || p.run(None).unwrap());
    let got = got.lock().unwrap().clone();
    (got, m)
}

fn nums(v: &[String]) -> Vec<u64> {
    v.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn block_is_lossless_and_ordered() {
    let (got, m) = policy_run(Policy::Block, 5000, 4);
    assert_eq!(nums(&got), (0..5000).collect::<Vec<_>>());
    let e = &m.edges[0];
    assert_eq!(e.sent, 5000);
    assert_eq!(e.delivered, 5000);
    assert_eq!(e.dropped_total, 0);
    assert!(
        e.max_depth <= 4,
        "queue exceeded its capacity: {}",
        e.max_depth
    );
}

#[test]
fn drop_oldest_keeps_the_newest_capacity() {
    let (got, m) = policy_run(Policy::DropOldest, 100, 4);
    assert_eq!(nums(&got), vec![96, 97, 98, 99]);
    let e = &m.edges[0];
    assert_eq!(e.sent, 100);
    assert_eq!(e.sent, e.delivered + e.dropped["oldest"]);
    assert_eq!(e.dropped["oldest"], 96);
}

#[test]
fn drop_newest_keeps_the_first_capacity() {
    let (got, m) = policy_run(Policy::DropNewest, 100, 4);
    assert_eq!(nums(&got), vec![0, 1, 2, 3]);
    let e = &m.edges[0];
    assert_eq!(e.sent, e.delivered + e.dropped["newest"]);
    assert_eq!(e.dropped["newest"], 96);
}

#[test]
fn latest_delivers_only_the_newest() {
    let (got, m) = policy_run(Policy::Latest, 100, 4);
    assert_eq!(nums(&got), vec![99]);
    let e = &m.edges[0];
    assert_eq!(e.sent, e.delivered + e.dropped["latest"]);
    assert_eq!(e.dropped["latest"], 99);
}

#[test]
fn max_age_drops_stale_messages() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut r = Registry::builtin();
    let d = done.clone();
    kind(&mut r, "count", &[], &["out"], move |p| {
        Box::new(Counter {
            n: p.get_or("n", 0).unwrap(),
            i: 0,
            done: d.clone(),
        })
    });
    let (g, gate) = (got.clone(), done.clone());
    kind(&mut r, "collect", &["in"], &[], move |_| {
        Box::new(Collect {
            got: g.clone(),
            gate: Some(gate.clone()),
            delay: Duration::ZERO,
        })
    });
    let yaml = r#"
stages:
  - { id: src, kind: count, params: { n: 10 } }
  - { id: sink, kind: collect }
edges:
  - { from: src.out, to: sink.in, capacity: 16, max_age: 5ms }
"#;
    let p = edgeflow_graph::Pipeline::from_yaml(yaml, &r).unwrap();
    let m = within(30, move || p.run(None).unwrap());
    // The sink waited > 20 ms before reading: every message was too old.
    assert!(got.lock().unwrap().is_empty());
    assert_eq!(m.edges[0].dropped["age"], 10);
    assert_eq!(m.edges[0].sent, 10);
}

/// Bounded memory: a stalled sink stops the source, through every hop.
#[test]
fn backpressure_bounds_memory_with_a_stalled_sink() {
    let emitted = Arc::new(AtomicU64::new(0));
    let release = Arc::new(AtomicBool::new(false));
    let mut r = Registry::builtin();
    let e = emitted.clone();
    struct Endless(Arc<AtomicU64>);
    impl Stage for Endless {
        fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
            ctx.emit(0, Payload::Tokens(vec![0u32; 1024].into()))?;
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(Poll::Continue)
        }
    }
    kind(&mut r, "endless", &[], &["out"], move |_| {
        Box::new(Endless(e.clone()))
    });
    let rel = release.clone();
    struct Stalled(Arc<AtomicBool>);
    impl Stage for Stalled {
        fn process(&mut self, _i: Input, ctx: &mut StageCtx) -> StageResult {
            while !self.0.load(Ordering::SeqCst) {
                ctx.check()?;
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        }
    }
    kind(&mut r, "stalled", &["in"], &[], move |_| {
        Box::new(Stalled(rel.clone()))
    });
    let running = PipelineBuilder::new("bp")
        .stage("src", "endless", json!({}))
        .stage("a", "passthrough", json!({}))
        .stage("b", "passthrough", json!({}))
        .stage("sink", "stalled", json!({}))
        .edge_with("src.out", "a.in", 4, Policy::Block)
        .edge_with("a.out", "b.in", 4, Policy::Block)
        .edge_with("b.out", "sink.in", 4, Policy::Block)
        .build(&r)
        .unwrap()
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let first = emitted.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    let second = emitted.load(Ordering::SeqCst);
    // 3 queues of 4 + one message held by each of a, b, sink + one blocked push.
    assert!(second <= 3 * 4 + 3 + 1, "source kept producing: {second}");
    assert_eq!(first, second, "source was not stalled");
    let m = running.metrics();
    for e in &m.edges {
        assert!(e.depth <= 4 && e.max_depth <= 4, "{e:?}");
    }
    assert!(m.edges[0].blocked > 0);
    running.stop();
    release.store(true, Ordering::SeqCst);
    within(10, move || {
        let _ = running.wait(Some(Duration::from_secs(5)));
    });
}

/// Cancel an epoch across a chain: the long loop stops at its next step,
/// queued messages of that epoch are dropped, every stage resets and
/// acknowledges, and the next epoch flows untouched.
#[test]
fn cancel_is_acknowledged_across_a_chain() {
    let resets = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicBool::new(false));
    let mut r = Registry::builtin();
    struct LongLoop {
        resets: Arc<AtomicUsize>,
        started: Arc<AtomicBool>,
    }
    impl Stage for LongLoop {
        fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
            // A "decode loop": 10 s of steps unless cancelled.
            self.started.store(true, Ordering::SeqCst);
            for step in 0..10_000 {
                ctx.check()?;
                std::thread::sleep(Duration::from_millis(1));
                if step % 100 == 0 {
                    ctx.emit(0, input.msg.payload.clone())?;
                }
                if input.msg.payload.as_text() == Some("short") && step == 3 {
                    return ctx.emit(0, Payload::text("done"));
                }
            }
            Ok(())
        }
        fn reset(&mut self, _e: u64, _ctx: &mut StageCtx) -> StageResult {
            self.resets.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }
    let (rs, st) = (resets.clone(), started.clone());
    kind(&mut r, "long", &["in"], &["out"], move |_| {
        Box::new(LongLoop {
            resets: rs.clone(),
            started: st.clone(),
        })
    });
    let yaml = r#"
stages:
  - { id: in, kind: host_in, params: { type: text } }
  - { id: think, kind: long }
  - { id: a, kind: passthrough }
  - { id: b, kind: passthrough }
  - { id: out, kind: host_out }
edges:
  - { from: in.out, to: think.in }
  - { from: think.out, to: a.in }
  - { from: a.out, to: b.in }
  - { from: b.out, to: out.in }
"#;
    let running = edgeflow_graph::Pipeline::from_yaml(yaml, &r)
        .unwrap()
        .start()
        .unwrap();
    let e0 = running.current_epoch();
    running.push("in", Payload::text("long")).unwrap();
    running
        .push("in", Payload::text("queued-in-epoch-0"))
        .unwrap();
    while !started.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // First output of epoch 0 arrives.
    let first = running
        .pull("out", Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(first.epoch, e0);
    let t0 = Instant::now();
    let report = running.cancel(e0, Duration::from_secs(5)).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(report.acked, report.stages);
    assert_eq!(report.stages, 5, "every live stage acknowledges");
    assert!(report.ack_ms.is_some());
    assert_eq!(resets.load(Ordering::SeqCst), 1);
    // Nothing more from epoch 0; the next epoch is untouched.
    let e1 = running.new_epoch();
    assert_ne!(e0, e1);
    running.push("in", Payload::text("short")).unwrap();
    loop {
        let m = running
            .pull("out", Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!(
            m.epoch, e1,
            "a message of the cancelled epoch leaked: {m:?}"
        );
        if m.payload.as_text() == Some("done") {
            break;
        }
    }
    let metrics = running.metrics();
    assert_eq!(metrics.cancels.len(), 1);
    running.stop();
    within(10, move || {
        let _ = running.wait(Some(Duration::from_secs(5)));
    });
}

#[test]
fn a_panicking_stage_stops_the_pipeline_cleanly() {
    let mut r = Registry::builtin();
    struct Boom;
    impl Stage for Boom {
        fn process(&mut self, input: Input, _ctx: &mut StageCtx) -> StageResult {
            if input.msg.payload.as_text() == Some("3") {
                panic!("boom at 3");
            }
            Ok(())
        }
    }
    kind(&mut r, "boom", &["in"], &[], |_| Box::new(Boom));
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    kind(&mut r, "count", &[], &["out"], move |p| {
        Box::new(Counter {
            n: p.get_or("n", 0).unwrap(),
            i: 0,
            done: d.clone(),
        })
    });
    // An endless upstream too: it must be stopped, not left running.
    let p = PipelineBuilder::new("panic")
        .stage("tick", "timer", json!({ "rate_hz": 1000.0 }))
        .stage("ticks", "discard", json!({}))
        .stage("src", "count", json!({ "n": 1_000_000 }))
        .stage("mid", "passthrough", json!({}))
        .stage("boom", "boom", json!({}))
        .edge("tick.out", "ticks.in")
        .edge("src.out", "mid.in")
        .edge("mid.out", "boom.in")
        .build(&r)
        .unwrap();
    let err = within(20, move || p.run(None).unwrap_err());
    let s = err.to_string();
    assert!(
        s.contains("stage `boom` panicked") && s.contains("boom at 3"),
        "{s}"
    );
}

#[test]
fn a_failing_stage_is_named() {
    let mut r = Registry::builtin();
    struct Fail;
    impl Stage for Fail {
        fn process(&mut self, _input: Input, _ctx: &mut StageCtx) -> StageResult {
            Err(StageError::msg("model file vanished"))
        }
    }
    kind(&mut r, "fail", &["in"], &[], |_| Box::new(Fail));
    let p = PipelineBuilder::new("fail")
        .stage("t", "timer", json!({ "rate_hz": 100.0 }))
        .stage("f", "fail", json!({}))
        .edge("t.out", "f.in")
        .build(&r)
        .unwrap();
    let err = within(20, move || p.run(None).unwrap_err());
    assert_eq!(err.to_string(), "stage `f` failed: model file vanished");
}

/// An inline stage is started like a threaded one, before its first
/// message (on its producer's thread), and a failing start names the
/// inline stage, not its producer.
#[test]
fn inline_stages_are_started_and_their_failures_named() {
    struct Loaded {
        ready: bool,
        fail: bool,
    }
    impl Stage for Loaded {
        fn start(&mut self, _ctx: &mut StageCtx) -> StageResult {
            if self.fail {
                return Err(StageError::msg("weights missing"));
            }
            self.ready = true;
            Ok(())
        }
        fn process(&mut self, _input: Input, _ctx: &mut StageCtx) -> StageResult {
            if !self.ready {
                return Err(StageError::msg("a message before start"));
            }
            Ok(())
        }
    }
    let mut r = Registry::builtin();
    kind(&mut r, "loaded", &["in"], &[], |_| {
        Box::new(Loaded {
            ready: false,
            fail: false,
        })
    });
    kind(&mut r, "unloadable", &["in"], &[], |_| {
        Box::new(Loaded {
            ready: false,
            fail: true,
        })
    });
    let yaml = |kind: &str| {
        format!(
            r#"
stages:
  - {{ id: t, kind: text, params: {{ whole: false, text: "a\nb\nc" }} }}
  - {{ id: p, kind: passthrough }}
  - {{ id: l, kind: {kind}, inline: true }}
edges:
  - {{ from: t.out, to: p.in }}
  - {{ from: p.out, to: l.in }}
"#
        )
    };
    let p = edgeflow_graph::Pipeline::from_yaml(&yaml("loaded"), &r).unwrap();
    let m = within(20, move || p.run(None).unwrap());
    let l = m.stages.iter().find(|s| s.id == "l").unwrap();
    assert_eq!(l.processed, 3, "{m:?}");
    let p = edgeflow_graph::Pipeline::from_yaml(&yaml("unloadable"), &r).unwrap();
    let err = within(20, move || p.run(None).unwrap_err());
    assert_eq!(err.to_string(), "stage `l` failed: weights missing");
}

#[test]
fn finite_pipeline_ends_by_end_of_stream() {
    let p = PipelineBuilder::new("eos")
        // A text source, not a timer: a loaded machine makes timers skip ticks.
        .stage("t", "text", json!({ "whole": false, "text": (1..=25).map(|i| i.to_string()).collect::<Vec<_>>().join("\n") }))
        .stage("a", "passthrough", json!({}))
        .stage("b", "discard", json!({}))
        .edge("t.out", "a.in")
        .edge("a.out", "b.in")
        .build(&Registry::builtin())
        .unwrap();
    let m = within(20, move || p.run(None).unwrap());
    assert_eq!(m.stages[2].processed, 25);
    assert_eq!(m.edges[1].delivered, 25);
}

#[test]
fn timeout_stops_an_endless_pipeline() {
    let p = PipelineBuilder::new("endless")
        .stage("t", "timer", json!({ "rate_hz": 100.0 }))
        .stage("b", "discard", json!({}))
        .edge("t.out", "b.in")
        .build(&Registry::builtin())
        .unwrap();
    let err = within(20, move || {
        p.run(Some(Duration::from_millis(200))).unwrap_err()
    });
    assert!(matches!(err, edgeflow_graph::Error::Timeout(_)), "{err}");
}

#[test]
fn inline_stage_runs_on_the_producer_thread() {
    let mut r = Registry::builtin();
    let names = Arc::new(Mutex::new(Vec::<String>::new()));
    struct Where(Arc<Mutex<Vec<String>>>);
    impl Stage for Where {
        fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
            let n = std::thread::current().name().unwrap_or("").to_string();
            self.0.lock().unwrap().push(n);
            ctx.emit_msg(0, input.msg)
        }
    }
    let n2 = names.clone();
    kind(&mut r, "where", &["in"], &["out"], move |_| {
        Box::new(Where(n2.clone()))
    });
    let p = PipelineBuilder::new("inline")
        .stage(
            "t",
            "text",
            json!({ "whole": false, "text": "a\nb\nc\nd\ne" }),
        )
        .stage("w", "where", json!({}))
        .inline()
        .stage("sink", "discard", json!({}))
        .edge("t.out", "w.in")
        .edge("w.out", "sink.in")
        .build(&r)
        .unwrap();
    let m = within(20, move || p.run(None).unwrap());
    let names = names.lock().unwrap();
    assert_eq!(names.len(), 5);
    assert!(names.iter().all(|n| n == "ef-t"), "{names:?}");
    assert_eq!(m.stages[2].processed, 5);
}

/// An inline stage fed only by a back edge (as a split pipeline's sender
/// for a feedback edge is) still gets its producer's messages: it used to
/// be resolved after its producer, whose output then led into the inline
/// stage's unserved queue and every message was dropped there.
#[test]
fn an_inline_stage_behind_a_back_edge_receives_its_messages() {
    let yaml = r#"
stages:
  - { id: in, kind: host_in, params: { type: text } }
  - { id: p, kind: passthrough }
  - { id: w, kind: passthrough, inline: true }
  - { id: out, kind: host_out }
edges:
  - { from: in.out, to: p.in }
  - { from: p.out, to: w.in, back_edge: true, policy: latest, capacity: 1 }
  - { from: w.out, to: out.in }
"#;
    let running = edgeflow_graph::Pipeline::from_yaml(yaml, &Registry::builtin())
        .unwrap()
        .start()
        .unwrap();
    for i in 0..3 {
        running.push("in", Payload::text(format!("m{i}"))).unwrap();
        let m = running
            .pull("out", Duration::from_secs(5))
            .expect("the message crossed the inline stage")
            .unwrap();
        assert_eq!(m.payload.as_text(), Some(format!("m{i}").as_str()));
    }
    let m = running.metrics();
    let w = m.stages.iter().find(|s| s.id == "w").unwrap();
    assert_eq!(w.processed, 3, "run inline: {m:?}");
    running.stop();
    within(10, move || {
        let _ = running.wait(Some(Duration::from_secs(5)));
    });
}

#[test]
fn tensors_are_shared_not_copied() {
    let t = edgeflow_runtime::Tensor::from_vec(vec![1.0f32; 1 << 20], &[1 << 20]).unwrap();
    let yaml = r#"
stages:
  - { id: in, kind: host_in, params: { type: tensor } }
  - { id: a, kind: passthrough }
  - { id: b, kind: passthrough }
  - { id: out, kind: host_out }
edges:
  - { from: in.out, to: a.in }
  - { from: a.out, to: b.in }
  - { from: b.out, to: out.in }
"#;
    let running = edgeflow_graph::Pipeline::from_yaml(yaml, &Registry::builtin())
        .unwrap()
        .start()
        .unwrap();
    running.push("in", Payload::Tensor(t.clone())).unwrap();
    let m: Message = running
        .pull("out", Duration::from_secs(5))
        .unwrap()
        .unwrap();
    let Payload::Tensor(back) = m.payload else {
        panic!("not a tensor")
    };
    // candle tensors share one allocation (and id) when cloned.
    assert_eq!(
        back.as_candle().unwrap().id(),
        t.as_candle().unwrap().id(),
        "the tensor was copied on the way"
    );
}

#[test]
fn cancel_resets_inline_stages_and_completes() {
    let resets = Arc::new(AtomicUsize::new(0));
    let mut r = Registry::builtin();
    struct Counted(Arc<AtomicUsize>);
    impl Stage for Counted {
        fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
            ctx.emit_msg(0, input.msg)
        }
        fn reset(&mut self, _e: u64, _ctx: &mut StageCtx) -> StageResult {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }
    let r2 = resets.clone();
    kind(&mut r, "counted", &["in"], &["out"], move |_| {
        Box::new(Counted(r2.clone()))
    });
    let running = PipelineBuilder::new("inline-cancel")
        .stage("in", "host_in", json!({}))
        .stage("a", "counted", json!({}))
        .inline()
        .stage("b", "counted", json!({}))
        .inline()
        .stage("out", "host_out", json!({}))
        .edge("in.out", "a.in")
        .edge("a.out", "b.in")
        .edge("b.out", "out.in")
        .build(&r)
        .unwrap()
        .start()
        .unwrap();
    running.push("in", Payload::text("x")).unwrap();
    assert!(running
        .pull("out", Duration::from_secs(5))
        .unwrap()
        .is_some());
    let rep = running
        .cancel(running.current_epoch(), Duration::from_secs(5))
        .unwrap();
    assert_eq!(rep.acked, rep.stages);
    assert_eq!(resets.load(Ordering::SeqCst), 2, "both inline stages reset");
    running.stop();
    within(10, move || {
        let _ = running.wait(Some(Duration::from_secs(5)));
    });
}

/// A timer blocked by a slow consumer falls behind: it skips the ticks it
/// slept through and counts them as deadline misses instead of bunching up.
#[test]
fn timer_counts_deadline_misses_under_backpressure() {
    let mut r = Registry::builtin();
    struct Slow;
    impl Stage for Slow {
        fn process(&mut self, _i: Input, _ctx: &mut StageCtx) -> StageResult {
            std::thread::sleep(Duration::from_millis(10));
            Ok(())
        }
    }
    kind(&mut r, "slow", &["in"], &[], |_| Box::new(Slow));
    let p = PipelineBuilder::new("late")
        .stage("t", "timer", json!({ "rate_hz": 1000.0, "count": 200 }))
        .stage("s", "slow", json!({}))
        .edge_with("t.out", "s.in", 1, Policy::Block)
        .build(&r)
        .unwrap();
    let m = within(30, move || p.run(None).unwrap());
    let timer = &m.stages[0];
    let sink = &m.stages[1];
    // Every tick index up to 200 was either delivered or counted as missed.
    assert!(timer.deadline_misses > 0, "{timer:?}");
    assert!(
        sink.processed < 200,
        "ticks were bunched up instead of skipped"
    );
    assert!(sink.processed + timer.deadline_misses >= 200);
    // The consumer saw ticks whose deadline had already passed.
    assert!(sink.deadline_misses > 0);
}

#[test]
fn sentence_chunker_can_start_a_turn_with_its_first_clause() {
    let yaml = r#"
stages:
  - { id: in, kind: host_in, params: { type: text } }
  - { id: ctl, kind: host_in, params: { type: control } }
  - { id: chunk, kind: sentence_chunker, params: { min_chars: 8, first_clause_chars: 12 } }
  - { id: out, kind: host_out, params: { type: text } }
edges:
  - { from: in.out, to: chunk.in }
  - { from: ctl.out, to: chunk.flush }
  - { from: chunk.out, to: out.in }
"#;
    let running = edgeflow_graph::Pipeline::from_yaml(yaml, &Registry::builtin())
        .unwrap()
        .start()
        .unwrap();
    let pull = |running: &edgeflow_graph::Running| {
        let m = running
            .pull("out", Duration::from_secs(5))
            .unwrap()
            .unwrap();
        m.payload.as_text().unwrap().to_string()
    };
    // "Yes, it" is too short to be cut at its comma; the first clause that
    // is long enough goes out before its sentence ends; later clauses wait
    // for whole sentences.
    for p in [
        "Yes, the capital",
        " of Italy",
        ", it's Rome",
        ", a city",
        " of art. More",
        " text.",
    ] {
        running.push("in", Payload::text(p)).unwrap();
    }
    assert_eq!(pull(&running), "Yes, the capital of Italy,");
    assert_eq!(pull(&running), "it's Rome, a city of art.");
    // The end of the turn: the next turn may start with a clause again.
    running
        .push("ctl", Payload::event(edgeflow_graph::Event::Flush))
        .unwrap();
    assert_eq!(pull(&running), "More text.");
    for p in ["Paris is the capital", ", and also", " the largest city. "] {
        running.push("in", Payload::text(p)).unwrap();
    }
    assert_eq!(pull(&running), "Paris is the capital,");
    assert_eq!(pull(&running), "and also the largest city.");
    running.stop();
    within(10, move || {
        let _ = running.wait(Some(Duration::from_secs(5)));
    });
}

#[test]
fn sentence_chunker_cuts_streamed_text_into_sentences() {
    let yaml = r#"
stages:
  - { id: in, kind: host_in, params: { type: text } }
  - { id: ctl, kind: host_in, params: { type: control } }
  - { id: chunk, kind: sentence_chunker, params: { min_chars: 8, max_chars: 60 } }
  - { id: out, kind: host_out, params: { type: text } }
edges:
  - { from: in.out, to: chunk.in }
  - { from: ctl.out, to: chunk.flush }
  - { from: chunk.out, to: out.in }
"#;
    let running = edgeflow_graph::Pipeline::from_yaml(yaml, &Registry::builtin())
        .unwrap()
        .start()
        .unwrap();
    let pieces = [
        "Hello",
        " there",
        ". Dr",
        ". Smith is",
        " here at 3.5",
        " pm! Ok.",
        " Is it",
        " raining",
        "? A very long clause without any full stop that keeps going and going",
    ];
    for p in pieces {
        running.push("in", Payload::text(p)).unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..3 {
        let m = running
            .pull("out", Duration::from_secs(5))
            .unwrap()
            .unwrap();
        got.push(m.payload.as_text().unwrap().to_string());
    }
    // "Ok." is shorter than min_chars and joins the next sentence.
    assert_eq!(
        got,
        [
            "Hello there.",
            "Dr. Smith is here at 3.5 pm!",
            "Ok. Is it raining?",
        ]
    );
    // The over-long clause is split at a space once it passes max_chars.
    let m = running
        .pull("out", Duration::from_secs(5))
        .unwrap()
        .unwrap();
    let long = m.payload.as_text().unwrap().to_string();
    assert!(
        long.starts_with("A very long clause") && long.chars().count() <= 60,
        "{long}"
    );
    // Flush emits the rest.
    running
        .push("ctl", Payload::event(edgeflow_graph::Event::Flush))
        .unwrap();
    let m = running
        .pull("out", Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert!(m.payload.as_text().unwrap().ends_with("going"), "{m:?}");
    running.stop();
    within(10, move || {
        let _ = running.wait(Some(Duration::from_secs(5)));
    });
}

/// A feedback loop ends when its forward inputs end: a back edge does not
/// keep its consumer alive.
#[test]
fn a_loop_with_a_back_edge_ends_at_end_of_stream() {
    let mut r = Registry::builtin();
    struct Merge;
    impl Stage for Merge {
        fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
            // Forward input 0 goes on; feedback (input 1) is consumed.
            if input.port == 0 {
                ctx.emit_msg(0, input.msg)?;
            }
            Ok(())
        }
    }
    struct Tee;
    impl Stage for Tee {
        fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
            ctx.emit_msg(1, input.msg.clone())?;
            ctx.emit_msg(0, input.msg)
        }
    }
    kind(&mut r, "merge", &["in", "feedback"], &["out"], |_| {
        Box::new(Merge)
    });
    kind(&mut r, "tee", &["in"], &["out", "back"], |_| Box::new(Tee));
    let yaml = r#"
stages:
  - { id: src, kind: text, params: { whole: false, text: "a\nb\nc" } }
  - { id: m, kind: merge }
  - { id: t, kind: tee }
  - { id: sink, kind: discard }
edges:
  - { from: src.out, to: m.in }
  - { from: m.out, to: t.in }
  - { from: t.out, to: sink.in }
  - { from: t.back, to: m.feedback, back_edge: true }
"#;
    let p = edgeflow_graph::Pipeline::from_yaml(yaml, &r).unwrap();
    let m = within(20, move || p.run(None).unwrap());
    assert_eq!(m.stages[3].processed, 3);
}

/// A source whose send is refused because its epoch was just cancelled
/// (a cancel racing a host's push) keeps running: the next epoch's
/// messages still flow, and the source ends only when it says so.
#[test]
fn a_source_refused_by_a_cancel_goes_on_to_the_next_epoch() {
    struct CancelThenEmit {
        first: Option<edgeflow_graph::Epoch>,
    }
    impl Stage for CancelThenEmit {
        fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
            match self.first {
                None => {
                    let e = ctx.epoch();
                    self.first = Some(e);
                    ctx.cancel_epoch(e);
                    // Refused: `Err(Cancelled)` leaves poll.
                    ctx.emit(0, Payload::text("cancelled"))?;
                    Ok(Poll::Continue)
                }
                Some(e) if ctx.current_epoch() > e => {
                    ctx.emit(0, Payload::text("after"))?;
                    Ok(Poll::Done)
                }
                Some(_) => {
                    std::thread::sleep(Duration::from_millis(5));
                    Ok(Poll::Idle)
                }
            }
        }
    }
    let mut r = Registry::builtin();
    kind(&mut r, "cancel_then_emit", &[], &["out"], |_| {
        Box::new(CancelThenEmit { first: None })
    });
    let yaml = r#"
stages:
  - { id: src, kind: cancel_then_emit }
  - { id: out, kind: host_out }
edges:
  - { from: src.out, to: out.in }
"#;
    let running = edgeflow_graph::Pipeline::from_yaml(yaml, &r)
        .unwrap()
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let e2 = running.new_epoch();
    let m = running
        .pull("out", Duration::from_secs(10))
        .unwrap()
        .expect("the source outlived the refused send");
    assert_eq!(m.payload.as_text(), Some("after"));
    assert_eq!(m.epoch, e2);
    running.stop();
}
