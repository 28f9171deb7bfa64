//! `edgeflow bench control`: zenoh round trip raw vs through our stages, and
//! the controller's wake-up jitter at a fixed rate, idle and loaded. The
//! measuring lives in `edgeflow_control::bench`.

use std::process::ExitCode;

/// `edgeflow bench control` options.
#[derive(Debug, clap::Args)]
pub struct BenchControlArgs {
    /// Seconds the controller runs in each variant (idle, loaded).
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Controller rate in Hz.
    #[arg(long, default_value_t = 100.0)]
    pub rate_hz: f64,
    /// Round trips per variant.
    #[arg(long, default_value_t = 2000)]
    pub round_trips: usize,
    /// SCHED_FIFO priority the controller tries (0: do not).
    #[arg(long, default_value_t = 50)]
    pub rt_priority: i32,
}

/// Run it.
pub fn run(a: BenchControlArgs) -> anyhow::Result<ExitCode> {
    let o = edgeflow_control::bench::BenchOptions {
        round_trips: a.round_trips,
        seconds: a.seconds,
        rate_hz: a.rate_hz,
        rt_priority: a.rt_priority,
    };
    eprintln!(
        "measuring {} zenoh round trips (raw, stages), then the controller at {} Hz for 2 x {} s...",
        o.round_trips, o.rate_hz, o.seconds
    );
    print!("{}", edgeflow_control::bench::run(&o)?.render());
    Ok(ExitCode::SUCCESS)
}
