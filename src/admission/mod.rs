//! Per-class admission: a bounded queue, fair across tenants, that hands backend leases to
//! waiting requests as capacity frees, or sheds them with 429/503 and an honest Retry-After.
//!
//! How it works:
//! - `admit` takes a lease at once when nobody waits; otherwise the request joins the queue (one
//!   oneshot channel per waiter) and sleeps until `dispatch` sends it a lease, `max_wait` passes,
//!   or a lighter tenant pushes it out of a full queue.
//! - `dispatch` is called by whoever frees capacity (a slot's `Drop`). It takes leases with
//!   `acquire()` *outside* the lock, picks the next waiter *under* it, and sends *outside* it, so
//!   a lease dropped anywhere here may re-enter `dispatch` without deadlock.
//! - A waiter that vanishes is taken out by its guard; if it was already chosen, the lease goes
//!   back to the dispatcher (send fails) or on to the next waiter (guard drains its channel).
//! - No lost wake-up: a request that fails its first try joins the queue and then dispatches
//!   once itself; a releaser wakes the dispatcher after its release while any request waits
//!   (`WaitTally` counts them; a fence on each side). Whichever comes second sees the other.

mod drain;
#[cfg(test)]
mod fair_tests;
mod policy;
mod shared;
mod state;
mod tally;
#[cfg(test)]
mod tests;

pub use policy::{Fairness, QueuePolicy, Shed, ShedReason};
pub use shared::TenantSlot;
pub use tally::WaitTally;

use shared::{Shared, WaitGuard, RECHECK};
use state::{Joined, Ticket};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{timeout_at, Instant};

/// A granted admission: the lease, the tenant's slot, and the time spent queued.
#[derive(Debug)]
pub struct Admitted<L> {
    /// What `acquire()` yielded for this request.
    pub lease: L,
    /// Counts the request against its tenant until dropped.
    pub tenant_slot: TenantSlot,
    /// Time spent waiting in the queue (zero when admitted at once).
    pub queued_for: Duration,
}

/// How `enter` let a request in.
enum Entry<L> {
    Admitted(Admitted<L>),
    Queued(TenantSlot, Ticket<L>),
}

/// The admission queue of one class; lives across config reloads (the policy comes per call).
pub struct ClassQueue<L> {
    shared: Arc<Shared<L>>,
}

impl<L: Send + 'static> ClassQueue<L> {
    /// An empty queue.
    pub fn new() -> Self {
        ClassQueue {
            shared: Arc::new(Shared::new(None)),
        }
    }

    /// An empty queue whose waiting requests are also counted in `tally`.
    pub fn tallied(tally: Arc<WaitTally>) -> Self {
        ClassQueue {
            shared: Arc::new(Shared::new(Some(tally))),
        }
    }

    /// Admits one request of `tenant`: at once when nobody waits and `acquire()` yields a lease,
    /// else after waiting its turn; or refuses it (see [`ShedReason`]).
    pub async fn admit(
        &self,
        tenant: &str,
        policy: &QueuePolicy,
        mut acquire: impl FnMut() -> Option<L>,
    ) -> Result<Admitted<L>, Shed> {
        let start = Instant::now();
        match self.enter(tenant, policy, start, &mut acquire)? {
            Entry::Admitted(admitted) => Ok(admitted),
            Entry::Queued(slot, ticket) => {
                self.wait(slot, ticket, policy, start, &mut acquire).await
            }
        }
    }

    /// Refuses, admits at once, or queues: one lock for a refusal, no allocation.
    fn enter(
        &self,
        tenant: &str,
        policy: &QueuePolicy,
        start: Instant,
        acquire: &mut dyn FnMut() -> Option<L>,
    ) -> Result<Entry<L>, Shed> {
        let shared = &*self.shared;
        let granted = shared.granted();
        let joined = shared.with_state(|s| {
            s.join(tenant, policy)
                .map_err(|reason| Shed::new(reason, s.retry_after(start, granted)))
        })?;
        let (slot, ticket) = match joined {
            Joined::TryNow(name) => {
                let slot = TenantSlot::new(&self.shared, name);
                if let Some(lease) = acquire() {
                    return Ok(Entry::Admitted(Admitted {
                        lease,
                        tenant_slot: slot,
                        queued_for: Duration::ZERO,
                    }));
                }
                let requeued = shared.with_state(|s| {
                    s.requeue(slot.name(), policy)
                        .map_err(|reason| Shed::new(reason, s.retry_after(start, granted)))
                });
                // On refusal the slot drops here, after the lock is released.
                (slot, requeued?)
            }
            Joined::Queued(name, ticket) => (TenantSlot::new(&self.shared, name), ticket),
        };
        Ok(Entry::Queued(slot, ticket))
    }

    /// Waits in the queue until a lease comes, the request is pushed out, or `max_wait` passes.
    async fn wait(
        &self,
        slot: TenantSlot,
        ticket: Ticket<L>,
        policy: &QueuePolicy,
        start: Instant,
        acquire: &mut impl FnMut() -> Option<L>,
    ) -> Result<Admitted<L>, Shed> {
        let shared = &*self.shared;
        let Ticket { id, rx, evicted } = ticket;
        if let Some(waiter) = evicted {
            // The pushed-out waiter answers 429; nothing to do if it has gone already.
            let _ = waiter.send(Err(ShedReason::TenantOverShare));
        }
        // A local drops before the `slot` parameter: the waiter leaves before its slot does.
        let mut guard = WaitGuard::new(shared, policy, Arc::clone(slot.name()), id, rx);
        // Capacity may have freed between the failed try and joining, seen by nobody.
        shared.deliver(policy, None, &mut *acquire);
        let deadline = start
            .checked_add(policy.max_wait)
            .unwrap_or_else(|| start + Duration::from_secs(365 * 86_400));
        let outcome = loop {
            let wake = deadline.min(Instant::now() + RECHECK);
            match timeout_at(wake, &mut guard.rx).await {
                Ok(received) => {
                    guard.settle();
                    break received.ok();
                }
                Err(_) if Instant::now() < deadline => shared.recheck(policy, &mut *acquire),
                Err(_) => break guard.leave(),
            }
        };
        match outcome {
            Some(Ok(lease)) => Ok(Admitted {
                lease,
                tenant_slot: slot,
                queued_for: start.elapsed(),
            }),
            Some(Err(reason)) => Err(shared.shed(reason)),
            None => Err(shared.shed(ShedReason::WaitTimeout)),
        }
    }

    /// Capacity may have freed: hands leases to waiters in fairness order while `acquire()`
    /// yields. Cheap when nobody waits (one atomic load); callable from any thread or `Drop`.
    pub fn dispatch(&self, policy: &QueuePolicy, mut acquire: impl FnMut() -> Option<L>) {
        self.shared.deliver(policy, None, &mut acquire);
    }

    /// Refuses every request waiting now with `reason` (each answers at once).
    pub fn shed_all(&self, policy: &QueuePolicy, reason: ShedReason) {
        while let Some(waiter) = self.shared.with_state(|s| s.pop_next(policy)) {
            // A waiter that has gone already needs no answer.
            let _ = waiter.send(Err(reason));
        }
    }

    /// Requests waiting now.
    pub fn depth(&self) -> usize {
        self.shared.depth()
    }

    /// Requests waiting now, per tenant with any.
    pub fn depth_by_tenant(&self) -> Vec<(String, usize)> {
        self.shared.with_state(|s| s.depth_by_tenant())
    }

    /// Time the queue needs to drain at its observed rate, in [1 s, 60 s]; 1 s when unknown.
    pub fn retry_after(&self) -> Duration {
        let granted = self.shared.granted();
        self.shared
            .with_state(|s| s.retry_after(Instant::now(), granted))
    }
}

impl<L: Send + 'static> Default for ClassQueue<L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<L> fmt::Debug for ClassQueue<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassQueue")
            .field("depth", &self.shared.depth())
            .finish_non_exhaustive()
    }
}
