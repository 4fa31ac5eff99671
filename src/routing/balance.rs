//! Backend selection: least outstanding requests relative to weight (and, when measured,
//! speed), ties broken at random.
//!
//! Pure functions over a slice of candidates, so they are tested (and benchmarked) alone.

use rand::Rng;
use std::cmp::Ordering;

/// What selection needs to know about one backend of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Requests this proxy has in flight on the backend (checked against the cap).
    pub outstanding: u32,
    /// Load used for the choice: `outstanding`, or more when the backend's own queue figures
    /// show work this proxy did not send (other replicas, clients that bypass the proxy).
    pub load: u32,
    /// Relative capacity, at least 1.
    pub weight: u32,
    /// In-flight cap; a backend at its cap is skipped.
    pub max_outstanding: u32,
    /// False when the backend must not get new requests (unhealthy, excluded, already tried).
    pub eligible: bool,
    /// Measured service time relative to the pool's fastest backend, in thousandths:
    /// [`REFERENCE_SPEED`] is as fast as the fastest, twice that takes twice as long.
    pub slowness_milli: u32,
    /// Estimated tokens of work on it: what its model server reports of its KV-cache in use,
    /// or the estimated tokens this proxy has in flight there, whichever is more.
    pub work_tokens: u64,
    /// KV-cache tokens still free, when the server states its capacity.
    pub kv_free_tokens: Option<u64>,
}

/// `slowness_milli` of the fastest backend, and of any backend not measured.
pub const REFERENCE_SPEED: u32 = 1000;

/// Width of a speed tier for [`pick_fastest`]: backends within a quarter of each other's
/// service time count as equally fast, so noise in the measurement does not decide.
const SPEED_TIER_MILLI: u32 = 250;

impl Candidate {
    /// Requests per unit of weight once one more is added, scaled by slowness: the figure
    /// least-loaded selection compares.
    pub fn normalized_load(&self) -> f64 {
        (f64::from(self.load) + 1.0) * f64::from(self.slowness_milli.max(1))
            / f64::from(REFERENCE_SPEED)
            / f64::from(self.weight.max(1))
    }

    /// Whether this candidate may take one more request.
    pub fn available(&self) -> bool {
        self.eligible && self.outstanding < self.max_outstanding
    }

    /// Records that another request took this candidate's last slot after it was read: it is
    /// full, not out of the running — a request may still be held for it to free a slot.
    pub fn filled_by_another(&mut self) {
        self.outstanding = self.max_outstanding;
        self.load = self.load.saturating_add(1).max(self.max_outstanding);
    }
}

/// Compares the load after adding one request, `(load + 1) * slowness / weight`, without
/// division.
fn lighter(a: &Candidate, b: &Candidate) -> Ordering {
    let cost = |c: &Candidate, other: &Candidate| {
        (u128::from(c.load) + 1)
            * u128::from(other.weight.max(1))
            * u128::from(c.slowness_milli.max(1))
    };
    cost(a, b).cmp(&cost(b, a))
}

/// The speed tier of a candidate: 0 for the fastest, one more per quarter of extra time.
fn speed_tier(c: &Candidate) -> u32 {
    (c.slowness_milli.saturating_sub(REFERENCE_SPEED) + SPEED_TIER_MILLI / 2) / SPEED_TIER_MILLI
}

/// Picks the available candidate with the least load relative to weight and speed.
///
/// Candidates tied at that load are chosen between uniformly at random (reservoir sampling in
/// one pass), which is what power-of-two choices reduces to when both draws are equally loaded:
/// no backend becomes the default target when the pool is idle.
pub fn pick<R: Rng + ?Sized>(candidates: &[Candidate], rng: &mut R) -> Option<usize> {
    pick_by(candidates, rng, lighter)
}

/// Picks the available candidate with the least estimated work after adding `tokens`, relative
/// to weight and speed: `(work + tokens) * slowness / weight`; requests break ties.
pub fn pick_least_work<R: Rng + ?Sized>(
    candidates: &[Candidate],
    tokens: u64,
    rng: &mut R,
) -> Option<usize> {
    let cost = |c: &Candidate, other: &Candidate| {
        (u128::from(c.work_tokens) + u128::from(tokens))
            * u128::from(other.weight.max(1))
            * u128::from(c.slowness_milli.max(1))
    };
    pick_by(candidates, rng, |a, b| {
        cost(a, b).cmp(&cost(b, a)).then_with(|| lighter(a, b))
    })
}

/// Picks an available candidate of the fastest speed tier, the least loaded among those.
pub fn pick_fastest<R: Rng + ?Sized>(candidates: &[Candidate], rng: &mut R) -> Option<usize> {
    pick_by(candidates, rng, |a, b| {
        speed_tier(a)
            .cmp(&speed_tier(b))
            .then_with(|| lighter(a, b))
    })
}

/// The available candidate that `better` orders first, ties broken uniformly at random.
fn pick_by<R: Rng + ?Sized>(
    candidates: &[Candidate],
    rng: &mut R,
    better: impl Fn(&Candidate, &Candidate) -> Ordering,
) -> Option<usize> {
    let mut best: Option<usize> = None;
    let mut ties = 0u32;
    for (index, candidate) in candidates.iter().enumerate() {
        if !candidate.available() {
            continue;
        }
        match best.map(|b| better(candidate, &candidates[b])) {
            None | Some(Ordering::Less) => {
                best = Some(index);
                ties = 1;
            }
            Some(Ordering::Equal) => {
                ties += 1;
                if rng.random_range(0..ties) == 0 {
                    best = Some(index);
                }
            }
            Some(Ordering::Greater) => {}
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn cand(outstanding: u32, weight: u32) -> Candidate {
        Candidate {
            outstanding,
            load: outstanding,
            weight,
            max_outstanding: 100,
            eligible: true,
            slowness_milli: REFERENCE_SPEED,
            work_tokens: 0,
            kv_free_tokens: None,
        }
    }

    #[test]
    fn least_work_counts_tokens_not_requests() {
        let mut rng = StdRng::seed_from_u64(9);
        // Three 4k-token jobs weigh more than three 50-token chats.
        let mut long_jobs = cand(3, 1);
        long_jobs.work_tokens = 12_000;
        let mut chats = cand(3, 1);
        chats.work_tokens = 150;
        assert_eq!(pick_least_work(&[long_jobs, chats], 100, &mut rng), Some(1));
        // Twice the weight carries twice the work; speed divides it.
        let mut big = cand(0, 2);
        big.work_tokens = 700;
        let mut small = cand(0, 1);
        small.work_tokens = 400;
        assert_eq!(pick_least_work(&[big, small], 100, &mut rng), Some(0));
        big.slowness_milli = 2 * REFERENCE_SPEED;
        assert_eq!(pick_least_work(&[big, small], 100, &mut rng), Some(1));
        // No estimates at all: least outstanding requests decides.
        assert_eq!(
            pick_least_work(&[cand(2, 1), cand(1, 1)], 0, &mut rng),
            Some(1)
        );
    }

    #[test]
    fn least_outstanding_wins() {
        let mut rng = StdRng::seed_from_u64(1);
        let pool = [cand(3, 1), cand(1, 1), cand(2, 1)];
        for _ in 0..50 {
            assert_eq!(pick(&pool, &mut rng), Some(1));
        }
    }

    #[test]
    fn weight_scales_the_load() {
        let mut rng = StdRng::seed_from_u64(2);
        // (4+1)/3 < (1+1)/1: the heavy backend still wins with four in flight.
        assert_eq!(pick(&[cand(1, 1), cand(4, 3)], &mut rng), Some(1));
        // (6+1)/3 > (1+1)/1.
        assert_eq!(pick(&[cand(1, 1), cand(6, 3)], &mut rng), Some(0));
    }

    #[test]
    fn skips_ineligible_and_capped_backends() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut down = cand(0, 1);
        down.eligible = false;
        let mut full = cand(5, 1);
        full.max_outstanding = 5;
        assert_eq!(pick(&[down, full, cand(9, 1)], &mut rng), Some(2));
        assert_eq!(pick(&[down, full], &mut rng), None);
        assert_eq!(pick(&[], &mut rng), None);
    }

    #[test]
    fn ties_are_spread_evenly() {
        let mut rng = StdRng::seed_from_u64(4);
        let pool = [cand(2, 1), cand(0, 1), cand(0, 1), cand(0, 1), cand(1, 1)];
        let mut hits = [0u32; 5];
        for _ in 0..3000 {
            hits[pick(&pool, &mut rng).unwrap()] += 1;
        }
        assert_eq!(hits[0] + hits[4], 0);
        for &h in &hits[1..4] {
            assert!((800..1200).contains(&h), "uneven tie break: {hits:?}");
        }
    }

    #[test]
    fn load_decides_and_outstanding_caps() {
        let mut rng = StdRng::seed_from_u64(6);
        let mut busy_elsewhere = cand(0, 1);
        busy_elsewhere.load = 5;
        assert_eq!(pick(&[busy_elsewhere, cand(2, 1)], &mut rng), Some(1));
        let mut capped = cand(3, 1);
        capped.max_outstanding = 3;
        capped.load = 0;
        assert_eq!(pick(&[capped, cand(9, 1)], &mut rng), Some(1));
    }

    #[test]
    fn slowness_scales_the_load() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut slow = cand(1, 1);
        slow.slowness_milli = 2 * REFERENCE_SPEED;
        // (1+1)*2 > (2+1)*1: the fast one takes a third request first...
        assert_eq!(pick(&[slow, cand(2, 1)], &mut rng), Some(1));
        // ...but (1+1)*2 < (4+1)*1.
        assert_eq!(pick(&[slow, cand(4, 1)], &mut rng), Some(0));
    }

    #[test]
    fn pick_fastest_prefers_the_fastest_tier_whatever_its_load() {
        let mut rng = StdRng::seed_from_u64(8);
        let mut slow = cand(0, 1);
        slow.slowness_milli = 1_900;
        let mut nearly_fast = cand(1, 1);
        nearly_fast.slowness_milli = 1_100;
        // 1.1x is in the fastest tier: it and the reference one share it, least loaded wins.
        assert_eq!(
            pick_fastest(&[slow, nearly_fast, cand(7, 1)], &mut rng),
            Some(1)
        );
        // Only when no faster one is available does the slow one get the request.
        let mut full = cand(7, 1);
        full.max_outstanding = 7;
        assert_eq!(pick_fastest(&[slow, full], &mut rng), Some(0));
        assert_eq!(speed_tier(&slow), 4);
        assert_eq!(speed_tier(&cand(0, 1)), 0);
    }

    #[test]
    fn sequential_picks_fill_by_weight() {
        let mut rng = StdRng::seed_from_u64(5);
        let mut pool = [cand(0, 1), cand(0, 3)];
        for _ in 0..40 {
            let i = pick(&pool, &mut rng).unwrap();
            pool[i].outstanding += 1;
            pool[i].load += 1;
        }
        assert_eq!((pool[0].outstanding, pool[1].outstanding), (10, 30));
    }
}
