//! Admission control: per-class queues woken by releases, shedding with Retry-After, tenant
//! fairness, reserved shares, spill-over and classification by size.

mod common;

use common::*;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const WAIT: Duration = Duration::from_secs(15);

/// One worker behind a single class `c` with the given class keys and backend cap.
async fn one_class(class_keys: &str, cap: u32) -> (Vec<gpulb::tools::sim::SimWorker>, Proxy) {
    let workers = start_workers(1, |_| {}).await;
    let config = format!(
        "{}classes:\n  - {{name: c, pool: default{class_keys}}}\n",
        backends_yaml(&workers, move |_| format!(", max_outstanding: {cap}"))
    );
    let proxy = Proxy::start(&config).await;
    (workers, proxy)
}

/// Sends a GET in the background; yields the response and the instant it completed.
fn spawn_get(url: String, tenant: &'static str) -> tokio::task::JoinHandle<(u16, String, Instant)> {
    tokio::spawn(async move {
        let resp = reqwest::Client::new()
            .get(url)
            .header("x-tenant", tenant)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        (status, body, Instant::now())
    })
}

async fn wait_in_flight(proxy: &Proxy, n: u64) {
    eventually(WAIT, &format!("{n} in flight"), || async {
        (proxy.outstanding("w0").await == n).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_gets_the_slot_as_soon_as_it_frees() {
    let (_workers, proxy) = one_class("", 1).await;
    let hold = spawn_get(format!("{}/sleep/700", proxy.url), "a");
    wait_in_flight(&proxy, 1).await;
    let queued: Vec<_> = (0..3)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(30));
            spawn_get(format!("{}/echo/{i}", proxy.url), "a")
        })
        .collect();
    let (status, _, released_at) = hold.await.unwrap();
    assert_eq!(status, 200);
    let mut done = Vec::new();
    for (i, q) in queued.into_iter().enumerate() {
        let (status, body, at) = q.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(&format!("/echo/{i}")));
        done.push(at);
    }
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "served out of order");
    // The queue's safety re-check runs every 250 ms; a release must be much faster than that.
    let delay = done[0].saturating_duration_since(released_at);
    assert!(
        delay < Duration::from_millis(120),
        "first queued request waited {delay:?} after the release"
    );
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_sheds_at_once_with_retry_after_and_an_openai_error() {
    let (_workers, proxy) = one_class(", queue: {max_depth: 1}", 1).await;
    let hold = spawn_get(format!("{}/sleep/800", proxy.url), "a");
    wait_in_flight(&proxy, 1).await;
    let queued = spawn_get(format!("{}/echo", proxy.url), "a");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let shed = reqwest::get(format!("{}/echo", proxy.url)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "shedding must not wait"
    );
    assert_eq!(shed.status(), 503);
    let retry: u64 = shed.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry));
    let body: serde_json::Value = shed.json().await.unwrap();
    assert_eq!(body["error"]["code"], "queue_full");
    assert_eq!(body["error"]["type"], "overloaded_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("class \"c\""));
    assert_eq!(hold.await.unwrap().0, 200);
    assert_eq!(queued.await.unwrap().0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_past_max_wait_sheds() {
    let (_workers, proxy) = one_class(", queue: {max_wait: 300ms}", 1).await;
    let hold = spawn_get(format!("{}/sleep/1500", proxy.url), "a");
    wait_in_flight(&proxy, 1).await;
    let started = Instant::now();
    let resp = reqwest::get(format!("{}/echo", proxy.url)).await.unwrap();
    let waited = started.elapsed();
    assert_eq!(resp.status(), 503);
    assert!(
        waited >= Duration::from_millis(280) && waited < Duration::from_millis(1200),
        "{waited:?}"
    );
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "wait_timeout");
    assert_eq!(hold.await.unwrap().0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_the_queue_frees_its_place() {
    let (workers, proxy) = one_class(", queue: {max_depth: 1}", 1).await;
    let hold = spawn_get(format!("{}/sleep/1500", proxy.url), "a");
    wait_in_flight(&proxy, 1).await;
    // A raw client queues a POST with a body, then goes away.
    let addr = proxy.url.trim_start_matches("http://").to_string();
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    raw.write_all(b"POST /echo/gone HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let refused = reqwest::get(format!("{}/echo", proxy.url)).await.unwrap();
    assert_eq!(
        refused.status(),
        503,
        "the raw client should hold the only queue place"
    );
    drop(raw);
    // Its place frees once the proxy notices (it checks a few times a second).
    let after = eventually(WAIT, "the place to free", || async {
        let url = format!("{}/echo/after", proxy.url);
        let probe = spawn_get(url, "a");
        tokio::time::sleep(Duration::from_millis(100)).await;
        if probe.is_finished() {
            return None; // shed at once: the place is still taken
        }
        Some(probe)
    })
    .await;
    assert_eq!(hold.await.unwrap().0, 200);
    assert_eq!(after.await.unwrap().0, 200);
    proxy.wait_idle().await;
    let received = workers[0].stats().received_total;
    assert_eq!(
        received, 2,
        "the departed request must never reach the backend"
    );
    let metrics = reqwest::get(format!("{}/metrics", proxy.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gpulb_requests_total{") && l.contains("status=\"499\"")),
        "the departed request is counted as 499"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_share_lets_a_trickle_through_a_flood() {
    let (_workers, proxy) = one_class(", fairness: {policy: equal_share}", 2).await;
    let flood: Vec<_> = (0..40)
        .map(|_| spawn_get(format!("{}/sleep/100", proxy.url), "flood"))
        .collect();
    wait_in_flight(&proxy, 2).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let trickle: Vec<_> = (0..3)
        .map(|_| spawn_get(format!("{}/sleep/100", proxy.url), "trickle"))
        .collect();
    let mut slowest = Duration::ZERO;
    for t in trickle {
        let (status, _, at) = t.await.unwrap();
        assert_eq!(status, 200);
        slowest = slowest.max(at - started);
    }
    let mut flood_done = started;
    for f in flood {
        let (status, _, at) = f.await.unwrap();
        assert_eq!(status, 200);
        flood_done = flood_done.max(at);
    }
    let flood_took = flood_done - started;
    // FIFO would put the trickle behind ~38 flood requests (~1.9 s at 2 x 100 ms).
    assert!(
        slowest < flood_took / 3,
        "trickle waited {slowest:?}, flood drained in {flood_took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_share_serves_tenants_by_weight() {
    let (_workers, proxy) = one_class(
        ", fairness: {policy: fixed_share, weights: {gold: 3, bronze: 1}}",
        1,
    )
    .await;
    let hold = spawn_get(format!("{}/sleep/600", proxy.url), "gold");
    wait_in_flight(&proxy, 1).await;
    let mut queued = Vec::new();
    for _ in 0..24 {
        queued.push(("gold", spawn_get(format!("{}/echo", proxy.url), "gold")));
        queued.push(("bronze", spawn_get(format!("{}/echo", proxy.url), "bronze")));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hold.await.unwrap().0, 200);
    let mut finished = Vec::new();
    for (tenant, q) in queued {
        let (status, _, at) = q.await.unwrap();
        assert_eq!(status, 200);
        finished.push((at, tenant));
    }
    finished.sort();
    let gold = finished[..20].iter().filter(|(_, t)| *t == "gold").count();
    assert!(
        (14..=16).contains(&gold),
        "3:1 should give ~15 of the first 20 to gold, gave {gold}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_cap_answers_429() {
    let (_workers, proxy) = one_class(", tenant_max_outstanding: 1", 4).await;
    let hold = spawn_get(format!("{}/sleep/800", proxy.url), "greedy");
    wait_in_flight(&proxy, 1).await;
    let resp = reqwest::Client::new()
        .get(format!("{}/echo", proxy.url))
        .header("x-tenant", "greedy")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "tenant_cap");
    let other = reqwest::Client::new()
        .get(format!("{}/echo", proxy.url))
        .header("x-tenant", "polite")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
    assert_eq!(hold.await.unwrap().0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_flood_cannot_take_the_interactive_reserve() {
    let workers = start_workers(2, |_| {}).await;
    let config = format!(
        "{}classes:\n  - {{name: interactive, pool: default, match: {{path_prefix: /echo}}}}\n  \
         - {{name: bulk, pool: default, backend_share: 0.5}}\ndefault_class: bulk\n",
        backends_yaml(&workers, |_| ", max_outstanding: 4".into())
    );
    let proxy = Proxy::start(&config).await;
    let flood: Vec<_> = (0..20)
        .map(|_| spawn_get(format!("{}/sleep/1500", proxy.url), "b"))
        .collect();
    eventually(WAIT, "bulk to fill its half", || async {
        let s = proxy.status().await;
        (backend_field(&s, "w0", "outstanding") + backend_field(&s, "w1", "outstanding") == 4)
            .then_some(())
    })
    .await;
    let client = reqwest::Client::new();
    for _ in 0..5 {
        let started = Instant::now();
        let resp = client
            .get(format!("{}/echo/interactive", proxy.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "interactive waited {:?}",
            started.elapsed()
        );
    }
    for f in flood {
        assert_eq!(f.await.unwrap().0, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_spills_onto_interactive_gpus_but_not_the_other_way() {
    let workers = start_workers(2, |_| {}).await;
    let config = format!(
        "{}pools:\n  - {{name: fast, backends: [w0]}}\n  - {{name: slow, backends: [w1]}}\n\
         classes:\n  - {{name: interactive, pool: fast, queue: {{max_depth: 0}}, match: {{headers: {{x-priority: high}}}}}}\n  \
         - {{name: bulk, pool: slow, fallback_pool: fast, queue: {{max_depth: 0}}}}\ndefault_class: bulk\n",
        backends_yaml(&workers, |_| ", max_outstanding: 1".into())
    );
    let proxy = Proxy::start(&config).await;
    let client = reqwest::Client::new();
    let bulk_hold = spawn_get(format!("{}/sleep/800", proxy.url), "t");
    eventually(WAIT, "w1 busy", || async {
        (proxy.outstanding("w1").await == 1).then_some(())
    })
    .await;
    let spilled = client
        .get(format!("{}/echo", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        worker_of(&spilled),
        "w0",
        "bulk spills onto the idle interactive GPU"
    );
    assert_eq!(bulk_hold.await.unwrap().0, 200);

    let interactive_hold = {
        let req = client
            .get(format!("{}/sleep/800", proxy.url))
            .header("x-priority", "high");
        tokio::spawn(async move { req.send().await })
    };
    eventually(WAIT, "w0 busy", || async {
        (proxy.outstanding("w0").await == 1).then_some(())
    })
    .await;
    let refused = client
        .get(format!("{}/echo", proxy.url))
        .header("x-priority", "high")
        .send()
        .await
        .unwrap();
    assert_eq!(
        refused.status(),
        503,
        "interactive must not spill onto bulk GPUs"
    );
    assert_eq!(interactive_hold.await.unwrap().unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_requests_are_classified_as_bulk() {
    let workers = start_workers(2, |_| {}).await;
    let config = format!(
        "{}pools:\n  - {{name: small, backends: [w0]}}\n  - {{name: large, backends: [w1]}}\n\
         classes:\n  - {{name: bulk, pool: large, match: {{min_content_length: 4096}}}}\n  \
         - {{name: interactive, pool: small}}\ndefault_class: interactive\n",
        backends_yaml(&workers, |_| String::new())
    );
    let proxy = Proxy::start(&config).await;
    let client = reqwest::Client::new();
    let small = client
        .post(format!("{}/echo", proxy.url))
        .body("x".repeat(100))
        .send()
        .await
        .unwrap();
    assert_eq!(worker_of(&small), "w0");
    let large = client
        .post(format!("{}/echo", proxy.url))
        .body("x".repeat(10_000))
        .send()
        .await
        .unwrap();
    assert_eq!(worker_of(&large), "w1");
}
