//! `edgeflow bench all [--markdown [--out BENCHMARKS.md]] [--quick]`: every
//! bench in one run, and the machine it ran on.
//!
//! A bench that fails (a model not fetched, a peer that crashed) becomes a
//! "not measured" section with the error; an absent peer environment is a
//! row saying so with the command that creates it. Neither stops the run.

use super::audio::AudioArgs;
use super::control::ControlArgs;
use super::dataflow::DataflowArgs;
use super::omni::OmniArgs;
use super::ops::OpsArgs;
use super::speech::SpeechArgs;
use super::thinker::ThinkerArgs;
use super::tts::TtsArgs;
use super::vision::VisionArgs;
use super::{command, pool_threads, repo_root, Bench, BenchReport, MissingPeer};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

/// The benches `bench all` runs, in order (ops first: its bandwidth probe
/// goes in the machine section).
pub(crate) const NAMES: [&str; 9] = [
    "ops", "dataflow", "audio", "speech", "tts", "thinker", "control", "vision", "omni",
];

/// Options of `edgeflow bench all`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct AllArgs {
    /// Write every report as Markdown to --out (the text tables still go
    /// to stdout).
    #[arg(long)]
    pub markdown: bool,
    /// Where --markdown writes.
    #[arg(long, default_value = "BENCHMARKS.md")]
    pub out: PathBuf,
    /// Short run counts (fewer repetitions, shorter minimum times), so the
    /// whole run takes a few minutes; noisier figures.
    #[arg(long)]
    pub quick: bool,
    /// Run only these benches (comma-separated: ops, dataflow, audio,
    /// speech, tts, thinker, control, vision, omni).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// The benches with their options: the defaults, or short runs for `--quick`.
pub(crate) fn benches(quick: bool) -> Vec<Box<dyn Bench>> {
    // Both TTS engines get the threads the CPU backend's pool has (main
    // pinned it before any bench ran).
    let threads = pool_threads();
    if !quick {
        return vec![
            Box::new(OpsArgs::default()),
            Box::new(DataflowArgs::default()),
            Box::new(AudioArgs::default()),
            Box::new(SpeechArgs::default()),
            Box::new(TtsArgs {
                threads,
                ..TtsArgs::default()
            }),
            Box::new(ThinkerArgs::default()),
            Box::new(ControlArgs::default()),
            Box::new(VisionArgs::default()),
            Box::new(OmniArgs::default()),
        ];
    }
    vec![
        Box::new(OpsArgs {
            min_time_ms: 100,
            ..OpsArgs::default()
        }),
        Box::new(DataflowArgs {
            latency_msgs: 500,
            throughput_msgs: 20_000,
            ..DataflowArgs::default()
        }),
        Box::new(AudioArgs { live_seconds: 2.0 }),
        Box::new(SpeechArgs {
            repeats: 1,
            ..SpeechArgs::default()
        }),
        Box::new(TtsArgs {
            threads,
            runs: 1,
            ..TtsArgs::default()
        }),
        Box::new(ThinkerArgs {
            runs: 1,
            ..ThinkerArgs::default()
        }),
        Box::new(ControlArgs {
            seconds: 5.0,
            round_trips: 500,
            ..ControlArgs::default()
        }),
        Box::new(VisionArgs {
            sizes: vec![112],
            runs: 3,
            ..VisionArgs::default()
        }),
        Box::new(OmniArgs {
            codes: 24,
            runs: 1,
            ..OmniArgs::default()
        }),
    ]
}

/// One bench's outcome.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// `edgeflow bench NAME`.
    pub name: String,
    /// What it compares.
    pub compares: String,
    /// The command that reproduces it.
    pub command: String,
    /// The report, or why there is none.
    pub report: Result<BenchReport, String>,
    /// Wall-clock seconds it took.
    pub seconds: f64,
}

/// The machine a run measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Machine {
    /// CPU model name.
    pub cpu: String,
    /// ISA extensions the kernels use that this CPU has.
    pub isa: Vec<&'static str>,
    /// Logical CPUs.
    pub logical_cpus: usize,
    /// Threads of the CPU backend's pool.
    pub pool_threads: usize,
    /// 1-, 5- and 15-minute load averages at the start and at the end.
    pub load_start: String,
    /// See above.
    pub load_end: String,
    /// UTC date and time of the start.
    pub date: String,
    /// `git describe`-like commit of the checkout, if git knows it.
    pub commit: Option<String>,
}

impl Machine {
    /// Read what the OS says (the end load average is filled in later).
    pub(crate) fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        let flags: Vec<String> = field("flags")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        Machine {
            cpu: field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_string()),
            isa: isa_extensions(&flags),
            logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            pool_threads: pool_threads(),
            load_start: load_average(),
            load_end: String::new(),
            date: utc_now(),
            commit: git_commit(),
        }
    }
}

/// The ISA extensions our kernels dispatch on, of the CPU flags given
/// (`/proc/cpuinfo` names).
pub(crate) fn isa_extensions(flags: &[String]) -> Vec<&'static str> {
    let has = |f: &str| flags.iter().any(|x| x == f);
    let mut v = Vec::new();
    for (flag, name) in [
        ("avx2", "AVX2"),
        ("fma", "FMA"),
        ("f16c", "F16C"),
        ("avx512f", "AVX-512F"),
        ("avx512bw", "AVX-512BW"),
        ("avx512_vnni", "AVX-512 VNNI"),
        ("avx_vnni", "AVX-VNNI"),
        ("amx_tile", "AMX-TILE"),
        ("amx_int8", "AMX-INT8"),
        ("amx_bf16", "AMX-BF16"),
        ("asimd", "NEON"),
    ] {
        if has(flag) {
            v.push(name);
        }
    }
    v
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

fn git_commit() -> Option<String> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(repo_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"])?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{head} (with uncommitted changes)")
    } else {
        head
    })
}

/// Now as `YYYY-MM-DD HH:MM UTC`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_date(secs)
}

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM UTC` (the proleptic
/// Gregorian calendar; Howard Hinnant's days-to-civil).
fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02} UTC")
}

/// Run the benches (all, or `only`), printing each text table as it
/// finishes.
pub(crate) fn run_all(
    benches: Vec<Box<dyn Bench>>,
    only: &[String],
) -> anyhow::Result<Vec<Outcome>> {
    if let Some(n) = only.iter().find(|n| !NAMES.contains(&n.as_str())) {
        anyhow::bail!(
            "--only: unknown bench `{n}`; choose from {}",
            NAMES.join(", ")
        );
    }
    let mut out = Vec::new();
    for b in benches
        .iter()
        .filter(|b| only.is_empty() || only.iter().any(|n| n == b.name()))
    {
        eprintln!("== {}", command(b.as_ref()));
        let t = Instant::now();
        let report = b.run().map_err(|e| format!("{e:#}"));
        match &report {
            Ok(r) => println!("{}", r.render_text()),
            Err(e) => println!("edgeflow bench {}: not measured: {e}\n", b.name()),
        }
        out.push(Outcome {
            name: b.name().into(),
            compares: b.compares().into(),
            command: command(b.as_ref()),
            report,
            seconds: t.elapsed().as_secs_f64(),
        });
    }
    Ok(out)
}

/// A warning when the 1-minute load average, at the start or the end, was
/// above the number of logical CPUs.
fn contention(m: &Machine) -> Option<String> {
    let first = |l: &str| l.split_whitespace().next()?.parse::<f64>().ok();
    let worst = [first(&m.load_start), first(&m.load_end)]
        .into_iter()
        .flatten()
        .fold(f64::NAN, f64::max);
    (worst > m.logical_cpus as f64).then(|| {
        format!(
            "Contended run: a 1-minute load of up to {worst:.1} on {} logical CPUs means other \
             work held most of the CPU time; read absolute figures as lower bounds, ratios as \
             rough (a side that ran in a busier moment looks slower), and % of bandwidth \
             against a ceiling that was probed low",
            m.logical_cpus
        )
    })
}

/// `BENCHMARKS.md`: the machine, then every bench's table with its command.
pub(crate) fn render_markdown(
    m: &Machine,
    outcomes: &[Outcome],
    quick: bool,
    total_s: f64,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# edgeflow benchmarks\n");
    let _ = writeln!(
        s,
        "Written by `edgeflow bench all --markdown{}`. Every figure sits next to a \
         baseline measured in the same run on the same machine state; the ratio \
         column says what divides what. Reproduce a table with the command under \
         its heading (from a checkout, `cargo run --release -p edgeflow -- bench ...`).\n",
        if quick { " --quick" } else { "" }
    );
    if quick {
        let _ = writeln!(
            s,
            "**This is a `--quick` run**: short run counts (one repetition where \
             the benches default to three, 100 ms minimum per op row instead of \
             600 ms), so figures are noisier than a full `edgeflow bench all \
             --markdown`.\n"
        );
    }
    let _ = writeln!(s, "## Machine\n");
    let _ = writeln!(s, "- CPU: {}", m.cpu);
    let _ = writeln!(
        s,
        "- ISA extensions the kernels use: {}",
        if m.isa.is_empty() {
            "none of AVX2 / FMA / AVX-512 / VNNI / AMX / NEON".to_string()
        } else {
            m.isa.join(", ")
        }
    );
    let _ = writeln!(
        s,
        "- cores: {} logical CPUs; the CPU backend's pool has {} threads",
        m.logical_cpus, m.pool_threads
    );
    let bw = outcomes
        .iter()
        .filter_map(|o| o.report.as_ref().ok())
        .find_map(|r| r.bandwidth_gbs);
    let _ = writeln!(
        s,
        "- memory read bandwidth: {}",
        match bw {
            Some(g) => format!(
                "{g:.1} GB/s (the ops bench's ceiling probe: f32 sum over 256 MB on huge pages, best probe of the run)"
            ),
            None => "not measured (the ops bench did not run)".into(),
        }
    );
    let _ = writeln!(
        s,
        "- load average (1, 5, 15 min): {} at the start, {} at the end. A load \
         near or above the core count means other work shared the CPUs during \
         the run: absolute figures drop, and same-run ratios move less but not \
         nothing.",
        m.load_start, m.load_end
    );
    if let Some(caveat) = contention(m) {
        let _ = writeln!(s, "- **{caveat}**");
    }
    let _ = writeln!(s, "- date: {}", m.date);
    let _ = writeln!(
        s,
        "- commit: {}",
        m.commit
            .as_deref()
            .unwrap_or("unknown (not a git checkout)")
    );
    let _ = writeln!(
        s,
        "- build: {}",
        if cfg!(debug_assertions) {
            "dev profile (dependencies and numeric crates at opt-level 3; the CLI and graph engine with debug assertions)"
        } else {
            "release profile"
        }
    );
    let _ = writeln!(s, "- whole run: {total_s:.0} s\n");

    let missing: Vec<&MissingPeer> = outcomes
        .iter()
        .filter_map(|o| o.report.as_ref().ok())
        .flat_map(|r| &r.missing)
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(s, "## Absent baselines\n");
        let _ = writeln!(
            s,
            "These peers were not on the machine, so their rows have our figure only:\n"
        );
        for p in missing {
            let _ = writeln!(
                s,
                "- {} (looked for `{}`): create it with `{}`",
                p.what, p.looked_at, p.create
            );
        }
        s.push('\n');
    }

    for o in outcomes {
        let _ = writeln!(s, "## {}: {}\n", o.name, o.compares);
        let _ = writeln!(s, "`{}` ({:.0} s)\n", o.command, o.seconds);
        match &o.report {
            Ok(r) => {
                s.push_str(&r.render_markdown());
                s.push('\n');
            }
            Err(e) => {
                let _ = writeln!(s, "Not measured: {}\n", e.replace('\n', " "));
            }
        }
    }
    s
}

/// `edgeflow bench all`.
pub(crate) fn run(a: AllArgs) -> anyhow::Result<ExitCode> {
    let mut machine = Machine::read();
    let t = Instant::now();
    let outcomes = run_all(benches(a.quick), &a.only)?;
    machine.load_end = load_average();
    let total = t.elapsed().as_secs_f64();
    if a.markdown {
        let md = render_markdown(&machine, &outcomes, a.quick, total);
        std::fs::write(&a.out, md)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", a.out.display()))?;
        eprintln!("wrote {} ({total:.0} s)", a.out.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Row;

    #[test]
    fn dates_come_out_in_the_gregorian_calendar() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        // 2000-02-29 12:34:56 (a leap day in a century year).
        assert_eq!(utc_date(951_827_696), "2000-02-29 12:34 UTC");
        assert_eq!(utc_date(1_796_083_200), "2026-12-01 00:00 UTC");
    }

    #[test]
    fn isa_extensions_come_from_cpu_flags() {
        let flags: Vec<String> = "fpu sse2 avx2 fma avx512f avx512_vnni amx_tile"
            .split(' ')
            .map(str::to_string)
            .collect();
        assert_eq!(
            isa_extensions(&flags),
            ["AVX2", "FMA", "AVX-512F", "AVX-512 VNNI", "AMX-TILE"]
        );
        assert!(isa_extensions(&[]).is_empty());
    }

    #[test]
    fn the_markdown_file_has_the_machine_every_bench_and_its_command() {
        let m = Machine {
            cpu: "Test CPU".into(),
            isa: vec!["AVX2", "FMA"],
            logical_cpus: 2,
            pool_threads: 2,
            load_start: "1.50 1.20 0.90".into(),
            load_end: "2.10 1.40 1.00".into(),
            date: "2026-12-01 22:00 UTC".into(),
            commit: Some("abc123".into()),
        };
        let mut ops = BenchReport::new("ops title", "candle", "candle / runtime");
        ops.bandwidth_gbs = Some(21.5);
        ops.rows
            .push(Row::new("gemm", 1.0, "ms").baseline(1.1).ratio(1.1));
        let mut tts = BenchReport::new("tts title", "onnxruntime", "ours / onnxruntime");
        tts.peer_missing("vs piper", crate::bench::Peer::Piper.missing());
        let outcomes = vec![
            Outcome {
                name: "ops".into(),
                compares: "kernels vs candle".into(),
                command: "edgeflow bench ops --min-time-ms 100".into(),
                report: Ok(ops),
                seconds: 30.0,
            },
            Outcome {
                name: "tts".into(),
                compares: "piper vs onnxruntime".into(),
                command: "edgeflow bench tts --runs 1".into(),
                report: Ok(tts),
                seconds: 5.0,
            },
            Outcome {
                name: "thinker".into(),
                compares: "llm".into(),
                command: "edgeflow bench thinker".into(),
                report: Err("no GGUF: run `edgeflow models fetch smollm2`".into()),
                seconds: 0.0,
            },
        ];
        let md = render_markdown(&m, &outcomes, true, 120.0);
        assert!(md.starts_with("# edgeflow benchmarks\n"), "{md}");
        assert!(
            md.contains("`edgeflow bench all --markdown --quick`"),
            "{md}"
        );
        assert!(md.contains("This is a `--quick` run"), "{md}");
        assert!(md.contains("- CPU: Test CPU\n"), "{md}");
        assert!(md.contains("kernels use: AVX2, FMA\n"), "{md}");
        assert!(md.contains("- memory read bandwidth: 21.5 GB/s"), "{md}");
        assert!(
            md.contains("1.50 1.20 0.90 at the start, 2.10 1.40 1.00 at the end"),
            "{md}"
        );
        assert!(md.contains("- commit: abc123\n"), "{md}");
        assert!(
            md.contains("**Contended run: a 1-minute load of up to 2.1 on 2 logical CPUs"),
            "{md}"
        );
        let quiet = Machine {
            load_start: "0.50 0.40 0.30".into(),
            load_end: "1.90 0.40 0.30".into(),
            ..m.clone()
        };
        assert!(contention(&quiet).is_none());
        assert!(
            md.contains(
                "## ops: kernels vs candle\n\n`edgeflow bench ops --min-time-ms 100` (30 s)\n"
            ),
            "{md}"
        );
        assert!(
            md.contains("| gemm | 1.000 ms | 1.100 ms | 1.10x |  |\n"),
            "{md}"
        );
        assert!(md.contains("## Absent baselines\n"), "{md}");
        assert!(
            md.contains("create it with `scripts/peer_envs.sh piper`"),
            "{md}"
        );
        assert!(md.contains("## thinker: llm\n"), "{md}");
        assert!(
            md.contains("Not measured: no GGUF: run `edgeflow models fetch smollm2`"),
            "{md}"
        );
    }

    #[test]
    fn an_unknown_bench_name_is_refused_before_running() {
        let e = run_all(benches(true), &["opz".into()]).unwrap_err();
        assert!(
            e.to_string().contains("opz") && e.to_string().contains("thinker"),
            "{e}"
        );
    }
}
