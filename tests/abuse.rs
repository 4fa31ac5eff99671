//! Hostile and careless clients: stalled uploads, slowloris, idle floods, protocol abuse. Each
//! case asserts the status the client gets, that nothing leaked (slots, queue places) and that
//! no healthy backend was ejected for a client's fault.

mod common;

use common::{start_workers, Config, Proxy, Raw, Req};
use serde_json::Value;

/// Whether backend `name` is ejected in a `/status` document.
fn ejected(status: &Value, name: &str) -> bool {
    status["backends"]
        .as_array()
        .and_then(|all| all.iter().find(|b| b["name"] == name))
        .map(|b| b["ejected"] == true)
        .expect("backend in status")
}

/// A POST to the sim's `/echo` announcing `length` body bytes and sending `sent` of them.
fn partial_upload(length: usize, sent: usize) -> String {
    format!(
        "POST /echo HTTP/1.1\r\nhost: gpulb\r\ncontent-type: application/octet-stream\r\n\
         content-length: {length}\r\n\r\n{}",
        "x".repeat(sent)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_uploads_get_408_and_never_hold_a_slot() {
    let workers = start_workers(1, |_| {}).await;
    // One slot and no queue: a stalled upload holding the slot would turn the real request
    // below into a 503. One failure would eject the backend.
    let config = Config::fleet(&workers)
        .each_backend(|b| b.max_outstanding(1))
        .set("timeouts", "{client_body: 1s}")
        .set("outlier_detection", "{consecutive_failures: 1}")
        .set(
            "classes",
            "[{name: default, pool: default, queue: {max_depth: 0}}]",
        );
    let proxy = Proxy::start(config).await;
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut raw = Raw::connect(&proxy.url).await;
        raw.send(partial_upload(1000, 10)).await;
        stalled.push(raw);
    }
    let served = proxy.send(&Req::post("/echo", "whole body")).await;
    assert_eq!(served.status, 200, "the stalled uploads took no slot");
    for raw in &mut stalled {
        let answer = raw.answer().await;
        assert_eq!(answer.status, 408, "{}", answer.text);
        assert!(answer.text.contains("body_timeout"), "{}", answer.text);
    }
    proxy.wait_idle().await;
    assert!(!ejected(&proxy.status().await, "w0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_in_a_streamed_upload_is_the_clients_fault() {
    let workers = start_workers(1, |_| {}).await;
    // Bodies over 1 KiB stream to the backend; the backend's read timeout is short, so it
    // expires while the backend waits on the client's body.
    let config = Config::fleet(&workers)
        .set("request_body", "{max_bytes: 1024}")
        .set("timeouts", "{read: 300ms, client_body: 5s}")
        .set("outlier_detection", "{consecutive_failures: 1}");
    let proxy = Proxy::start(config).await;
    let chunked =
        "POST /echo HTTP/1.1\r\nhost: gpulb\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n";
    for request in [partial_upload(100_000, 2000), chunked.to_string()] {
        let mut raw = Raw::connect(&proxy.url).await;
        raw.send(&request).await;
        let answer = raw.answer().await;
        assert_eq!(answer.status, 408, "{}", answer.text);
        proxy.wait_idle().await;
        let status = proxy.status().await;
        assert!(!ejected(&status, "w0"), "a client's stall ejected {status}");
    }
    let served = proxy.send(&Req::completion(2)).await;
    assert_eq!(served.status, 200);
}
