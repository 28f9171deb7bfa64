//! Helpers shared by the live voice tests (a PulseAudio server with the
//! null sink `vsink`, as `audio/tests/start-pulse.sh` starts it): whether
//! to run, the models they need, a second null sink for the agent's voice,
//! a recorder of a sink's monitor, and word overlap.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The models the voice loop runs (other cards, e.g. the 1.1 GB Qwen, need
/// not be fetched for it).
const USED: [&str; 4] = ["piper-joe", "qwen2.5-0.5b", "silero-vad", "whisper-tiny-en"];

/// True when the live tests should run; panics with instructions when they
/// should but cannot. `what` names the test in the skip line.
pub(crate) fn live(what: &str) -> bool {
    if std::env::var("EDGEFLOW_SKIP_LIVE_AUDIO").is_ok_and(|v| v == "1") {
        eprintln!("{what} test skipped: EDGEFLOW_SKIP_LIVE_AUDIO=1");
        return false;
    }
    let how = "start one with `export XDG_RUNTIME_DIR=$(mktemp -d); audio/tests/start-pulse.sh`, \
               or set EDGEFLOW_SKIP_LIVE_AUDIO=1 to skip the live audio tests";
    match Command::new("pactl").arg("info").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "no PulseAudio server is reachable (pactl info: {}); {how}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("cannot run pactl ({e}): install pulseaudio-utils; {how}"),
    }
    assert!(
        pactl(&["list", "short", "sinks"]).contains("vsink"),
        "the PulseAudio server has no sink `vsink`; {how}"
    );
    true
}

/// True when the voice loop's models are cached; panics naming them when
/// they are not, unless `EDGEFLOW_SKIP_MODEL_TESTS=1`.
pub(crate) fn models(what: &str) -> bool {
    if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("{what} test skipped: EDGEFLOW_SKIP_MODEL_TESTS=1");
        return false;
    }
    let missing: Vec<String> = edgeflow::model_cards()
        .iter()
        .filter(|c| USED.contains(&c.name))
        .filter_map(|c| c.locate().err().map(|e| format!("{}: {e}", c.name)))
        .collect();
    assert!(
        missing.is_empty(),
        "models missing (or set EDGEFLOW_SKIP_MODEL_TESTS=1):\n  {}",
        missing.join("\n  ")
    );
    true
}

/// Run `pactl`; its stdout.
pub(crate) fn pactl(args: &[&str]) -> String {
    let o = Command::new("pactl").args(args).output().expect("pactl");
    assert!(
        o.status.success(),
        "pactl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A second null sink for the agent's voice, the default for output
/// streams opened while it lives (`PULSE_SINK`, also inherited by the
/// processes started meanwhile): with one sink the loop would hear, and
/// be interrupted by, its own voice.
pub(crate) struct AgentSink {
    module: String,
}

impl AgentSink {
    /// Load a null sink named `name` (unloading one an aborted run left).
    pub(crate) fn load(name: &str) -> Self {
        for line in pactl(&["list", "short", "modules"]).lines() {
            if line.contains(&format!("sink_name={name}")) {
                if let Some(id) = line.split_whitespace().next() {
                    pactl(&["unload-module", id]);
                }
            }
        }
        let module = pactl(&[
            "load-module",
            "module-null-sink",
            &format!("sink_name={name}"),
            "rate=48000",
            "channels=2",
        ])
        .trim()
        .to_string();
        std::env::set_var("PULSE_SINK", name);
        AgentSink { module }
    }
}

impl Drop for AgentSink {
    fn drop(&mut self) {
        std::env::remove_var("PULSE_SINK");
        let _ = Command::new("pactl")
            .args(["unload-module", &self.module])
            .output();
    }
}

/// Sample rate of [`Recorder`].
pub(crate) const REC_RATE: usize = 16_000;

/// Records a sink's monitor (16 kHz mono) with `parec`.
pub(crate) struct Recorder {
    child: Child,
    data: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    /// Start recording `sink`'s monitor.
    pub(crate) fn start(sink: &str) -> Self {
        let mut child = Command::new("parec")
            .arg(format!("--device={sink}.monitor"))
            .args(["--format=s16le", "--rate=16000", "--channels=1"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("parec (pulseaudio-utils) must be installed");
        let mut out = child.stdout.take().expect("parec stdout");
        let data = Arc::new(Mutex::new(Vec::new()));
        let d = data.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                d.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Recorder {
            child,
            data,
            reader: Some(reader),
        }
    }

    /// What was recorded so far.
    pub(crate) fn samples(&self) -> Vec<f32> {
        let d = self.data.lock().unwrap();
        d.chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0)
            .collect()
    }

    /// Voiced seconds recorded so far ([`voiced_seconds`]).
    pub(crate) fn voiced(&self) -> f64 {
        voiced_seconds(&self.samples())
    }

    /// Stop; everything recorded.
    pub(crate) fn stop(mut self) -> Vec<f32> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.samples()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Seconds of `x` (16 kHz) in 50 ms windows louder than -34 dBFS RMS.
pub(crate) fn voiced_seconds(x: &[f32]) -> f64 {
    x.chunks(REC_RATE / 20)
        .filter(|c| {
            let e = c.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / c.len() as f64;
            e.sqrt() > 0.02
        })
        .count() as f64
        * 0.05
}

/// Lower-case words of `s`, letters and digits only.
pub(crate) fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
        .collect()
}

/// Share of the words of `said` found in `heard`.
pub(crate) fn overlap(said: &str, heard: &str) -> f64 {
    let h = words(heard);
    let s = words(said);
    s.iter().filter(|w| h.contains(w)).count() as f64 / s.len().max(1) as f64
}
