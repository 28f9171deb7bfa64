//! int8 quantization primitives of the NPU simulator: affine activation
//! parameters, per-output-channel symmetric weights, int32 bias and the
//! fixed-point requantization multiplier (TFLite / gemmlowp arithmetic, which
//! QNN, RKNN, Ethos-U and CoreML's int8 paths all mirror).

use serde::{Deserialize, Serialize};

/// Smallest int8 value.
pub(super) const QMIN: i32 = -128;
/// Largest int8 value.
pub(super) const QMAX: i32 = 127;

/// How activation (tensor) ranges are turned into int8 parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ActivationScheme {
    /// `real = scale * (q - zero_point)`, the range `[min(min,0), max(max,0)]`
    /// mapped onto `[-128, 127]`. Uses all 256 codes for one-sided ranges
    /// (ReLU / sigmoid outputs). Default, as in TFLite int8 and QNN.
    #[default]
    Asymmetric,
    /// `zero_point = 0`, `scale = max|x| / 127` (Ethos-U / some DSPs).
    /// Loses one bit on one-sided ranges, cheaper kernels.
    Symmetric,
}

/// Per-tensor affine quantization of an activation: `real = scale * (q - zero_point)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QParams {
    /// Step between adjacent int8 codes.
    pub scale: f32,
    /// The int8 code that represents real 0 (exactly).
    pub zero_point: i32,
}

impl QParams {
    /// Parameters covering the observed range `[min, max]`.
    ///
    /// The range is widened to include 0 so that zero (padding, ReLU) is
    /// exact. A degenerate range gets a tiny positive scale.
    pub fn from_range(min: f32, max: f32, scheme: ActivationScheme) -> QParams {
        let (min, max) = if min.is_finite() && max.is_finite() {
            (min.min(0.0), max.max(0.0))
        } else {
            (0.0, 0.0)
        };
        match scheme {
            ActivationScheme::Symmetric => {
                let a = min.abs().max(max.abs());
                QParams {
                    scale: if a > 0.0 { a / QMAX as f32 } else { 1e-8 },
                    zero_point: 0,
                }
            }
            ActivationScheme::Asymmetric => {
                let span = max - min;
                if span <= 0.0 {
                    return QParams {
                        scale: 1e-8,
                        zero_point: 0,
                    };
                }
                let scale = span / (QMAX - QMIN) as f32;
                let zp = (QMIN as f32 - min / scale).round() as i32;
                QParams {
                    scale,
                    zero_point: zp.clamp(QMIN, QMAX),
                }
            }
        }
    }

    /// Quantize one value (round to nearest, saturate).
    #[inline]
    pub fn quantize(&self, x: f32) -> i32 {
        ((x / self.scale).round() as i32)
            .saturating_add(self.zero_point)
            .clamp(QMIN, QMAX)
    }

    /// Quantize one value and subtract the zero point (the form kernels use).
    #[inline]
    pub fn quantize_centered(&self, x: f32) -> i32 {
        self.quantize(x) - self.zero_point
    }

    /// Dequantize one code.
    #[inline]
    pub fn dequantize(&self, q: i32) -> f32 {
        self.scale * (q - self.zero_point) as f32
    }

    /// Quantize-dequantize a slice (what an int8 tensor can represent).
    pub fn fake_quantize(&self, xs: &[f32]) -> Vec<f32> {
        xs.iter()
            .map(|&x| self.dequantize(self.quantize(x)))
            .collect()
    }
}

/// int8 weights, symmetric, one scale per output channel (dim 0), as NPUs
/// store Linear `[n, k]` and Conv `[c_out, c_in/groups, ...]` weights.
#[derive(Debug, Clone)]
pub struct QWeight {
    /// Codes in `[-127, 127]` (symmetric: -128 is never used), row-major.
    pub data: Vec<i8>,
    /// One scale per output channel: `w[c, i] ≈ scales[c] * data[c, i]`.
    pub scales: Vec<f32>,
    /// Elements per output channel.
    pub per_channel: usize,
    /// Logical dims of the weight (`dims[0]` = output channels).
    pub dims: Vec<usize>,
}

impl QWeight {
    /// Quantize `w` (row-major, dims `dims`, output channels `dims[0]`) per
    /// output channel. A channel that is all zero gets scale 1 (codes all 0).
    pub fn quantize(w: &[f32], dims: &[usize]) -> QWeight {
        let channels = dims.first().copied().unwrap_or(0);
        let per_channel = w.len().checked_div(channels).unwrap_or(0);
        let mut data = Vec::with_capacity(w.len());
        let mut scales = Vec::with_capacity(channels);
        for c in 0..channels {
            let row = &w[c * per_channel..(c + 1) * per_channel];
            let amax = row.iter().fold(0f32, |m, &x| m.max(x.abs()));
            let s = if amax > 0.0 && amax.is_finite() {
                amax / 127.0
            } else {
                1.0
            };
            scales.push(s);
            data.extend(
                row.iter()
                    .map(|&x| ((x / s).round() as i32).clamp(-127, 127) as i8),
            );
        }
        QWeight {
            data,
            scales,
            per_channel,
            dims: dims.to_vec(),
        }
    }

    /// Number of output channels.
    pub fn channels(&self) -> usize {
        self.scales.len()
    }

    /// Dequantized weights (for error analysis).
    pub fn dequantize(&self) -> Vec<f32> {
        self.data
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let c = i.checked_div(self.per_channel).unwrap_or(0);
                q as f32 * self.scales[c]
            })
            .collect()
    }

    /// Bytes on the NPU: int8 codes plus one f32 scale per channel.
    pub fn size_bytes(&self) -> usize {
        self.data.len() + 4 * self.scales.len()
    }
}

/// A real multiplier `m` as `m0 * 2^(shift - 31)` with `m0` a Q31 int32 in
/// `[2^30, 2^31)`: the fixed-point requantization scale NPUs use instead of
/// float (gemmlowp `QuantizeMultiplier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Multiplier {
    /// Q31 mantissa.
    pub m0: i32,
    /// Power-of-two exponent (positive = left shift).
    pub shift: i32,
}

impl Multiplier {
    /// Encode a non-negative real multiplier.
    pub fn new(m: f64) -> Multiplier {
        if m <= 0.0 || !m.is_finite() {
            return Multiplier { m0: 0, shift: 0 };
        }
        // frexp: m = q * 2^shift, q in [0.5, 1).
        let mut shift = m.log2().floor() as i32 + 1;
        let mut q = m / 2f64.powi(shift);
        while q >= 1.0 {
            q /= 2.0;
            shift += 1;
        }
        while q < 0.5 {
            q *= 2.0;
            shift -= 1;
        }
        let mut q_fixed = (q * (1i64 << 31) as f64).round() as i64;
        if q_fixed == 1i64 << 31 {
            q_fixed /= 2;
            shift += 1;
        }
        if shift < -31 {
            return Multiplier { m0: 0, shift: 0 };
        }
        Multiplier {
            m0: q_fixed as i32,
            shift: shift.min(30),
        }
    }

    /// `round(x * m)` in integer arithmetic, saturating to int32.
    #[inline]
    pub fn apply(&self, x: i32) -> i32 {
        let left = self.shift.max(0);
        let right = (-self.shift).max(0);
        let shifted = ((x as i64) << left).clamp(i32::MIN as i64, i32::MAX as i64) as i32;
        rounding_divide_by_pot(
            saturating_rounding_doubling_high_mul(shifted, self.m0),
            right,
        )
    }
}

#[inline]
fn saturating_rounding_doubling_high_mul(a: i32, b: i32) -> i32 {
    if a == i32::MIN && b == i32::MIN {
        return i32::MAX;
    }
    let ab = a as i64 * b as i64;
    let nudge: i64 = if ab >= 0 { 1 << 30 } else { 1 - (1 << 30) };
    ((ab + nudge) / (1i64 << 31)) as i32
}

#[inline]
fn rounding_divide_by_pot(x: i32, exponent: i32) -> i32 {
    if exponent <= 0 {
        return x;
    }
    let exponent = exponent.min(31);
    let mask: i64 = (1i64 << exponent) - 1;
    let x = x as i64;
    let remainder = x & mask;
    let threshold = (mask >> 1) + i64::from(x < 0);
    ((x >> exponent) + i64::from(remainder > threshold)) as i32
}

/// Running min/max of a tensor seen during calibration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RangeObserver {
    /// Smallest value seen.
    pub min: f32,
    /// Largest value seen.
    pub max: f32,
}

impl Default for RangeObserver {
    fn default() -> Self {
        RangeObserver {
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
        }
    }
}

impl RangeObserver {
    /// Widen the range by the finite values of `xs`.
    pub fn observe(&mut self, xs: &[f32]) {
        for &x in xs {
            if x.is_finite() {
                self.min = self.min.min(x);
                self.max = self.max.max(x);
            }
        }
    }

    /// int8 parameters for the observed range.
    pub fn qparams(&self, scheme: ActivationScheme) -> QParams {
        QParams::from_range(self.min, self.max, scheme)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_channel_round_trip_is_within_half_a_step() {
        // Channels with very different magnitudes: per-channel scales keep
        // each row's error within scale/2 = max|row| / 254.
        let channels = 5;
        let k = 37;
        let w: Vec<f32> = (0..channels * k)
            .map(|i| {
                let c = i / k;
                let mag = 10f32.powi(c as i32 - 2);
                mag * ((i as f32 * 0.731).sin())
            })
            .collect();
        let q = QWeight::quantize(&w, &[channels, k]);
        assert_eq!(q.channels(), channels);
        let d = q.dequantize();
        for c in 0..channels {
            let row = &w[c * k..(c + 1) * k];
            let amax = row.iter().fold(0f32, |m, &x| m.max(x.abs()));
            let bound = amax / 254.0 * 1.0001 + 1e-12;
            for i in 0..k {
                let err = (d[c * k + i] - row[i]).abs();
                assert!(err <= bound, "channel {c} elem {i}: err {err} > {bound}");
            }
        }
        // A per-tensor scale would lose the small channel entirely.
        let global = w.iter().fold(0f32, |m, &x| m.max(x.abs())) / 127.0;
        let small_row_amax = w[..k].iter().fold(0f32, |m, &x| m.max(x.abs()));
        assert!(
            small_row_amax < global,
            "test premise: row 0 below one global step"
        );
        assert!(q.scales[0] < global / 100.0);
    }

    #[test]
    fn activation_round_trip_bounds() {
        for scheme in [ActivationScheme::Asymmetric, ActivationScheme::Symmetric] {
            let p = QParams::from_range(-1.5, 3.0, scheme);
            // Zero is exact.
            assert_eq!(p.dequantize(p.quantize(0.0)), 0.0);
            for i in 0..=1000 {
                let x = -1.5 + 4.5 * i as f32 / 1000.0;
                let err = (p.dequantize(p.quantize(x)) - x).abs();
                assert!(err <= p.scale * 0.5001, "{scheme:?} x={x} err={err}");
            }
            // Out of range saturates.
            assert!(p.dequantize(p.quantize(100.0)) <= 3.0 + p.scale);
        }
        let a = QParams::from_range(-1.5, 3.0, ActivationScheme::Asymmetric);
        let s = QParams::from_range(-1.5, 3.0, ActivationScheme::Symmetric);
        assert!(a.scale < s.scale, "asymmetric uses the codes better");
    }

    #[test]
    fn fixed_point_multiplier_matches_float() {
        for &m in &[0.000_123, 0.0071, 0.25, 0.5, 0.999_999, 1.0, 1.7, 3.9] {
            let mq = Multiplier::new(m);
            for &x in &[-100_000i32, -12_345, -3, 0, 1, 7, 999, 54_321, 1_000_000] {
                let want = (x as f64 * m).round();
                let got = mq.apply(x) as f64;
                assert!(
                    (got - want).abs() <= 1.0,
                    "m={m} x={x}: got {got}, want {want}"
                );
            }
        }
        assert_eq!(Multiplier::new(0.0).apply(12345), 0);
    }
}
