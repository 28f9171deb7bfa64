//! [`Device`]: the handle model code runs ops through, with per-op CPU
//! fallback and counted transfers; [`DeviceSpec`]: placement as written in YAML.

use crate::{Backend, DeviceKind, Error, Op, Result, Storage, Tensor};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Placement as written in a pipeline: `cpu`, `gpu`, `gpu:N`, `npu`, `npu:N`, `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceSpec {
    /// Best available device, from cached probe results.
    #[default]
    Auto,
    /// The host CPU.
    Cpu,
    /// GPU adapter N.
    Gpu(usize),
    /// NPU N.
    Npu(usize),
}

impl FromStr for DeviceSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let (kind, idx) = match s.split_once(':') {
            Some((k, i)) => (
                k,
                Some(
                    i.parse::<usize>()
                        .map_err(|_| Error::BadDevice(s.to_string()))?,
                ),
            ),
            None => (s, None),
        };
        match (kind, idx) {
            ("auto", None) => Ok(DeviceSpec::Auto),
            ("cpu", None | Some(0)) => Ok(DeviceSpec::Cpu),
            ("gpu", i) => Ok(DeviceSpec::Gpu(i.unwrap_or(0))),
            ("npu", i) => Ok(DeviceSpec::Npu(i.unwrap_or(0))),
            _ => Err(Error::BadDevice(s.to_string())),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Gpu(i) => write!(f, "gpu:{i}"),
            DeviceSpec::Npu(i) => write!(f, "npu:{i}"),
        }
    }
}

/// Counters a [`Device`] keeps; shown in stage metrics.
#[derive(Debug, Default)]
pub struct DeviceStats {
    ops: AtomicU64,
    fallback_ops: AtomicU64,
    uploads: AtomicU64,
    downloads: AtomicU64,
    bytes_transferred: AtomicU64,
    resident_bytes: AtomicU64,
    fallback_by_op: Mutex<BTreeMap<&'static str, u64>>,
    /// Per (op, input shapes): calls and wall time, while profiling is on.
    op_profile: Mutex<Option<BTreeMap<String, (u64, f64)>>>,
}

/// One row of an op profile ([`DeviceStats::op_profile`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpProfileRow {
    /// Op name and input shapes, e.g. `conv1d [1, 192, 363] [384, 192, 5]`.
    pub op: String,
    /// Calls.
    pub calls: u64,
    /// Wall time over all calls, seconds.
    pub seconds: f64,
}

/// The `top` rows of an op profile ([`DeviceStats::op_profile`]) as a
/// table, with each row's share of the total time.
pub fn render_op_profile(rows: &[OpProfileRow], top: usize) -> String {
    // A fold from +0.0: an empty float sum is -0.0, which prints as "-0.0".
    let total = rows.iter().fold(0.0, |a, r| a + r.seconds);
    let mut s = format!(
        "op profile: {:.1} ms in {} ops\n{:>10} {:>6} {:>6}  op [input shapes]\n",
        total * 1e3,
        rows.iter().map(|r| r.calls).sum::<u64>(),
        "ms",
        "%",
        "calls"
    );
    for r in rows.iter().take(top) {
        s.push_str(&format!(
            "{:>10.2} {:>6.1} {:>6}  {}\n",
            r.seconds * 1e3,
            100.0 * r.seconds / total.max(1e-12),
            r.calls,
            r.op
        ));
    }
    s
}

/// A point-in-time copy of [`DeviceStats`], serializable for metrics JSON.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DeviceStatsSnapshot {
    /// Ops dispatched.
    pub ops: u64,
    /// Ops the placed backend lacked, run on the CPU instead.
    pub fallback_ops: u64,
    /// Host -> device copies.
    pub uploads: u64,
    /// Device -> host copies.
    pub downloads: u64,
    /// Bytes moved by those copies.
    pub bytes_transferred: u64,
    /// Bytes of weights and state held by the stage on this device.
    pub resident_bytes: u64,
    /// Fallback count per op name.
    pub fallback_by_op: BTreeMap<String, u64>,
}

impl DeviceStats {
    /// Snapshot the counters.
    pub fn snapshot(&self) -> DeviceStatsSnapshot {
        DeviceStatsSnapshot {
            ops: self.ops.load(Ordering::Relaxed),
            fallback_ops: self.fallback_ops.load(Ordering::Relaxed),
            uploads: self.uploads.load(Ordering::Relaxed),
            downloads: self.downloads.load(Ordering::Relaxed),
            bytes_transferred: self.bytes_transferred.load(Ordering::Relaxed),
            resident_bytes: self.resident_bytes.load(Ordering::Relaxed),
            fallback_by_op: self
                .fallback_by_op
                .lock()
                .map(|m| m.iter().map(|(k, v)| (k.to_string(), *v)).collect())
                .unwrap_or_default(),
        }
    }

    /// Start (or, with `false`, stop and clear) timing every op this
    /// device runs, keyed by op name and input shapes. Wall time from the
    /// call to the op's result: exact for CPU kernels, which finish before
    /// they return; for a GPU it is the time to record and submit (plus
    /// any read-back the op waits for). `EDGEFLOW_PROFILE_OPS=1` turns it
    /// on for every device when it is created.
    pub fn profile_ops(&self, on: bool) {
        if let Ok(mut p) = self.op_profile.lock() {
            *p = on.then(BTreeMap::new);
        }
    }

    /// The op profile so far, most time first (empty when not profiling).
    pub fn op_profile(&self) -> Vec<OpProfileRow> {
        let mut rows: Vec<OpProfileRow> = self
            .op_profile
            .lock()
            .ok()
            .and_then(|p| {
                p.as_ref().map(|m| {
                    m.iter()
                        .map(|(k, &(calls, seconds))| OpProfileRow {
                            op: k.clone(),
                            calls,
                            seconds,
                        })
                        .collect()
                })
            })
            .unwrap_or_default();
        rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        rows
    }

    fn profiling(&self) -> bool {
        self.op_profile.lock().is_ok_and(|p| p.is_some())
    }

    fn record_op(&self, op: &Op, inputs: &[&Tensor], seconds: f64) {
        let mut key = op.name().to_string();
        for t in inputs {
            key.push_str(&format!(" {:?}", t.dims()));
        }
        if let Ok(mut p) = self.op_profile.lock() {
            if let Some(m) = p.as_mut() {
                let e = m.entry(key).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += seconds;
            }
        }
    }

    /// Account `bytes` more (or fewer, with a negative value) resident bytes.
    pub fn add_resident(&self, bytes: i64) {
        if bytes >= 0 {
            self.resident_bytes
                .fetch_add(bytes as u64, Ordering::Relaxed);
        } else {
            self.resident_bytes
                .fetch_sub(bytes.unsigned_abs(), Ordering::Relaxed);
        }
    }
}

fn is_integer(d: crate::DType) -> bool {
    matches!(d, crate::DType::I64 | crate::DType::I32 | crate::DType::U8)
}

/// The handle a model stage runs ops through.
///
/// Each op goes to the placed backend when it [`Backend::supports`] it; else
/// its inputs are moved to the host (counted) and the CPU backend runs it
/// (counted per op). A wrong answer or a crash is never the fallback.
#[derive(Clone)]
pub struct Device {
    primary: Arc<dyn Backend>,
    cpu: Arc<dyn Backend>,
    stats: Arc<DeviceStats>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("primary", &self.primary.name())
            .finish()
    }
}

impl Device {
    /// A device placed on `primary`, falling back to `cpu` op by op.
    /// For a CPU placement pass the same backend twice.
    pub fn new(primary: Arc<dyn Backend>, cpu: Arc<dyn Backend>) -> Self {
        let stats = DeviceStats::default();
        if std::env::var("EDGEFLOW_PROFILE_OPS").is_ok_and(|v| !v.is_empty() && v != "0") {
            stats.profile_ops(true);
        }
        Device {
            primary,
            cpu,
            stats: Arc::new(stats),
        }
    }

    /// The placed backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.primary
    }

    /// The CPU backend this device falls back to.
    pub fn cpu_backend(&self) -> &Arc<dyn Backend> {
        &self.cpu
    }

    /// The same device on the host: its CPU fallback backend, sharing these
    /// counters (for host-side work such as quantizing weights at load).
    pub fn host(&self) -> Device {
        Device {
            primary: self.cpu.clone(),
            cpu: self.cpu.clone(),
            stats: self.stats.clone(),
        }
    }

    /// The placed backend's kind.
    pub fn kind(&self) -> DeviceKind {
        self.primary.kind()
    }

    /// Counters (fallbacks, transfers, resident bytes).
    pub fn stats(&self) -> &Arc<DeviceStats> {
        &self.stats
    }

    /// What reduced precision has cost on the placed backend so far (the
    /// NPU simulator's int8 error); `None` where it computes in f32.
    pub fn precision_error(&self) -> Option<crate::PrecisionError> {
        self.backend().precision_error()
    }

    fn count_transfer(&self, t: &Tensor, up: bool) {
        let c = if up {
            &self.stats.uploads
        } else {
            &self.stats.downloads
        };
        c.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_transferred
            .fetch_add(t.size_bytes() as u64, Ordering::Relaxed);
    }

    /// Bring a tensor to the host (counted when it was elsewhere).
    pub fn to_host(&self, t: &Tensor) -> Result<Tensor> {
        if t.is_host() {
            return Ok(t.clone());
        }
        self.count_transfer(t, false);
        // A buffer the CPU backend laid out (packed weights) goes back
        // through it, whichever backend this device places on.
        match t.storage() {
            Storage::Device(b) if b.backend() == self.cpu.name() => self.cpu.download(t),
            _ => self.primary.download(t),
        }
    }

    /// Place a tensor on the primary backend (counted when it moves).
    /// Use it for weights at load time; they then count as resident.
    pub fn place(&self, t: &Tensor) -> Result<Tensor> {
        if self.primary.holds(t) {
            return self.primary.make_resident(t);
        }
        let host = self.to_host(t)?;
        let placed = self.primary.upload(&host)?;
        // Placement never changes what a tensor means: a backend that holds
        // only floats (the NPU simulator) would turn token ids and indices
        // into floats, so those stay on the host and ops that read them
        // take the counted CPU path.
        if placed.dtype() != host.dtype() && is_integer(host.dtype()) {
            return Ok(host);
        }
        self.count_transfer(&host, true);
        Ok(placed)
    }

    /// Tell the backends that loading is over ([`Backend::release_load_memory`]);
    /// a dropped [`crate::weights::WeightStore`] calls it.
    pub fn release_load_memory(&self) {
        self.primary.release_load_memory();
        if !Arc::ptr_eq(&self.primary, &self.cpu) {
            self.cpu.release_load_memory();
        }
    }

    /// Run `f` (a forward pass: many ops in a row) the way the placed
    /// backend issues ops cheapest ([`Backend::run_batch`]): on the CPU, on
    /// a worker of its thread pool. Results are the same as calling `f`
    /// directly; `f` should not block on anything but its own ops.
    pub fn batch<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let mut f = Some(f);
        let mut out = None;
        self.primary.run_batch(&mut || {
            if let Some(f) = f.take() {
                out = Some(f());
            }
        });
        match out {
            Some(r) => r,
            // A backend that did not call the closure: run it here.
            None => match f.take() {
                Some(f) => f(),
                None => unreachable!("the closure ran but left no result"),
            },
        }
    }

    /// Whether the placed backend runs `op` on these inputs itself (no CPU
    /// fallback). Composite helpers use it to pick a fused op or its parts.
    pub fn runs_natively(&self, op: &Op, inputs: &[&Tensor]) -> bool {
        self.primary.supports(op, inputs)
    }

    /// Run one op: natively when the placed backend supports it, otherwise on
    /// the CPU with counted transfers.
    pub fn run(&self, op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
        if self.stats.profiling() {
            let started = std::time::Instant::now();
            let r = self.dispatch(&op, inputs);
            self.stats
                .record_op(&op, inputs, started.elapsed().as_secs_f64());
            return r;
        }
        self.dispatch(&op, inputs)
    }

    fn dispatch(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        if self.primary.supports(op, inputs) {
            let mut moved = Vec::with_capacity(inputs.len());
            for t in inputs {
                moved.push(if self.primary.holds(t) {
                    (*t).clone()
                } else {
                    let host = self.to_host(t)?;
                    self.count_transfer(&host, true);
                    self.primary.upload(&host)?
                });
            }
            let refs: Vec<&Tensor> = moved.iter().collect();
            return self.primary.execute(op, &refs);
        }
        if !Arc::ptr_eq(&self.primary, &self.cpu) {
            self.stats.fallback_ops.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut m) = self.stats.fallback_by_op.lock() {
                *m.entry(op.name()).or_default() += 1;
            }
        }
        let mut host = Vec::with_capacity(inputs.len());
        for t in inputs {
            host.push(self.to_host(t)?);
        }
        let refs: Vec<&Tensor> = host.iter().collect();
        if !self.cpu.supports(op, &refs) {
            return Err(Error::Unsupported {
                backend: self.cpu.name().to_string(),
                op: op.name(),
                msg: "not supported on the CPU either (check input dtypes and shapes)".into(),
            });
        }
        self.cpu.execute(op, &refs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_op_profile_renders_its_top_rows_with_their_shares() {
        let row = |op: &str, calls, seconds| OpProfileRow {
            op: op.into(),
            calls,
            seconds,
        };
        let rows = [
            row("linear [1, 576] [3072, 576]", 30, 0.003),
            row("rms_norm [1, 576] [576]", 61, 0.0005),
            row("add [1, 576] [1, 576]", 60, 0.0005),
        ];
        let s = render_op_profile(&rows, 2);
        assert!(s.starts_with("op profile: 4.0 ms in 151 ops\n"), "{s}");
        assert!(
            s.contains("      3.00   75.0     30  linear [1, 576] [3072, 576]"),
            "{s}"
        );
        assert!(s.contains("rms_norm") && !s.contains("add ["), "{s}");
        assert!(render_op_profile(&[], 5).starts_with("op profile: 0.0 ms in 0 ops"));
    }
}
