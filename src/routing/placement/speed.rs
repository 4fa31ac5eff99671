//! Speed-aware placement: measured service times turned into each backend's slowness relative
//! to the pool's fastest, and the decision to hold a request for a faster backend.

use crate::routing::balance::{Candidate, REFERENCE_SPEED};
use crate::routing::service_time::Measured;

/// A backend counts as faster than another when the other takes at least this much longer.
const CLEARLY_FASTER: f64 = 1.25;
/// Slowness is capped here (16x), so one very slow measurement cannot zero a backend's share.
const MAX_SLOWNESS_MILLI: f64 = 16.0 * REFERENCE_SPEED as f64;

/// Samples of one class beyond this add no more weight to its say on a backend's speed.
const MAX_WEIGHT: u32 = 50;

/// What placement knows of each member of a pool for one class, in member order.
#[derive(Debug)]
pub struct PoolSpeeds {
    /// Each member's service time relative to the fastest eligible member's; `None` where no
    /// class has measured it.
    ratios: Vec<Option<f64>>,
}

impl PoolSpeeds {
    /// Speeds of a class from what was measured of it (`own`) and of the other classes on the
    /// same members (`others`), one entry per member in each. The fastest is taken over
    /// `eligible` members (a backend that is down does not set the pace).
    ///
    /// How much slower a member is than the fastest is taken from every class, each weighted
    /// by its samples there: a GPU at half speed is half as fast for every class, and a class
    /// of many short requests sees it long before (and far more steadily than) a class of few
    /// long jobs. So a class that has measured nothing yet (the first bulk jobs still running,
    /// or a replica that started after the others) already knows the slow GPU from the others.
    pub fn new(
        own: &[Option<Measured>],
        others: &[Vec<Option<Measured>>],
        eligible: &[bool],
    ) -> Self {
        let classes: Vec<&[Option<Measured>]> = std::iter::once(own)
            .chain(others.iter().map(Vec::as_slice))
            .collect();
        let class_ratios: Vec<Vec<Option<f64>>> = classes
            .iter()
            .map(|class| ratios(class, eligible))
            .collect();
        let ratios: Vec<Option<f64>> = (0..own.len())
            .map(|member| {
                weighted_mean(classes.iter().zip(&class_ratios).filter_map(|(class, r)| {
                    let measured = class.get(member).copied().flatten()?;
                    Some((r.get(member).copied().flatten()?, measured))
                }))
            })
            .collect();
        PoolSpeeds { ratios }
    }

    /// How much slower than the fastest member `member` is, in thousandths; members with no
    /// measurement count as fast as the fastest, so they get traffic and are measured.
    pub fn slowness_milli(&self, member: usize) -> u32 {
        let ratio = self.ratio(member).unwrap_or(1.0);
        (ratio * f64::from(REFERENCE_SPEED)).clamp(f64::from(REFERENCE_SPEED), MAX_SLOWNESS_MILLI)
            as u32
    }

    /// Whether a request placed on `chosen` should rather wait for a faster member.
    ///
    /// It waits only when every clearly faster eligible member is full and those members are
    /// expected to free a slot for each of the `queued` requests of the class (this one
    /// included) before the time `chosen` would lose on the request has passed. A full member
    /// with `n` requests in flight that each take `t` there is taken to free `n / t` slots per
    /// unit of time — every request on it, other replicas' too (its `load`): theirs free slots
    /// as fast as ours. Times are relative to the fastest member's: the class's own scale
    /// cancels out (slots freed per unit of time, times the units lost), so the decision
    /// needs no time of its own and is the same before and after its first job finishes.
    /// Members no class has measured never cause a wait. `size` is the request's estimated work
    /// relative to the class's mean request (1 when unknown): a job twice the usual size loses
    /// twice the time on a slower member.
    pub fn should_hold(
        &self,
        chosen: usize,
        candidates: &[Candidate],
        queued: usize,
        size: f64,
    ) -> bool {
        let Some(chosen_time) = self.ratio(chosen) else {
            return false;
        };
        let mut faster_rate = 0.0;
        let mut fastest = chosen_time;
        for (member, candidate) in candidates.iter().enumerate() {
            let Some(time) = self.ratio(member) else {
                continue;
            };
            if member == chosen || !candidate.eligible || time * CLEARLY_FASTER > chosen_time {
                continue;
            }
            if candidate.available() {
                return false;
            }
            faster_rate += f64::from(candidate.load) / time.max(f64::EPSILON);
            fastest = fastest.min(time);
        }
        let time_saved = (chosen_time - fastest) * size;
        faster_rate > 0.0 && (queued as f64) < faster_rate * time_saved
    }

    /// `member`'s service time relative to the fastest's, where some class measured it.
    fn ratio(&self, member: usize) -> Option<f64> {
        self.ratios.get(member).copied().flatten()
    }
}

/// The mean of `values`, each weighted by the samples of the measurement behind it.
fn weighted_mean(values: impl Iterator<Item = (f64, Measured)>) -> Option<f64> {
    let (sum, weights) = values.fold((0.0, 0.0), |(sum, weights), (value, m)| {
        let w = f64::from(m.samples.min(MAX_WEIGHT));
        (sum + value * w, weights + w)
    });
    (weights > 0.0).then(|| sum / weights)
}

/// Each member's measured service time relative to the fastest eligible member's.
fn ratios(observed: &[Option<Measured>], eligible: &[bool]) -> Vec<Option<f64>> {
    let fastest = observed
        .iter()
        .zip(eligible)
        .filter(|(_, eligible)| **eligible)
        .filter_map(|(m, _)| m.map(|m| m.secs))
        .filter(|secs| *secs > 0.0)
        .reduce(f64::min);
    observed
        .iter()
        .map(|m| Some(m.as_ref()?.secs / fastest?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A measurement with plenty of samples.
    fn m(secs: f64) -> Option<Measured> {
        Some(Measured { secs, samples: 10 })
    }

    fn cand(outstanding: u32) -> Candidate {
        Candidate {
            outstanding,
            load: outstanding,
            weight: 1,
            max_outstanding: 8,
            eligible: true,
            slowness_milli: REFERENCE_SPEED,
            work_tokens: 0,
            kv_free_tokens: None,
        }
    }

    #[test]
    fn slowness_is_relative_to_the_fastest_eligible_member() {
        let speeds = PoolSpeeds::new(
            &[m(2.0), m(4.0), None, m(1.0)],
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
        let speeds = PoolSpeeds::new(&[m(7.0), m(14.0), m(7.0)], &[], &[true; 3]);
        let mut full = cand(7);
        full.max_outstanding = 7;
        let pool = [full, cand(2), full];
        assert!(speeds.should_hold(1, &pool, 1, 1.0));
        assert!(speeds.should_hold(1, &pool, 13, 1.0));
        assert!(
            !speeds.should_hold(1, &pool, 14, 1.0),
            "a long queue uses the slow one too"
        );
        // A job twice the class's usual size loses twice the time there: it waits longer.
        assert!(speeds.should_hold(1, &pool, 14, 2.0));
        assert!(
            !speeds.should_hold(1, &pool, 7, 0.5),
            "a small one does not"
        );
        // A faster member with a free slot: no waiting (the pick chose by load).
        assert!(!speeds.should_hold(1, &[cand(3), cand(2), full], 1, 1.0));
        // A faster member that is down is not waited for.
        let mut down = full;
        down.eligible = false;
        assert!(!speeds.should_hold(1, &[down, cand(2), down], 1, 1.0));
        // The fastest never waits.
        assert!(!speeds.should_hold(0, &[cand(2), full, full], 1, 1.0));
        // Fast members full of other replicas' requests free slots as fast as of ours.
        let mut shared = cand(1);
        shared.load = 7;
        shared.max_outstanding = 1;
        assert!(speeds.should_hold(1, &[shared, cand(2), shared], 13, 1.0));
    }

    #[test]
    fn a_fast_member_filled_by_a_concurrent_request_is_still_waited_for() {
        // Read free, then another request took its only slot before this one could.
        let speeds = PoolSpeeds::new(&[m(0.25), m(2.0)], &[], &[true; 2]);
        let mut raced = cand(0);
        raced.max_outstanding = 1;
        assert!(!speeds.should_hold(1, &[raced, cand(0)], 2, 1.0));
        raced.filled_by_another();
        assert!(!raced.available());
        assert!(speeds.should_hold(1, &[raced, cand(0)], 2, 1.0));
    }

    #[test]
    fn an_unmeasured_member_borrows_its_relative_speed_from_other_classes() {
        // The long class has measured only the fast members; the short class saw member 1
        // take twice as long as member 0.
        let own = [m(7.0), None, m(7.0)];
        let short_class = vec![vec![m(1.0), m(2.0), None]];
        let speeds = PoolSpeeds::new(&own, &short_class, &[true; 3]);
        assert_eq!(speeds.slowness_milli(1), 2000);
        assert_eq!(speeds.slowness_milli(2), 1000);
        // Expected 14 s on member 1, so the same decisions as when measured.
        let mut full = cand(7);
        full.max_outstanding = 7;
        assert!(speeds.should_hold(1, &[full, cand(0), full], 13, 1.0));
        assert!(!speeds.should_hold(1, &[full, cand(0), full], 14, 1.0));
        // Without the other class, member 1 is unknown: it is used, and so measured.
        let alone = PoolSpeeds::new(&own, &[], &[true; 3]);
        assert_eq!(alone.slowness_milli(1), 1000);
        assert!(!alone.should_hold(1, &[full, cand(0), full], 1, 1.0));
    }

    #[test]
    fn relative_speed_pools_every_class_by_its_samples() {
        // Three long jobs made member 1 look only 1.3x slower; fifty short requests on each
        // member say 2x. The pooled view is close to 2x.
        let few = |secs| Some(Measured { secs, samples: 3 });
        let many = |secs| Some(Measured { secs, samples: 50 });
        let speeds = PoolSpeeds::new(
            &[few(4.0), few(5.2)],
            &[vec![many(1.0), many(2.0)]],
            &[true; 2],
        );
        let slowness = speeds.slowness_milli(1);
        assert!((1950..=1970).contains(&slowness), "{slowness}");
    }

    #[test]
    fn a_class_that_has_measured_nothing_yet_holds_on_what_the_others_measured() {
        // The first bulk jobs are still running (or this replica just started): only the
        // short class has times, and it saw member 1 take twice as long as members 0 and 2.
        let short_class = vec![vec![m(1.0), m(2.0), m(1.0)]];
        let speeds = PoolSpeeds::new(&[None, None, None], &short_class, &[true; 3]);
        assert_eq!(speeds.slowness_milli(1), 2000);
        // The same decisions as once its own times are in (7 s and 14 s, as above).
        let measured = PoolSpeeds::new(&[m(7.0), m(14.0), m(7.0)], &short_class, &[true; 3]);
        let mut full = cand(7);
        full.max_outstanding = 7;
        let pool = [full, cand(2), full];
        for queued in [1, 13, 14, 20] {
            assert_eq!(
                speeds.should_hold(1, &pool, queued, 1.0),
                measured.should_hold(1, &pool, queued, 1.0),
                "{queued} queued"
            );
        }
        assert!(speeds.should_hold(1, &pool, 13, 1.0));
        assert!(!speeds.should_hold(1, &pool, 14, 1.0));
        // Nobody has measured anything: no waiting.
        let cold = PoolSpeeds::new(&[None, None, None], &[vec![None; 3]], &[true; 3]);
        assert!(!cold.should_hold(1, &pool, 1, 1.0));
    }

    #[test]
    fn no_wait_without_measurements_or_a_clear_difference() {
        let mut full = cand(8);
        full.max_outstanding = 8;
        let unmeasured = PoolSpeeds::new(&[None, m(14.0)], &[], &[true; 2]);
        assert!(!unmeasured.should_hold(1, &[full, cand(0)], 1, 1.0));
        // 8 s against 7 s is within the noise of a measurement: no waiting.
        let close = PoolSpeeds::new(&[m(7.0), m(8.0)], &[], &[true; 2]);
        assert!(!close.should_hold(1, &[full, cand(0)], 1, 1.0));
        // A faster member that is full of nothing (its cap is 0): no slot will free there.
        let mut closed = cand(0);
        closed.max_outstanding = 0;
        let fast = PoolSpeeds::new(&[m(7.0), m(14.0)], &[], &[true; 2]);
        assert!(!fast.should_hold(1, &[closed, cand(0)], 1, 1.0));
    }
}
