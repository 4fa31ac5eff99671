//! Speed-aware placement: gpulb measures each backend's service time and, when a class asks
//! for it, routes away from a slow backend (`speed_weighted`) or waits for a fast one
//! (`earliest_finish`).

mod common;

use common::{eventually, served_by, start_workers, Class, Config, Proxy, Req, WAIT};
use gpulb::tools::sim::{Fault, SimWorker};
use serde_json::Value;

/// How much longer `/sleep/250` takes on the slow worker.
const SLOWDOWN: f64 = 8.0;

/// Two workers, w1 [`SLOWDOWN`] times slower than w0, one slot each, behind one class placed by
/// `placement`.
async fn uneven_pair(placement: &str) -> (Vec<SimWorker>, Proxy) {
    let workers = start_workers(2, |_| {}).await;
    workers[1].set_fault(Fault::Slow(SLOWDOWN));
    let config = Config::fleet(&workers)
        .each_backend(|b| b.max_outstanding(1))
        .class(
            Class::new("c", "default")
                .placement(placement)
                .max_depth(64)
                .max_wait("10s"),
        );
    let proxy = Proxy::start(config).await;
    (workers, proxy)
}

/// `count` copies of `req` at once; the workers that answered them.
async fn burst(proxy: &Proxy, count: usize, req: &Req) -> Vec<String> {
    served_by(&proxy.burst(count, req).await)
}

/// The request every test here sends: 250 ms of work on w0, [`SLOWDOWN`] times that on w1.
fn job() -> Req {
    Req::sleep(250)
}

/// The request id the requests of [`three_rounds_of_three`] carry, to find them in the log.
const ROUND_ID: &str = "round-of-three";

/// Under `placement`, once both workers are measured: three bursts of three requests, one after
/// the other; the proxy and the access-log records of those nine requests.
async fn three_rounds_of_three(placement: &str) -> (Vec<SimWorker>, Proxy, Vec<Value>) {
    let (workers, proxy) = uneven_pair(placement).await;
    measure_both(&proxy).await;
    let tagged = job().header("x-request-id", ROUND_ID);
    for _ in 0..3 {
        burst(&proxy, 3, &tagged).await;
    }
    let rounds = eventually(WAIT, "the nine requests' access-log lines", || async {
        let rounds: Vec<Value> = proxy
            .access_records()
            .into_iter()
            .filter(|r| r["request_id"] == ROUND_ID)
            .collect();
        (rounds.len() == 9).then_some(rounds)
    })
    .await;
    (workers, proxy, rounds)
}

/// How many of `records` were placed on `backend` by their first attempt (a retry after a failed
/// attempt is admitted already and never held for a faster backend).
fn placed_first_on(records: &[Value], backend: &str) -> usize {
    records
        .iter()
        .filter(|r| r["backend"] == backend && r["attempts"] == 1)
        .count()
}

/// The class's measured service times from `/status`.
async fn service_seconds(proxy: &Proxy) -> Value {
    proxy.status().await["classes"][0]["service_seconds"].clone()
}

/// Sends pairs of requests (one slot each, so one per worker) until the proxy has measured
/// both workers; returns what it measured.
async fn measure_both(proxy: &Proxy) -> (f64, f64) {
    eventually(WAIT, "both workers measured", || async {
        burst(proxy, 2, &job()).await;
        let seen = service_seconds(proxy).await;
        Some((seen["w0"].as_f64()?, seen["w1"].as_f64()?))
    })
    .await
}

fn count(workers: &[String], name: &str) -> usize {
    workers.iter().filter(|w| *w == name).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_times_are_measured_and_shown_per_backend() {
    let (_workers, proxy) = uneven_pair("least_loaded").await;
    let (fast, slow) = measure_both(&proxy).await;
    assert!((0.24..0.6).contains(&fast), "w0 measured at {fast} s");
    assert!(
        slow > fast * 3.0,
        "w1 measured at {slow} s against {fast} s"
    );
    assert_eq!(
        proxy.status().await["classes"][0]["placement"],
        "least_loaded"
    );
    let metrics = proxy.metrics().await;
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("gpulb_service_seconds{"))
        .collect();
    assert_eq!(series.len(), 2, "{series:?}");
    assert!(
        series
            .iter()
            .any(|l| l.contains("backend=\"w1\"") && l.contains("class=\"c\"")),
        "{series:?}"
    );
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earliest_finish_waits_for_the_fast_backend_unless_the_queue_is_long() {
    let (_workers, proxy, rounds) = three_rounds_of_three("earliest_finish").await;
    // Three at once, three times: one starts on w0; waiting for w0 (250 ms per request)
    // beats starting on w1 (2 s), so the other two wait for it rather than take w1's free
    // slot, even when two of them read w0 free at once and one loses the race for its slot.
    // (Under least_loaded each round puts one on w1. A retry after a failed reuse of a pooled
    // connection to w0 may go to w1: it is admitted already, so it is not counted.)
    assert_eq!(
        placed_first_on(&rounds, "w1"),
        0,
        "access log {rounds:#?}; measured {}",
        service_seconds(&proxy).await
    );
    // Sixteen at once: w0 cannot drain that queue in the 1.75 s w1 would lose, so w1 helps.
    let served = burst(&proxy, 16, &job()).await;
    assert!(count(&served, "w1") >= 1, "w1 never used: {served:?}");
    assert!(
        count(&served, "w0") > count(&served, "w1"),
        "served by {served:?}"
    );
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_loaded_uses_the_free_slow_backend_at_once() {
    // The same rounds under the default placement: the free slot on w1 is taken each time.
    let (_workers, proxy, rounds) = three_rounds_of_three("least_loaded").await;
    assert!(
        placed_first_on(&rounds, "w1") >= 3,
        "access log {rounds:#?}"
    );
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speed_weighted_sends_one_at_a_time_traffic_to_the_fast_backend() {
    let (_workers, proxy) = uneven_pair("speed_weighted").await;
    measure_both(&proxy).await;
    // Both idle: (0+1) x 1 against (0+1) x 8, so w0 every time (least_loaded would toss a coin);
    // the previous request may still hold w0's slot: (1+1) x 1 still wins.
    let served = served_by(&proxy.send_n(10, &job()).await);
    assert_eq!(count(&served, "w0"), 10, "served by {served:?}");
    proxy.wait_idle().await;
}
