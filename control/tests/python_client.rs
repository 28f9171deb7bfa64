//! The Python robot client (examples/python/robot_client.py, PyPI
//! eclipse-zenoh from the pinned venv) against a pipeline over zenoh on
//! 127.0.0.1, as a separate process: it publishes observations, the
//! pipeline's controller sends commands back; and its death is reported.

mod common;

use common::{free_port, registry, repo, zenoh_python};
use edgeflow_graph::{ActionChunk, Event, Payload, Pipeline, Running};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pipeline(port: u16) -> Running {
    let yaml = format!(
        r#"
stages:
  - {{ id: obs, kind: zenoh_sub, params: {{ key: robot/obs, type: robot_state, dim: 4, watch: "edgeflow/alive/python_robot", listen: ["tcp/127.0.0.1:{port}"] }} }}
  - {{ id: seen, kind: host_out, params: {{ type: tensor }} }}
  - {{ id: peer, kind: host_out, params: {{ type: control }} }}
  - {{ id: chunks, kind: host_in, params: {{ type: actions }} }}
  - {{ id: ctl, kind: controller, params: {{ rate_hz: 50, horizon: 5, threshold: 0.5, rt_priority: 0, lock_memory: false, max_obs_age: 1s, grace: 500ms }} }}
  - {{ id: reqs, kind: host_out, params: {{ type: control }} }}
  - {{ id: cmd, kind: zenoh_pub, params: {{ key: robot/cmd, priority: real_time, express: true, policy: latest, listen: ["tcp/127.0.0.1:{port}"] }} }}
edges:
  - {{ from: obs.out, to: seen.in, policy: latest, capacity: 1 }}
  - {{ from: obs.out, to: ctl.obs, policy: latest, capacity: 1 }}
  - {{ from: obs.peer, to: peer.in }}
  - {{ from: chunks.out, to: ctl.actions }}
  - {{ from: ctl.request, to: reqs.in }}
  - {{ from: ctl.command, to: cmd.in, policy: latest, capacity: 4 }}
"#
    );
    Pipeline::from_yaml(&yaml, &registry())
        .expect("valid pipeline")
        .start()
        .expect("start")
}

fn client(port: u16, seconds: f64) -> std::process::Child {
    let py = zenoh_python();
    Command::new(py)
        .arg(repo().join("examples/python/robot_client.py"))
        .args([
            "--connect",
            &format!("tcp/127.0.0.1:{port}"),
            "--seconds",
            &seconds.to_string(),
            "--min-commands",
            "20",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the Python client")
}

#[test]
fn python_client_publishes_observations_and_reads_commands() {
    let port = free_port();
    let running = pipeline(port);
    let mut child = client(port, 4.0);
    // Play the policy: answer each chunk request with 5 actions that move
    // the point robot +0.01 in x per step from its observed position.
    let t_end = Instant::now() + Duration::from_secs(15);
    let mut last_obs: Option<Vec<f32>> = None;
    let mut chunks = 0;
    while Instant::now() < t_end {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        while let Some(m) = running
            .pull("seen", Duration::from_millis(0))
            .ok()
            .flatten()
        {
            if let Payload::Tensor(t) = &m.payload {
                last_obs = Some(t.to_vec_f32().expect("f32"));
            }
        }
        let Some(req) = running
            .pull("reqs", Duration::from_millis(5))
            .ok()
            .flatten()
        else {
            continue;
        };
        let (Some(Event::Named(name, v)), Some(obs)) = (req.payload.as_event(), &last_obs) else {
            continue;
        };
        assert_eq!(name, "chunk_request");
        let step = v["step"].as_u64().expect("step");
        let mut actions = Vec::new();
        for i in 0..5 {
            actions.extend([obs[0] + 0.01 * (i + 1) as f32, obs[1]]);
        }
        running
            .push(
                "chunks",
                Payload::Actions(Arc::new(ActionChunk {
                    start_step: step,
                    dt: Duration::from_millis(20),
                    dim: 2,
                    actions,
                })),
            )
            .expect("push");
        chunks += 1;
    }
    let out = child.wait_with_output().expect("client output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "robot_client.py failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let line = stdout.lines().last().expect("a summary line");
    let summary: serde_json::Value = serde_json::from_str(line).expect("JSON summary");
    eprintln!("python client: {summary}; {chunks} chunks sent");
    assert!(
        summary["commands"].as_u64().expect("commands") >= 20,
        "{summary}"
    );
    assert_eq!(summary["bad"], 0, "{summary}");
    // The robot followed the commands: x grew from 0.
    let x = summary["last_command"][0].as_f64().expect("last command");
    assert!(x > 0.05, "robot did not move: {summary}");
    running.stop();
}

#[test]
fn killed_python_robot_is_reported_lost_within_a_second() {
    let port = free_port();
    let running = pipeline(port);
    let mut child = client(port, 60.0);
    let name = |m: &edgeflow_graph::Message| match m.payload.as_event() {
        Some(Event::Named(n, _)) => n.clone(),
        _ => String::new(),
    };
    let t_end = Instant::now() + Duration::from_secs(20);
    let mut alive = false;
    while Instant::now() < t_end && !alive {
        if let Some(m) = running
            .pull("peer", Duration::from_millis(50))
            .ok()
            .flatten()
        {
            alive = name(&m) == "peer_alive";
        }
    }
    assert!(alive, "the Python robot's liveliness token never showed up");
    child.kill().expect("kill -9 the client");
    let t0 = Instant::now();
    let _ = child.wait();
    let mut lost = None;
    while t0.elapsed() < Duration::from_secs(5) {
        if let Some(m) = running
            .pull("peer", Duration::from_millis(10))
            .ok()
            .flatten()
        {
            if name(&m) == "peer_lost" {
                lost = Some(t0.elapsed());
                break;
            }
        }
    }
    let lost = lost.expect("peer_lost after the kill");
    assert!(
        lost < Duration::from_secs(1),
        "peer loss reported after {lost:?}"
    );
    running.stop();
}
