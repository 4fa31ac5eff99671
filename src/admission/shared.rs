//! State shared by a class queue, its waiting requests and its tenant slots; the lease hand-off.
//!
//! Rule: nothing that can run foreign code (a lease's drop, a `TenantSlot`'s drop, `acquire()`)
//! runs while the state lock is held. Everything taken out of the state under the lock (a
//! waiter's sender, a lease sent back by a vanished waiter) is acted on after unlocking.

use super::policy::{QueuePolicy, Shed, ShedReason};
use super::state::{Answer, State, Waiter};
use super::tally::WaitTally;
use std::fmt;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// A waiter that has seen nobody try for capacity this long tries itself; a safety net for
/// capacity that appears without a release (a reload adding backends, a caller that forgot to
/// call `dispatch`), not the normal path, which is woken by `dispatch`.
pub(super) const RECHECK: Duration = Duration::from_millis(250);

/// The queue proper; held by the `ClassQueue` and by every `TenantSlot` it handed out.
pub(super) struct Shared<L> {
    state: Mutex<State<L>>,
    /// Mirror of the state's depth, so `dispatch` on an empty queue takes no lock.
    depth: AtomicUsize,
    /// Leases handed to waiters, ever; feeds the drain rate.
    granted: AtomicU64,
    epoch: Instant,
    /// When a dispatch last tried for capacity (ms since `epoch`).
    last_try_ms: AtomicU64,
    /// Told of every change of the depth, when the queue is a class's.
    tally: Option<Arc<WaitTally>>,
}

impl<L> Shared<L> {
    /// Requests waiting now (lock-free).
    pub(super) fn depth(&self) -> usize {
        self.depth.load(Ordering::SeqCst)
    }

    /// Leases handed to waiters so far.
    pub(super) fn granted(&self) -> u64 {
        self.granted.load(Ordering::Relaxed)
    }
}

impl<L: Send + 'static> Shared<L> {
    /// An empty queue, reporting its depth to `tally` if given.
    pub(super) fn new(tally: Option<Arc<WaitTally>>) -> Self {
        let now = Instant::now();
        Shared {
            state: Mutex::new(State::new(now)),
            depth: AtomicUsize::new(0),
            granted: AtomicU64::new(0),
            epoch: now,
            last_try_ms: AtomicU64::new(0),
            tally,
        }
    }

    /// Runs `f` under the lock and refreshes the depth mirror (and the tally, under the same
    /// lock, so its changes from this queue are in order). `f` must not drop leases or slots.
    pub(super) fn with_state<R>(&self, f: impl FnOnce(&mut State<L>) -> R) -> R {
        // The state stays consistent if a panic unwound through a previous holder.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let out = f(&mut state);
        let depth = state.depth();
        let before = self.depth.swap(depth, Ordering::SeqCst);
        if let Some(tally) = &self.tally {
            tally.moved(before, depth);
        }
        out
    }

    /// A refusal for `reason`, with the current Retry-After estimate.
    pub(super) fn shed(&self, reason: ShedReason) -> Shed {
        let granted = self.granted();
        Shed::new(
            reason,
            self.with_state(|s| s.retry_after(Instant::now(), granted)),
        )
    }

    /// Hands `carry`, then whatever `acquire()` yields, to waiters in fairness order, until the
    /// queue is empty or `acquire()` yields nothing. A lease left over is dropped unlocked.
    pub(super) fn deliver(
        &self,
        policy: &QueuePolicy,
        mut carry: Option<L>,
        acquire: &mut dyn FnMut() -> Option<L>,
    ) {
        loop {
            let lease = match carry.take() {
                Some(lease) => lease,
                None => {
                    // Pairs with the releaser's fence: a request that joined the queue after
                    // its own failed try, and a release racing with it, cannot both miss.
                    fence(Ordering::SeqCst);
                    if self.depth() == 0 {
                        break;
                    }
                    self.last_try_ms.store(self.millis(), Ordering::Relaxed);
                    match acquire() {
                        Some(lease) => lease,
                        None => break,
                    }
                }
            };
            let (now, granted) = (Instant::now(), self.granted());
            let Some(waiter) = self.with_state(|s| {
                s.roll(now, granted);
                s.pop_next(policy)
            }) else {
                carry = Some(lease);
                break;
            };
            carry = self.send(waiter, lease);
        }
        // Outside the lock: dropping a lease may release a slot and re-enter `dispatch`.
        drop(carry);
    }

    /// Sends `lease` to a chosen waiter; gives it back if the waiter is gone.
    pub(super) fn send(&self, waiter: Waiter<L>, lease: L) -> Option<L> {
        match waiter.send(Ok(lease)) {
            Ok(()) => {
                self.granted.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(Ok(lease)) => Some(lease),
            Err(Err(_)) => None,
        }
    }

    /// The waiters' safety net: dispatch if nobody has tried for capacity within [`RECHECK`].
    pub(super) fn recheck(&self, policy: &QueuePolicy, acquire: &mut dyn FnMut() -> Option<L>) {
        let since = self
            .millis()
            .saturating_sub(self.last_try_ms.load(Ordering::Relaxed));
        if u128::from(since) >= RECHECK.as_millis() {
            self.deliver(policy, None, acquire);
        }
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl<L> Drop for Shared<L> {
    /// A queue dropped with requests still counted (their waiters hold it, so none are left in
    /// practice) takes them out of the tally.
    fn drop(&mut self) {
        if let Some(tally) = &self.tally {
            tally.moved(*self.depth.get_mut(), 0);
        }
    }
}

/// Gives tenant slots back to the queue that counts them, whatever its lease type.
trait Release: Send + Sync {
    fn release(&self, tenant: &str);
}

impl<L: Send + 'static> Release for Shared<L> {
    fn release(&self, tenant: &str) {
        self.with_state(|s| s.release_slot(tenant));
    }
}

/// One request of a tenant counted by its class queue, from admission until dropped; the
/// tenant's caps and shares count these.
pub struct TenantSlot {
    owner: Arc<dyn Release>,
    tenant: Arc<str>,
}

impl TenantSlot {
    /// Counts a new slot (already added to the books) for `tenant`.
    pub(super) fn new<L: Send + 'static>(owner: &Arc<Shared<L>>, tenant: Arc<str>) -> Self {
        let owner: Arc<dyn Release> = Arc::clone(owner) as Arc<dyn Release>;
        TenantSlot { owner, tenant }
    }

    /// The tenant this slot counts for.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub(super) fn name(&self) -> &Arc<str> {
        &self.tenant
    }
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        self.owner.release(&self.tenant);
    }
}

impl fmt::Debug for TenantSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantSlot")
            .field("tenant", &self.tenant)
            .finish()
    }
}

/// A queued request's place; leaving it (drop, timeout) takes the waiter out of the queue, and
/// a lease already sent to it goes on to the next waiter instead of being lost.
pub(super) struct WaitGuard<'a, L: Send + 'static> {
    shared: &'a Shared<L>,
    policy: &'a QueuePolicy,
    tenant: Arc<str>,
    id: u64,
    /// The waiter's end of its channel.
    pub(super) rx: oneshot::Receiver<Answer<L>>,
    settled: bool,
}

impl<'a, L: Send + 'static> WaitGuard<'a, L> {
    /// Guards waiter `id` of `tenant`.
    pub(super) fn new(
        shared: &'a Shared<L>,
        policy: &'a QueuePolicy,
        tenant: Arc<str>,
        id: u64,
        rx: oneshot::Receiver<Answer<L>>,
    ) -> Self {
        WaitGuard {
            shared,
            policy,
            tenant,
            id,
            rx,
            settled: false,
        }
    }

    /// Marks the outcome as taken from the channel: nothing left to clean up.
    pub(super) fn settle(&mut self) {
        self.settled = true;
    }

    /// Leaves the queue; returns what a dispatcher sent if one chose this waiter first.
    pub(super) fn leave(&mut self) -> Option<Answer<L>> {
        self.settled = true;
        let removed = self
            .shared
            .with_state(|s| s.remove_waiter(&self.tenant, self.id));
        if removed.is_some() {
            return None;
        }
        // Already chosen: a send not yet made now fails back to the dispatcher, which keeps the
        // lease; a send already made is taken here.
        self.rx.close();
        self.rx.try_recv().ok()
    }
}

impl<L: Send + 'static> Drop for WaitGuard<'_, L> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some(Ok(lease)) = self.leave() {
            self.shared.deliver(self.policy, Some(lease), &mut || None);
        }
    }
}
