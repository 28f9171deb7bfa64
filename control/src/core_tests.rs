//! Period-by-period tests of the controller logic.

use super::*;

const P: u64 = 20_000_000; // 20 ms in ns

fn cfg(threshold: f32) -> CoreConfig {
    CoreConfig {
        period: Duration::from_nanos(P),
        threshold,
        horizon: 4,
        merge: MergeMode::LatestOnly,
        safe: SafeMode::Hold,
        max_obs_age: Duration::from_millis(100),
        grace: Duration::from_millis(40),
        dim: Some(1),
        request_timeout: Duration::from_secs(10),
    }
}

/// Period k runs at k * P.
fn t(k: u64) -> u64 {
    k * P
}

#[test]
fn asks_when_below_threshold_and_measures_delay() {
    let mut c = ControllerCore::new(cfg(0.5));
    // Period 0: empty queue, asks for step 1.
    let k = c.tick(t(0));
    assert_eq!(
        k.request,
        Some(Request {
            step: 1,
            last_delay: None,
            prefix: vec![],
            dim: 1,
        })
    );
    // No second request while one is outstanding.
    assert_eq!(c.tick(t(1)).request, None);
    assert_eq!(c.tick(t(2)).request, None);
    // The chunk for steps 1..5 arrives at 2.5 periods: delay 3 periods;
    // steps 1 and 2 already passed.
    let (rep, delay) = c
        .on_chunk(1, 1, &[1.0, 2.0, 3.0, 4.0], t(2) + P / 2)
        .expect("chunk");
    assert_eq!(delay, Some(3));
    assert_eq!(rep.stale, 2);
    assert_eq!(c.dropped(), 2);
    // Step 3 pops 3.0; one action (step 4) left, 1 < 0.5 * 4: ask, with the delay.
    let k = c.tick(t(3));
    assert_eq!((k.source, k.command.clone()), (Source::Queue, vec![3.0]));
    assert_eq!(
        k.request,
        Some(Request {
            step: 4,
            last_delay: Some(3),
            prefix: vec![4.0],
            dim: 1,
        })
    );
}

#[test]
fn no_request_while_queue_is_above_threshold() {
    let mut c = ControllerCore::new(cfg(0.5));
    c.tick(t(0));
    c.on_chunk(1, 1, &[1.0, 2.0, 3.0, 4.0], t(0) + 1)
        .expect("chunk");
    // Step 1 leaves 3 (>= 2): no request; step 2 leaves 2: none; step 3 leaves 1: ask.
    assert_eq!(c.tick(t(1)).request, None);
    assert_eq!(c.tick(t(2)).request, None);
    assert!(c.tick(t(3)).request.is_some());
}

#[test]
fn requests_carry_the_queued_prefix_up_to_the_first_gap() {
    let mut c = ControllerCore::new(CoreConfig {
        dim: Some(2),
        ..cfg(1.0)
    });
    c.tick(t(0));
    // Steps 6 and 1..=4 queued (5 missing), 2-D actions; H = 4.
    c.on_chunk(6, 2, &[6., 6.], t(0) + 1).expect("chunk");
    c.on_chunk(1, 2, &[1., 1., 2., 2., 3., 3., 4., 4.], t(0) + 2)
        .expect("chunk");
    // Step 1 leaves 2, 3, 4, 6: 4 is not below 1.0 x 4.
    assert_eq!(c.tick(t(1)).request, None);
    // Step 2 leaves 3, 4, 6: ask, with what executes from step 3 on.
    let r = c.tick(t(2)).request.expect("a request");
    assert_eq!(r.step, 3);
    assert_eq!(r.prefix, vec![3., 3., 4., 4.], "stops at the gap at step 5");
    assert_eq!(r.dim, 2);
}

#[test]
fn synchronous_waits_for_each_chunk() {
    let mut c = ControllerCore::new(cfg(0.0));
    assert!(c.tick(t(0)).request.is_some());
    c.on_chunk(1, 1, &[1.0, 2.0], t(0) + 1).expect("chunk");
    let k = c.tick(t(1));
    assert_eq!(
        k.request, None,
        "one action left: sync mode waits until empty"
    );
    let k = c.tick(t(2));
    assert_eq!(k.command, vec![2.0]);
    assert_eq!(
        k.request,
        Some(Request {
            step: 3,
            last_delay: Some(1),
            prefix: vec![],
            dim: 1,
        })
    );
    // Waiting for the next chunk: hold, not an underrun.
    let k = c.tick(t(3));
    assert_eq!((k.source, k.underrun), (Source::Hold, false));
}

#[test]
fn watchdog_safe_hold_in_the_same_period_and_recovery() {
    let mut c = ControllerCore::new(cfg(0.5));
    c.tick(t(0));
    c.on_chunk(1, 1, &[1.0, 2.0], t(0) + 1).expect("chunk");
    assert_eq!(c.tick(t(1)).command, vec![1.0]);
    assert_eq!(c.tick(t(2)).command, vec![2.0]);
    // Queue empty from step 3 (t = 60 ms); grace 40 ms.
    let k = c.tick(t(3));
    assert_eq!((k.source, k.underrun), (Source::Hold, true));
    let k = c.tick(t(4));
    assert_eq!(k.source, Source::Hold, "20 ms empty < 40 ms grace");
    let k = c.tick(t(5));
    assert_eq!(
        k.source,
        Source::Safe,
        "40 ms empty: safe action in this period"
    );
    assert_eq!(k.safe_started, Some(SafeReason::EmptyQueue));
    assert_eq!(k.safe_reaction_ns, Some(0), "due exactly at this period");
    assert_eq!(k.command, vec![2.0], "hold = last command");
    assert_eq!(c.tick(t(6)).source, Source::Safe);
    // Fresh actions: resume in the next period; the episode lasted 2 periods.
    c.on_chunk(7, 1, &[7.0, 8.0], t(6) + 1).expect("chunk");
    let k = c.tick(t(7));
    assert_eq!(
        (k.source, k.command.clone(), k.safe_ended),
        (Source::Queue, vec![7.0], Some(2))
    );
    let s = c.stats();
    assert_eq!((s.safe_episodes, s.safe_periods, s.underruns), (1, 2, 4));
}

#[test]
fn stale_observation_triggers_zero_safe_action() {
    let mut cf = cfg(0.5);
    cf.safe = SafeMode::Zero;
    cf.dim = Some(2);
    let mut c = ControllerCore::new(cf);
    c.on_observation(t(0));
    c.on_chunk(
        0,
        2,
        &[
            1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0, 7.0, 7.0,
        ],
        t(0),
    )
    .expect("chunk");
    for k in 0..5 {
        assert_eq!(c.tick(t(k)).source, Source::Queue, "period {k}");
    }
    // Observation from t=0 is 120 ms old at period 6 (> 100 ms).
    let k = c.tick(t(6));
    assert_eq!(
        (k.source, k.safe_started),
        (Source::Safe, Some(SafeReason::StaleObservation))
    );
    // Due at 100 ms, published at 120 ms: within one period.
    assert_eq!(k.safe_reaction_ns, Some(t(6) - 100_000_000));
    assert_eq!(k.command, vec![0.0, 0.0]);
    c.on_observation(t(6) + 1);
    assert_eq!(c.tick(t(7)).source, Source::Queue);
}

#[test]
fn peer_lost_holds() {
    let mut c = ControllerCore::new(cfg(0.5));
    c.on_chunk(0, 1, &[1.0, 2.0, 3.0], 0).expect("chunk");
    c.tick(t(0));
    c.set_peer_lost(true, t(1) - 5);
    let k = c.tick(t(1));
    assert_eq!(
        (k.source, k.safe_started, k.command),
        (Source::Safe, Some(SafeReason::PeerLost), vec![1.0])
    );
}
