//! The `edgeflow` command line.

use clap::Parser;
use std::process::ExitCode;

mod cli;

/// Run multimodal agent pipelines (speech, voice loops, robot control) from YAML.
#[derive(Debug, Parser)]
#[command(name = "edgeflow", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: cli::Command,
}

/// Keep freed heap memory in the process for reuse instead of handing it
/// back to the kernel. glibc serves buffers over its mmap threshold (a few
/// MB by default) with a fresh `mmap` and unmaps them on free, and trims
/// the heap top as soon as 2x that is free; a vocoder allocates and drops
/// tens of MB of activations per chunk, so every chunk page-faulted its
/// memory in again (kernel page-fault and page-zeroing work was about a
/// tenth of `bench tts`'s samples). The resident size stays at the peak
/// working set, as with onnxruntime's arena.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: mallopt only changes allocator tunables; called before any
    // other thread exists. A refused value leaves glibc's default.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, i32::MAX);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() -> ExitCode {
    keep_freed_memory();
    // Before any thread starts: candle otherwise re-reads /proc/cpuinfo on
    // every CPU matmul to find its thread count. `bench tts` sets the count
    // from its own --threads flag instead.
    let args: Vec<String> = std::env::args().collect();
    if !args.windows(2).any(|w| w[0] == "bench" && w[1] == "tts") {
        edgeflow_backends::pin_cpu_threads();
    }
    let cli = Cli::parse();
    match cli::dispatch(cli.cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
