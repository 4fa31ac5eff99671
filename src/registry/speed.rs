//! Speed-aware placement: measured service times turned into each backend's slowness relative
//! to the pool's fastest, and the decision to hold a request for a faster backend.

use crate::balance::{Candidate, REFERENCE_SPEED};

/// A backend counts as faster than another when the other takes at least this much longer.
const CLEARLY_FASTER: f64 = 1.25;
/// Slowness is capped here (16x), so one very slow measurement cannot zero a backend's share.
const MAX_SLOWNESS_MILLI: f64 = 16.0 * REFERENCE_SPEED as f64;

/// What placement knows of each member of a pool for one class, in member order.
#[derive(Debug)]
pub struct PoolSpeeds {
    /// Expected service time of the class on each member, in seconds.
    secs: Vec<Option<f64>>,
    /// Service time relative to the fastest eligible member, 1.0 when unknown.
    ratios: Vec<f64>,
}

impl PoolSpeeds {
    /// Speeds of a class from what was measured of it (`own`) and of the other classes on the
    /// same members (`others`), one entry per member in each. The fastest is taken over
    /// `eligible` members (a backend that is down does not set the pace).
    ///
    /// A member this class has not measured yet borrows its relative speed from the other
    /// classes: a half-speed GPU is seen as such from its short requests long before its
    /// first long job finishes.
    pub fn new(own: &[Option<f64>], others: &[Vec<Option<f64>>], eligible: &[bool]) -> Self {
        let own_ratios = ratios(own, eligible);
        let other_ratios: Vec<Vec<Option<f64>>> =
            others.iter().map(|o| ratios(o, eligible)).collect();
        let fastest = fastest_secs(own, eligible);
        let mut speeds = PoolSpeeds {
            secs: Vec::with_capacity(own.len()),
            ratios: Vec::with_capacity(own.len()),
        };
        for (member, observed) in own.iter().enumerate() {
            let borrowed = || {
                let known: Vec<f64> = other_ratios
                    .iter()
                    .filter_map(|r| r.get(member).copied().flatten())
                    .collect();
                (!known.is_empty()).then(|| known.iter().sum::<f64>() / known.len() as f64)
            };
            let ratio = own_ratios[member].or_else(borrowed);
            speeds
                .secs
                .push(observed.or_else(|| Some(fastest? * ratio?)));
            speeds.ratios.push(ratio.unwrap_or(1.0));
        }
        speeds
    }

    /// How much slower than the fastest member `member` is, in thousandths; members with no
    /// measurement count as fast as the fastest, so they get traffic and are measured.
    pub fn slowness_milli(&self, member: usize) -> u32 {
        let ratio = self.ratios.get(member).copied().unwrap_or(1.0);
        (ratio * f64::from(REFERENCE_SPEED)).clamp(f64::from(REFERENCE_SPEED), MAX_SLOWNESS_MILLI)
            as u32
    }

    /// Whether a request placed on `chosen` should rather wait for a faster member.
    ///
    /// It waits only when every clearly faster eligible member is full and those members are
    /// expected to free a slot for each of the `queued` requests of the class (this one
    /// included) before the time `chosen` would lose on the request has passed. A full member
    /// with `n` requests in flight that each take `t` seconds there is taken to free `n / t`
    /// slots a second. Members this class has no estimate for never cause a wait.
    pub fn should_hold(&self, chosen: usize, candidates: &[Candidate], queued: usize) -> bool {
        let Some(chosen_secs) = self.secs.get(chosen).copied().flatten() else {
            return false;
        };
        let mut faster_rate = 0.0;
        let mut fastest = chosen_secs;
        for (member, candidate) in candidates.iter().enumerate() {
            let Some(secs) = self.secs.get(member).copied().flatten() else {
                continue;
            };
            if member == chosen || !candidate.eligible || secs * CLEARLY_FASTER > chosen_secs {
                continue;
            }
            if candidate.available() {
                return false;
            }
            faster_rate += f64::from(candidate.outstanding) / secs.max(f64::EPSILON);
            fastest = fastest.min(secs);
        }
        let time_saved = chosen_secs - fastest;
        faster_rate > 0.0 && (queued as f64) < faster_rate * time_saved
    }
}

/// The shortest measured service time among eligible members.
fn fastest_secs(observed: &[Option<f64>], eligible: &[bool]) -> Option<f64> {
    observed
        .iter()
        .zip(eligible)
        .filter(|(_, eligible)| **eligible)
        .filter_map(|(secs, _)| *secs)
        .filter(|secs| *secs > 0.0)
        .reduce(f64::min)
}

/// Each member's measured service time relative to the fastest eligible member's.
fn ratios(observed: &[Option<f64>], eligible: &[bool]) -> Vec<Option<f64>> {
    let fastest = fastest_secs(observed, eligible);
    observed
        .iter()
        .map(|secs| Some((*secs)? / fastest?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(outstanding: u32) -> Candidate {
        Candidate {
            outstanding,
            load: outstanding,
            weight: 1,
            max_outstanding: 8,
            eligible: true,
            slowness_milli: REFERENCE_SPEED,
        }
    }

    #[test]
    fn slowness_is_relative_to_the_fastest_eligible_member() {
        let speeds = PoolSpeeds::new(
            &[Some(2.0), Some(4.0), None, Some(1.0)],
            &[],
            &[true, true, true, false],
        );
        assert_eq!(speeds.slowness_milli(0), 1000);
        assert_eq!(speeds.slowness_milli(1), 2000);
        assert_eq!(speeds.slowness_milli(2), 1000, "unmeasured counts as fast");
        // The ineligible member was faster, but does not set the pace; nobody is below 1x.
        assert_eq!(speeds.slowness_milli(3), 1000);
        let nothing = PoolSpeeds::new(&[None, None], &[], &[true, true]);
        assert_eq!(nothing.slowness_milli(0), 1000);
    }

    #[test]
    fn holds_while_the_fast_members_drain_the_queue_sooner() {
        // Member 1 takes 14 s, members 0 and 2 take 7 s with 7 in flight each: they free about
        // one slot a second each, so about 14 in the 7 s that member 1 would lose.
        let speeds = PoolSpeeds::new(&[Some(7.0), Some(14.0), Some(7.0)], &[], &[true; 3]);
        let mut full = cand(7);
        full.max_outstanding = 7;
        let pool = [full, cand(2), full];
        assert!(speeds.should_hold(1, &pool, 1));
        assert!(speeds.should_hold(1, &pool, 13));
        assert!(
            !speeds.should_hold(1, &pool, 14),
            "a long queue uses the slow one too"
        );
        // A faster member with a free slot: no waiting (the pick chose by load).
        assert!(!speeds.should_hold(1, &[cand(3), cand(2), full], 1));
        // A faster member that is down is not waited for.
        let mut down = full;
        down.eligible = false;
        assert!(!speeds.should_hold(1, &[down, cand(2), down], 1));
        // The fastest never waits.
        assert!(!speeds.should_hold(0, &[cand(2), full, full], 1));
    }

    #[test]
    fn an_unmeasured_member_borrows_its_relative_speed_from_other_classes() {
        // The long class has measured only the fast members; the short class saw member 1
        // take twice as long as member 0.
        let own = [Some(7.0), None, Some(7.0)];
        let short_class = vec![vec![Some(1.0), Some(2.0), None]];
        let speeds = PoolSpeeds::new(&own, &short_class, &[true; 3]);
        assert_eq!(speeds.slowness_milli(1), 2000);
        assert_eq!(speeds.slowness_milli(2), 1000);
        // Expected 14 s on member 1, so the same decisions as when measured.
        let mut full = cand(7);
        full.max_outstanding = 7;
        assert!(speeds.should_hold(1, &[full, cand(0), full], 13));
        assert!(!speeds.should_hold(1, &[full, cand(0), full], 14));
        // Without the other class, member 1 is unknown: it is used, and so measured.
        let alone = PoolSpeeds::new(&own, &[], &[true; 3]);
        assert_eq!(alone.slowness_milli(1), 1000);
        assert!(!alone.should_hold(1, &[full, cand(0), full], 1));
    }

    #[test]
    fn no_wait_without_measurements_or_a_clear_difference() {
        let mut full = cand(8);
        full.max_outstanding = 8;
        let unmeasured = PoolSpeeds::new(&[None, Some(14.0)], &[], &[true; 2]);
        assert!(!unmeasured.should_hold(1, &[full, cand(0)], 1));
        // 8 s against 7 s is within the noise of a measurement: no waiting.
        let close = PoolSpeeds::new(&[Some(7.0), Some(8.0)], &[], &[true; 2]);
        assert!(!close.should_hold(1, &[full, cand(0)], 1));
        // A faster member that is full of nothing (its cap is 0): no slot will free there.
        let mut closed = cand(0);
        closed.max_outstanding = 0;
        let fast = PoolSpeeds::new(&[Some(7.0), Some(14.0)], &[], &[true; 2]);
        assert!(!fast.should_hold(1, &[closed, cand(0)], 1));
    }
}
