//! Choosing a backend for a request and feeding attempt outcomes to outlier ejection.

use super::balance::{Candidate, REFERENCE_SPEED};
use super::placement::{Affinity, Choice, PoolSpeeds};
use super::prefix::rendezvous;
use super::{Class, Grant, Lease, ModelRoute, Pool, Snapshot};
use crate::config::Guards;
use crate::health::{ms_at, now_ms, AttemptFailure};
use crate::telemetry::{is_fresh, OthersAtRead};
use smallvec::SmallVec;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Snapshot {
    /// What selection sees of backend `index` for a class with `guards`: healthy, not ejected,
    /// inside the guards (fresh telemetry only: stale is unknown), and its load with the model
    /// server's own running + waiting counts folded in, so other proxy replicas and clients
    /// that bypass this proxy are seen — in its score, and, with `telemetry.count_others`, in
    /// its cap: their requests take slots of `max_outstanding` (and of the class's share) too.
    fn candidate(
        &self,
        index: usize,
        guards: &Guards,
        class: &Class,
        claim: RoomClaim,
        now_ms: u64,
        now: Instant,
    ) -> Candidate {
        let share = class.backend_share;
        let b = &self.backends[index];
        let settings = &self.config.telemetry;
        let outstanding = b.state.outstanding.get();
        let telemetry = b.state.telemetry.load();
        let fresh = telemetry
            .as_deref()
            .filter(|t| is_fresh(t, settings.stale_after, now));
        let server = fresh.and_then(|t| t.reading.server.as_ref());
        let ours = b.state.outstanding_tokens.load(Ordering::Relaxed);
        let capacity = server.and_then(|s| s.kv_capacity_tokens.filter(|c| *c > 0.0));
        // The KV the server reports in use, or what this proxy alone has sent, if more.
        let kv_used = capacity
            .zip(server.and_then(|s| s.kv_cache_usage))
            .map_or(0, |(c, u)| (c * u.clamp(0.0, 1.0)) as u64)
            .max(ours);
        let others = settings
            .count_others
            .then(|| fresh?.others_at_read(settings.others_max_age, now))
            .flatten();
        let cap = share_of(b.max_outstanding, share);
        let (load, max_outstanding) = match others {
            // Ours as of now, theirs as of the reading.
            Some(at_read) => (
                outstanding.saturating_add(at_read.others),
                cap_beside_others(cap, at_read, claim),
            ),
            None => {
                let reported = server
                    .map(|s| s.running.unwrap_or(0.0) + s.waiting.unwrap_or(0.0))
                    .unwrap_or(0.0);
                // Our own requests are part of what the server reports: the larger, not the sum.
                let reported = reported.clamp(0.0, f64::from(u32::MAX / 2)) as u32;
                (outstanding.max(reported), cap)
            }
        };
        Candidate {
            work_tokens: kv_used,
            kv_free_tokens: capacity.map(|c| (c as u64).saturating_sub(kv_used)),
            outstanding,
            load,
            weight: b.weight,
            max_outstanding,
            eligible: b.state.eligible(now_ms) && !fresh.is_some_and(|t| t.reading.breaks(guards)),
            slowness_milli: REFERENCE_SPEED,
        }
    }

    /// Takes a slot on a backend of `pool` for `class` (whose guards there are `guards`),
    /// skipping `excluded`. With `may_hold`, the class's placement may decline the backend it
    /// picked to wait for a better one ([`Miss::Held`]).
    fn acquire(
        &self,
        pool: usize,
        class: &Class,
        guards: &Guards,
        ask: &Ask<'_>,
    ) -> Result<Lease, Miss> {
        let pool = self.pools.get(pool).ok_or(Miss::Full)?;
        let members = &pool.members;
        let now = Instant::now();
        let now_ms = ms_at(now);
        let queued = class.state.queues.depth();
        let claim = RoomClaim::of(class, queued);
        // Gathered on the stack for the usual pool (up to 16 backends): no allocation.
        let mut candidates: SmallVec<[Candidate; 16]> = members
            .iter()
            .map(|&i| {
                let mut c = self.candidate(i, guards, class, claim, now_ms, now);
                c.eligible &=
                    !ask.excluded.contains(&i) && self.backends[i].state.admits(&ask.demand.route);
                c
            })
            .collect();
        keep_to_kv_room(&mut candidates, ask.demand.tokens);
        pass_over_refusing(&mut candidates, |k| {
            self.backends[members[k]].state.refusing(now_ms)
        });
        let placement = &class.placement;
        let speeds = placement
            .uses_speeds()
            .then(|| self.pool_speeds(pool, class, &candidates, now));
        let mut choice = Choice {
            candidates: &mut candidates,
            speeds: speeds.as_ref(),
            tokens: ask.demand.tokens,
            mean_tokens: class.state.mean_tokens.load(Ordering::Relaxed),
            affinity: placement
                .uses_prefix()
                .then(|| self.affinity(members, &ask.demand.prefix))
                .flatten(),
        };
        placement.rank(&mut choice);
        let mut rng = rand::rng();
        // Each failed acquire (another request took the last slot) fills one candidate.
        for _ in 0..choice.candidates.len() {
            let chosen = placement.pick(&choice, &mut rng).ok_or(Miss::Full)?;
            if ask.may_hold && placement.may_hold(chosen, &choice, queued.max(1)) {
                return Err(Miss::Held);
            }
            let backend = &self.backends[members[chosen]];
            if let Some(slot) = backend
                .state
                .outstanding
                .try_acquire(choice.candidates[chosen].max_outstanding)
            {
                backend.state.attempts_total.fetch_add(1, Ordering::Relaxed);
                if choice.affinity.is_some() {
                    self.prefixes.record(&ask.demand.prefix, backend.state.id);
                }
                let counter = &backend.state.outstanding_tokens;
                return Ok(Lease::new(
                    members[chosen],
                    slot,
                    counter,
                    ask.demand.tokens,
                ));
            }
            choice.candidates[chosen].filled_by_another();
        }
        Err(Miss::Full)
    }

    /// What the prefix index knows of `prefix` on each of `members`; `None` for no prefix.
    fn affinity(&self, members: &[usize], prefix: &[u64]) -> Option<Affinity> {
        let first = *prefix.first()?;
        let ids: Vec<u32> = members.iter().map(|&i| self.backends[i].state.id).collect();
        Some(Affinity {
            blocks: u32::try_from(prefix.len()).unwrap_or(u32::MAX),
            matched: self.prefixes.matches(prefix, &ids),
            rendezvous: members
                .iter()
                .map(|&i| rendezvous(first, &self.backends[i].state.name))
                .collect(),
        })
    }

    /// What was measured of `class` and of the other classes on each member of `pool`.
    fn pool_speeds(
        &self,
        pool: &Pool,
        class: &Class,
        candidates: &[Candidate],
        now: Instant,
    ) -> PoolSpeeds {
        let observe = |c: &Class| c.state.service_times.observe(self.member_names(pool), now);
        let others: Vec<_> = self
            .classes
            .iter()
            .filter(|c| !Arc::ptr_eq(&c.state, &class.state))
            .map(observe)
            .collect();
        let eligible: Vec<bool> = candidates.iter().map(|c| c.eligible).collect();
        PoolSpeeds::new(&observe(class), &others, &eligible)
    }

    /// A backend slot for class `class`: its own pool first, then its fallback pool. A request
    /// held for a faster backend of its own pool does not spill over.
    fn acquire_in_pools(&self, class: usize, ask: &Ask<'_>) -> Result<Lease, Miss> {
        let c = self.classes.get(class).ok_or(Miss::Full)?;
        match self.acquire(c.pool, c, &c.guards, ask) {
            Err(Miss::Full) => match &c.fallback {
                Some((pool, guards)) => self.acquire(*pool, c, guards, ask),
                None => Err(Miss::Full),
            },
            placed_or_held => placed_or_held,
        }
    }

    /// A backend slot for another attempt of a request of class `class` that asks for
    /// `demand`, skipping the backends in `excluded` (never held: the request is admitted).
    pub fn acquire_for_class(
        &self,
        class: usize,
        demand: &Demand,
        excluded: &[usize],
    ) -> Option<Lease> {
        let ask = Ask {
            demand,
            excluded,
            may_hold: false,
        };
        self.acquire_in_pools(class, &ask).ok()
    }

    /// Admission's unit: a class slot and a backend lease (on a backend `demand` allows),
    /// taken together or not at all.
    pub fn grant(&self, class: usize, demand: &Demand) -> Option<Grant> {
        let c = self.classes.get(class)?;
        let class_slot = c.state.outstanding.try_acquire(c.max_outstanding)?;
        let ask = Ask {
            demand,
            excluded: &[],
            may_hold: true,
        };
        match self.acquire_in_pools(class, &ask) {
            Ok(lease) => Some(Grant { class_slot, lease }),
            Err(_) => {
                class_slot.cancel();
                None
            }
        }
    }

    /// Whether a request of class `class` for `route` would find a backend slot now with nobody
    /// queued before it. Nothing is taken: by the time it is acted on, the answer may be stale.
    pub fn has_room(&self, class: usize, route: &ModelRoute) -> bool {
        let Some(c) = self.classes.get(class) else {
            return false;
        };
        if c.state.outstanding.get() >= c.max_outstanding || c.state.queues.depth() > 0 {
            return false;
        }
        let Some(pool) = self.pools.get(c.pool) else {
            return false;
        };
        let now = Instant::now();
        let now_ms = ms_at(now);
        pool.members.iter().any(|&i| {
            self.backends[i].state.admits(route)
                && self
                    .candidate(i, &c.guards, c, RoomClaim::Split, now_ms, now)
                    .available()
        })
    }

    /// Hands free slots to the queued requests of every class, in each queue's fairness order.
    pub fn dispatch_all(&self) {
        for (index, class) in self.classes.iter().enumerate() {
            for (route, queue) in class.state.queues.waiting() {
                // The slot goes to whoever is next: sized as the class's requests usually are.
                let tokens = class.state.mean_tokens.load(Ordering::Relaxed);
                let demand = Demand {
                    route,
                    tokens,
                    prefix: Arc::from([]),
                };
                queue.dispatch(&class.policy, || self.grant(index, &demand));
            }
        }
    }

    /// Whether ejecting backend `index` keeps every pool that lists it within
    /// `max_ejected_percent` (one ejected backend per pool is always allowed).
    fn may_eject(&self, index: usize, now: u64) -> bool {
        let percent = u64::from(self.config.outlier_detection.max_ejected_percent);
        self.pools
            .iter()
            .filter(|p| p.members.contains(&index))
            .all(|pool| {
                let ejected = pool
                    .members
                    .iter()
                    .filter(|&&m| self.backends[m].state.health.is_ejected(now))
                    .count() as u64;
                ejected == 0 || (ejected + 1) * 100 <= percent * pool.members.len() as u64
            })
    }

    /// Feeds one attempt's outcome on backend `index` to passive outlier ejection.
    pub fn report(&self, index: usize, outcome: Result<(), AttemptFailure>) {
        let Some(backend) = self.backends.get(index) else {
            return;
        };
        let health = &backend.state.health;
        match outcome {
            Ok(()) => health.record_success(),
            Err(cause) => {
                let now = now_ms();
                let policy = &self.config.outlier_detection;
                if let Some(ejection) =
                    health.record_failure(policy, now, || self.may_eject(index, now))
                {
                    tracing::warn!(
                        backend = %backend.state.name,
                        %cause,
                        failures = policy.consecutive_failures,
                        duration = ?ejection.duration,
                        ejections = ejection.count,
                        "backend ejected: consecutive failures on live traffic"
                    );
                }
            }
        }
    }
}

/// What one request needs of a backend: its model, and its estimated size.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Demand {
    /// Which backends its model allows.
    pub route: ModelRoute,
    /// Its estimated tokens (prompt + max_tokens); 0 when unknown.
    pub tokens: u64,
    /// Its prompt's fingerprint (see [`crate::request::BodyFacts::prefix`]); empty when unknown.
    pub prefix: Arc<[u64]>,
}

/// Keeps a request of `tokens` estimated tokens off backends whose free KV-cache cannot hold it
/// (it would push running work out there), when another available backend can; when none can,
/// or no backend's KV capacity is known, nothing changes.
fn keep_to_kv_room(candidates: &mut [Candidate], tokens: u64) {
    if tokens > 0 {
        prefer(candidates, |_, c| {
            c.kv_free_tokens.is_none_or(|free| free >= tokens)
        });
    }
}

/// Leaves out the backends that refused work lately (a `retry_statuses` answer, for its
/// `Retry-After`), while another can take the request: a backend that refuses everything looks
/// idle, and would otherwise get first tries that each cost a round trip.
fn pass_over_refusing(candidates: &mut [Candidate], refusing: impl Fn(usize) -> bool) {
    prefer(candidates, |k, _| !refusing(k));
}

/// Makes the candidates that are not `wanted` ineligible, when a wanted one is available.
fn prefer(candidates: &mut [Candidate], wanted: impl Fn(usize, &Candidate) -> bool) {
    if !candidates
        .iter()
        .enumerate()
        .any(|(k, c)| c.available() && wanted(k, c))
    {
        return;
    }
    for (k, c) in candidates.iter_mut().enumerate() {
        c.eligible &= wanted(k, c);
    }
}

/// What one request asks of selection besides its class.
struct Ask<'a> {
    /// Its model's backends and its size.
    demand: &'a Demand,
    /// Backends already tried for it.
    excluded: &'a [usize],
    /// Whether the placement may keep it queued for a better backend.
    may_hold: bool,
}

/// Why no backend slot was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Miss {
    /// No backend of the pool could take the request.
    Full,
    /// A slower backend could, but the request does better waiting for a faster one.
    Held,
}

/// How much of the room a backend had free at its last reading this proxy claims beside the
/// other replicas there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoomClaim {
    /// Its part: the others keep their remembered share of it ([`cap_beside_others`]).
    Split,
    /// All of it: the class has requests queued here, so this proxy fills its own freed slots
    /// at once and still has more to place, and the class keeps no room for other classes
    /// (no `backend_share`). Room still free at a reading is room the replicas that hold the
    /// backend did not refill, so leaving them part of it only idles it while requests wait
    /// here; should two replicas both claim it before the next reading, the overshoot is what
    /// they both took of that room, and it waits in the server's own queue for one step.
    Whole,
}

impl RoomClaim {
    /// The claim of a request of `class`, which has `queued` requests waiting now.
    fn of(class: &Class, queued: usize) -> Self {
        let keeps_room_for_others = class.backend_share.is_some_and(|s| s < 1.0);
        if queued > 0 && !keeps_room_for_others {
            RoomClaim::Whole
        } else {
            RoomClaim::Split
        }
    }
}

/// This proxy's cap on a backend whose cap (for the class) is `cap`, when its server was last
/// read holding `at_read`: the others' requests take their slots, and the room that was free
/// then is split by who has been sending there — the others see the same room, and until the
/// next reading neither sees what the other takes. Their part is the room times their
/// remembered share of the backend's load ([`OthersAtRead::others_share`]), at least half of
/// it while others are there now, rounded down and never all of it: so a replica that saw
/// nobody else at the last reading does not take the whole room when others sent there
/// lately, and one free slot is always fillable. With [`RoomClaim::Whole`] the room is all
/// this proxy's. A slot this proxy releases meanwhile is its own to fill again.
fn cap_beside_others(cap: u32, at_read: OthersAtRead, claim: RoomClaim) -> u32 {
    let room = cap.saturating_sub(at_read.own.saturating_add(at_read.others));
    let theirs_of_room = match claim {
        RoomClaim::Whole => 0,
        RoomClaim::Split => {
            let mut share = at_read.others_share.clamp(0.0, 1.0);
            if at_read.others > 0 {
                share = share.max(0.5);
            }
            ((f64::from(room) * share) as u32).min(room.saturating_sub(1))
        }
    };
    cap.saturating_sub(at_read.others.saturating_add(theirs_of_room))
}

/// A class's cap on one backend: `share` of its `max_outstanding`, rounded up, at least 1.
fn share_of(max_outstanding: u32, share: Option<f64>) -> u32 {
    match share {
        Some(share) if share < 1.0 => {
            ((f64::from(max_outstanding) * share).ceil() as u32).clamp(1, max_outstanding)
        }
        _ => max_outstanding,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(kv_free_tokens: Option<u64>) -> Candidate {
        Candidate {
            outstanding: 0,
            load: 0,
            weight: 1,
            max_outstanding: 8,
            eligible: true,
            slowness_milli: REFERENCE_SPEED,
            work_tokens: 0,
            kv_free_tokens,
        }
    }

    fn eligible(candidates: &[Candidate]) -> Vec<bool> {
        candidates.iter().map(|c| c.eligible).collect()
    }

    #[test]
    fn a_long_job_stays_off_a_backend_whose_kv_cannot_hold_it() {
        let mut pool = [cand(Some(500)), cand(Some(5_000)), cand(None)];
        keep_to_kv_room(&mut pool, 2_000);
        assert_eq!(
            eligible(&pool),
            [false, true, true],
            "unknown capacity counts as room"
        );
        // Nowhere has room: it goes where it can rather than nowhere.
        let mut tight = [cand(Some(500)), cand(Some(900))];
        keep_to_kv_room(&mut tight, 2_000);
        assert_eq!(eligible(&tight), [true, true]);
        // A backend with room that is full does not count as room.
        let mut full = [cand(Some(500)), cand(Some(5_000))];
        full[1].outstanding = 8;
        keep_to_kv_room(&mut full, 2_000);
        assert_eq!(eligible(&full), [true, true]);
        // Unknown size: nothing changes.
        let mut unknown = [cand(Some(0)), cand(Some(5_000))];
        keep_to_kv_room(&mut unknown, 0);
        assert_eq!(eligible(&unknown), [true, true]);
    }
}
