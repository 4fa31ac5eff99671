//! `prefix_affinity`: send a prompt to the backend where the part of it not yet in its KV-cache
//! costs the least to prefill — the longest cached prefix, weighed by the backend's measured
//! speed — unless that backend is much busier than the least loaded one; when no backend has
//! seen the prompt, choose among the least loaded (speed counted) by rendezvous hash of the
//! prompt's first block, so independent gpulb replicas agree on its home.

use super::{Choice, Placement};
use crate::config::PlacementKind;
use crate::routing::balance::{self, Candidate};
use rand::RngCore;

/// The home may carry this many more requests (per unit of weight) than the least loaded...
pub const LOAD_SLACK: f64 = 4.0;
/// ...and this many times its load, before the request goes to the least loaded instead.
pub const LOAD_FACTOR: f64 = 1.5;

/// Cheapest prefill of the uncached rest first, within a bounded load; rendezvous for unseen
/// prompts.
#[derive(Debug)]
pub struct PrefixAffinity;

/// The prefill work left on `c` when it already holds `matched` of the prompt's `blocks`:
/// the uncached blocks times the backend's slowness (a half-speed GPU prefills a block in
/// twice the time).
fn uncached_cost(c: &Candidate, blocks: u32, matched: u32) -> u64 {
    u64::from(blocks.saturating_sub(matched).max(1)) * u64::from(c.slowness_milli.max(1))
}

impl Placement for PrefixAffinity {
    fn kind(&self) -> PlacementKind {
        PlacementKind::PrefixAffinity
    }

    fn uses_prefix(&self) -> bool {
        true
    }

    /// Measured speeds make the load a half-speed backend carries count double, and its
    /// prefill of an uncached prompt too.
    fn uses_speeds(&self) -> bool {
        true
    }

    fn pick(&self, choice: &Choice<'_>, rng: &mut dyn RngCore) -> Option<usize> {
        let candidates = &*choice.candidates;
        let least = balance::pick(candidates, rng)?;
        let Some(affinity) = &choice.affinity else {
            return Some(least);
        };
        let available = |i: &usize| candidates[*i].available();
        let cost = |i: usize| uncached_cost(&candidates[i], affinity.blocks, affinity.matched[i]);
        let home = (0..candidates.len())
            .filter(available)
            .filter(|&i| affinity.matched[i] > 0)
            .min_by(|&a, &b| {
                let by_cost = cost(a).cmp(&cost(b));
                let by_load = candidates[a]
                    .normalized_load()
                    .total_cmp(&candidates[b].normalized_load());
                by_cost.then(by_load)
            });
        if let Some(home) = home {
            let (home_load, least_load) = (
                candidates[home].normalized_load(),
                candidates[least].normalized_load(),
            );
            let overloaded =
                home_load > least_load + LOAD_SLACK && home_load > least_load * LOAD_FACTOR;
            if overloaded {
                return Some(least);
            }
            if cost(home) <= cost(least) {
                return Some(home);
            }
            // It holds so little of the prompt, or is so slow, that prefilling all of it on
            // the least loaded costs less: as if nobody had it.
        }
        // Nobody has it (worth having): the rendezvous winner among the least loaded.
        let lightest = candidates[least].normalized_load();
        (0..candidates.len())
            .filter(available)
            .filter(|&i| candidates[i].normalized_load() <= lightest)
            .max_by_key(|&i| affinity.rendezvous[i])
    }
}

#[cfg(test)]
mod tests {
    use super::super::Affinity;
    use super::*;
    use crate::routing::balance::{Candidate, REFERENCE_SPEED};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn cand(load: u32) -> Candidate {
        Candidate {
            outstanding: load,
            load,
            weight: 1,
            max_outstanding: 32,
            eligible: true,
            slowness_milli: REFERENCE_SPEED,
            work_tokens: 0,
            kv_free_tokens: None,
        }
    }

    fn pick(loads: &[u32], matched: &[u32], rendezvous: &[u64]) -> Option<usize> {
        pick_among(
            loads.iter().map(|&l| cand(l)).collect(),
            matched,
            rendezvous,
        )
    }

    fn pick_among(
        mut candidates: Vec<Candidate>,
        matched: &[u32],
        rendezvous: &[u64],
    ) -> Option<usize> {
        let choice = Choice {
            candidates: &mut candidates,
            speeds: None,
            tokens: 0,
            mean_tokens: 0,
            affinity: Some(Affinity {
                blocks: 10,
                matched: matched.to_vec(),
                rendezvous: rendezvous.to_vec(),
            }),
        };
        PrefixAffinity.pick(&choice, &mut StdRng::seed_from_u64(1))
    }

    #[test]
    fn the_longest_cached_prefix_wins_within_the_load_bound() {
        // Backend 2 holds 6 blocks, backend 1 holds 3; both a little busier than backend 0.
        assert_eq!(pick(&[0, 2, 3], &[0, 3, 6], &[9, 9, 9]), Some(2));
        // Equal matches: the less loaded of the two homes.
        assert_eq!(pick(&[0, 3, 2], &[0, 6, 6], &[9, 9, 9]), Some(2));
    }

    #[test]
    fn an_overloaded_home_falls_back_to_the_least_loaded() {
        // Home at 12 in flight against 2: more than 4 above and 1.5x: the least loaded.
        assert_eq!(pick(&[2, 12], &[0, 8], &[0, 0]), Some(0));
        // At 6 against 2 it is within the slack: the home keeps it.
        assert_eq!(pick(&[2, 6], &[0, 8], &[0, 0]), Some(1));
        // A full home is no home.
        assert_eq!(
            pick_among(vec![cand(1), cand(32)], &[0, 5], &[0, 0]),
            Some(0)
        );
    }

    fn slow(load: u32, slowness_milli: u32) -> Candidate {
        Candidate {
            slowness_milli,
            ..cand(load)
        }
    }

    #[test]
    fn a_half_speed_home_keeps_a_long_match_but_not_a_short_one() {
        // Of 10 blocks, the half-speed backend 1 holds 8: 2 left at twice the time beats 10.
        let half = 2 * REFERENCE_SPEED;
        assert_eq!(
            pick_among(vec![cand(0), slow(0, half)], &[0, 8], &[0, 0]),
            Some(1)
        );
        // It holds 3: 7 blocks at twice the time cost more than all 10 on the fast one.
        assert_eq!(
            pick_among(vec![cand(0), slow(0, half)], &[0, 3], &[9, 0]),
            Some(0)
        );
        // Two homes: the fast one with 6 of 10 (4 left) beats the slow one with 7 (3 left, 6
        // at half speed).
        assert_eq!(
            pick_among(
                vec![cand(0), slow(0, half), cand(0)],
                &[6, 7, 0],
                &[0, 0, 0]
            ),
            Some(0)
        );
    }

    #[test]
    fn an_unseen_prompt_avoids_a_slow_backend_as_loaded_as_the_others() {
        // Idle fleet, the rendezvous winner at half speed: it counts as busier, so one of the
        // fast ones gets the prompt.
        let half = 2 * REFERENCE_SPEED;
        assert_eq!(
            pick_among(
                vec![cand(0), slow(0, half), cand(0)],
                &[0, 0, 0],
                &[5, 50, 7]
            ),
            Some(2)
        );
    }

    #[test]
    fn an_unseen_prompt_goes_to_the_rendezvous_winner_among_the_least_loaded() {
        assert_eq!(pick(&[1, 1, 1], &[0, 0, 0], &[5, 50, 7]), Some(1));
        // The winner is busier: the best score among the least loaded instead.
        assert_eq!(pick(&[1, 2, 1], &[0, 0, 0], &[5, 50, 7]), Some(2));
    }
}
