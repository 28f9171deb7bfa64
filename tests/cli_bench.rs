//! `edgeflow bench`: the cheap dataflow bench end to end, the table it
//! prints and the Markdown `bench all --markdown` writes. No timed
//! assertions: only what the output says, never how fast.

use std::path::Path;
use std::process::{Command, Output};

fn edgeflow(args: &[&str]) -> Output {
    edgeflow_env(args, &[])
}

/// [`edgeflow`] with extra environment variables.
fn edgeflow_env(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgeflow"))
        .args(args)
        .envs(envs.iter().copied())
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("failed to start the edgeflow binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const TINY: [&str; 6] = [
    "--stages",
    "4",
    "--latency-msgs",
    "40",
    "--throughput-msgs",
    "400",
];

#[test]
fn bench_dataflow_prints_one_table_with_baseline_ratios() {
    let mut args = vec!["bench", "dataflow"];
    args.extend(TINY);
    let out = edgeflow(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(
        t.starts_with("edgeflow bench dataflow: 4-stage chain"),
        "{t}"
    );
    let head = t
        .lines()
        .find(|l| l.starts_with("measured"))
        .unwrap_or_else(|| panic!("no header: {t}"));
    assert!(head.contains("baseline (raw crossbeam-channel)"), "{t}");
    assert!(head.contains("ratio (ours / baseline)"), "{t}");
    for label in [
        "edgeflow, thread per stage: latency p50",
        "edgeflow, thread per stage: latency p99",
        "edgeflow, thread per stage: throughput",
        "edgeflow, inline passthroughs: latency p50",
        "edgeflow, inline passthroughs: throughput",
        "4 MB tensor through 8 hops, latency p50",
    ] {
        let row = t
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no row {label:?}: {t}"));
        // A value with its unit, a baseline with the same unit, a ratio.
        let unit = if label.ends_with("throughput") {
            "msgs/s"
        } else {
            "us"
        };
        assert_eq!(row.matches(unit).count(), 2, "{row}");
        assert!(row.trim_end().contains('x'), "{row}");
    }
}

#[test]
fn bench_dataflow_refuses_a_chain_without_a_sink() {
    let out = edgeflow(&["bench", "dataflow", "--stages", "1"]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("--stages 1") && e.contains("at least 2"), "{e}");
}

#[test]
fn bench_all_writes_markdown_with_the_machine_and_the_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let md_path = dir.path().join("BENCHMARKS.md");
    let out = edgeflow(&[
        "bench",
        "all",
        "--markdown",
        "--quick",
        "--only",
        "dataflow",
        "--out",
        md_path.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let md = std::fs::read_to_string(&md_path).expect("BENCHMARKS.md written");
    assert!(md.starts_with("# edgeflow benchmarks\n"), "{md}");
    assert!(md.contains("This is a `--quick` run"), "{md}");
    assert!(md.contains("## Machine\n"), "{md}");
    assert!(md.contains("- CPU: "), "{md}");
    assert!(md.contains("- load average (1, 5, 15 min): "), "{md}");
    assert!(
        md.contains("- memory read bandwidth: not measured (the ops bench did not run)"),
        "{md}"
    );
    assert!(
        md.contains("`edgeflow bench dataflow --latency-msgs 500 --throughput-msgs 20000`"),
        "{md}"
    );
    assert!(
        md.contains("| edgeflow, thread per stage: latency p50 | "),
        "{md}"
    );
    // Only the bench asked for ran.
    assert!(!md.contains("## ops"), "{md}");
}

#[test]
fn bench_all_refuses_an_unknown_bench_name() {
    let out = edgeflow(&["bench", "all", "--only", "dataflw"]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("dataflw") && e.contains("thinker"), "{e}");
}

/// A short `bench control` run: both round trips (on 127.0.0.1, and
/// across the veth pair the bench makes between two network namespaces,
/// as root: CI runs so) and both controller variants produce rows beside
/// their baselines.
#[test]
fn bench_control_prints_the_round_trip_and_jitter_rows() {
    let out = edgeflow(&[
        "bench",
        "control",
        "--seconds",
        "0.5",
        "--round-trips",
        "50",
        "--rt-priority",
        "0",
        "--veth",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for row in [
        "round trip p50, zenoh_pub/zenoh_sub",
        "round trip p50 across veth, zenoh_pub/zenoh_sub",
        "round trip p99 across veth, zenoh_pub/zenoh_sub",
        "wake-up jitter p99, idle",
        "wake-up jitter p99, with compute load",
        "missed periods, with compute load",
    ] {
        assert!(stdout.contains(row), "no `{row}` row in:\n{stdout}");
    }
}

#[test]
fn bench_control_refuses_a_bad_rate() {
    let out = edgeflow(&["bench", "control", "--rate-hz", "0"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("--rate-hz"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A tiny `bench thinker` on the cached SmolLM2 (`edgeflow models fetch
/// smollm2`) reports how long loading took, the resident memory it added
/// beside the file's size, and decode's weight bandwidth against the read
/// ceiling probed in the same run. Loaded on 4 KB pages
/// (`EDGEFLOW_HUGE_PAGES=after-load`), the weights are on 2 MB pages
/// before the timed runs and the report says how they got there.
#[test]
fn bench_thinker_reports_load_time_and_resident_memory() {
    if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("skipped: EDGEFLOW_SKIP_MODEL_TESTS=1");
        return;
    }
    let args = [
        "bench",
        "thinker",
        "--runs",
        "1",
        "--prompt-tokens",
        "8",
        "--decode-tokens",
        "4",
    ];
    let out = edgeflow_env(&args, &[("EDGEFLOW_HUGE_PAGES", "alloc")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(!stdout.contains("loaded on 4 KB pages"), "{stdout}");
    let out = edgeflow_env(&args, &[("EDGEFLOW_HUGE_PAGES", "after-load")]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("on 2 MB pages") && stdout.contains("(loaded on 4 KB pages"),
        "{stdout}"
    );
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let row = |name: &str| -> String {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no `{name}` row in:\n{stdout}"))
            .to_string()
    };
    assert!(row("load ").contains(" s "), "{stdout}");
    let bw = row("decode weight bandwidth");
    assert!(
        bw.contains("GB/s read ceiling probed after the runs") && bw.contains("% of the"),
        "{bw}"
    );
    let mem = row("resident memory added by loading");
    assert!(
        mem.contains("MiB") && mem.contains("x the") && mem.contains("MiB file"),
        "{mem}"
    );
}
