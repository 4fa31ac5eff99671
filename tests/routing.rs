//! Routing follows least outstanding requests, respects weights and caps, and classes pick pools.

mod common;

use common::{backend_field, start_workers, Class, Config, Pool, Proxy, Req};

/// In the spirit of nginx's `upstream_least_conn.t`: two slow requests held on one backend,
/// the next ten all go to the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_backend_gets_no_new_requests() {
    let workers = start_workers(3, |_| {}).await;
    let config = Config::fleet(&workers)
        .pool(Pool::new("all", &["w0", "w1", "w2"]))
        .pool(Pool::new("pinned", &["w0"]))
        .class(Class::new("pinned", "pinned").match_header("x-pin", "w0"))
        .class(Class::new("all", "all"))
        .default_class("all");
    let proxy = Proxy::start(config).await;
    let slow: Vec<_> = (0..2)
        .map(|_| proxy.spawn(Req::sleep(4000).header("x-pin", "w0")))
        .collect();
    proxy.wait_outstanding("w0", 2).await;
    for _ in 0..10 {
        let resp = proxy.send(&Req::completion(1)).await;
        assert_eq!(resp.status, 200);
        assert_ne!(resp.worker, "w0", "a request went to the busy backend");
    }
    for handle in slow {
        assert_eq!(handle.await.unwrap().worker, "w0");
    }
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_spread_by_weight() {
    let workers = start_workers(2, |_| {}).await;
    let config =
        Config::fleet(&workers).each_backend_at(|i, b| if i == 1 { b.weight(3) } else { b });
    let proxy = Proxy::start(config).await;
    // One at a time, each in flight before the next is sent: two requests arriving at once on
    // the proxy's two threads may both read the same counts and both go to the same backend.
    let mut held = Vec::new();
    for in_flight in 1..=8 {
        held.push(proxy.spawn(Req::sleep(3000)));
        proxy.wait_total_outstanding(in_flight).await;
    }
    let (w0, w1) = proxy
        .wait_status("eight requests in flight", |s| {
            let counts = (
                backend_field(s, "w0", "outstanding"),
                backend_field(s, "w1", "outstanding"),
            );
            (counts.0 + counts.1 == 8).then_some(counts)
        })
        .await;
    assert_eq!(
        (w0, w1),
        (2, 6),
        "weights 1:3 should split eight in-flight requests 2:6"
    );
    for handle in held {
        assert_eq!(handle.await.unwrap().status, 200);
    }
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_cap_and_class_cap_give_openai_shaped_503() {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers)
        .each_backend(|b| b.max_outstanding(2))
        .class(
            Class::new("capped", "default")
                .max_outstanding(1)
                .max_depth(0)
                .match_path("/sleep/"),
        )
        .class(Class::new("rest", "default"))
        .default_class("rest");
    let proxy = Proxy::start(config).await;
    let first = proxy.spawn(Req::sleep(3000));
    proxy.wait_outstanding("w0", 1).await;

    let shed = proxy.send(&Req::sleep(10)).await;
    assert_eq!(shed.status, 503);
    assert!(shed.headers.contains_key("retry-after"));
    assert!(shed.headers.contains_key("x-request-id"));
    let body = shed.json();
    assert_eq!(body["error"]["code"], "no_backend_available");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("capped"));

    let second = proxy.send(&Req::get("/echo/hold")).await;
    assert_eq!(
        second.status, 200,
        "the other class still has room on the backend"
    );
    // w0 has cap 2: one sleeping request plus this one fits.
    let held = proxy.send(&Req::get("/echo/one-more")).await;
    assert_eq!(held.status, 200);
    assert_eq!(first.await.unwrap().status, 200);
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_pool_answers_no_backend_available() {
    let workers = start_workers(2, |_| {}).await;
    let config = Config::fleet(&workers)
        .each_backend(|b| b.max_outstanding(1))
        .class(Class::new("default", "default").max_depth(0));
    let proxy = Proxy::start(config).await;
    let held: Vec<_> = (0..2).map(|_| proxy.spawn(Req::sleep(3000))).collect();
    proxy.wait_total_outstanding(2).await;
    let resp = proxy.send(&Req::completion(1)).await;
    assert_eq!(resp.status, 503);
    let body = resp.json();
    assert_eq!(body["error"]["code"], "no_backend_available");
    assert_eq!(body["error"]["type"], "overloaded_error");
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    proxy.wait_idle().await;
}
