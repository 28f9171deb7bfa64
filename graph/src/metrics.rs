//! Per-stage and per-edge metrics, and their JSON snapshot.

use edgeflow_runtime::{DeviceStats, DeviceStatsSnapshot};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A log-linear histogram of durations (about 3% relative precision), cheap
/// to record into on the hot path.
#[derive(Debug, Clone)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    sum_ns: u128,
    max_ns: u64,
    min_ns: u64,
}

const SUB: u32 = 32; // sub-buckets per power of two

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; (64 * SUB) as usize],
            count: 0,
            sum_ns: 0,
            max_ns: 0,
            min_ns: u64::MAX,
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    let v = ns.max(1);
    let exp = 63 - v.leading_zeros();
    if exp < 5 {
        return v as usize; // exact below 32 ns
    }
    let mant = ((v >> (exp - 5)) & (SUB as u64 - 1)) as u32;
    (exp * SUB + mant) as usize
}

fn bucket_value(b: usize) -> u64 {
    let b = b as u32;
    if b < 5 * SUB {
        return b as u64;
    }
    let exp = b / SUB;
    let mant = (b % SUB) as u64;
    ((SUB as u64 + mant) << (exp - 5)) + (1u64 << (exp - 5)) / 2
}

impl Histogram {
    /// Record one duration.
    pub fn record(&mut self, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        self.buckets[bucket_of(ns)] += 1;
        self.count += 1;
        self.sum_ns += ns as u128;
        self.max_ns = self.max_ns.max(ns);
        self.min_ns = self.min_ns.min(ns);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The `q` quantile (0..=1).
    pub fn quantile(&self, q: f64) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let target = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= target {
                let v = bucket_value(i).clamp(self.min_ns, self.max_ns);
                return Duration::from_nanos(v);
            }
        }
        Duration::from_nanos(self.max_ns)
    }

    /// Summary in microseconds.
    pub fn summary(&self) -> LatencySummary {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        LatencySummary {
            count: self.count,
            mean_us: if self.count == 0 {
                0.0
            } else {
                self.sum_ns as f64 / self.count as f64 / 1e3
            },
            p50_us: us(self.quantile(0.5)),
            p90_us: us(self.quantile(0.9)),
            p99_us: us(self.quantile(0.99)),
            max_us: self.max_ns as f64 / 1e3,
        }
    }
}

/// Latency summary, microseconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Maximum.
    pub max_us: f64,
}

/// Counters of one edge. `sent == delivered + dropped_* + depth` at any quiet moment.
#[derive(Debug, Default)]
pub struct EdgeStats {
    /// Messages offered to the edge (excluding those refused for a cancelled epoch).
    pub sent: AtomicU64,
    /// Messages handed to the consumer.
    pub delivered: AtomicU64,
    /// Dropped by `drop_oldest`.
    pub dropped_oldest: AtomicU64,
    /// Dropped by `drop_newest`.
    pub dropped_newest: AtomicU64,
    /// Replaced under `latest`.
    pub dropped_latest: AtomicU64,
    /// Older than `max_age` at dequeue.
    pub dropped_age: AtomicU64,
    /// Belonged to a cancelled epoch.
    pub dropped_cancel: AtomicU64,
    /// Arrived after the consumer had stopped.
    pub dropped_closed: AtomicU64,
    /// Times a producer had to wait on a full `block` edge.
    pub blocked: AtomicU64,
    /// Deepest queue seen.
    pub max_depth: AtomicU64,
}

/// JSON form of one edge's metrics.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EdgeSnapshot {
    /// `from -> to`.
    pub edge: String,
    /// Policy name.
    pub policy: String,
    /// Capacity.
    pub capacity: usize,
    /// Offered.
    pub sent: u64,
    /// Delivered.
    pub delivered: u64,
    /// Drops by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Total drops (all reasons except a cancelled epoch, which is intended).
    pub dropped_total: u64,
    /// Waits on a full edge (backpressure events).
    pub blocked: u64,
    /// Queue depth now.
    pub depth: u64,
    /// Deepest queue seen.
    pub max_depth: u64,
}

impl EdgeStats {
    pub(crate) fn snapshot(
        &self,
        edge: &str,
        policy: &str,
        capacity: usize,
        depth: usize,
    ) -> EdgeSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut dropped = BTreeMap::new();
        for (k, v) in [
            ("oldest", g(&self.dropped_oldest)),
            ("newest", g(&self.dropped_newest)),
            ("latest", g(&self.dropped_latest)),
            ("age", g(&self.dropped_age)),
            ("cancel", g(&self.dropped_cancel)),
            ("closed", g(&self.dropped_closed)),
        ] {
            dropped.insert(k.to_string(), v);
        }
        let dropped_total = dropped
            .iter()
            .filter(|(k, _)| k.as_str() != "cancel")
            .map(|(_, v)| v)
            .sum();
        EdgeSnapshot {
            edge: edge.to_string(),
            policy: policy.to_string(),
            capacity,
            sent: g(&self.sent),
            delivered: g(&self.delivered),
            dropped,
            dropped_total,
            blocked: g(&self.blocked),
            depth: depth as u64,
            max_depth: g(&self.max_depth),
        }
    }
}

/// Summary of a recorded domain metric.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ValueSummary {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Smallest.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Most recent.
    pub last: f64,
}

#[derive(Debug, Default)]
struct Values {
    samples: Vec<f64>,
    count: u64,
    last: f64,
}

const MAX_VALUE_SAMPLES: usize = 100_000;

/// Metrics of one stage.
#[derive(Debug, Default)]
pub struct StageMetrics {
    processing: Mutex<Histogram>,
    processed: AtomicU64,
    deadline_misses: AtomicU64,
    values: Mutex<BTreeMap<String, Values>>,
    device: Mutex<Option<Arc<DeviceStats>>>,
}

impl StageMetrics {
    pub(crate) fn processed(&self, d: Duration) {
        self.processed.fetch_add(1, Ordering::Relaxed);
        self.processing.lock().record(d);
    }

    /// Record a domain value.
    pub fn record(&self, name: &str, v: f64) {
        let mut m = self.values.lock();
        let e = m.entry(name.to_string()).or_default();
        e.count += 1;
        e.last = v;
        if e.samples.len() < MAX_VALUE_SAMPLES {
            e.samples.push(v);
        }
    }

    /// Count a missed deadline.
    pub fn deadline_missed(&self) {
        self.deadline_misses.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn attach_device(&self, stats: Arc<DeviceStats>) {
        *self.device.lock() = Some(stats);
    }

    pub(crate) fn snapshot(&self, id: &str, kind: &str, device: &str) -> StageSnapshot {
        let values = self
            .values
            .lock()
            .iter()
            .map(|(k, v)| {
                let mut s = v.samples.clone();
                s.sort_by(|a, b| a.total_cmp(b));
                let q = |q: f64| {
                    if s.is_empty() {
                        0.0
                    } else {
                        s[((q * (s.len() - 1) as f64).round() as usize).min(s.len() - 1)]
                    }
                };
                (
                    k.clone(),
                    ValueSummary {
                        count: v.count,
                        mean: if s.is_empty() {
                            0.0
                        } else {
                            s.iter().sum::<f64>() / s.len() as f64
                        },
                        min: s.first().copied().unwrap_or(0.0),
                        p50: q(0.5),
                        p99: q(0.99),
                        max: s.last().copied().unwrap_or(0.0),
                        last: v.last,
                    },
                )
            })
            .collect();
        StageSnapshot {
            id: id.to_string(),
            kind: kind.to_string(),
            device: device.to_string(),
            processed: self.processed.load(Ordering::Relaxed),
            processing: self.processing.lock().summary(),
            deadline_misses: self.deadline_misses.load(Ordering::Relaxed),
            values,
            runtime: self.device.lock().as_ref().map(|d| d.snapshot()),
        }
    }
}

/// JSON form of one stage's metrics.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StageSnapshot {
    /// Stage id.
    pub id: String,
    /// Kind.
    pub kind: String,
    /// Placement as written.
    pub device: String,
    /// Messages processed (or polls that produced output, for sources).
    pub processed: u64,
    /// Time spent in `process` / `poll`.
    pub processing: LatencySummary,
    /// Deadline misses.
    pub deadline_misses: u64,
    /// Domain metrics the stage recorded.
    pub values: BTreeMap<String, ValueSummary>,
    /// Tensor-runtime counters (fallbacks, transfers, resident bytes).
    pub runtime: Option<DeviceStatsSnapshot>,
}

/// One cancellation and how long it took until every stage acknowledged.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CancelReport {
    /// The cancelled epoch.
    pub epoch: u64,
    /// Stages that acknowledged.
    pub acked: usize,
    /// Stages asked.
    pub stages: usize,
    /// From the cancel request to the last acknowledgement, in ms (None if pending).
    pub ack_ms: Option<f64>,
}

/// Everything measured in one run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MetricsSnapshot {
    /// Pipeline name.
    pub pipeline: String,
    /// Seconds since start.
    pub wall_s: f64,
    /// Per stage.
    pub stages: Vec<StageSnapshot>,
    /// Per edge.
    pub edges: Vec<EdgeSnapshot>,
    /// Cancellations.
    pub cancels: Vec<CancelReport>,
}

impl MetricsSnapshot {
    /// A short human summary for the end of a run.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "pipeline `{}`: {:.2} s", self.pipeline, self.wall_s);
        for st in &self.stages {
            let _ = write!(
                s,
                "  {:<14} {:>7} msgs  p50 {:>9.1} us  p99 {:>9.1} us",
                st.id, st.processed, st.processing.p50_us, st.processing.p99_us
            );
            if st.deadline_misses > 0 {
                let _ = write!(s, "  deadline misses {}", st.deadline_misses);
            }
            if let Some(r) = &st.runtime {
                if r.fallback_ops > 0 {
                    let _ = write!(s, "  cpu fallbacks {}", r.fallback_ops);
                }
            }
            for (k, v) in &st.values {
                let _ = write!(s, "  {k} {:.3}", v.last);
            }
            s.push('\n');
        }
        for e in &self.edges {
            if e.dropped_total > 0 {
                let _ = writeln!(
                    s,
                    "  edge {}: {} dropped ({})",
                    e.edge, e.dropped_total, e.policy
                );
            }
        }
        for c in &self.cancels {
            match c.ack_ms {
                Some(ms) => {
                    let _ = writeln!(
                        s,
                        "  cancel epoch {}: acknowledged by {} stages in {:.2} ms",
                        c.epoch, c.acked, ms
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "  cancel epoch {}: {}/{} acknowledged",
                        c.epoch, c.acked, c.stages
                    );
                }
            }
        }
        s
    }
}
