//! Two gpulb replicas in front of one model server: each counts the other's requests (the
//! server's running + waiting less its own) against the backend's cap, so together they do
//! not overfill it.

mod common;

use common::{eventually, start_workers, Answer, Class, Config, Proxy, Req, WAIT};
use gpulb::tools::sim::SimWorker;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// One backend with room for 4 requests, read every 100 ms, behind a class whose queue
/// waits long enough for the other replica's requests to finish.
fn replica_config(worker: &SimWorker, count_others: bool) -> Config {
    Config::fleet(std::slice::from_ref(worker))
        .set("telemetry", format!("{{count_others: {count_others}}}"))
        .each_backend(|b| b.max_outstanding(4).vllm())
        .class(Class::new("default", "default").max_wait("20s"))
}

/// One worker that runs up to 16 at once (so overfilling its cap of 4 shows), and two
/// replicas in front of it.
async fn two_replicas(count_others: bool) -> (Vec<SimWorker>, Proxy, Proxy) {
    let workers = start_workers(1, |p| {
        p.decode_step = Duration::from_millis(20);
        p.max_running = 16;
    })
    .await;
    let a = Proxy::start(replica_config(&workers[0], count_others)).await;
    let b = Proxy::start(replica_config(&workers[0], count_others)).await;
    (workers, a, b)
}

/// Replica `a` fills the backend: four requests of ~2 s each, in flight once this returns.
async fn fill(a: &Proxy) -> Vec<JoinHandle<Answer>> {
    let held = (0..4).map(|_| a.spawn(Req::completion(100))).collect();
    a.wait_outstanding("w0", 4).await;
    held
}

/// Samples `worker` until every task of `tasks` has finished (bounded by [`WAIT`]); the most
/// requests it held at once (running + waiting).
async fn peak_until_done<T>(worker: &SimWorker, tasks: &[JoinHandle<T>]) -> usize {
    let deadline = Instant::now() + WAIT;
    let mut peak = 0;
    while !tasks.iter().all(|t| t.is_finished()) {
        assert!(
            Instant::now() < deadline,
            "requests still running after {WAIT:?}"
        );
        let s = worker.stats();
        peak = peak.max(s.running + s.waiting);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_waits_for_room_the_other_replica_holds_then_is_woken_by_telemetry() {
    let (workers, a, b) = two_replicas(true).await;
    let w = &workers[0];
    let held = fill(&a).await;
    b.wait_status("B to see A's four requests on w0", |s| {
        (s["backends"][0]["others_outstanding"] == 4).then_some(())
    })
    .await;
    // B has none of its own there, yet its requests wait: the backend is full.
    let waiting: Vec<_> = (0..2).map(|_| b.spawn(Req::completion(5))).collect();
    b.wait_queued("default", 2).await;
    assert_eq!(b.outstanding("w0").await, 0);
    let metrics = b.metrics().await;
    assert!(
        metrics.contains("gpulb_backend_others_outstanding{backend=\"w0\"} 4"),
        "the estimate is exported:\n{metrics}"
    );

    // A's requests end; no slot of B's is ever released, and still B's queue moves: each new
    // reading of the server wakes it.
    let all: Vec<_> = held.into_iter().chain(waiting).collect();
    let peak = peak_until_done(w, &all).await;
    for h in all {
        assert_eq!(h.await.unwrap().status, 200);
    }
    assert!(
        peak <= 4,
        "the two replicas together held {peak} on a cap of 4"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_count_others_each_replica_fills_the_cap_alone() {
    let (workers, a, b) = two_replicas(false).await;
    let w = &workers[0];
    let held = fill(&a).await;
    let status = b.status().await;
    assert!(
        status["backends"][0]["others_outstanding"].is_null(),
        "no estimate when off: {status}"
    );
    let overfill: Vec<_> = (0..4).map(|_| b.spawn(Req::completion(100))).collect();
    b.wait_outstanding("w0", 4).await;
    eventually(WAIT, "the server running all eight", || async {
        (w.stats().running + w.stats().waiting == 8).then_some(())
    })
    .await;
    for h in held.into_iter().chain(overfill) {
        assert_eq!(h.await.unwrap().status, 200);
    }
}
