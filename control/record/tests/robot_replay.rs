//! Record the robot loop (pipelines/robot-expert.yaml, the push simulator
//! on a thread of this process over zenoh on 127.0.0.1), then replay it
//! with the simulator side, the policy and the command sink stubbed by
//! their recorded outputs:
//!
//! 1. the controller rerun from its journal (what `edgeflow replay` does by
//!    default): every command bit-identical to the recorded one, at
//!    recorded speed and as fast as possible;
//! 2. the same journal through the library (`edgeflow_control::journal`):
//!    the same commands;
//! 3. the controller live on its own clock (`--live ctl`): it runs and
//!    commands most steps, but is not bit-identical by construction (its
//!    metronome, not an input, sets the ticks, and a chunk can land on the
//!    other side of a tick than it did), which is why the journal exists.

use edgeflow_control::journal::Entry;
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

    let journal = recording
        .journals
        .get("ctl")
        .expect("the controller journaled");
    assert!(journal.len() > recorded.len(), "{} entries", journal.len());
    let summary = edgeflow_record::Summary::of(&recording);
    assert_eq!(summary.journals.get("ctl"), Some(&(journal.len() as u64)));
    assert!(
        summary.render().contains("journal    `ctl`"),
        "{}",
        summary.render()
    );
    let stubs = ["state".to_string(), "policy".into(), "cmd".into()];
    let dir_of = yaml_path.parent().expect("dir");

    // 1. From the journal, at recorded speed and as fast as possible.
    for speed in [Speed::Factor(1.0), Speed::Max] {
        let r = prepare(&recording, &reg, &stubs, &[], speed, dir_of).expect("prepare");
        assert_eq!(r.journaled, [("ctl".to_string(), journal.len())]);
        let seen = Arc::new(Commanded::default());
        r.pipeline
            .start_with_tap(seen.clone())
            .expect("start the replay")
            .wait(Some(Duration::from_secs(30)))
            .expect("the replay ends by itself");
        let replayed = seen.0.lock().clone();
        let (equal, both) = same(&recorded, &replayed);
        eprintln!(
            "journal replay at {speed:?}: {equal} of {} recorded commands bit-identical ({} replayed)",
            recorded.len(),
            replayed.len()
        );
        assert_eq!(replayed.len(), recorded.len(), "{speed:?}");
        assert_eq!(both, recorded.len(), "{speed:?}");
        assert_eq!(equal, both, "{speed:?}: every command bit-identical");
    }

    // 2. The journal through the library.
    let params: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&recording.params["ctl"]).expect("ctl params");
    let params = Params::new("ctl", params.into_iter().collect());
    let cfg = edgeflow_control::controller::parse_config(&params).expect("config");
    let entries: Vec<Entry> = journal
        .iter()
        .map(|j| Entry::decode(&j.data).expect("entry"))
        .collect();
    let ticks = edgeflow_control::journal::replay(cfg.core, &entries);
    let lib: Commands = ticks
        .iter()
        .filter(|t| !t.command.is_empty())
        .map(|t| (t.step, bits(&t.command)))
        .collect();
    assert_eq!(
        lib, recorded,
        "the library replay gives the recorded commands"
    );

    // 3. The controller live, on its own clock.
    let r = prepare(
        &recording,
        &reg,
        &stubs,
        &["ctl".to_string()],
        Speed::Factor(1.0),
        dir_of,
    )
    .expect("prepare");
    assert!(r.journaled.is_empty());
    let seen = Arc::new(Commanded::default());
    r.pipeline
        .start_with_tap(seen.clone())
        .expect("start the replay")
        .wait(Some(Duration::from_secs(30)))
        .expect("the replay ends by itself");
    let replayed = seen.0.lock().clone();
    let (equal, both) = same(&recorded, &replayed);
    eprintln!(
        "live replay: {equal} of {both} commands (by step) bit-identical; {} recorded, {} replayed",
        recorded.len(),
        replayed.len()
    );
    assert!(both > recorded.len() / 2, "the live replay covered the run");
}
