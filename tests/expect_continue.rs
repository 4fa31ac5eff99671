//! A client that sends `Expect: 100-continue` and waits (curl above 1 MiB, .NET, Java) is told
//! to go on by gpulb itself, which reads the body before any backend is asked: without the
//! `100 Continue` such a client waits out its own timeout (1 s for curl) on every request.

mod common;

use common::{recording_backend, Backend, Config, Proxy, Raw, WAIT};
use serde_json::Value;
use std::time::Duration;
use tokio::io::AsyncReadExt;

const ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";

/// Well under the second a client waits before it sends its body without a `100 Continue`.
const PROMPT: Duration = Duration::from_millis(500);

/// A request header announcing `body` that waits for `100 Continue` (`version` 1.0 or 1.1).
fn waiting_header(body: &str, version: &str) -> String {
    format!(
        "POST /v1/completions HTTP/{version}\r\nhost: gpulb\r\ncontent-type: application/json\r\n\
         expect: 100-continue\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
}

/// [`waiting_header`] for HTTP/1.1, with the request id `id`.
fn waiting_header_with_id(body: &str, id: &str) -> String {
    let header = waiting_header(body, "1.1");
    header.replace(
        "host: gpulb\r\n",
        &format!("host: gpulb\r\nx-request-id: {id}\r\n"),
    )
}

/// What arrives on `raw` within `limit`, read until a blank line ends a header (or nothing
/// more comes).
async fn header_within(raw: &mut Raw, limit: Duration) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(limit, async {
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match raw.0.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

fn body() -> String {
    common::completion(5, false)
}

/// The access-log record of the request with `id`, once written.
async fn record_of(proxy: &Proxy, id: &str) -> Value {
    common::eventually(WAIT, "the request's access-log record", || async {
        proxy
            .access_records()
            .into_iter()
            .find(|r| r["request_id"] == id)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_client_is_told_to_continue_and_its_request_goes_on_whole_without_the_expectation(
) {
    let (url, seen) = recording_backend(ANSWER).await;
    let proxy = Proxy::start(Config::new().backend(Backend::at("b0", &url).unchecked())).await;
    let mut raw = Raw::connect(&proxy.url).await;
    let body = body();
    raw.send(waiting_header_with_id(&body, "waits")).await;
    let interim = header_within(&mut raw, PROMPT).await;
    assert_eq!(
        interim, "HTTP/1.1 100 Continue\r\n\r\n",
        "no 100 Continue within {PROMPT:?} for a client that waits for one"
    );
    raw.send(&body).await;
    let answer = raw.answer().await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert!(answer.text.ends_with("{\"ok\":true}"), "{}", answer.text);
    assert!(
        !answer
            .text
            .to_ascii_lowercase()
            .contains("connection: close"),
        "a 100 Continue cost the connection its keep-alive: {}",
        answer.text
    );
    // The connection serves the next request.
    raw.send(format!(
        "POST /v1/completions HTTP/1.1\r\nhost: gpulb\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ))
    .await;
    let next = raw.answer().await;
    assert_eq!(next.status, 200, "{}", next.text);

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let first = seen[0].text();
    assert!(
        first.ends_with(&body),
        "the body did not arrive whole: {first}"
    );
    assert!(
        !first.to_ascii_lowercase().contains("expect:"),
        "the expectation gpulb answered was sent on: {first}"
    );
    assert_eq!(seen[0].reads, 1, "header and body went apart: {first}");
    assert_eq!(record_of(&proxy, "waits").await["status"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_after_the_100_continue_still_reaches_the_client() {
    // Nothing listens on the backend's port: every attempt fails after the 100 was sent.
    let dead = format!("http://127.0.0.1:{}", common::free_port());
    let proxy = Proxy::start(Config::new().backend(Backend::at("b0", &dead).unchecked())).await;
    let mut raw = Raw::connect(&proxy.url).await;
    let body = body();
    raw.send(waiting_header_with_id(&body, "dead")).await;
    assert_eq!(
        header_within(&mut raw, PROMPT).await,
        "HTTP/1.1 100 Continue\r\n\r\n"
    );
    raw.send(&body).await;
    let answer = raw.answer().await;
    assert!(
        answer.status >= 500,
        "no error answer after the 100 Continue: {:?}",
        answer.text
    );
    assert!(answer.text.contains("\"error\""), "{}", answer.text);
    let record = record_of(&proxy, "dead").await;
    assert_eq!(record["status"], answer.status, "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_client_is_never_sent_a_100_continue() {
    let (url, seen) = recording_backend(ANSWER).await;
    let proxy = Proxy::start(Config::new().backend(Backend::at("b0", &url).unchecked())).await;
    let mut raw = Raw::connect(&proxy.url).await;
    let body = body();
    raw.send(waiting_header(&body, "1.0")).await;
    assert_eq!(
        header_within(&mut raw, PROMPT).await,
        "",
        "an HTTP/1.0 client got a 1xx answer"
    );
    raw.send(&body).await;
    let answer = raw.answer().await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_refused_by_its_length_gets_the_refusal_and_no_100_continue() {
    let (url, seen) = recording_backend(ANSWER).await;
    let config = Config::new()
        .backend(Backend::at("b0", &url).unchecked())
        .set("request_body", "{max_bytes: 16}");
    let proxy = Proxy::start(config).await;
    let mut raw = Raw::connect(&proxy.url).await;
    raw.send(waiting_header(&body(), "1.1")).await;
    let answer = raw.answer().await;
    assert_eq!(answer.status, 413, "{}", answer.text);
    assert!(!answer.text.contains("100 Continue"), "{}", answer.text);
    assert!(seen.lock().unwrap().is_empty());
}
