//! Choosing a backend for a request and feeding attempt outcomes to outlier ejection.

use super::Snapshot;
use crate::backend::{Grant, Lease};
use crate::balance::{self, Candidate};
use crate::config::Guards;
use crate::health::now_ms;
use crate::telemetry::is_fresh;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Snapshot {
    /// What selection sees of backend `index` for a class with `guards`: healthy, not ejected,
    /// inside the guards (fresh telemetry only: stale is unknown), and its load with the model
    /// server's own running + waiting counts folded in, so other proxy replicas and clients
    /// that bypass this proxy are seen.
    fn candidate(
        &self,
        index: usize,
        guards: &Guards,
        share: Option<f64>,
        now_ms: u64,
        now: Instant,
    ) -> Candidate {
        let b = &self.backends[index];
        let outstanding = b.state.outstanding.get();
        let telemetry = b.state.telemetry.load();
        let fresh = telemetry
            .as_deref()
            .filter(|t| is_fresh(t, self.config.telemetry.stale_after, now));
        let reported = fresh
            .and_then(|t| t.reading.server.as_ref())
            .map(|s| s.running.unwrap_or(0.0) + s.waiting.unwrap_or(0.0))
            .unwrap_or(0.0);
        Candidate {
            outstanding,
            // Our own requests are part of what the server reports: take the larger, not the sum.
            load: outstanding.max(reported.clamp(0.0, f64::from(u32::MAX / 2)) as u32),
            weight: b.weight,
            max_outstanding: share_of(b.max_outstanding, share),
            eligible: b.state.health.eligible(now_ms)
                && !fresh.is_some_and(|t| guards.excludes(&t.reading)),
        }
    }

    /// Takes a slot on the least loaded available backend of `pool` for a class with `guards`
    /// that may fill `share` of each backend, skipping `excluded`.
    fn acquire(
        &self,
        pool: usize,
        guards: &Guards,
        share: Option<f64>,
        excluded: &[usize],
    ) -> Option<Lease> {
        let members = &self.pools.get(pool)?.members;
        let (now_ms, now) = (now_ms(), Instant::now());
        let mut candidates: Vec<Candidate> = members
            .iter()
            .map(|&i| {
                let mut c = self.candidate(i, guards, share, now_ms, now);
                c.eligible &= !excluded.contains(&i);
                c
            })
            .collect();
        let mut rng = rand::rng();
        // Each failed acquire (another request took the last slot) removes one candidate.
        for _ in 0..candidates.len() {
            let chosen = balance::pick(&candidates, &mut rng)?;
            let backend = &self.backends[members[chosen]];
            if let Some(slot) = backend
                .state
                .outstanding
                .try_acquire(candidates[chosen].max_outstanding)
            {
                backend.state.attempts_total.fetch_add(1, Ordering::Relaxed);
                return Some(Lease::new(members[chosen], slot));
            }
            candidates[chosen].eligible = false;
        }
        None
    }

    /// A backend slot for class `class`: its own pool first, then its fallback pool.
    pub fn acquire_for_class(&self, class: usize, excluded: &[usize]) -> Option<Lease> {
        let c = self.classes.get(class)?;
        self.acquire(c.pool, &c.guards, c.backend_share, excluded)
            .or_else(|| {
                let (pool, guards) = c.fallback.as_ref()?;
                self.acquire(*pool, guards, c.backend_share, excluded)
            })
    }

    /// Admission's unit: a class slot and a backend lease, taken together or not at all.
    pub fn grant(&self, class: usize) -> Option<Grant> {
        let c = self.classes.get(class)?;
        let class_slot = c.state.outstanding.try_acquire(c.max_outstanding)?;
        match self.acquire_for_class(class, &[]) {
            Some(lease) => Some(Grant { class_slot, lease }),
            None => {
                class_slot.cancel();
                None
            }
        }
    }

    /// Hands free slots to the queued requests of every class, in each queue's fairness order.
    pub fn dispatch_all(&self) {
        for (index, class) in self.classes.iter().enumerate() {
            if class.state.queue.depth() > 0 {
                class
                    .state
                    .queue
                    .dispatch(&class.policy, || self.grant(index));
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
    pub fn report(&self, index: usize, outcome: Result<(), &str>) {
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

/// A class's cap on one backend: `share` of its `max_outstanding`, rounded up, at least 1.
fn share_of(max_outstanding: u32, share: Option<f64>) -> u32 {
    match share {
        Some(share) if share < 1.0 => {
            ((f64::from(max_outstanding) * share).ceil() as u32).clamp(1, max_outstanding)
        }
        _ => max_outstanding,
    }
}
