//! Queue basics: FIFO service, shedding, timeouts, vanished waiters, and lease accounting.

use super::*;
use futures_util::FutureExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Capacity simulated by a count of free slots; counts every lease made and dropped.
#[derive(Debug, Default)]
pub(super) struct Pool {
    free: AtomicUsize,
    pub(super) created: AtomicUsize,
    pub(super) dropped: AtomicUsize,
}

/// A lease on the simulated pool; gives its slot back when dropped.
#[derive(Debug)]
pub(super) struct TestLease {
    pub(super) id: usize,
    pool: Arc<Pool>,
}

impl Drop for TestLease {
    fn drop(&mut self) {
        self.pool.dropped.fetch_add(1, Ordering::SeqCst);
        self.pool.free.fetch_add(1, Ordering::SeqCst);
    }
}

impl Pool {
    pub(super) fn new(free: usize) -> Arc<Pool> {
        let pool = Pool::default();
        pool.free.store(free, Ordering::SeqCst);
        Arc::new(pool)
    }

    /// An `acquire` closure taking one free slot, if any.
    pub(super) fn acquirer(self: &Arc<Self>) -> impl FnMut() -> Option<TestLease> + Send + 'static {
        let pool = Arc::clone(self);
        move || {
            pool.free
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .ok()?;
            let id = pool.created.fetch_add(1, Ordering::SeqCst);
            Some(TestLease {
                id,
                pool: Arc::clone(&pool),
            })
        }
    }

    /// Frees one slot, as a finished request elsewhere would.
    pub(super) fn add(&self, n: usize) {
        self.free.fetch_add(n, Ordering::SeqCst);
    }

    pub(super) fn created(&self) -> usize {
        self.created.load(Ordering::SeqCst)
    }

    pub(super) fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }
}

pub(super) type Outcome = Result<Admitted<TestLease>, Shed>;
pub(super) type Pending<'a> = Pin<Box<dyn Future<Output = Outcome> + 'a>>;

pub(super) fn policy(fairness: Fairness, max_depth: usize) -> QueuePolicy {
    QueuePolicy {
        max_depth,
        max_wait: Duration::from_secs(30),
        fairness,
        tenant_max_outstanding: None,
    }
}

/// Polls once; `None` while the request waits. Unconstrained: tests poll many futures from one
/// task, which would otherwise run out of tokio's cooperative budget and see `Pending`.
pub(super) fn poll(fut: &mut Pending<'_>) -> Option<Outcome> {
    tokio::task::unconstrained(fut.as_mut()).now_or_never()
}

/// Starts an admission and checks that it waits.
pub(super) fn waiting<'a>(
    q: &'a ClassQueue<TestLease>,
    tenant: &'a str,
    p: &'a QueuePolicy,
    pool: &Arc<Pool>,
) -> Pending<'a> {
    let mut fut: Pending<'a> = Box::pin(q.admit(tenant, p, pool.acquirer()));
    assert!(poll(&mut fut).is_none(), "{tenant} should wait");
    fut
}

fn tracked(q: &ClassQueue<TestLease>) -> usize {
    q.shared.with_state(|s| s.tenants_tracked())
}

#[tokio::test(start_paused = true)]
async fn queued_requests_are_served_in_arrival_order() {
    let pool = Pool::new(0);
    let q = ClassQueue::new();
    let p = policy(Fairness::BestEffort, 10);
    let mut futs: Vec<_> = (0..5)
        .map(|i| waiting(&q, ["a", "b"][i % 2], &p, &pool))
        .collect();
    assert_eq!(q.depth(), 5);
    let mut held = Vec::new();
    for i in 0..5 {
        tokio::time::advance(Duration::from_millis(10)).await;
        pool.add(1);
        q.dispatch(&p, pool.acquirer());
        let admitted = poll(&mut futs[i]).expect("served").expect("admitted");
        assert_eq!(
            admitted.lease.id, i,
            "the i-th lease goes to the i-th arrival"
        );
        assert!(admitted.queued_for >= Duration::from_millis(10 * (i as u64 + 1)));
        for later in &mut futs[i + 1..] {
            assert!(poll(later).is_none());
        }
        assert_eq!(q.depth(), 4 - i);
        held.push(admitted);
    }
    assert_eq!(pool.created(), 5);
    drop(held);
    assert_eq!(tracked(&q), 0, "tenants with nothing left are forgotten");
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_at_once_with_503() {
    let pool = Pool::new(0);
    let q = ClassQueue::new();
    let p = policy(Fairness::BestEffort, 2);
    let _a = waiting(&q, "a", &p, &pool);
    let _b = waiting(&q, "b", &p, &pool);
    let mut third: Pending<'_> = Box::pin(q.admit("c", &p, pool.acquirer()));
    let shed = poll(&mut third).expect("refused at once").unwrap_err();
    assert_eq!((shed.reason, shed.status), (ShedReason::QueueFull, 503));
    assert_eq!(shed.reason.as_str(), "queue_full");
    assert!(
        shed.retry_after >= Duration::from_secs(1) && shed.retry_after <= Duration::from_secs(60)
    );
    assert!((1..=60).contains(&shed.retry_after_secs()));
    assert_eq!(q.depth(), 2);
    let r = q.retry_after();
    assert!(r >= Duration::from_secs(1) && r <= Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn no_queue_means_shed_when_no_capacity() {
    let pool = Pool::new(1);
    let q = ClassQueue::new();
    let p = policy(Fairness::EqualShare, 0);
    let first = q
        .admit("a", &p, pool.acquirer())
        .await
        .expect("capacity free");
    let shed = q.admit("a", &p, pool.acquirer()).await.unwrap_err();
    assert_eq!(shed.reason, ShedReason::QueueFull);
    drop(first);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_waits_too_long_is_shed_without_spinning() {
    let q: ClassQueue<TestLease> = ClassQueue::new();
    let mut p = policy(Fairness::BestEffort, 10);
    p.max_wait = Duration::from_secs(2);
    let tries = AtomicUsize::new(0);
    let start = Instant::now();
    let shed = q
        .admit("a", &p, || {
            tries.fetch_add(1, Ordering::SeqCst);
            None
        })
        .await
        .unwrap_err();
    assert_eq!((shed.reason, shed.status), (ShedReason::WaitTimeout, 503));
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    // First try, one after joining, then the 250 ms safety net: no busy loop.
    assert!(tries.load(Ordering::SeqCst) <= 12, "{tries:?}");
    assert_eq!((q.depth(), tracked(&q)), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_frees_its_place() {
    let pool = Pool::new(0);
    let q = ClassQueue::new();
    let p = policy(Fairness::EqualShare, 10);
    let (first, mut second) = two_waiting(&q, &p, &pool);
    assert_eq!(q.depth(), 2);
    drop(first);
    assert_eq!(q.depth(), 1);
    assert_eq!(q.depth_by_tenant(), vec![("b".to_string(), 1)]);
    assert_eq!(tracked(&q), 1, "a's books are gone");
    pool.add(1);
    q.dispatch(&p, pool.acquirer());
    let admitted = poll(&mut second).expect("served").expect("admitted");
    assert_eq!(admitted.tenant_slot.tenant(), "b");
    drop(admitted);
    assert_eq!((q.depth(), tracked(&q)), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn tenant_cap_refuses_with_429() {
    let pool = Pool::new(10);
    let q = ClassQueue::new();
    let mut p = policy(Fairness::EqualShare, 10);
    p.tenant_max_outstanding = Some(2);
    let a1 = q.admit("a", &p, pool.acquirer()).await.unwrap();
    let _a2 = q.admit("a", &p, pool.acquirer()).await.unwrap();
    let shed = q.admit("a", &p, pool.acquirer()).await.unwrap_err();
    assert_eq!((shed.reason, shed.status), (ShedReason::TenantCap, 429));
    let _b = q
        .admit("b", &p, pool.acquirer())
        .await
        .expect("other tenants unaffected");
    drop(a1);
    let _a3 = q.admit("a", &p, pool.acquirer()).await.expect("room again");
    // Queued requests count too.
    let empty = Pool::new(0);
    p.tenant_max_outstanding = Some(1);
    let _c1 = waiting(&q, "c", &p, &empty);
    let shed = q.admit("c", &p, empty.acquirer()).await.unwrap_err();
    assert_eq!(shed.reason, ShedReason::TenantCap);
}

/// Two admissions that wait, of tenants `a` and `b` in that order.
fn two_waiting<'a>(
    q: &'a ClassQueue<TestLease>,
    p: &'a QueuePolicy,
    pool: &Arc<Pool>,
) -> (Pending<'a>, Pending<'a>) {
    (waiting(q, "a", p, pool), waiting(q, "b", p, pool))
}

/// Polls `waiter` to its admission and checks that it holds the pool's first lease, with no
/// lease lost on the way.
fn admitted_with_first_lease(waiter: &mut Pending<'_>, pool: &Pool) -> Admitted<TestLease> {
    let admitted = poll(waiter).expect("served").expect("admitted");
    assert_eq!(admitted.lease.id, 0);
    assert_eq!((pool.created(), pool.dropped()), (1, 0));
    admitted
}

#[tokio::test(start_paused = true)]
async fn a_lease_sent_to_a_vanished_waiter_goes_to_the_next() {
    let pool = Pool::new(0);
    let q = ClassQueue::new();
    let p = policy(Fairness::BestEffort, 10);
    let (first, mut second) = two_waiting(&q, &p, &pool);
    pool.add(1);
    q.dispatch(&p, pool.acquirer());
    // The lease sits in the first waiter's channel; the client leaves before reading it.
    drop(first);
    drop(admitted_with_first_lease(&mut second, &pool));
    assert_eq!(pool.dropped(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_vanishing_between_choice_and_send_loses_no_lease() {
    let pool = Pool::new(0);
    let q = ClassQueue::new();
    let p = policy(Fairness::BestEffort, 10);
    let (first, mut second) = two_waiting(&q, &p, &pool);
    // The steps of `dispatch`, with the first waiter leaving between choice and send.
    pool.add(1);
    let lease = pool.acquirer()().expect("a free slot");
    let chosen = q.shared.with_state(|s| s.pop_next(&p)).expect("a waiter");
    drop(first);
    let back = q.shared.send(chosen, lease);
    assert!(back.is_some(), "the send fails and the lease comes back");
    q.shared.deliver(&p, back, &mut || None);
    let _admitted = admitted_with_first_lease(&mut second, &pool);
    // With nobody left to take it, a returned lease is dropped, not kept.
    let third = waiting(&q, "c", &p, &pool);
    pool.add(1);
    let lease = pool.acquirer()().expect("a free slot");
    let chosen = q.shared.with_state(|s| s.pop_next(&p)).expect("a waiter");
    drop(third);
    q.shared
        .deliver(&p, q.shared.send(chosen, lease), &mut || None);
    assert_eq!((pool.created(), pool.dropped()), (2, 1));
    assert_eq!((q.depth(), tracked(&q)), (0, 1));
}

#[test]
fn admit_futures_are_send() {
    fn is_send<T: Send>(_: &T) {}
    let pool = Pool::new(0);
    let q = ClassQueue::new();
    let p = policy(Fairness::EqualShare, 1);
    is_send(&q.admit("a", &p, pool.acquirer()));
    fn is_sync<T: Send + Sync>(_: &T) {}
    is_sync(&q);
}

#[tokio::test(start_paused = true)]
async fn a_tallied_queue_counts_its_waiters_in_the_class_and_anywhere() {
    let pool = Pool::new(0);
    let anywhere = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(WaitTally::new(Arc::clone(&anywhere)));
    let (first, second) = (
        ClassQueue::tallied(Arc::clone(&tally)),
        ClassQueue::tallied(Arc::clone(&tally)),
    );
    let p = policy(Fairness::BestEffort, 10);
    let mut a = waiting(&first, "t", &p, &pool);
    let mut b = waiting(&second, "t", &p, &pool);
    let c = waiting(&second, "t", &p, &pool);
    assert_eq!(
        (tally.class_depth(), anywhere.load(Ordering::SeqCst)),
        (3, 3)
    );
    pool.add(1);
    second.dispatch(&p, pool.acquirer());
    let served = poll(&mut b).expect("served").expect("admitted");
    assert_eq!(
        (tally.class_depth(), anywhere.load(Ordering::SeqCst)),
        (2, 2)
    );
    drop(c); // the client left
    assert_eq!(tally.class_depth(), 1);
    drop(served);
    first.dispatch(&p, pool.acquirer());
    assert!(poll(&mut a).expect("served").is_ok());
    assert_eq!(
        (tally.class_depth(), anywhere.load(Ordering::SeqCst)),
        (0, 0)
    );
}
