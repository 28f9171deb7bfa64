//! Numerical error of the simulator against f32, per op kind.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// SQNR reported for an error-free output (keeps the JSON finite).
pub const EXACT_SQNR_DB: f64 = 300.0;

/// Running error sums of int8 outputs against an f32 reference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorAccum {
    /// Elements compared.
    pub elements: u64,
    /// Largest `|int8 - f32|`.
    pub max_abs_err: f64,
    /// Largest `|f32|` (the output range the error is relative to).
    pub max_abs_ref: f64,
    /// `Σ (int8 - f32)²`.
    pub sum_sq_err: f64,
    /// `Σ f32²`.
    pub sum_sq_ref: f64,
}

impl ErrorAccum {
    /// Add one output (`got` from int8, `want` from f32).
    pub fn add(&mut self, got: &[f32], want: &[f32]) {
        for (&g, &w) in got.iter().zip(want) {
            let (g, w) = (g as f64, w as f64);
            let e = (g - w).abs();
            if e.is_finite() {
                self.max_abs_err = self.max_abs_err.max(e);
                self.sum_sq_err += e * e;
            }
            if w.is_finite() {
                self.max_abs_ref = self.max_abs_ref.max(w.abs());
                self.sum_sq_ref += w * w;
            }
            self.elements += 1;
        }
    }

    /// Merge another accumulator.
    pub fn merge(&mut self, o: &ErrorAccum) {
        self.elements += o.elements;
        self.max_abs_err = self.max_abs_err.max(o.max_abs_err);
        self.max_abs_ref = self.max_abs_ref.max(o.max_abs_ref);
        self.sum_sq_err += o.sum_sq_err;
        self.sum_sq_ref += o.sum_sq_ref;
    }

    /// Summary figures.
    pub fn stats(&self) -> ErrorStats {
        let sqnr_db = if self.sum_sq_err > 0.0 {
            10.0 * (self.sum_sq_ref / self.sum_sq_err).log10()
        } else if self.elements > 0 {
            EXACT_SQNR_DB
        } else {
            0.0
        };
        ErrorStats {
            elements: self.elements,
            max_abs_err: self.max_abs_err,
            max_err_over_range: if self.max_abs_ref > 0.0 {
                self.max_abs_err / self.max_abs_ref
            } else {
                0.0
            },
            rel_rms_err: if self.sum_sq_ref > 0.0 {
                (self.sum_sq_err / self.sum_sq_ref).sqrt()
            } else {
                0.0
            },
            sqnr_db,
        }
    }
}

/// Error figures of int8 outputs against f32.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ErrorStats {
    /// Elements compared.
    pub elements: u64,
    /// Largest absolute error.
    pub max_abs_err: f64,
    /// `max_abs_err / max|f32|`: worst error as a fraction of the output range.
    pub max_err_over_range: f64,
    /// `‖int8 - f32‖₂ / ‖f32‖₂`.
    pub rel_rms_err: f64,
    /// Signal-to-quantization-noise ratio `10 log10(Σf32² / Σerr²)` in dB
    /// ([`EXACT_SQNR_DB`] when exact; higher is better; int8 is typically 30-45 dB).
    pub sqnr_db: f64,
}

/// Error of one op kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpErrorReport {
    /// Op name ([`edgeflow_runtime::Op::name`]).
    pub op: String,
    /// int8 executions measured.
    pub calls: u64,
    /// The op's own error: int8 kernel vs the f32 op on the *same* inputs
    /// (includes quantizing those inputs and the weights).
    pub local: ErrorStats,
    /// Accumulated error: int8 output vs an f32 shadow of the whole chain of
    /// NPU ops since the data last came from the host.
    pub end_to_end: ErrorStats,
}

/// Counters of compilation and calibration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NpuCounters {
    /// Op sites currently known (calibrating or compiled).
    pub sites: u64,
    /// Executions that observed ranges (calibration warm-up; they are
    /// counted in `int8_runs` too).
    pub calibration_runs: u64,
    /// Static-shape compilations (first shape of a site plus recompiles).
    pub compiles: u64,
    /// Compilations for a new shape of an already compiled site.
    pub recompiles: u64,
    /// Ops refused because their site's recompile budget was spent (they ran
    /// on the CPU through the dispatcher's counted fallback).
    pub budget_rejections: u64,
    /// Eager op executions in int8 (warm-up and compiled).
    pub int8_runs: u64,
    /// Whole captured subgraphs compiled through [`super::NpuDelegate::compile`].
    pub subgraphs_compiled: u64,
}

/// What the NPU simulator reports about its numerics (serializable for the
/// CLI and metrics JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NpuErrorReport {
    /// Backend name, e.g. `npu-sim:0`.
    pub backend: String,
    /// Whether f32 shadow computation was on (without it `ops` is empty).
    pub shadow: bool,
    /// Compilation / calibration counters.
    pub counters: NpuCounters,
    /// Per op kind, sorted by name.
    pub ops: Vec<OpErrorReport>,
    /// All op kinds together.
    pub overall_local: ErrorStats,
}

impl NpuErrorReport {
    /// The entry for one op name.
    pub fn op(&self, name: &str) -> Option<&OpErrorReport> {
        self.ops.iter().find(|o| o.op == name)
    }
}

impl fmt::Display for NpuErrorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counters;
        writeln!(
            f,
            "{} (simulated NPU, int8) sites {} compiles {} recompiles {} budget-rejections {} calib-runs {} int8-runs {}",
            self.backend, c.sites, c.compiles, c.recompiles, c.budget_rejections, c.calibration_runs, c.int8_runs
        )?;
        if !self.shadow {
            return writeln!(f, "  (f32 shadow off: no error figures)");
        }
        writeln!(
            f,
            "  {:<12} {:>7} {:>11} {:>9} {:>9} {:>9} {:>11}",
            "op", "calls", "max|err|", "err/range", "rel-rms", "SQNR dB", "e2e SQNR dB"
        )?;
        for o in &self.ops {
            writeln!(
                f,
                "  {:<12} {:>7} {:>11.3e} {:>9.4} {:>9.4} {:>9.1} {:>11.1}",
                o.op,
                o.calls,
                o.local.max_abs_err,
                o.local.max_err_over_range,
                o.local.rel_rms_err,
                o.local.sqnr_db,
                o.end_to_end.sqnr_db
            )?;
        }
        Ok(())
    }
}

/// Accumulators keyed by op name.
#[derive(Debug, Default, Clone)]
pub(crate) struct ErrorBook {
    pub(crate) ops: BTreeMap<&'static str, (u64, ErrorAccum, ErrorAccum)>,
}

impl ErrorBook {
    pub(crate) fn record(
        &mut self,
        op: &'static str,
        got: &[f32],
        local_ref: &[f32],
        e2e_ref: &[f32],
    ) {
        let e = self.ops.entry(op).or_default();
        e.0 += 1;
        e.1.add(got, local_ref);
        e.2.add(got, e2e_ref);
    }

    pub(crate) fn report(
        &self,
        backend: &str,
        shadow: bool,
        counters: NpuCounters,
    ) -> NpuErrorReport {
        let mut all = ErrorAccum::default();
        let ops = self
            .ops
            .iter()
            .map(|(name, (calls, l, e))| {
                all.merge(l);
                OpErrorReport {
                    op: name.to_string(),
                    calls: *calls,
                    local: l.stats(),
                    end_to_end: e.stats(),
                }
            })
            .collect();
        NpuErrorReport {
            backend: backend.to_string(),
            shadow,
            counters,
            ops,
            overall_local: all.stats(),
        }
    }
}
