//! The benchmarks behind `edgeflow bench NAME`: each puts one part of
//! edgeflow next to a baseline measured in the same run, on the same
//! machine state, and reports the ratio.
//!
//! | bench | ours | baseline |
//! |---|---|---|
//! | `dataflow` | the graph engine: a 17-stage chain, 4 MB tensor hops | the same chain on raw crossbeam channels |
//! | `ops` | the tensor runtime's CPU kernels | raw candle calls on the same shapes; the memory bandwidth ceiling |
//! | `audio` | resampler, log-mel, denoiser; mic -> speaker latency | real time |
//! | `tts` | the Piper "joe" voice on our runtime | Piper on onnxruntime (peer venv) |
//! | `speech` | Silero VAD and Whisper tiny.en | onnxruntime and faster-whisper (peer venv) |
//! | `thinker` | a thinker's prefill and decode (SmolLM2-135M, or `--model`), decode's weight bandwidth | llama.cpp's `llama-bench` on the same GGUF (peer build); the read-bandwidth ceiling probed in the same run |
//! | `vision` | the DINOv2 ViT-S/14 encoder | onnxruntime on the same ONNX (peer venv) |
//! | `omni` | token2wav (DiT + BigVGAN) at the real configuration, HiFi-GAN universal | transformers / PyTorch on the CPU (peer venv) |
//!
//! Every bench returns one [`BenchReport`]: rows of label, our value, unit,
//! the baseline's value, the ratio and a note; [`BenchReport::render_text`]
//! prints it, [`BenchReport::render_markdown`] writes it for
//! `BENCHMARKS.md`. `edgeflow bench all --markdown` ([`all`]) runs them all
//! and writes the machine (CPU, the ISA extensions the kernels use, cores,
//! the measured memory bandwidth, the load average), the date and commit,
//! and every table with the command that reproduces it.
//!
//! ## Peer environments
//! The peers run from pinned environments outside git, under
//! `${XDG_CACHE_HOME:-~/.cache}/edgeflow/peers` (or `$EDGEFLOW_PEERS`),
//! created by `scripts/peer_envs.sh [piper|speech|llama.cpp]`:
//! `piper-venv` (piper-tts on onnxruntime), `speech-venv` (faster-whisper,
//! onnxruntime for Silero) and `llama.cpp/llama-bench`. A bench whose peer
//! is absent still measures our side and prints a row saying the baseline is
//! absent, with the command that creates it.
//!
//! ## Machine load
//! A bench reads the machine as it is: other processes running at the same
//! time slow both sides, not always alike. Ratios from one run are more
//! trustworthy than absolute figures; `BENCHMARKS.md` records the load
//! average at the start and end of its run.

pub(crate) mod all;
pub(crate) mod audio;
pub(crate) mod control;
pub(crate) mod dataflow;
pub(crate) mod omni;
pub(crate) mod ops;
mod report;
pub(crate) mod speech;
pub(crate) mod thinker;
pub(crate) mod tts;
pub(crate) mod vision;

pub(crate) use report::{BenchReport, MissingPeer, Row};

use std::path::{Path, PathBuf};

/// One benchmark, with its options.
pub(crate) trait Bench {
    /// Its name: `edgeflow bench NAME`.
    fn name(&self) -> &'static str;
    /// What it compares with what, in one line.
    fn compares(&self) -> &'static str;
    /// The options of this run as command-line flags (what follows
    /// `edgeflow bench NAME` to reproduce it).
    fn args(&self) -> Vec<String>;
    /// Measure. Progress goes to stderr; an absent peer is a row of the
    /// report, not an error.
    fn run(&self) -> anyhow::Result<BenchReport>;
}

/// The command that reproduces a bench run.
pub(crate) fn command(b: &dyn Bench) -> String {
    let mut c = format!("edgeflow bench {}", b.name());
    for a in b.args() {
        c.push(' ');
        if a.contains(|ch: char| ch.is_whitespace() || ch == '"' || ch == '\'') {
            c.push_str(&format!("'{}'", a.replace('\'', "'\\''")));
        } else {
            c.push_str(&a);
        }
    }
    c
}

/// The checkout this binary was built from (scripts, fixtures).
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where `scripts/peer_envs.sh` puts the peer environments:
/// `$EDGEFLOW_PEERS`, else `${XDG_CACHE_HOME:-$HOME/.cache}/edgeflow/peers`.
pub(crate) fn peers_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("EDGEFLOW_PEERS").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    cache_dir().join("edgeflow/peers")
}

fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
}

/// A peer environment: where the bench looks for it, and how to create it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// piper-tts on onnxruntime (`bench tts`).
    Piper,
    /// faster-whisper and onnxruntime (`bench speech`).
    Speech,
    /// llama.cpp's llama-bench (`bench thinker`).
    LlamaCpp,
    /// onnxruntime for the DINOv2 ONNX (`bench vision`).
    Vision,
    /// transformers and torch on the CPU (`bench omni`).
    Omni,
}

impl Peer {
    /// The argument of `scripts/peer_envs.sh` that creates it.
    pub(crate) fn script_arg(self) -> &'static str {
        match self {
            Peer::Piper => "piper",
            Peer::Speech => "speech",
            Peer::LlamaCpp => "llama.cpp",
            Peer::Vision => "vision",
            Peer::Omni => "omni",
        }
    }

    /// The executable the bench runs: the venv's python or llama-bench.
    /// `EDGEFLOW_PIPER_VENV` (a venv directory) overrides the Piper one.
    pub(crate) fn program(self) -> PathBuf {
        match self {
            Peer::Piper => {
                match std::env::var_os("EDGEFLOW_PIPER_VENV").filter(|v| !v.is_empty()) {
                    Some(v) => PathBuf::from(v).join("bin/python"),
                    None => peers_dir().join("piper-venv/bin/python"),
                }
            }
            Peer::Speech => peers_dir().join("speech-venv/bin/python"),
            Peer::LlamaCpp => peers_dir().join("llama.cpp/llama-bench"),
            Peer::Vision => peers_dir().join("vision-venv/bin/python"),
            Peer::Omni => peers_dir().join("omni-venv/bin/python"),
        }
    }

    /// The executable if it is there.
    pub(crate) fn find(self) -> Option<PathBuf> {
        let p = self.program();
        p.is_file().then_some(p)
    }

    /// The report entry for its absence.
    pub(crate) fn missing(self) -> MissingPeer {
        let what = match self {
            Peer::Piper => "the Piper onnxruntime venv",
            Peer::Speech => "the faster-whisper / onnxruntime venv",
            Peer::LlamaCpp => "the llama.cpp build",
            Peer::Vision => "the onnxruntime venv for DINOv2",
            Peer::Omni => "the torch / transformers venv",
        };
        MissingPeer {
            what: what.into(),
            looked_at: self.program().display().to_string(),
            create: format!("scripts/peer_envs.sh {}", self.script_arg()),
        }
    }
}

/// Waits (a minute at most) for the CPU backend's background move of
/// placed weights onto 2 MB pages, so that one-off copy does not share the
/// cores with the timed runs, as a long-running pipeline would see them;
/// says how long it took and whether the weights loaded on 4 KB pages
/// first ([`edgeflow_backends::HugePagePolicy`]), for the report.
pub(crate) fn settle_huge_pages() -> String {
    let t = std::time::Instant::now();
    let how = match edgeflow_backends::huge_page_policy() {
        edgeflow_backends::HugePagePolicy::AtAllocation => "",
        edgeflow_backends::HugePagePolicy::AfterLoad => {
            " (loaded on 4 KB pages: this host takes free 2 MB blocks back)"
        }
    };
    if edgeflow_backends::wait_for_huge_pages(std::time::Duration::from_secs(60)) {
        format!(
            "on 2 MB pages {:.2} s later{how}",
            t.elapsed().as_secs_f64()
        )
    } else {
        format!("still moving to 2 MB pages after 60 s (timed anyway){how}")
    }
}

/// Median (NaN for none).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One more call of `f` with every op of `dev` timed (the timing costs a
/// little, so benches time their runs without it): its top `top` ops by
/// time, rendered. Profiling is off again afterwards, even if `f` failed.
pub(crate) fn op_profile(
    dev: &edgeflow_runtime::Device,
    top: usize,
    f: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let stats = dev.stats();
    stats.profile_ops(true);
    let r = f();
    let rows = stats.op_profile();
    stats.profile_ops(false);
    r?;
    Ok(edgeflow_runtime::render_op_profile(&rows, top))
}

/// The median of rounds' ratios, and their spread as a note
/// (`rounds 0.91-1.04x`).
pub(crate) fn rounds_ratio(ratios: &[f64]) -> (f64, String) {
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(0.0, f64::max);
    (median(ratios.to_vec()), format!("rounds {lo:.2}-{hi:.2}x"))
}

/// This process's resident memory now and at its peak, MB (`VmRSS`,
/// `VmHWM` of `/proc/self/status`); `None` where there is no such file.
pub(crate) fn resident_mb() -> Option<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: f64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Threads of the CPU backend's pool (`RAYON_NUM_THREADS`, which `main`
/// pins, else every core).
pub(crate) fn pool_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_grows_with_what_the_process_touches() {
        let (before, _) = resident_mb().expect("/proc/self/status");
        let v = vec![1u8; 64 << 20];
        let (after, peak) = resident_mb().expect("again");
        assert!(
            after - before > 50.0,
            "{before} -> {after} MB after touching 64 MiB"
        );
        assert!(peak >= after);
        drop(v);
    }

    struct Demo;
    impl Bench for Demo {
        fn name(&self) -> &'static str {
            "demo"
        }
        fn compares(&self) -> &'static str {
            "nothing"
        }
        fn args(&self) -> Vec<String> {
            vec![
                "--text".into(),
                "it's two words".into(),
                "--runs".into(),
                "1".into(),
            ]
        }
        fn run(&self) -> anyhow::Result<BenchReport> {
            Ok(BenchReport::default())
        }
    }

    #[test]
    fn the_command_quotes_arguments_a_shell_would_split() {
        assert_eq!(
            command(&Demo),
            "edgeflow bench demo --text 'it'\\''s two words' --runs 1"
        );
    }

    #[test]
    fn an_absent_peer_names_the_script_that_creates_it() {
        let m = Peer::LlamaCpp.missing();
        assert_eq!(m.create, "scripts/peer_envs.sh llama.cpp");
        assert!(m.looked_at.ends_with("llama.cpp/llama-bench"), "{m:?}");
    }
}
