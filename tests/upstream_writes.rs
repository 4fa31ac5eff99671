//! A request whose body gpulb holds reaches the backend in one piece: header and body leave in
//! one write, so the model server wakes and reads once per request, not once for the header
//! and again for the body.

mod common;

use common::{recording_backend, Backend, Config, Proxy, Req};

const ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_with_a_held_body_reaches_the_backend_in_one_read() {
    let (url, seen) = recording_backend(ANSWER).await;
    let config = Config::new().backend(
        Backend::at("b0", &url)
            .unchecked()
            .set("models", "[sim-model]"),
    );
    let proxy = Proxy::start(config).await;
    const REQUESTS: usize = 30;
    for _ in 0..REQUESTS {
        let answer = proxy.send(&Req::completion(5)).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        REQUESTS,
        "the backend saw another number of requests"
    );
    for request in &seen {
        let (reads, text) = (request.reads, request.text());
        assert!(
            text.ends_with(&common::completion(5, false)),
            "the body did not arrive whole: {text}"
        );
        assert_eq!(
            reads, 1,
            "a request came in {reads} reads (header and body written apart): {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_body_and_with_an_empty_one_still_go_through() {
    let (url, seen) = recording_backend(ANSWER).await;
    let proxy = Proxy::start(Config::new().backend(Backend::at("b0", &url).unchecked())).await;
    let get = proxy.send(&Req::get("/v1/anything")).await;
    assert_eq!(get.status, 200, "{}", get.body);
    let empty = proxy.send(&Req::post("/v1/anything", "")).await;
    assert_eq!(empty.status, 200, "{}", empty.body);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].text().starts_with("GET /v1/anything"));
    assert!(seen[1].text().starts_with("POST /v1/anything"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_streamed_unread_arrives_whole_after_its_header() {
    // Over `request_body.max_bytes` with `over_limit: forward`, the body is not held: the
    // header waits for its first piece and the rest follows as the client sends it.
    let (url, seen) = recording_backend(ANSWER).await;
    let config = Config::new()
        .backend(Backend::at("b0", &url).unchecked())
        .set("request_body", "{max_bytes: 1024, over_limit: forward}");
    let proxy = Proxy::start(config).await;
    let prompt = "x".repeat(200_000);
    let body = format!(r#"{{"model":"sim-model","prompt":"{prompt}","max_tokens":1}}"#);
    let answer = proxy
        .send(&Req::post("/v1/completions", body.clone()))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].text().ends_with(&body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_streamed_unread_keeps_its_100_continue_expectation_for_the_backend() {
    // gpulb answers `Expect: 100-continue` itself only for a body it reads
    // (tests/expect_continue.rs); one it streams unread goes on with the expectation, for the
    // backend to answer, its header written first.
    let (url, seen) = recording_backend(ANSWER).await;
    let config = Config::new()
        .backend(Backend::at("b0", &url).unchecked())
        .set("request_body", "{max_bytes: 16, over_limit: forward}");
    let proxy = Proxy::start(config).await;
    let body = common::completion(5, false);
    let answer = proxy
        .send(
            &Req::post("/v1/completions", body.clone())
                .header("content-type", "application/json")
                .header("expect", "100-continue"),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let text = seen[0].text();
    assert!(text.ends_with(&body), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("expect: 100-continue"),
        "{text}"
    );
}
