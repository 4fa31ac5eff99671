//! Routing follows least outstanding requests, respects weights and caps, and classes pick pools.

mod common;

use common::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// In the spirit of nginx's `upstream_least_conn.t`: two slow requests held on one backend,
/// the next ten all go to the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_backend_gets_no_new_requests() {
    let workers = start_workers(3, |_| {}).await;
    let config = format!(
        "{}pools:\n  - {{name: all, backends: [w0, w1, w2]}}\n  - {{name: pinned, backends: [w0]}}\n\
         classes:\n  - {{name: pinned, pool: pinned, match: {{headers: {{x-pin: w0}}}}}}\n  \
         - {{name: all, pool: all}}\ndefault_class: all\n",
        backends_yaml(&workers, |_| String::new())
    );
    let proxy = Proxy::start(&config).await;
    let client = reqwest::Client::new();
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let req = client
                .get(format!("{}/sleep/4000", proxy.url))
                .header("x-pin", "w0");
            tokio::spawn(async move { req.send().await })
        })
        .collect();
    eventually(WAIT, "two requests in flight on w0", || async {
        (proxy.outstanding("w0").await == 2).then_some(())
    })
    .await;
    for _ in 0..10 {
        let resp = proxy.complete(&client, 1, false).await;
        assert_eq!(resp.status(), 200);
        assert_ne!(worker_of(&resp), "w0", "a request went to the busy backend");
    }
    for handle in slow {
        let resp = handle.await.unwrap().unwrap();
        assert_eq!(worker_of(&resp), "w0");
    }
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_spread_by_weight() {
    let workers = start_workers(2, |_| {}).await;
    let config = backends_yaml(&workers, |i| {
        if i == 1 {
            ", weight: 3".into()
        } else {
            String::new()
        }
    });
    let proxy = Proxy::start(&config).await;
    let client = reqwest::Client::new();
    let held: Vec<_> = (0..8)
        .map(|_| {
            let req = client.get(format!("{}/sleep/3000", proxy.url));
            tokio::spawn(async move { req.send().await })
        })
        .collect();
    let (w0, w1) = eventually(WAIT, "eight requests in flight", || async {
        let status = proxy.status().await;
        let counts = (
            backend_field(&status, "w0", "outstanding"),
            backend_field(&status, "w1", "outstanding"),
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
        assert_eq!(handle.await.unwrap().unwrap().status(), 200);
    }
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_cap_and_class_cap_give_openai_shaped_503() {
    let workers = start_workers(1, |_| {}).await;
    let config = format!(
        "{}classes:\n  - {{name: capped, pool: default, max_outstanding: 1, queue: {{max_depth: 0}}, match: {{path_prefix: /sleep/}}}}\n  \
         - {{name: rest, pool: default}}\ndefault_class: rest\n",
        backends_yaml(&workers, |_| ", max_outstanding: 2".into())
    );
    let proxy = Proxy::start(&config).await;
    let client = reqwest::Client::new();
    let first = {
        let req = client.get(format!("{}/sleep/3000", proxy.url));
        tokio::spawn(async move { req.send().await })
    };
    eventually(WAIT, "one request in flight", || async {
        (proxy.outstanding("w0").await == 1).then_some(())
    })
    .await;

    let shed = client
        .get(format!("{}/sleep/10", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(shed.status(), 503);
    assert!(shed.headers().contains_key("retry-after"));
    assert!(shed.headers().contains_key("x-request-id"));
    let body: serde_json::Value = shed.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_backend_available");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("capped"));

    let second = {
        let req = client.get(format!("{}/echo/hold", proxy.url));
        req.send().await.unwrap()
    };
    assert_eq!(
        second.status(),
        200,
        "the other class still has room on the backend"
    );
    let held = {
        let req = client.get(format!("{}/echo/one-more", proxy.url));
        // w0 has cap 2: one sleeping request plus this one fits.
        req.send().await.unwrap()
    };
    assert_eq!(held.status(), 200);
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_pool_answers_no_backend_available() {
    let workers = start_workers(2, |_| {}).await;
    let proxy = Proxy::start(&format!(
        "{}classes:\n  - {{name: default, pool: default, queue: {{max_depth: 0}}}}\n",
        backends_yaml(&workers, |_| ", max_outstanding: 1".into())
    ))
    .await;
    let client = reqwest::Client::new();
    let held: Vec<_> = (0..2)
        .map(|_| {
            let req = client.get(format!("{}/sleep/3000", proxy.url));
            tokio::spawn(async move { req.send().await })
        })
        .collect();
    eventually(WAIT, "both backends full", || async {
        let s = proxy.status().await;
        (backend_field(&s, "w0", "outstanding") + backend_field(&s, "w1", "outstanding") == 2)
            .then_some(())
    })
    .await;
    let resp = proxy.complete(&client, 1, false).await;
    assert_eq!(resp.status(), 503);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_backend_available");
    assert_eq!(body["error"]["type"], "overloaded_error");
    for h in held {
        assert_eq!(h.await.unwrap().unwrap().status(), 200);
    }
    proxy.wait_idle().await;
}
