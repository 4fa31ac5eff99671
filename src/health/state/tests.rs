//! Unit tests of health transitions and ejection arithmetic.

use super::*;

fn fail() -> CheckFailure {
    CheckFailure::Connect { url: "x".into() }
}

fn cfg(rise: u32, fall: u32) -> HealthCheck {
    HealthCheck {
        rise,
        fall,
        ..HealthCheck::default()
    }
}

fn policy(n: u32) -> OutlierDetection {
    OutlierDetection {
        consecutive_failures: n,
        base_ejection: Duration::from_secs(10),
        max_ejection: Duration::from_secs(25),
        max_ejected_percent: 50,
    }
}

#[test]
fn first_pass_makes_a_new_backend_healthy() {
    let h = HealthState::default();
    assert!(!h.eligible(0), "no traffic before the first check");
    assert_eq!(
        h.observe_check("b", Ok(()), &cfg(3, 3), 0),
        Some(CheckStatus::Healthy)
    );
    assert!(h.eligible(0));
}

#[test]
fn fall_then_rise() {
    let h = HealthState::default();
    let c = cfg(2, 3);
    h.observe_check("b", Ok(()), &c, 0);
    assert_eq!(h.observe_check("b", Err(fail()), &c, 0), None);
    assert_eq!(h.observe_check("b", Err(fail()), &c, 0), None);
    assert_eq!(
        h.observe_check("b", Err(fail()), &c, 0),
        Some(CheckStatus::Unhealthy)
    );
    assert!(!h.eligible(0));
    assert_eq!(
        h.observe_check("b", Ok(()), &c, 0),
        None,
        "one pass is not enough with rise 2"
    );
    assert_eq!(
        h.observe_check("b", Ok(()), &c, 0),
        Some(CheckStatus::Healthy)
    );
}

#[test]
fn a_failure_in_between_restarts_the_count() {
    let h = HealthState::default();
    let c = cfg(2, 2);
    h.observe_check("b", Ok(()), &c, 0);
    h.observe_check("b", Err(fail()), &c, 0);
    h.observe_check("b", Ok(()), &c, 0);
    assert_eq!(h.observe_check("b", Err(fail()), &c, 0), None);
    assert_eq!(h.status(), CheckStatus::Healthy);
}

#[test]
fn consecutive_failures_eject_for_growing_capped_times() {
    let h = HealthState::default();
    h.observe_check("b", Ok(()), &cfg(1, 1), 0);
    let p = policy(3);
    assert_eq!(h.record_failure(&p, 0, || true), None);
    h.record_success();
    assert_eq!(h.record_failure(&p, 0, || true), None);
    assert_eq!(h.record_failure(&p, 0, || true), None);
    let first = h.record_failure(&p, 0, || true).unwrap();
    assert_eq!(
        first,
        Ejection {
            duration: Duration::from_secs(10),
            count: 1
        }
    );
    assert!(!h.eligible(5_000));
    assert!(
        !h.eligible(20_000),
        "a checked backend needs a passing check to return"
    );
    assert_eq!(h.observe_check("b", Ok(()), &cfg(1, 1), 5_000), None);
    assert!(
        !h.eligible(5_000),
        "a check before the time is up does not return it"
    );
    h.observe_check("b", Ok(()), &cfg(1, 1), 10_000);
    assert!(h.eligible(10_000));
    for _ in 0..3 {
        h.record_failure(&p, 10_000, || true);
    }
    assert_eq!(h.ejections_total(), 2);
    for _ in 0..3 {
        h.record_failure(&p, 40_000, || true);
    }
    // Already ejected at 40s (needs a check): no third ejection yet.
    assert_eq!(h.ejections_total(), 2);
    h.observe_check("b", Ok(()), &cfg(1, 1), 40_000);
    let third = (0..3)
        .filter_map(|_| h.record_failure(&p, 40_000, || true))
        .next()
        .unwrap();
    assert_eq!(
        third.duration,
        Duration::from_secs(25),
        "capped at max_ejection"
    );
}

#[test]
fn pool_guard_and_zero_policy_prevent_ejection() {
    let h = HealthState::default();
    h.set_unchecked();
    for _ in 0..10 {
        assert_eq!(h.record_failure(&policy(2), 0, || false), None);
        assert_eq!(h.record_failure(&policy(0), 0, || true), None);
    }
    assert!(h.eligible(0));
}

#[test]
fn unchecked_backends_return_when_the_time_is_up() {
    let h = HealthState::default();
    h.set_unchecked();
    h.record_failure(&policy(1), 1_000, || true).unwrap();
    assert!(!h.eligible(5_000));
    assert!(h.eligible(11_000));
}
