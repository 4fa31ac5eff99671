//! Admission control: per-class queues woken by releases, shedding with Retry-After, tenant
//! fairness, reserved shares, spill-over and classification by size.

mod common;

use common::{class_field, start_workers, Class, Config, Pool, Proxy, Req};
use gpulb::tools::sim::SimWorker;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// One worker with in-flight cap `cap` behind a single class `c` that `shape` configures.
async fn one_class(shape: impl FnOnce(Class) -> Class, cap: u32) -> (Vec<SimWorker>, Proxy) {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers)
        .each_backend(|b| b.max_outstanding(cap))
        .class(shape(Class::new("c", "default")));
    let proxy = Proxy::start(config).await;
    (workers, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_gets_the_slot_as_soon_as_it_frees() {
    let (_workers, proxy) = one_class(|c| c, 1).await;
    let hold = proxy.spawn(Req::sleep(700).tenant("a"));
    proxy.wait_outstanding("w0", 1).await;
    let mut queued = Vec::new();
    for i in 0..3 {
        queued.push(proxy.spawn(Req::get(format!("/echo/{i}")).tenant("a")));
        // In the queue before the next is sent, so the order of arrival is known.
        proxy.wait_queued("c", i + 1).await;
    }
    let held = hold.await.unwrap();
    assert_eq!(held.status, 200);
    let released_at = held.at;
    let mut done = Vec::new();
    for (i, q) in queued.into_iter().enumerate() {
        let answer = q.await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(answer.body.contains(&format!("/echo/{i}")));
        done.push(answer.at);
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
    let (_workers, proxy) = one_class(|c| c.max_depth(1), 1).await;
    let hold = proxy.spawn(Req::sleep(800).tenant("a"));
    proxy.wait_outstanding("w0", 1).await;
    let queued = proxy.spawn(Req::get("/echo").tenant("a"));
    proxy.wait_queued("c", 1).await;
    let started = Instant::now();
    let shed = proxy.send(&Req::get("/echo")).await;
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "shedding must not wait"
    );
    assert_eq!(shed.status, 503);
    let retry: u64 = shed.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    let body = shed.json();
    assert_eq!(body["error"]["code"], "queue_full");
    assert_eq!(body["error"]["type"], "overloaded_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("class \"c\""));
    assert_eq!(hold.await.unwrap().status, 200);
    assert_eq!(queued.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_past_max_wait_sheds() {
    let (_workers, proxy) = one_class(|c| c.max_wait("300ms"), 1).await;
    let hold = proxy.spawn(Req::sleep(1500).tenant("a"));
    proxy.wait_outstanding("w0", 1).await;
    let started = Instant::now();
    let resp = proxy.send(&Req::get("/echo")).await;
    let waited = started.elapsed();
    assert_eq!(resp.status, 503);
    assert!(
        waited >= Duration::from_millis(280) && waited < Duration::from_millis(1200),
        "{waited:?}"
    );
    assert_eq!(resp.json()["error"]["code"], "wait_timeout");
    assert_eq!(hold.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_the_queue_frees_its_place() {
    let (workers, proxy) = one_class(|c| c.max_depth(1), 1).await;
    let hold = proxy.spawn(Req::sleep(1500).tenant("a"));
    proxy.wait_outstanding("w0", 1).await;
    // A raw client queues a POST with a body, then goes away.
    let addr = proxy.url.trim_start_matches("http://").to_string();
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    raw.write_all(b"POST /echo/gone HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    proxy.wait_queued("c", 1).await;
    let refused = proxy.send(&Req::get("/echo")).await;
    assert_eq!(
        refused.status, 503,
        "the raw client should hold the only queue place"
    );
    drop(raw);
    // Its place frees once the proxy notices (it checks a few times a second).
    proxy.wait_queued("c", 0).await;
    let after = proxy.spawn(Req::get("/echo/after").tenant("a"));
    assert_eq!(hold.await.unwrap().status, 200);
    assert_eq!(after.await.unwrap().status, 200);
    proxy.wait_idle().await;
    let received = workers[0].stats().received_total;
    assert_eq!(
        received, 2,
        "the departed request must never reach the backend"
    );
    let metrics = proxy.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gpulb_requests_total{") && l.contains("status=\"499\"")),
        "the departed request is counted as 499"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_share_lets_a_trickle_through_a_flood() {
    let (_workers, proxy) = one_class(|c| c.fairness("{policy: equal_share}"), 2).await;
    let flood: Vec<_> = (0..40)
        .map(|_| proxy.spawn(Req::sleep(100).tenant("flood")))
        .collect();
    proxy.wait_outstanding("w0", 2).await;
    proxy
        .wait_status("the whole flood to reach the proxy", |s| {
            let seen = ["queue_depth", "outstanding", "requests_total"]
                .iter()
                .map(|f| class_field(s, "c", f))
                .sum::<u64>();
            (seen >= 40).then_some(())
        })
        .await;
    let started = Instant::now();
    let trickle: Vec<_> = (0..3)
        .map(|_| proxy.spawn(Req::sleep(100).tenant("trickle")))
        .collect();
    let mut slowest = Duration::ZERO;
    for t in trickle {
        let answer = t.await.unwrap();
        assert_eq!(answer.status, 200);
        slowest = slowest.max(answer.at - started);
    }
    let mut flood_done = started;
    for f in flood {
        let answer = f.await.unwrap();
        assert_eq!(answer.status, 200);
        flood_done = flood_done.max(answer.at);
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
    let fixed = "{policy: fixed_share, weights: {gold: 3, bronze: 1}}";
    let (_workers, proxy) = one_class(|c| c.fairness(fixed), 1).await;
    let hold = proxy.spawn(Req::sleep(600).tenant("gold"));
    proxy.wait_outstanding("w0", 1).await;
    let mut queued = Vec::new();
    for _ in 0..24 {
        for tenant in ["gold", "bronze"] {
            queued.push((tenant, proxy.spawn(Req::get("/echo").tenant(tenant))));
        }
    }
    // All of them wait before the slot frees, so the policy alone picks the order.
    proxy.wait_queued("c", 48).await;
    assert_eq!(hold.await.unwrap().status, 200);
    let mut finished = Vec::new();
    for (tenant, q) in queued {
        let answer = q.await.unwrap();
        assert_eq!(answer.status, 200);
        finished.push((answer.at, tenant));
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
    let (_workers, proxy) = one_class(|c| c.tenant_max_outstanding(1), 4).await;
    let hold = proxy.spawn(Req::sleep(800).tenant("greedy"));
    proxy.wait_outstanding("w0", 1).await;
    let resp = proxy.send(&Req::get("/echo").tenant("greedy")).await;
    assert_eq!(resp.status, 429);
    assert!(resp.headers.contains_key("retry-after"));
    assert_eq!(resp.json()["error"]["code"], "tenant_cap");
    let other = proxy.send(&Req::get("/echo").tenant("polite")).await;
    assert_eq!(other.status, 200);
    assert_eq!(hold.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_flood_cannot_take_the_interactive_reserve() {
    let workers = start_workers(2, |_| {}).await;
    let config = Config::fleet(&workers)
        .each_backend(|b| b.max_outstanding(4))
        .class(Class::new("interactive", "default").match_path("/echo"))
        .class(Class::new("bulk", "default").backend_share(0.5))
        .default_class("bulk");
    let proxy = Proxy::start(config).await;
    let flood: Vec<_> = (0..20)
        .map(|_| proxy.spawn(Req::sleep(1500).tenant("b")))
        .collect();
    // Bulk fills its half of the two backends' eight slots.
    proxy.wait_total_outstanding(4).await;
    for _ in 0..5 {
        let started = Instant::now();
        let resp = proxy.send(&Req::get("/echo/interactive")).await;
        assert_eq!(resp.status, 200);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "interactive waited {:?}",
            started.elapsed()
        );
    }
    for f in flood {
        assert_eq!(f.await.unwrap().status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_spills_onto_interactive_gpus_but_not_the_other_way() {
    let workers = start_workers(2, |_| {}).await;
    let config = Config::fleet(&workers)
        .each_backend(|b| b.max_outstanding(1))
        .pool(Pool::new("fast", &["w0"]))
        .pool(Pool::new("slow", &["w1"]))
        .class(
            Class::new("interactive", "fast")
                .max_depth(0)
                .match_header("x-priority", "high"),
        )
        .class(
            Class::new("bulk", "slow")
                .fallback_pool("fast")
                .max_depth(0),
        )
        .default_class("bulk");
    let proxy = Proxy::start(config).await;
    let bulk_hold = proxy.spawn(Req::sleep(800).tenant("t"));
    proxy.wait_outstanding("w1", 1).await;
    let spilled = proxy.send(&Req::get("/echo")).await;
    assert_eq!(
        spilled.worker, "w0",
        "bulk spills onto the idle interactive GPU"
    );
    assert_eq!(bulk_hold.await.unwrap().status, 200);

    let interactive_hold = proxy.spawn(Req::sleep(800).header("x-priority", "high"));
    proxy.wait_outstanding("w0", 1).await;
    let refused = proxy
        .send(&Req::get("/echo").header("x-priority", "high"))
        .await;
    assert_eq!(
        refused.status, 503,
        "interactive must not spill onto bulk GPUs"
    );
    assert_eq!(interactive_hold.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_requests_are_classified_as_bulk() {
    let workers = start_workers(2, |_| {}).await;
    let config = Config::fleet(&workers)
        .pool(Pool::new("small", &["w0"]))
        .pool(Pool::new("large", &["w1"]))
        .class(Class::new("bulk", "large").match_min_content_length(4096))
        .class(Class::new("interactive", "small"))
        .default_class("interactive");
    let proxy = Proxy::start(config).await;
    let small = proxy.send(&Req::post("/echo", "x".repeat(100))).await;
    assert_eq!(small.worker, "w0");
    let large = proxy.send(&Req::post("/echo", "x".repeat(10_000))).await;
    assert_eq!(large.worker, "w1");
}
