//! `timeouts.first_byte` bounds the wait for a backend's first body byte (the first token),
//! `timeouts.idle` the silence between chunks after it; a cut exchange gives its slot back.

mod common;

use common::{start_workers, Config, Proxy, Req, WAIT};
use gpulb::tools::sim::Fault;
use std::time::Duration;

/// Reads `resp`'s body until it ends or breaks (within `WAIT`): the bytes, and whether the
/// body ended cleanly.
async fn read_all(mut resp: reqwest::Response) -> (String, bool) {
    let mut body = Vec::new();
    let clean = tokio::time::timeout(WAIT, async {
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    })
    .await
    .expect("the body neither ended nor broke in time");
    (String::from_utf8_lossy(&body).into_owned(), clean)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_never_answers_gets_504_at_first_byte() {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers)
        .set("timeouts", "{first_byte: 300ms}")
        .set("outlier_detection", "{consecutive_failures: 0}");
    let proxy = Proxy::start(config).await;
    workers[0].set_fault(Fault::Hang);
    let answer = tokio::time::timeout(WAIT, proxy.send(&Req::completion(5)))
        .await
        .expect("no answer: the first-byte deadline did not cut the exchange");
    assert_eq!(answer.status, 504, "{}", answer.body);
    assert!(answer.body.contains("upstream_timeout"), "{}", answer.body);
    assert!(
        answer.body.contains("timeouts.first_byte, 300ms"),
        "the cause is not named: {}",
        answer.body
    );
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_token_not_the_header_must_come_within_first_byte() {
    // The worker sends its header at once and its first token after one 2 s step.
    let workers = start_workers(1, |p| p.decode_step = Duration::from_secs(2)).await;
    let proxy = Proxy::start(Config::fleet(&workers).set("timeouts", "{first_byte: 400ms}")).await;
    let resp = proxy.open(&Req::completion_stream(3)).await;
    let status = resp.status().as_u16();
    let (body, clean) = read_all(resp).await;
    assert!(!body.contains("data: {"), "a token came through: {body}");
    assert!(
        status == 504 || !clean,
        "a cut stream must not look complete ({status}): {body}"
    );
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_goes_quiet_is_cut_at_idle_and_a_steady_one_is_not() {
    let slow = start_workers(1, |p| p.decode_step = Duration::from_millis(1500)).await;
    let config = Config::fleet(&slow).set("timeouts", "{first_byte: 10s, idle: 400ms}");
    let proxy = Proxy::start(config).await;
    let resp = proxy.open(&Req::completion_stream(4)).await;
    assert_eq!(resp.status(), 200);
    let (body, clean) = read_all(resp).await;
    assert!(body.contains("data: {"), "the first token was cut: {body}");
    assert!(!clean && !body.contains("[DONE]"), "not cut: {body}");
    proxy.wait_idle().await;

    let steady = start_workers(1, |p| p.decode_step = Duration::from_millis(50)).await;
    let config = Config::fleet(&steady).set("timeouts", "{first_byte: 10s, idle: 400ms}");
    let proxy = Proxy::start(config).await;
    let resp = proxy.open(&Req::completion_stream(20)).await;
    assert_eq!(resp.status(), 200);
    let (body, clean) = read_all(resp).await;
    assert!(clean && body.ends_with("data: [DONE]\n\n"), "cut: {body}");
    proxy.wait_idle().await;
}
