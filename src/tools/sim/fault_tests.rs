//! End-to-end tests of fault injection, kill and shutdown over real loopback HTTP.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use super::tests::{client, within, worker};
use super::Fault;

#[tokio::test]
async fn server_error_fault() {
    let w = worker("f").await;
    w.set_fault(Fault::ServerError);
    let c = client();
    let r = within(
        c.post(format!("{}/v1/completions", w.url()))
            .json(&json!({"prompt": "a"}))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 500);
    let v: Value = within(r.json()).await.unwrap();
    assert!(v["error"]["message"].is_string());
    let r = within(c.get(format!("{}/health", w.url())).send())
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let r = within(c.get(format!("{}/metrics", w.url())).send())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = within(c.get(format!("{}/echo", w.url())).send())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    w.set_fault(Fault::None);
    let r = within(c.get(format!("{}/health", w.url())).send())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn die_mid_stream_aborts_connection() {
    let w = worker("d").await;
    w.set_fault(Fault::DieMidStream { after_tokens: 2 });
    let body = json!({"prompt": "a", "max_tokens": 10, "stream": true});
    let r = within(
        client()
            .post(format!("{}/v1/completions", w.url()))
            .json(&body)
            .send(),
    )
    .await
    .unwrap();
    let mut stream = r.bytes_stream();
    let mut text = String::new();
    let mut failed = false;
    while let Some(chunk) = within(stream.next()).await {
        match chunk {
            Ok(b) => text.push_str(std::str::from_utf8(&b).unwrap()),
            Err(_) => failed = true,
        }
    }
    assert!(failed, "stream must end with an error, got {text}");
    assert_eq!(text.matches("data: ").count(), 2);
    assert!(!text.contains("[DONE]"));
}

#[tokio::test]
async fn hang_holds_requests_until_shutdown() {
    let w = worker("h").await;
    w.set_fault(Fault::Hang);
    let c = client();
    let res = tokio::time::timeout(
        Duration::from_millis(300),
        c.get(format!("{}/health", w.url())).send(),
    )
    .await;
    assert!(res.is_err(), "hung request must not be answered");
    let pending = tokio::spawn(c.get(format!("{}/v1/models", w.url())).send());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    within(w.shutdown()).await;
    assert!(started.elapsed() < Duration::from_millis(900));
    let _ = within(pending).await.unwrap();
}

#[tokio::test]
async fn kill_drops_connections_and_refuses_connects() {
    let w = worker("k").await;
    let addr = w.addr();
    let pending = tokio::spawn(client().get(format!("{}/sleep/5000", w.url())).send());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(w.stats().received_total, 1);
    within(w.kill_and_wait()).await;
    assert!(
        within(pending).await.unwrap().is_err(),
        "open request must fail"
    );
    assert!(
        within(tokio::net::TcpStream::connect(addr)).await.is_err(),
        "connect must be refused"
    );
    let r = within(client().get(format!("http://{addr}/health")).send()).await;
    assert!(r.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_kill_and_drop_stop_serving() {
    let w = worker("k2").await;
    let c = client();
    let url = format!("{}/health", w.url());
    within(c.get(&url).send()).await.unwrap(); // leaves a pooled keep-alive connection
    w.kill();
    assert!(within(c.get(&url).send()).await.is_err());
    assert!(within(client().get(&url).send()).await.is_err());

    let w2 = worker("k3").await;
    let addr = w2.addr();
    drop(w2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(within(tokio::net::TcpStream::connect(addr)).await.is_err());
}

#[tokio::test]
async fn slow_fault_scales_sleep_and_engine() {
    let w = worker("slow").await;
    w.set_fault(Fault::Slow(4.0));
    let c = client();
    let started = Instant::now();
    let r = within(c.get(format!("{}/sleep/30", w.url())).send())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(started.elapsed() >= Duration::from_millis(120));
    let started = Instant::now();
    let body = json!({"prompt": "a", "max_tokens": 3});
    let r = within(
        c.post(format!("{}/v1/completions", w.url()))
            .json(&body)
            .send(),
    )
    .await;
    assert_eq!(r.unwrap().status(), 200);
    assert!(started.elapsed() >= Duration::from_millis(120)); // 3 steps of 40ms
}
