//! How header fields are written on: names on HTTP/1 leave in lower case (the common ones
//! titled), as HAProxy and Envoy send them, unless `preserve_header_case` asks for them as they
//! arrived, every header and value arriving either way; and a `Content-Length` that came as
//! repeats of one value goes on as that value once.

mod common;

use common::{recording_backend, Backend, Config, Proxy, Raw, ReceivedLog};

/// What the backend answers: a header of its own in mixed case.
const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Engine-Name: sim\r\nContent-Length: 11\r\n\r\n{\"ok\":true}";

/// What the client sends: headers of its own in mixed case, one of them twice.
const REQUEST: &[u8] = b"POST /v1/completions HTTP/1.1\r\nHost: gpulb.test\r\nContent-Type: application/json\r\nX-Trace-Token: abc\r\nX-Trace-Token: def\r\nContent-Length: 2\r\n\r\n{}";

/// Sends [`REQUEST`] through a gpulb whose config is `preserve`, and returns what the backend
/// received and what the client got back.
async fn round_trip(preserve: Option<bool>) -> (String, String) {
    round_trip_of(REQUEST, preserve).await
}

/// Sends `request` through a gpulb whose config is `preserve`, and returns what the backend
/// received and what the client got back.
async fn round_trip_of(request: &[u8], preserve: Option<bool>) -> (String, String) {
    let (proxy, received, _) = start(preserve).await;
    exchange(&proxy, &received, request).await
}

/// A gpulb in front of a [`recording_backend`] answering [`ANSWER`], with
/// `preserve_header_case` set to `preserve` (left out for `None`), and its config.
async fn start(preserve: Option<bool>) -> (Proxy, ReceivedLog, Config) {
    let (url, received) = recording_backend(ANSWER).await;
    let mut config = Config::new().backend(
        Backend::at("b0", &url)
            .unchecked()
            .set("models", "[sim-model]"),
    );
    if let Some(preserve) = preserve {
        config = config.set("preserve_header_case", preserve);
    }
    (Proxy::start(config.clone()).await, received, config)
}

/// Sends `request` on a new connection to `proxy`: what the backend received for it, and what
/// the client got back.
async fn exchange(proxy: &Proxy, received: &ReceivedLog, request: &[u8]) -> (String, String) {
    let before = received.lock().unwrap().len();
    let mut client = Raw::connect(&proxy.url).await;
    client.send(request).await;
    let answer = client.answer().await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), before + 1, "the backend saw {received:?}");
    (received[before].text(), answer.text)
}

fn header_lines(message: &str) -> Vec<&str> {
    let head = message.split("\r\n\r\n").next().unwrap_or_default();
    head.split("\r\n").skip(1).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_names_leave_in_lower_case_with_the_common_ones_titled_by_default() {
    let (forwarded, answered) = round_trip(None).await;
    let sent = header_lines(&forwarded);
    for line in [
        "Host: gpulb.test",
        "Content-Type: application/json",
        "Content-Length: 2",
    ] {
        assert!(sent.contains(&line), "{line:?} not in {sent:?}");
    }
    assert_eq!(
        sent.iter()
            .filter(|l| l.starts_with("x-trace-token: "))
            .count(),
        2,
        "both values, in order, lower case: {sent:?}"
    );
    assert!(
        forwarded.find("x-trace-token: abc") < forwarded.find("x-trace-token: def"),
        "{forwarded}"
    );
    assert!(!forwarded.contains("X-Trace-Token"), "{forwarded}");
    assert!(
        forwarded.ends_with("\r\n\r\n{}"),
        "body intact: {forwarded}"
    );
    let got = header_lines(&answered);
    assert!(got.contains(&"x-engine-name: sim"), "{got:?}");
    assert!(got.contains(&"Content-Type: application/json"), "{got:?}");
    assert!(answered.ends_with("{\"ok\":true}"), "{answered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preserve_header_case_forwards_names_as_they_arrived_both_ways() {
    let (forwarded, answered) = round_trip(Some(true)).await;
    let sent = header_lines(&forwarded);
    for line in [
        "Host: gpulb.test",
        "X-Trace-Token: abc",
        "X-Trace-Token: def",
    ] {
        assert!(sent.contains(&line), "{line:?} not in {sent:?}");
    }
    assert!(!forwarded.contains("x-trace-token"), "{forwarded}");
    let got = header_lines(&answered);
    assert!(got.contains(&"X-Engine-Name: sim"), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_repeated_with_one_value_goes_on_once() {
    for (preserve, lengths) in [
        (None, "Content-Length: 2\r\nContent-Length: 2"),
        (None, "Content-Length: 2, 2"),
        (Some(true), "content-length: 2 , 2\r\nContent-Length: 2"),
    ] {
        let request = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: gpulb.test\r\nContent-Type: application/json\r\n{lengths}\r\n\r\n{{}}"
        );
        let (forwarded, answered) = round_trip_of(request.as_bytes(), preserve).await;
        let lines: Vec<&str> = header_lines(&forwarded)
            .into_iter()
            .filter(|l| l.to_ascii_lowercase().starts_with("content-length:"))
            .collect();
        assert_eq!(lines, ["Content-Length: 2"], "{lengths:?} sent {forwarded}");
        assert!(
            forwarded.ends_with("\r\n\r\n{}"),
            "body intact: {forwarded}"
        );
        assert!(answered.ends_with("{\"ok\":true}"), "{answered}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preserve_header_case_takes_effect_on_reload() {
    let (proxy, received, config) = start(None).await;
    let (forwarded, _) = exchange(&proxy, &received, REQUEST).await;
    assert!(forwarded.contains("x-trace-token: abc"), "{forwarded}");
    proxy.rewrite_config(config.set("preserve_header_case", true));
    proxy.wait_generation(2).await;
    let (forwarded, answered) = exchange(&proxy, &received, REQUEST).await;
    assert!(forwarded.contains("X-Trace-Token: abc"), "{forwarded}");
    assert!(answered.contains("X-Engine-Name: sim"), "{answered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_request_id_gpulb_cannot_use_is_replaced_by_one_of_its_own_sent_once() {
    let (proxy, received, _) = start(None).await;
    let unusable = "x".repeat(200);
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: gpulb.test\r\nX-Request-Id: {unusable}\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    let (forwarded, answered) = exchange(&proxy, &received, request.as_bytes()).await;
    let ids: Vec<&str> = header_lines(&forwarded)
        .into_iter()
        .filter_map(|l| l.strip_prefix("x-request-id: "))
        .collect();
    assert_eq!(ids.len(), 1, "{forwarded}");
    assert_eq!(ids[0].len(), 32, "not gpulb's own id: {forwarded}");
    assert!(!forwarded.contains(&unusable), "{forwarded}");
    assert!(
        answered.contains(&format!("x-request-id: {}", ids[0])),
        "{answered}"
    );
}
