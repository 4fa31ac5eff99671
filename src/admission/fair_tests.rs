//! Fairness across tenants, push-out of a flooding tenant, and a concurrent re-entrant run.

use super::tests::{policy, poll, waiting, Pending, Pool, TestLease};
use super::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Frees one slot, dispatches, and returns the tenant served (exactly one must be).
fn serve_one<'a>(
    q: &ClassQueue<TestLease>,
    p: &QueuePolicy,
    pool: &Arc<Pool>,
    futs: &mut Vec<(&'a str, Pending<'a>)>,
    held: &mut Vec<Admitted<TestLease>>,
) -> &'a str {
    pool.add(1);
    q.dispatch(p, pool.acquirer());
    let done: Vec<usize> = (0..futs.len())
        .filter(|&i| match poll(&mut futs[i].1) {
            Some(outcome) => {
                held.push(outcome.expect("admitted"));
                true
            }
            None => false,
        })
        .collect();
    assert_eq!(done.len(), 1, "one slot, one request served");
    futs.remove(done[0]).0
}

fn fixed_share(weights: &[(&str, u32)], min_share: &[(&str, f64)]) -> Fairness {
    Fairness::FixedShare {
        weights: weights.iter().map(|&(t, w)| (t.to_string(), w)).collect(),
        default_weight: 1,
        min_share: min_share.iter().map(|&(t, m)| (t.to_string(), m)).collect(),
    }
}

#[tokio::test(start_paused = true)]
async fn equal_share_serves_a_light_tenant_within_a_round() {
    let pool = Pool::new(0);
    let q = ClassQueue::new();
    let p = policy(Fairness::EqualShare, 200);
    let mut futs: Vec<_> = (0..100)
        .map(|_| ("a", waiting(&q, "a", &p, &pool)))
        .collect();
    futs.extend((0..3).map(|_| ("b", waiting(&q, "b", &p, &pool))));
    let mut held = Vec::new();
    let order: Vec<&str> = (0..6)
        .map(|_| serve_one(&q, &p, &pool, &mut futs, &mut held))
        .collect();
    assert_eq!(order, ["a", "b", "a", "b", "a", "b"]);
    let by_tenant: HashMap<String, usize> = q.depth_by_tenant().into_iter().collect();
    assert_eq!(by_tenant, HashMap::from([("a".to_string(), 97)]));
}

#[tokio::test(start_paused = true)]
async fn fixed_share_serves_three_to_one_under_saturation() {
    let pool = Pool::new(0);
    let q = ClassQueue::new();
    let p = policy(fixed_share(&[("a", 3), ("b", 1)], &[]), 100);
    let mut futs = Vec::new();
    for _ in 0..8 {
        futs.push(("a", waiting(&q, "a", &p, &pool)));
        futs.push(("b", waiting(&q, "b", &p, &pool)));
    }
    let mut held = Vec::new();
    let mut served = HashMap::new();
    for _ in 0..400 {
        let tenant = serve_one(&q, &p, &pool, &mut futs, &mut held);
        *served.entry(tenant).or_insert(0) += 1;
        // Keep both tenants saturating.
        futs.push((tenant, waiting(&q, tenant, &p, &pool)));
    }
    let a = served["a"];
    assert!((295..=305).contains(&a), "a got {a} of 400");
    assert_eq!(a + served["b"], 400);
}

#[tokio::test(start_paused = true)]
async fn a_tenant_below_its_min_share_is_served_first() {
    let pool = Pool::new(4);
    let q = ClassQueue::new();
    let p = policy(fixed_share(&[], &[("gold", 0.5)]), 100);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(
            q.admit("bulk", &p, pool.acquirer())
                .await
                .expect("capacity free"),
        );
    }
    let mut futs: Vec<_> = (0..3)
        .map(|_| ("bulk", waiting(&q, "bulk", &p, &pool)))
        .collect();
    futs.push(("gold", waiting(&q, "gold", &p, &pool)));
    assert_eq!(serve_one(&q, &p, &pool, &mut futs, &mut held), "gold");
    assert_eq!(serve_one(&q, &p, &pool, &mut futs, &mut held), "bulk");
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_the_flooding_tenant_before_a_light_one() {
    let pool = Pool::new(0);
    let q = ClassQueue::new();
    let p = policy(Fairness::EqualShare, 4);
    let mut floods: Vec<_> = (0..4).map(|_| waiting(&q, "a", &p, &pool)).collect();
    // Alone, the flooder holds its whole share: the class is full (503).
    let mut extra: Pending<'_> = Box::pin(q.admit("a", &p, pool.acquirer()));
    assert_eq!(
        poll(&mut extra).unwrap().unwrap_err().reason,
        ShedReason::QueueFull
    );
    // A light tenant gets in by pushing out the flooder's newest request (429).
    let mut light = waiting(&q, "b", &p, &pool);
    let pushed = poll(&mut floods[3]).expect("pushed out").unwrap_err();
    assert_eq!(
        (pushed.reason, pushed.status),
        (ShedReason::TenantOverShare, 429)
    );
    assert_eq!(q.depth(), 4);
    // Now over its share, the flooder is refused at once.
    let mut more: Pending<'_> = Box::pin(q.admit("a", &p, pool.acquirer()));
    let shed = poll(&mut more).unwrap().unwrap_err();
    assert_eq!(
        (shed.reason, shed.status),
        (ShedReason::TenantOverShare, 429)
    );
    pool.add(2);
    q.dispatch(&p, pool.acquirer());
    assert!(poll(&mut floods[0]).is_some_and(|o| o.is_ok()));
    assert!(
        poll(&mut light).is_some_and(|o| o.is_ok()),
        "served within one round"
    );
}

/// Shared by every lease of the concurrent test; a lease's drop dispatches (re-entrancy).
struct Fleet {
    queue: ClassQueue<FleetLease>,
    policy: QueuePolicy,
    free: AtomicUsize,
    created: AtomicUsize,
    dropped: AtomicUsize,
}

struct FleetLease(Arc<Fleet>);

impl Drop for FleetLease {
    fn drop(&mut self) {
        let fleet = &self.0;
        fleet.dropped.fetch_add(1, Ordering::SeqCst);
        fleet.free.fetch_add(1, Ordering::SeqCst);
        fleet.queue.dispatch(&fleet.policy, || take(fleet));
    }
}

fn take(fleet: &Arc<Fleet>) -> Option<FleetLease> {
    fleet
        .free
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .ok()?;
    fleet.created.fetch_add(1, Ordering::SeqCst);
    Some(FleetLease(Arc::clone(fleet)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_admits_never_lose_or_leak_a_lease() {
    let fleet = Arc::new(Fleet {
        queue: ClassQueue::new(),
        policy: QueuePolicy {
            max_depth: 1000,
            max_wait: Duration::from_secs(10),
            fairness: fixed_share(&[("t0", 2)], &[("t3", 0.2)]),
            tenant_max_outstanding: None,
        },
        free: AtomicUsize::new(4),
        created: AtomicUsize::new(0),
        dropped: AtomicUsize::new(0),
    });
    let tasks: Vec<_> = (0..400u64)
        .map(|i| {
            let fleet = Arc::clone(&fleet);
            tokio::spawn(async move {
                let tenant = ["t0", "t1", "t2", "t3"][(i % 4) as usize];
                let admit = fleet.queue.admit(tenant, &fleet.policy, || take(&fleet));
                // Every third client gives up early, some while queued.
                let outcome = if i % 3 == 0 {
                    let patience = Duration::from_micros(50 * (i % 7));
                    tokio::time::timeout(patience, admit).await.ok()
                } else {
                    Some(admit.await)
                };
                match outcome {
                    Some(Ok(admitted)) => {
                        tokio::task::yield_now().await;
                        drop(admitted);
                        "admitted"
                    }
                    Some(Err(shed)) => shed.reason.as_str(),
                    None => "gave_up",
                }
            })
        })
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for task in tasks {
        *counts.entry(task.await.expect("task")).or_default() += 1;
    }
    assert_eq!(
        counts.get("wait_timeout"),
        None,
        "nobody stranded: {counts:?}"
    );
    assert!(counts["admitted"] >= 266, "{counts:?}");
    let created = fleet.created.load(Ordering::SeqCst);
    assert_eq!(
        created,
        fleet.dropped.load(Ordering::SeqCst),
        "every lease made was released"
    );
    assert_eq!(fleet.free.load(Ordering::SeqCst), 4);
    assert_eq!(fleet.queue.depth(), 0);
    assert!(
        fleet.queue.shared.granted() > 0,
        "some requests were served from the queue"
    );
    assert_eq!(fleet.queue.shared.with_state(|s| s.tenants_tracked()), 0);
}
