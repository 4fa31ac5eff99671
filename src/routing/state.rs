//! Live per-backend and per-class state: in-flight counters and the RAII slots that hold them.

use super::models::{ModelRoute, ServedModels};
use super::queues::ClassQueues;
use crate::config::ResolveError;
use crate::health::HealthState;
use crate::metrics::ClassMetrics;
use crate::routing::service_time::ServiceTimes;
use crate::telemetry::Telemetry;
use arc_swap::ArcSwap;
use std::net::SocketAddr;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Wakes the admission dispatcher: when a slot is released while requests wait in some queue,
/// and whenever capacity may have appeared otherwise. Kept across reloads.
#[derive(Debug, Default)]
pub struct CapacitySignal {
    /// What the dispatcher waits on.
    pub notify: Notify,
    /// Requests waiting in any class queue now (every class's `WaitTally` adds to it).
    pub waiting: Arc<AtomicUsize>,
}

impl CapacitySignal {
    /// Wakes the dispatcher after a release, if anyone waits for capacity.
    fn released(&self) {
        // Pairs with the fence in a queue's dispatch after a request joined it: either that
        // dispatch sees this release, or this release sees the request waiting.
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.notify.notify_one();
        }
    }
}

/// An in-flight counter with an optional cap; each unit is held by a [`Slot`].
///
/// Releasing a unit while requests wait signals `released`, which wakes the admission
/// dispatcher: queued requests are woken by releases, not by polling; with nobody waiting a
/// release wakes nothing.
#[derive(Debug, Default)]
pub struct InflightCounter {
    value: AtomicU32,
    released: Option<Arc<CapacitySignal>>,
}

impl InflightCounter {
    /// A counter that signals `released` whenever a unit is given back while requests wait.
    pub fn with_release_signal(released: Arc<CapacitySignal>) -> Self {
        InflightCounter {
            value: AtomicU32::new(0),
            released: Some(released),
        }
    }

    /// Tells the dispatcher that capacity may have appeared without a release.
    pub fn signal_capacity(&self) {
        if let Some(released) = &self.released {
            released.notify.notify_one();
        }
    }

    /// Requests in flight now.
    pub fn get(&self) -> u32 {
        self.value.load(Ordering::Acquire)
    }

    /// Takes one unit if the count is below `cap`; the unit is given back when the slot drops.
    pub fn try_acquire(self: &Arc<Self>, cap: u32) -> Option<Slot> {
        self.value
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot {
                counter: Some(Arc::clone(self)),
            })
    }
}

/// One unit of an [`InflightCounter`], released exactly once when dropped.
#[derive(Debug)]
pub struct Slot {
    counter: Option<Arc<InflightCounter>>,
}

impl Slot {
    /// Gives back a unit that was taken but never used (a grant rolled back), without waking
    /// the dispatcher: nothing new became free, and a wake-up would only retry the same grant.
    pub fn cancel(mut self) {
        if let Some(counter) = self.counter.take() {
            counter.value.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(counter) = self.counter.take() {
            counter.value.fetch_sub(1, Ordering::AcqRel);
            if let Some(released) = &counter.released {
                released.released();
            }
        }
    }
}

/// Hands out [`BackendState::id`]s.
static NEXT_BACKEND_ID: AtomicU32 = AtomicU32::new(0);

/// Live state of one backend; shared by every pool that lists it and kept across reloads.
#[derive(Debug)]
pub struct BackendState {
    /// The backend's configured name.
    pub name: String,
    /// A number unique in this process, kept across reloads with the state (for indexes that
    /// must not depend on a snapshot's backend order).
    pub id: u32,
    /// Requests this proxy has in flight on the backend.
    pub outstanding: Arc<InflightCounter>,
    /// Requests ever sent to the backend (each attempt counts).
    pub attempts_total: AtomicU64,
    /// Of those, the ones it refused with a `retry_statuses` status that went to another
    /// backend instead.
    pub refusals_retried_total: AtomicU64,
    /// Until when (monotonic ms, [`crate::health::now_ms`]) it is passed over while another
    /// backend can take the request: it refused one with a `retry_statuses` status.
    refusing_until_ms: AtomicU64,
    /// Active check status and passive ejection.
    pub health: HealthState,
    /// Last telemetry read (GPU and model-server figures), with its time; `None` before any.
    pub telemetry: Arc<arc_swap::ArcSwapOption<Telemetry>>,
    /// Telemetry scrapes that failed.
    pub telemetry_errors: Arc<AtomicU64>,
    /// Where it is reached: resolved when a snapshot is built, again by each health check.
    pub address: Address,
    /// The models it serves, when known.
    pub models: ServedModels,
    /// Estimated tokens (prompt + max_tokens) of the requests this proxy has in flight on it.
    pub outstanding_tokens: Arc<AtomicU64>,
}

/// A backend's address, or why its name has none (then it gets no traffic).
#[derive(Debug)]
pub struct Address(ArcSwap<Result<SocketAddr, ResolveError>>);

impl Default for Address {
    fn default() -> Self {
        Address(ArcSwap::from_pointee(Err(ResolveError::Empty(
            "not resolved yet".to_string(),
        ))))
    }
}

impl Address {
    /// The address to connect to, when the name resolved.
    pub fn get(&self) -> Option<SocketAddr> {
        self.0.load().as_ref().as_ref().ok().copied()
    }

    /// Why the name has no address, when it has none.
    pub fn unresolved(&self) -> Option<String> {
        self.0
            .load()
            .as_ref()
            .as_ref()
            .err()
            .map(ToString::to_string)
    }

    /// Records a resolution; a failure keeps the last good address unless `forget` (the
    /// backend's URL changed, so the old address is not its address any more).
    pub fn update(&self, resolved: Result<SocketAddr, ResolveError>, forget: bool) {
        if resolved.is_ok() || forget || self.get().is_none() {
            self.0.store(Arc::new(resolved));
        }
    }
}

impl BackendState {
    /// Fresh state for a backend with no traffic yet; releases signal `released`.
    pub fn new(name: impl Into<String>, released: Arc<CapacitySignal>) -> Self {
        BackendState {
            name: name.into(),
            id: NEXT_BACKEND_ID.fetch_add(1, Ordering::Relaxed),
            outstanding: Arc::new(InflightCounter::with_release_signal(released)),
            attempts_total: AtomicU64::new(0),
            refusals_retried_total: AtomicU64::new(0),
            refusing_until_ms: AtomicU64::new(0),
            health: HealthState::default(),
            telemetry: Arc::new(arc_swap::ArcSwapOption::empty()),
            telemetry_errors: Arc::new(AtomicU64::new(0)),
            address: Address::default(),
            models: ServedModels::default(),
            outstanding_tokens: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Records a refusal at `now_ms`: it is passed over for `cooldown` while others have room.
    pub fn note_refusal(&self, now_ms: u64, cooldown: Duration) {
        let until = now_ms.saturating_add(u64::try_from(cooldown.as_millis()).unwrap_or(u64::MAX));
        self.refusing_until_ms.fetch_max(until, Ordering::Relaxed);
    }

    /// Ends a refusal's cooldown early: it took a request (no store while there is none).
    pub fn note_accepted(&self) {
        if self.refusing_until_ms.load(Ordering::Relaxed) != 0 {
            self.refusing_until_ms.store(0, Ordering::Relaxed);
        }
    }

    /// Whether it refused work lately enough to be passed over at `now_ms` ([`Self::note_refusal`]).
    pub fn refusing(&self, now_ms: u64) -> bool {
        now_ms < self.refusing_until_ms.load(Ordering::Relaxed)
    }

    /// Whether a request whose route is `route` may go to it: it serves the model, or it is
    /// the backend that stored the response the request names.
    pub fn admits(&self, route: &ModelRoute) -> bool {
        match route {
            ModelRoute::Stored(owner) => self.id == *owner,
            _ => self.models.admits(route),
        }
    }

    /// Whether new requests may go to it now: its name resolved, healthy and not ejected.
    pub fn eligible(&self, now_ms: u64) -> bool {
        self.health.eligible(now_ms) && self.address.get().is_some()
    }
}

/// Live state of one class; kept across reloads by class name.
pub struct ClassState {
    /// Requests of this class in flight now.
    pub outstanding: Arc<InflightCounter>,
    /// Requests of this class waiting for a backend slot, by the model they ask for.
    pub queues: ClassQueues,
    /// How long its requests take on each backend.
    pub service_times: ServiceTimes,
    /// Moving average of its requests' estimated tokens (0 before any body was read): the
    /// size assumed for a queued request when a slot is taken for whoever is next.
    pub mean_tokens: AtomicU64,
    /// Its batches taking members now (classes with `batching`).
    pub batches: crate::batching::OpenBatches,
    /// Its metric handles, looked up by name once rather than per request.
    pub metrics: OnceLock<Arc<ClassMetrics>>,
}

impl ClassState {
    /// Fresh state for a class; releases of its in-flight slots signal `released`, and its
    /// queued requests are counted in `released.waiting`.
    pub fn new(released: Arc<CapacitySignal>) -> Self {
        let queues = ClassQueues::new(Arc::clone(&released.waiting));
        ClassState {
            outstanding: Arc::new(InflightCounter::with_release_signal(released)),
            queues,
            service_times: ServiceTimes::default(),
            mean_tokens: AtomicU64::new(0),
            batches: crate::batching::OpenBatches::default(),
            metrics: OnceLock::new(),
        }
    }
}

impl ClassState {
    /// Folds one request's estimated tokens into [`ClassState::mean_tokens`] (weight 1/8).
    pub fn note_tokens(&self, tokens: u64) {
        let _ = self
            .mean_tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| {
                Some(if mean == 0 {
                    tokens
                } else {
                    mean - mean / 8 + tokens / 8
                })
            });
    }
}

impl std::fmt::Debug for ClassState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassState")
            .field("outstanding", &self.outstanding.get())
            .field("queued", &self.queues.depth())
            .finish()
    }
}

/// What admission hands a request: its class slot and a backend lease, taken together.
#[derive(Debug)]
pub struct Grant {
    /// Counts the request against its class until the request ends.
    pub class_slot: Slot,
    /// The backend slot of the first attempt.
    pub lease: Lease,
}

/// A backend slot held by one request attempt, with the request's estimated tokens counted
/// on the backend; dropping it releases both.
#[derive(Debug)]
pub struct Lease {
    /// Index of the backend in the snapshot the request runs under.
    pub backend: usize,
    /// When the slot was taken: the start of the request's service time on the backend.
    pub taken_at: Instant,
    tokens: TokenHold,
    _slot: Slot,
}

impl Lease {
    /// Wraps a slot taken on backend `backend` of a snapshot, counting `tokens` in `counter`.
    pub fn new(backend: usize, slot: Slot, counter: &Arc<AtomicU64>, tokens: u64) -> Self {
        counter.fetch_add(tokens, Ordering::Relaxed);
        Lease {
            backend,
            taken_at: Instant::now(),
            tokens: TokenHold {
                counter: Arc::clone(counter),
                tokens,
            },
            _slot: slot,
        }
    }

    /// Counts `tokens` for this request instead of what the slot was taken with (a queued
    /// request learns the real size of the one it was taken for).
    pub fn set_tokens(&mut self, tokens: u64) {
        let hold = &mut self.tokens;
        hold.counter.fetch_add(tokens, Ordering::Relaxed);
        hold.counter.fetch_sub(hold.tokens, Ordering::Relaxed);
        hold.tokens = tokens;
    }
}

/// Estimated tokens counted on a backend while a lease lives.
#[derive(Debug)]
struct TokenHold {
    counter: Arc<AtomicU64>,
    tokens: u64,
}

impl Drop for TokenHold {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.tokens, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_keeps_its_last_good_value_unless_told_to_forget() {
        let address = Address::default();
        assert_eq!(address.get(), None);
        assert!(address.unresolved().is_some());
        let failed = || {
            Err(ResolveError::Failed {
                authority: "gpu.example:8000".into(),
                cause: "no answer".into(),
            })
        };
        address.update(failed(), false);
        assert!(address.unresolved().unwrap().contains("gpu.example:8000"));
        let at: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        address.update(Ok(at), false);
        assert_eq!((address.get(), address.unresolved()), (Some(at), None));
        // A resolver hiccup does not take a working backend out...
        address.update(failed(), false);
        assert_eq!(address.get(), Some(at));
        // ...but a new URL that does not resolve is not the old server.
        address.update(failed(), true);
        assert_eq!(address.get(), None);
    }

    #[test]
    fn slots_respect_the_cap_and_release_on_drop() {
        let counter = Arc::new(InflightCounter::default());
        let a = counter.try_acquire(2).unwrap();
        let b = counter.try_acquire(2).unwrap();
        assert!(counter.try_acquire(2).is_none());
        assert_eq!(counter.get(), 2);
        drop(a);
        assert_eq!(counter.get(), 1);
        let c = counter.try_acquire(2).unwrap();
        drop((b, c));
        assert_eq!(counter.get(), 0);
    }

    #[tokio::test]
    async fn a_release_signals_while_requests_wait_and_a_cancel_never_does() {
        let signal = Arc::new(CapacitySignal::default());
        let counter = Arc::new(InflightCounter::with_release_signal(Arc::clone(&signal)));
        let quiet = || {
            tokio::time::timeout(
                std::time::Duration::from_millis(50),
                signal.notify.notified(),
            )
        };
        drop(counter.try_acquire(1).unwrap());
        assert!(quiet().await.is_err(), "nobody waits: nothing to wake");
        signal.waiting.store(1, Ordering::SeqCst);
        counter.try_acquire(1).unwrap().cancel();
        assert_eq!(counter.get(), 0);
        assert!(
            quiet().await.is_err(),
            "cancel must not wake the dispatcher"
        );
        drop(counter.try_acquire(1).unwrap());
        tokio::time::timeout(std::time::Duration::from_secs(1), signal.notify.notified())
            .await
            .expect("a release wakes the dispatcher while a request waits");
    }

    #[test]
    fn concurrent_acquires_never_exceed_the_cap() {
        let counter = Arc::new(InflightCounter::default());
        let held: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        (0..100)
                            .filter_map(|_| counter.try_acquire(50))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(held.len(), 50);
        assert_eq!(counter.get(), 50);
        drop(held);
        assert_eq!(counter.get(), 0);
    }
}
