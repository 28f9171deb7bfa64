//! `edgeflow devices`: every backend, its adapter and its probe result.

use std::process::ExitCode;

/// List the backends. `refresh` re-runs the probes instead of reading the
/// cache; `json` prints the reports as JSON. Exits non-zero only if the CPU
/// itself fails its probe.
pub(super) fn run(refresh: bool, json: bool) -> anyhow::Result<ExitCode> {
    let reports = edgeflow_backends::probe_all(refresh);
    if json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        println!(
            "{:<7} {:<10} {:>10} {:>10}  {:<48} note",
            "device", "available", "probe", "max err", "adapter"
        );
        for r in &reports {
            let err = r
                .max_abs_err
                .map(|e| format!("{e:.1e}"))
                .unwrap_or_else(|| "-".into());
            let probe = if r.probe_ms > 0.0 {
                format!("{:.2} ms", r.probe_ms)
            } else {
                "-".into()
            };
            let mut note = r.reason.clone().unwrap_or_default();
            if r.cached {
                note = if note.is_empty() {
                    "cached probe".into()
                } else {
                    format!("{note} (cached probe)")
                };
            }
            println!(
                "{:<7} {:<10} {:>10} {:>10}  {:<48} {}",
                r.name,
                if r.available { "yes" } else { "no" },
                probe,
                err,
                r.adapter,
                note
            );
        }
        println!("\nauto -> {}", edgeflow_backends::auto_spec());
        if let Some(p) = edgeflow_runtime::probe::ProbeCache::path() {
            println!("probe cache: {}", p.display());
        }
    }
    let cpu_ok = reports
        .iter()
        .any(|r| r.kind == edgeflow_runtime::DeviceKind::Cpu && r.available);
    Ok(if cpu_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
