//! Device probing: a backend is available only if a real computation on it
//! succeeded and matched the CPU (architecture.md, "Placement").
//!
//! ## Design
//! [`probe_backend`] runs a small linear layer (`x[8, 67] @ w[33, 67]^T + b`,
//! seeded inputs, odd sizes) natively on the backend and compares it with the
//! CPU backend's result. A probe that had to fall back to the CPU proves
//! nothing, so it counts as a failure. Results are cached per process by the
//! caller and on disk by [`ProbeCache`], keyed by backend name and adapter
//! description, so a new driver or adapter is probed again.

use crate::{rng, Backend, Device, DeviceKind, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// How many times the probe computation runs; the last result is checked.
const PROBE_RUNS: usize = 6;

/// The outcome of probing one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// Kind of device.
    pub kind: DeviceKind,
    /// Backend name as used in placement (`cpu`, `gpu:0`, `npu:0`).
    pub name: String,
    /// Adapter description (driver / device / simulator).
    pub adapter: String,
    /// True when the probe computation ran natively and matched the CPU.
    pub available: bool,
    /// Wall time of the last probe run (run and download), in ms.
    pub probe_ms: f64,
    /// Largest absolute difference from the CPU result (None if it did not run).
    pub max_abs_err: Option<f64>,
    /// Why the backend is unavailable, or notes (e.g. "simulator").
    pub reason: Option<String>,
    /// True when this is a software emulation (lavapipe, the NPU simulator):
    /// correct but not faster than the CPU, so `auto` does not pick it.
    pub simulated: bool,
    /// True when the report came from the on-disk cache.
    #[serde(default)]
    pub cached: bool,
}

impl ProbeReport {
    /// A report for a backend that could not even be opened.
    pub fn unavailable(kind: DeviceKind, name: &str, adapter: &str, reason: String) -> Self {
        ProbeReport {
            kind,
            name: name.to_string(),
            adapter: adapter.to_string(),
            available: false,
            probe_ms: 0.0,
            max_abs_err: None,
            reason: Some(reason),
            simulated: false,
            cached: false,
        }
    }
}

/// Maximum error allowed in the probe, relative to max(1, largest |output|).
/// Int8 backends (NPUs) get a few percent; float backends float rounding.
pub fn probe_tolerance(kind: DeviceKind) -> f64 {
    match kind {
        DeviceKind::Npu => 0.05,
        DeviceKind::Gpu | DeviceKind::Cpu => 1e-4,
    }
}

/// Run the probe computation on `backend`, checked against `cpu`.
pub fn probe_backend(backend: Arc<dyn Backend>, cpu: Arc<dyn Backend>) -> ProbeReport {
    let kind = backend.kind();
    let name = backend.name().to_string();
    let adapter = backend.adapter();
    let simulated = backend.is_simulated();
    // (probe ms, max abs error, allowed error, fallbacks)
    let run = || -> Result<(f64, f64, f64, u64)> {
        let x = rng::rand_normal_host(&[8, 67], 0.0, 1.0, 0x5eed_0001)?;
        let w = rng::rand_normal_host(&[33, 67], 0.0, 0.2, 0x5eed_0002)?;
        let b = rng::rand_normal_host(&[33], 0.0, 0.1, 0x5eed_0003)?;
        let host = Device::new(cpu.clone(), cpu.clone());
        let want = host.linear(&x, &w, Some(&b))?.to_vec_f32()?;
        let dev = Device::new(backend.clone(), cpu.clone());
        let (xd, wd, bd) = (dev.place(&x)?, dev.place(&w)?, dev.place(&b)?);
        // Several runs: backends that calibrate (the NPU simulator runs its
        // first calls in f32) must also pass on their steady-state path.
        let mut runs = Vec::with_capacity(PROBE_RUNS);
        let mut ms = 0.0;
        for _ in 0..PROBE_RUNS {
            let t0 = Instant::now();
            let y = dev.linear(&xd, &wd, Some(&bd))?;
            runs.push(dev.to_host(&y)?.to_vec_f32()?);
            backend.synchronize()?;
            ms = t0.elapsed().as_secs_f64() * 1e3;
        }
        if let Some(bad) = runs.iter().find(|g| g.len() != want.len()) {
            return Err(crate::Error::Backend {
                backend: name.clone(),
                msg: format!(
                    "probe returned {} values, expected {}",
                    bad.len(),
                    want.len()
                ),
            });
        }
        let err = runs
            .iter()
            .flat_map(|g| g.iter().zip(&want))
            .map(|(a, b)| (*a as f64 - *b as f64).abs())
            .fold(
                0.0,
                |m: f64, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
            );
        let range = want.iter().map(|v| v.abs() as f64).fold(1.0, f64::max);
        let fallbacks = dev.stats().snapshot().fallback_ops;
        Ok((ms, err, probe_tolerance(kind) * range, fallbacks))
    };
    let mut rep = ProbeReport {
        kind,
        name: name.clone(),
        adapter,
        available: false,
        probe_ms: 0.0,
        max_abs_err: None,
        reason: None,
        simulated,
        cached: false,
    };
    match run() {
        Ok((ms, err, tol, fallbacks)) => {
            rep.probe_ms = ms;
            rep.max_abs_err = Some(err);
            if fallbacks > 0 {
                rep.reason =
                    Some("probe op fell back to the CPU: backend cannot run linear".into());
            } else if err.is_nan() || err > tol {
                rep.reason = Some(format!(
                    "probe result differs from the CPU by {err:.3e} (allowed {tol:.1e})"
                ));
            } else {
                rep.available = true;
                if simulated {
                    rep.reason =
                        Some("software emulation: correct, not fast; auto skips it".into());
                }
            }
        }
        Err(e) => rep.reason = Some(format!("probe failed: {e}")),
    }
    rep
}

/// On-disk probe cache: `$XDG_CACHE_HOME/edgeflow/probe.json` (or
/// `~/.cache/edgeflow/probe.json`), keyed by `name|adapter`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ProbeCache {
    /// edgeflow version that wrote the cache; other versions re-probe.
    pub version: String,
    /// Reports by key.
    pub entries: BTreeMap<String, ProbeReport>,
}

impl ProbeCache {
    /// Where the cache lives (None when neither XDG_CACHE_HOME nor HOME is set).
    pub fn path() -> Option<PathBuf> {
        if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
            return Some(PathBuf::from(x).join("edgeflow").join("probe.json"));
        }
        std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| {
            PathBuf::from(h)
                .join(".cache")
                .join("edgeflow")
                .join("probe.json")
        })
    }

    /// Cache key for a backend.
    pub fn key(name: &str, adapter: &str) -> String {
        format!("{name}|{adapter}")
    }

    /// Load the cache; a missing, unreadable or stale file is an empty cache.
    pub fn load() -> ProbeCache {
        let fresh = ProbeCache {
            version: env!("CARGO_PKG_VERSION").to_string(),
            entries: BTreeMap::new(),
        };
        let Some(p) = Self::path() else { return fresh };
        let Ok(text) = std::fs::read_to_string(&p) else {
            return fresh;
        };
        match serde_json::from_str::<ProbeCache>(&text) {
            Ok(c) if c.version == fresh.version => c,
            _ => fresh,
        }
    }

    /// A cached report for this backend, marked `cached`.
    pub fn get(&self, name: &str, adapter: &str) -> Option<ProbeReport> {
        self.entries.get(&Self::key(name, adapter)).map(|r| {
            let mut r = r.clone();
            r.cached = true;
            r
        })
    }

    /// Record a report.
    pub fn insert(&mut self, r: &ProbeReport) {
        let mut r = r.clone();
        r.cached = false;
        self.entries.insert(Self::key(&r.name, &r.adapter), r);
    }

    /// Write the cache atomically (temp file + rename). Best effort: a cache
    /// that cannot be written only costs a re-probe next time.
    pub fn save(&self) -> Result<()> {
        let Some(p) = Self::path() else { return Ok(()) };
        let io = |error| crate::Error::Io {
            path: p.clone(),
            error,
        };
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| crate::Error::Io {
            path: p.clone(),
            error: std::io::Error::other(e),
        })?;
        let tmp = p.with_extension(format!("json.{}.tmp", std::process::id()));
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, &p).map_err(io)
    }
}
