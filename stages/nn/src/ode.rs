//! A flow-matching ODE sampler: integrate `dx/dt = v(x, t)` over a step
//! [`Schedule`] with Euler, midpoint, RK4 or RK4's 3/8 rule
//! ([`OdeMethod`]), checking a
//! caller's cancel closure between steps.

use crate::{Error, Result};
use edgeflow_runtime::{Device, Tensor};

/// The integration rule of one step `x(t) -> x(t + h)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OdeMethod {
    /// `x + h v(x, t)`: one velocity per step, first order.
    Euler,
    /// `x + h v(x + h/2 v(x, t), t + h/2)`: two per step, second order.
    Midpoint,
    /// Classic Runge-Kutta: four per step, fourth order.
    Rk4,
    /// Runge-Kutta's 3/8 rule: four per step, fourth order, evaluated at
    /// `t, t + h/3, t + 2h/3, t + h` with weights `1/8, 3/8, 3/8, 1/8`
    /// (torchdiffeq's `rk4`, the solver of F5-TTS and Qwen2.5-Omni's DiT).
    Rk4ThreeEighths,
}

impl OdeMethod {
    /// Velocity evaluations per step.
    pub fn evaluations_per_step(self) -> usize {
        match self {
            OdeMethod::Euler => 1,
            OdeMethod::Midpoint => 2,
            OdeMethod::Rk4 | OdeMethod::Rk4ThreeEighths => 4,
        }
    }
}

/// The times the sampler visits, `t_0 .. t_n` (`n` steps).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    times: Vec<f32>,
}

impl Schedule {
    /// `steps` equal steps from 0 to 1 (flow matching's noise -> data).
    pub fn uniform(steps: usize) -> Result<Self> {
        Self::uniform_between(0.0, 1.0, steps)
    }

    /// `steps` equal steps from `t0` to `t1`.
    pub fn uniform_between(t0: f32, t1: f32, steps: usize) -> Result<Self> {
        if steps == 0 {
            return Err(Error::BadInput(
                "an ODE schedule needs at least 1 step".into(),
            ));
        }
        let times = (0..=steps)
            .map(|i| {
                let a = i as f64 / steps as f64;
                (t0 as f64 + (t1 as f64 - t0 as f64) * a) as f32
            })
            .collect();
        Self::times(times)
    }

    /// A configured list of times (at least two, finite, strictly
    /// increasing or strictly decreasing), e.g. a schedule shifted toward
    /// the noise end.
    pub fn times(times: Vec<f32>) -> Result<Self> {
        if times.len() < 2 {
            return Err(Error::BadInput(format!(
                "an ODE schedule needs at least 2 times, got {}",
                times.len()
            )));
        }
        if let Some(t) = times.iter().find(|t| !t.is_finite()) {
            return Err(Error::BadInput(format!(
                "ODE schedule time {t} is not finite"
            )));
        }
        let up = times[1] > times[0];
        if !times
            .windows(2)
            .all(|w| if up { w[1] > w[0] } else { w[1] < w[0] })
        {
            return Err(Error::BadInput(format!(
                "ODE schedule times must be strictly monotone: {times:?}"
            )));
        }
        Ok(Schedule { times })
    }

    /// The times.
    pub fn as_slice(&self) -> &[f32] {
        &self.times
    }

    /// Number of steps.
    pub fn steps(&self) -> usize {
        self.times.len() - 1
    }
}

/// Integrates a velocity field over a [`Schedule`] with an [`OdeMethod`].
#[derive(Debug, Clone, PartialEq)]
pub struct OdeSampler {
    /// The rule.
    pub method: OdeMethod,
    /// The times.
    pub schedule: Schedule,
}

impl OdeSampler {
    /// A sampler.
    pub fn new(method: OdeMethod, schedule: Schedule) -> Self {
        OdeSampler { method, schedule }
    }

    /// Integrate from `x0` at the first time to the last. `velocity(x, t)`
    /// is the model (any error type that takes this crate's); `cancelled()`
    /// is asked before every step (a stage passes its context's cancel
    /// check) and a `true` ends the run with [`Error::Cancelled`].
    pub fn sample<E, V, C>(
        &self,
        dev: &Device,
        x0: &Tensor,
        mut velocity: V,
        mut cancelled: C,
    ) -> Result<Tensor, E>
    where
        E: From<Error>,
        V: FnMut(&Tensor, f32) -> Result<Tensor, E>,
        C: FnMut() -> bool,
    {
        let times = self.schedule.as_slice();
        let total = self.schedule.steps();
        let rt = |r: edgeflow_runtime::Result<Tensor>| r.map_err(|e| E::from(Error::from(e)));
        // x + s * v, with s in f64 as the op takes it.
        let axpy = |x: &Tensor, s: f64, v: &Tensor| -> Result<Tensor, E> {
            let sv = rt(dev.scale(v, s))?;
            rt(dev.add(x, &sv))
        };
        let mut x = x0.clone();
        for (i, w) in times.windows(2).enumerate() {
            if cancelled() {
                return Err(E::from(Error::Cancelled { steps: i, total }));
            }
            let (t, h) = (w[0], w[1] - w[0]);
            let hd = h as f64;
            x = match self.method {
                OdeMethod::Euler => {
                    let k1 = velocity(&x, t)?;
                    axpy(&x, hd, &k1)?
                }
                OdeMethod::Midpoint => {
                    let k1 = velocity(&x, t)?;
                    let k2 = velocity(&axpy(&x, hd / 2.0, &k1)?, t + h / 2.0)?;
                    axpy(&x, hd, &k2)?
                }
                OdeMethod::Rk4 => {
                    let k1 = velocity(&x, t)?;
                    let k2 = velocity(&axpy(&x, hd / 2.0, &k1)?, t + h / 2.0)?;
                    let k3 = velocity(&axpy(&x, hd / 2.0, &k2)?, t + h / 2.0)?;
                    let k4 = velocity(&axpy(&x, hd, &k3)?, w[1])?;
                    // x + h/6 (k1 + 2 k2 + 2 k3 + k4)
                    let s23 = rt(dev.add(&k2, &k3))?;
                    let s14 = rt(dev.add(&k1, &k4))?;
                    let sum = axpy(&s14, 2.0, &s23)?;
                    axpy(&x, hd / 6.0, &sum)?
                }
                OdeMethod::Rk4ThreeEighths => {
                    // Times as f32 sums, as the reference computes them.
                    let (t1, t2) = (t + h * (1.0 / 3.0), t + h * (2.0 / 3.0));
                    let k1 = velocity(&x, t)?;
                    let k2 = velocity(&axpy(&x, hd / 3.0, &k1)?, t1)?;
                    // x + h (k2 - k1/3)
                    let d3 = axpy(&k2, -1.0 / 3.0, &k1)?;
                    let k3 = velocity(&axpy(&x, hd, &d3)?, t2)?;
                    // x + h (k1 - k2 + k3)
                    let d4 = rt(dev.add(&rt(dev.sub(&k1, &k2))?, &k3))?;
                    let k4 = velocity(&axpy(&x, hd, &d4)?, w[1])?;
                    // x + h/8 (k1 + 3 (k2 + k3) + k4)
                    let s23 = rt(dev.add(&k2, &k3))?;
                    let s14 = rt(dev.add(&k1, &k4))?;
                    let sum = axpy(&s14, 3.0, &s23)?;
                    axpy(&x, hd / 8.0, &sum)?
                }
            };
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> Device {
        edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu")
    }

    /// `dx/dt = -x` from x(0) = 1 on [0, 2]: the error at t = 2 against
    /// e^-2 for `steps` steps.
    fn decay_error(method: OdeMethod, steps: usize) -> f64 {
        let dev = dev();
        let s = OdeSampler::new(
            method,
            Schedule::uniform_between(0.0, 2.0, steps).expect("sched"),
        );
        let x0 = Tensor::from_vec(vec![1.0], &[1]).expect("x0");
        let x = s
            .sample::<Error, _, _>(&dev, &x0, |x, _| Ok(dev.scale(x, -1.0)?), || false)
            .expect("sample");
        let v = x.to_vec_f32().expect("v")[0] as f64;
        (v - (-2f64).exp()).abs()
    }

    /// Halving the step divides the error by 2^order.
    #[test]
    fn each_method_shows_its_order_of_accuracy_on_exponential_decay() {
        for (method, order, steps) in [
            (OdeMethod::Euler, 1, 32),
            (OdeMethod::Midpoint, 2, 16),
            (OdeMethod::Rk4, 4, 4),
            (OdeMethod::Rk4ThreeEighths, 4, 4),
        ] {
            let (e1, e2) = (decay_error(method, steps), decay_error(method, 2 * steps));
            let ratio = e1 / e2;
            let want = 2f64.powi(order);
            assert!(
                ratio > want * 0.8 && ratio < want * 1.25,
                "{method:?}: error {e1:.3e} -> {e2:.3e}, ratio {ratio:.2}, expected ~{want}"
            );
        }
        // Higher orders are more accurate for the same steps.
        assert!(decay_error(OdeMethod::Rk4, 8) < decay_error(OdeMethod::Midpoint, 8));
        assert!(decay_error(OdeMethod::Midpoint, 8) < decay_error(OdeMethod::Euler, 8));
    }

    /// `dx/dt = 2t` (x = t^2): the midpoint rule and RK4 are exact for it on
    /// any schedule; Euler's error is the sum of `h^2` per step.
    #[test]
    fn time_dependent_velocity_on_a_listed_schedule() {
        let dev = dev();
        let times = vec![0.0, 0.1, 0.35, 0.5, 1.0];
        let sched = Schedule::times(times.clone()).expect("sched");
        let x0 = Tensor::from_vec(vec![0.0, 1.0], &[2]).expect("x0");
        let v = |x: &Tensor, t: f32| -> Result<Tensor> {
            Ok(dev.affine(&dev.scale(x, 0.0)?, 1.0, 2.0 * t as f64)?)
        };
        for method in [
            OdeMethod::Midpoint,
            OdeMethod::Rk4,
            OdeMethod::Rk4ThreeEighths,
        ] {
            let x = OdeSampler::new(method, sched.clone())
                .sample(&dev, &x0, v, || false)
                .expect("s");
            let got = x.to_vec_f32().expect("v");
            assert!(
                (got[0] - 1.0).abs() < 1e-6 && (got[1] - 2.0).abs() < 1e-6,
                "{method:?}: {got:?}"
            );
        }
        let x = OdeSampler::new(OdeMethod::Euler, sched)
            .sample(&dev, &x0, v, || false)
            .expect("s");
        let h2: f64 = times
            .windows(2)
            .map(|w| ((w[1] - w[0]) as f64).powi(2))
            .sum();
        assert!((x.to_vec_f32().expect("v")[0] as f64 - (1.0 - h2)).abs() < 1e-6);
    }

    /// One step of `dx/dt = t x^2` from x(0.2) = 0.5 with h = 0.6: the 3/8
    /// rule's stages written out in f64, and a result that differs from
    /// the classic rule's (the two agree only to fourth order).
    #[test]
    fn three_eighths_rule_takes_its_own_stages() {
        let dev = dev();
        let f = |t: f64, x: f64| t * x * x;
        let (t0, h, x0) = (0.2f64, 0.6f64, 0.5f64);
        let k1 = f(t0, x0);
        let k2 = f(t0 + h / 3.0, x0 + h * k1 / 3.0);
        let k3 = f(t0 + 2.0 * h / 3.0, x0 + h * (k2 - k1 / 3.0));
        let k4 = f(t0 + h, x0 + h * (k1 - k2 + k3));
        let want = x0 + h * (k1 + 3.0 * (k2 + k3) + k4) / 8.0;
        let sched = Schedule::times(vec![0.2, 0.8]).expect("sched");
        let x = Tensor::from_vec(vec![0.5], &[1]).expect("x0");
        let run = |method| {
            let v = |x: &Tensor, t: f32| -> Result<Tensor> {
                let x2 = dev.mul(x, x)?;
                Ok(dev.scale(&x2, t as f64)?)
            };
            OdeSampler::new(method, sched.clone())
                .sample(&dev, &x, v, || false)
                .expect("s")
                .to_vec_f32()
                .expect("v")[0] as f64
        };
        let got = run(OdeMethod::Rk4ThreeEighths);
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        let classic = run(OdeMethod::Rk4);
        assert!(
            (classic - want).abs() > 1e-5,
            "classic {classic} vs 3/8 {want}"
        );
    }

    #[test]
    fn a_cancel_between_steps_stops_with_a_typed_error() {
        let dev = dev();
        let s = OdeSampler::new(OdeMethod::Midpoint, Schedule::uniform(10).expect("sched"));
        let x0 = Tensor::from_vec(vec![1.0], &[1]).expect("x0");
        let mut calls = 0;
        let mut checks = 0;
        let r = s.sample::<Error, _, _>(
            &dev,
            &x0,
            |x, _| {
                calls += 1;
                Ok(x.clone())
            },
            || {
                checks += 1;
                checks > 3
            },
        );
        match r {
            Err(Error::Cancelled {
                steps: 3,
                total: 10,
            }) => {}
            other => panic!("expected a cancel after 3 steps, got {other:?}"),
        }
        assert_eq!(calls, 3 * OdeMethod::Midpoint.evaluations_per_step());
    }

    #[test]
    fn bad_schedules_are_rejected() {
        assert!(Schedule::uniform(0).is_err());
        assert!(Schedule::times(vec![0.5]).is_err());
        assert!(Schedule::times(vec![0.0, 0.5, 0.5]).is_err());
        assert!(Schedule::times(vec![0.0, f32::NAN]).is_err());
        assert_eq!(
            Schedule::times(vec![1.0, 0.2, 0.0]).expect("down").steps(),
            2
        );
        assert_eq!(
            Schedule::uniform(4).expect("u").as_slice(),
            &[0.0, 0.25, 0.5, 0.75, 1.0]
        );
    }
}
