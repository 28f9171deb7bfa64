//! Record the robot loop (pipelines/robot-expert.yaml, the push simulator
//! on a thread of this process over zenoh on 127.0.0.1), then:
//!
//! 1. replay it with the simulator side and the policy stubbed by their
//!    recorded outputs and the controller running for real, at recorded
//!    speed, and compare its commands with the recorded ones step by step;
//! 2. replay the controller's logic (`ControllerCore`) deterministically:
//!    ticks at the recorded command times, chunks and observations at their
//!    recorded times, and compare again.
//!
//! Why (1) is not bit-identical by construction: the controller's period
//! comes from its own wall-clock metronome on its own thread, not from an
//! input, so a replayed chunk can land on the other side of a tick than it
//! did when recorded, and a chunk merges into the queue relative to the
//! step current when the controller dequeues it (a time the recording
//! does not hold: it records send times). (2) removes the first cause by
//! replaying the ticks; for the second, a chunk sent within the dequeue
//! latency before a tick may have been applied after it: where the
//! send-order replay disagrees with the recorded command, the other order
//! is tried and must agree (the test prints how often, and how close to the
//! tick those chunks were sent). With both, every command is bit-identical.

use edgeflow_control::core::ControllerCore;
use edgeflow_control::sim_link::{run_push_sim, SimOptions};
use edgeflow_control::wire::Body;
use edgeflow_graph::{EdgeTap, Message, Override, Params, Payload, Pipeline, Registry, Timestamp};
use edgeflow_record::{prepare, RecordOptions, Recorder, Recording, RunInfo, Speed};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn registry() -> Registry {
    let mut r = Registry::builtin();
    edgeflow_control::register(&mut r);
    r
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// (step, command bits) of every `Actions` message.
type Commands = BTreeMap<u64, Vec<u32>>;

fn bits(a: &[f32]) -> Vec<u32> {
    a.iter().map(|x| x.to_bits()).collect()
}

#[derive(Default)]
struct Commanded(Mutex<Commands>);

impl EdgeTap for Commanded {
    fn on_message(&self, edge: usize, msg: &Message, _at: Timestamp) {
        // Edge 5 of robot-expert.yaml: ctl.command -> cmd.in.
        if edge == 5 {
            if let Payload::Actions(a) = &msg.payload {
                self.0.lock().insert(a.start_step, bits(&a.actions));
            }
        }
    }
}

fn same(a: &Commands, b: &Commands) -> (usize, usize) {
    let both = a.keys().filter(|k| b.contains_key(k)).count();
    let equal = a.iter().filter(|(k, v)| b.get(k) == Some(v)).count();
    (equal, both)
}

#[test]
fn replaying_the_controller_over_a_recorded_robot_run() {
    let yaml_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/robot-expert.yaml");
    let text = std::fs::read_to_string(&yaml_path).expect("robot-expert.yaml");
    let port = free_port();
    let ep = format!("tcp/127.0.0.1:{port}");
    let sim = {
        let ep = ep.clone();
        std::thread::spawn(move || {
            let o = SimOptions {
                session: edgeflow_control::session::SessionConfig::peer(&[ep.as_str()], &[]),
                episodes: 1,
                seed: 7,
                config: edgeflow_sim::PushConfig {
                    episode_seconds: 4.0,
                    ..Default::default()
                },
                image_hz: 5.0,
                wait_for: Some("edgeflow/alive/cmd".into()),
                ..Default::default()
            };
            run_push_sim(&o, |_| {})
        })
    };
    let sets = vec![
        format!("state.connect={ep}"),
        format!("cmd.connect={ep}"),
        "ctl.rt_priority=0".to_string(),
    ];
    let overrides: Vec<Override> = sets.iter().map(|s| s.parse().expect("override")).collect();
    let reg = registry();
    let p = Pipeline::from_file(&yaml_path, &reg, &overrides).expect("valid");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("robot.mcap");
    let info = RunInfo {
        pipeline_text: text,
        file: Some(yaml_path.display().to_string()),
        overrides: sets,
    };
    let rec = Recorder::create(&path, p.plan(), info, RecordOptions::default()).expect("create");
    let running = p.start_with_tap(rec.tap()).expect("start");
    let episodes = sim.join().expect("sim thread").expect("sim ran");
    assert_eq!(episodes.len(), 1);
    running.stop();
    let _ = running.finish(Some(Duration::from_secs(10)));
    let stats = rec.finish().expect("finish");
    assert!(stats.warnings().is_empty(), "{stats:?}");

    let recording = Recording::open(&path).expect("open");
    let cmd_edge = recording
        .edges
        .iter()
        .position(|e| e.topic == "ctl.command->cmd.in")
        .expect("command edge");
    let mut recorded = Commands::new();
    for m in recording.messages.iter().filter(|m| m.edge == cmd_edge) {
        if let Body::Actions(a) = recording.decode(m).expect("decode").body {
            recorded.insert(a.start_step, bits(&a.actions));
        }
    }
    assert!(recorded.len() > 100, "{} commands recorded", recorded.len());

    // 1. The controller for real, everything around it replayed.
    let r = prepare(
        &recording,
        &reg,
        &["state".into(), "policy".into(), "cmd".into()],
        Speed::Factor(1.0),
        yaml_path.parent().expect("dir"),
    )
    .expect("prepare");
    let seen = Arc::new(Commanded::default());
    r.pipeline
        .start_with_tap(seen.clone())
        .expect("start the replay")
        .wait(Some(Duration::from_secs(30)))
        .expect("the replay ends by itself");
    let replayed = seen.0.lock().clone();
    let (equal, both) = same(&recorded, &replayed);
    eprintln!(
        "wall-clock replay: {equal} of {both} commands (by step) bit-identical; {} recorded, {} replayed",
        recorded.len(),
        replayed.len()
    );
    assert!(both > recorded.len() / 2, "the replay covered the run");

    // 2. The controller's logic with the recorded ticks.
    let core_cmds = replay_core(&recording, &recorded);
    let (equal, both) = same(&recorded, &core_cmds);
    eprintln!("tick replay: {equal} of {both} commands bit-identical");
    assert_eq!(both, recorded.len(), "every recorded tick replayed");
    assert_eq!(
        equal, both,
        "the controller's logic replays bit-identically"
    );
}

/// One controller input or tick, as recorded.
#[derive(Debug, Clone)]
enum Ev {
    Obs(u64),
    Chunk(u64, usize, Vec<f32>),
    Peer(bool),
    Tick(u64),
}

fn apply(core: &mut ControllerCore, t: u64, ev: Ev) {
    match ev {
        Ev::Obs(c) => core.on_observation(c),
        Ev::Chunk(s, d, v) => {
            let _ = core.on_chunk(s, d, &v, t);
        }
        Ev::Peer(lost) => core.set_peer_lost(lost, t),
        Ev::Tick(_) => {}
    }
}

/// Feed `ControllerCore` the recorded inputs of `ctl` and ticks at the
/// recorded command times.
fn replay_core(rec: &Recording, recorded: &Commands) -> Commands {
    let params: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&rec.params["ctl"]).expect("ctl params");
    let params = Params::new("ctl", params.into_iter().collect());
    let cfg = edgeflow_control::controller::parse_config(&params).expect("config");
    let period = cfg.core.period.as_nanos() as u64;
    let mut core = ControllerCore::new(cfg.core);
    let mut evs: Vec<(u64, u8, Ev)> = Vec::new();
    let mut first_cmd: Option<(u64, u64)> = None;
    for m in &rec.messages {
        let e = &rec.edges[m.edge];
        let body = rec.decode(m).expect("decode").body;
        match (e.name.to_stage.as_str(), e.name.to_port.as_str(), body) {
            ("ctl", "obs", _) => evs.push((m.log_time, 0, Ev::Obs(m.publish_time))),
            ("ctl", "actions", Body::Actions(a)) => {
                evs.push((m.log_time, 0, Ev::Chunk(a.start_step, a.dim, a.actions)))
            }
            ("ctl", "peer", Body::Event(edgeflow_graph::Event::Named(n, _))) => {
                evs.push((m.log_time, 0, Ev::Peer(n == "peer_lost")))
            }
            ("cmd", "in", Body::Actions(a)) => {
                // The command's timestamp is the tick's `now`.
                evs.push((m.publish_time, 1, Ev::Tick(a.start_step)));
                if first_cmd.is_none_or(|(s, _)| a.start_step < s) {
                    first_cmd = Some((a.start_step, m.publish_time));
                }
            }
            _ => {}
        }
    }
    // Ticks before the first command emitted nothing: one per period before it.
    if let Some((s0, t)) = first_cmd {
        for k in 0..s0 {
            let at = t.saturating_sub((s0 - k) * period);
            evs.push((at, 1, Ev::Tick(k)));
        }
    }
    evs.sort_by_key(|e| (e.0, e.1));
    let mut out = Commands::new();
    // The core before the first chunk since the last tick, and what came
    // after it: a chunk sent just before a tick may have been dequeued
    // just after it (the recording holds send times, not dequeue times).
    let mut snapshot: Option<(ControllerCore, Vec<(u64, Ev)>)> = None;
    let mut reordered = Vec::new();
    for (t, _, ev) in evs {
        match ev {
            Ev::Tick(step) => {
                while core.step() < step {
                    core.tick(t);
                }
                let mut tick = core.tick(t);
                let want = recorded.get(&tick.step);
                if !tick.command.is_empty() && want != Some(&bits(&tick.command)) {
                    if let Some((mut alt, since)) = snapshot.take() {
                        // The other order: the tick before the chunks.
                        let (chunks, others): (Vec<_>, Vec<_>) = since
                            .into_iter()
                            .partition(|(_, e)| matches!(e, Ev::Chunk(..)));
                        for (at, e) in others {
                            apply(&mut alt, at, e);
                        }
                        let alt_tick = alt.tick(t);
                        if want == Some(&bits(&alt_tick.command)) {
                            let first = chunks.first().map_or(t, |c| c.0);
                            reordered.push((alt_tick.step, (t - first) as f64 / 1e6));
                            for (at, e) in chunks {
                                apply(&mut alt, at, e);
                            }
                            core = alt;
                            tick = alt_tick;
                        }
                    }
                }
                snapshot = None;
                if !tick.command.is_empty() {
                    out.insert(tick.step, bits(&tick.command));
                }
            }
            ev => {
                if matches!(ev, Ev::Chunk(..)) && snapshot.is_none() {
                    snapshot = Some((core.clone(), Vec::new()));
                }
                if let Some((_, since)) = snapshot.as_mut() {
                    since.push((t, ev.clone()));
                }
                apply(&mut core, t, ev);
            }
        }
    }
    eprintln!(
        "tick replay: {} chunk(s) sent just before a tick were applied after it (step, ms before the tick): {reordered:?}",
        reordered.len()
    );
    out
}
