//! The queue's books, kept under one lock: waiters by tenant and by arrival, tenant counts, and
//! the fair choice of the next waiter (FIFO, or deficit round robin across tenants).

use super::drain::DrainRate;
use super::policy::{Fairness, QueuePolicy, ShedReason};
use crate::fast_hash::FastMap;
use std::collections::{BTreeMap, HashMap};

mod choose;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// What a waiter is sent: a lease, or the reason it was pushed out of the queue.
pub(super) type Answer<L> = Result<L, ShedReason>;

/// The queue's end of one waiting request's channel.
pub(super) type Waiter<L> = oneshot::Sender<Answer<L>>;

/// A place taken in the queue.
pub(super) struct Ticket<L> {
    /// The waiter's arrival id (unique, increasing).
    pub(super) id: u64,
    /// The waiter's end of its channel.
    pub(super) rx: oneshot::Receiver<Answer<L>>,
    /// A waiter pushed out to make room, to be told so once the lock is released.
    pub(super) evicted: Option<Waiter<L>>,
}

/// How [`State::join`] let a request in; either way one tenant slot is now counted.
pub(super) enum Joined<L> {
    /// Nobody waits: try for capacity at once.
    TryNow(Arc<str>),
    /// Queued behind others.
    Queued(Arc<str>, Ticket<L>),
}

/// One tenant's FIFO and counts; forgotten once it has nothing queued or in flight.
struct Tenant<L> {
    /// Queued requests by arrival id.
    waiting: BTreeMap<u64, Waiter<L>>,
    /// Tenant slots alive: queued plus admitted.
    outstanding: usize,
    /// Requests left in the tenant's current round-robin turn.
    deficit: u32,
    /// The tenant's key in `State::ring`, held while it has waiters.
    turn: Option<u64>,
}

impl<L> Tenant<L> {
    fn in_flight(&self) -> usize {
        self.outstanding.saturating_sub(self.waiting.len())
    }
}

/// Everything the queue knows, guarded by the queue's one mutex.
pub(super) struct State<L> {
    tenants: FastMap<Arc<str>, Tenant<L>>,
    /// Every waiter by arrival id: the FIFO of `BestEffort`, and the depth.
    arrivals: BTreeMap<u64, Arc<str>>,
    /// Tenants with waiters in round-robin order; the first is the one whose turn it is.
    ring: BTreeMap<u64, Arc<str>>,
    next_id: u64,
    next_turn: u64,
    /// Tenant slots alive across all tenants.
    outstanding: usize,
    drain: DrainRate,
}

impl<L> State<L> {
    /// An empty queue.
    pub(super) fn new(now: Instant) -> Self {
        State {
            tenants: FastMap::default(),
            arrivals: BTreeMap::new(),
            ring: BTreeMap::new(),
            next_id: 0,
            next_turn: 0,
            outstanding: 0,
            drain: DrainRate::new(now),
        }
    }

    /// Requests waiting now.
    pub(super) fn depth(&self) -> usize {
        self.arrivals.len()
    }

    /// Waiting requests per tenant, for tenants with any.
    pub(super) fn depth_by_tenant(&self) -> Vec<(String, usize)> {
        self.tenants
            .iter()
            .filter(|(_, t)| !t.waiting.is_empty())
            .map(|(name, t)| (name.to_string(), t.waiting.len()))
            .collect()
    }

    /// Tenants the queue keeps counts for.
    #[cfg(test)]
    pub(super) fn tenants_tracked(&self) -> usize {
        self.tenants.len()
    }

    /// Closes the drain-rate window if due; `granted` is the running total of queue grants.
    pub(super) fn roll(&mut self, now: Instant, granted: u64) {
        self.drain.roll(now, granted, self.depth());
    }

    /// Retry-After estimate from the observed drain rate.
    pub(super) fn retry_after(&mut self, now: Instant, granted: u64) -> Duration {
        self.roll(now, granted);
        self.drain.retry_after(self.depth())
    }

    /// Lets a request of `tenant` in (to try at once, or to wait), or says why not.
    /// A refusal touches only counts: no allocation, no change.
    pub(super) fn join(
        &mut self,
        tenant: &str,
        policy: &QueuePolicy,
    ) -> Result<Joined<L>, ShedReason> {
        if let Some(cap) = policy.tenant_max_outstanding {
            let held = self.tenants.get(tenant).map_or(0, |t| t.outstanding);
            if held >= cap as usize {
                return Err(ShedReason::TenantCap);
            }
        }
        if self.arrivals.is_empty() {
            return Ok(Joined::TryNow(self.take_slot(tenant)));
        }
        let evicted = self.make_room(tenant, policy)?;
        let name = self.take_slot(tenant);
        let ticket = self.push(&name, evicted);
        Ok(Joined::Queued(name, ticket))
    }

    /// Queues a request whose first try failed (its tenant slot is already counted).
    pub(super) fn requeue(
        &mut self,
        name: &Arc<str>,
        policy: &QueuePolicy,
    ) -> Result<Ticket<L>, ShedReason> {
        let evicted = self.make_room(name, policy)?;
        Ok(self.push(name, evicted))
    }

    /// Counts one tenant slot released, forgetting the tenant once it holds nothing.
    pub(super) fn release_slot(&mut self, tenant: &str) {
        self.outstanding = self.outstanding.saturating_sub(1);
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.outstanding = t.outstanding.saturating_sub(1);
        }
        self.forget_if_idle(tenant);
    }

    /// Takes waiter `id` of `tenant` out of the queue, if it is still there.
    pub(super) fn remove_waiter(&mut self, tenant: &str, id: u64) -> Option<Waiter<L>> {
        let t = self.tenants.get_mut(tenant)?;
        let waiter = t.waiting.remove(&id)?;
        self.arrivals.remove(&id);
        if t.waiting.is_empty() {
            leave_ring(t, &mut self.ring);
        }
        self.forget_if_idle(tenant);
        Some(waiter)
    }

    /// Takes the next waiter to serve out of the queue, in the policy's order.
    pub(super) fn pop_next(&mut self, policy: &QueuePolicy) -> Option<Waiter<L>> {
        let name = match &policy.fairness {
            Fairness::BestEffort => Arc::clone(self.arrivals.first_key_value()?.1),
            Fairness::EqualShare => self.next_in_turn(&policy.fairness)?,
            Fairness::FixedShare { min_share, .. } => match self.below_min_share(min_share) {
                Some(name) => name,
                None => self.next_in_turn(&policy.fairness)?,
            },
        };
        self.pop_from(&name, false)
    }

    fn take_slot(&mut self, tenant: &str) -> Arc<str> {
        self.outstanding += 1;
        if let Some((name, _)) = self.tenants.get_key_value(tenant) {
            let name = Arc::clone(name);
            if let Some(t) = self.tenants.get_mut(&*name) {
                t.outstanding += 1;
            }
            return name;
        }
        let name: Arc<str> = Arc::from(tenant);
        let mut t = Tenant::new();
        t.outstanding = 1;
        self.tenants.insert(Arc::clone(&name), t);
        name
    }

    fn push(&mut self, name: &Arc<str>, evicted: Option<Waiter<L>>) -> Ticket<L> {
        let id = self.next_id;
        self.next_id += 1;
        let (tx, rx) = oneshot::channel();
        let t = self
            .tenants
            .entry(Arc::clone(name))
            .or_insert_with(Tenant::new);
        t.waiting.insert(id, tx);
        if t.turn.is_none() {
            t.turn = Some(self.next_turn);
            self.ring.insert(self.next_turn, Arc::clone(name));
            self.next_turn += 1;
        }
        self.arrivals.insert(id, Arc::clone(name));
        self.drain.note_waiting();
        Ticket { id, rx, evicted }
    }

    /// Takes the oldest (or newest) waiter of `tenant` out of the queue.
    fn pop_from(&mut self, tenant: &str, newest: bool) -> Option<Waiter<L>> {
        let t = self.tenants.get_mut(tenant)?;
        let (id, waiter) = if newest {
            t.waiting.pop_last()
        } else {
            t.waiting.pop_first()
        }?;
        self.arrivals.remove(&id);
        if t.waiting.is_empty() {
            leave_ring(t, &mut self.ring);
        }
        Some(waiter)
    }

    fn forget_if_idle(&mut self, tenant: &str) {
        if matches!(self.tenants.get(tenant), Some(t) if t.outstanding == 0 && t.waiting.is_empty())
        {
            self.tenants.remove(tenant);
        }
    }
}

impl<L> Tenant<L> {
    fn new() -> Self {
        Tenant {
            waiting: BTreeMap::new(),
            outstanding: 0,
            deficit: 0,
            turn: None,
        }
    }
}

/// Takes a tenant with no more waiters out of the round robin; its unused turn is lost.
fn leave_ring<L>(t: &mut Tenant<L>, ring: &mut BTreeMap<u64, Arc<str>>) {
    if let Some(turn) = t.turn.take() {
        ring.remove(&turn);
    }
    t.deficit = 0;
}
