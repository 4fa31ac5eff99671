//! How header fields are written on: names on HTTP/1 leave in lower case (the common ones
//! titled), as HAProxy and Envoy send them, unless `preserve_header_case` asks for them as they
//! arrived, every header and value arriving either way; and a `Content-Length` that came as
//! repeats of one value goes on as that value once.

mod common;

use common::{message_len, Backend, Config, Proxy, Raw, WAIT};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the backend answers: a header of its own in mixed case.
const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Engine-Name: sim\r\nContent-Length: 11\r\n\r\n{\"ok\":true}";

/// What the client sends: headers of its own in mixed case, one of them twice.
const REQUEST: &[u8] = b"POST /v1/completions HTTP/1.1\r\nHost: gpulb.test\r\nContent-Type: application/json\r\nX-Trace-Token: abc\r\nX-Trace-Token: def\r\nContent-Length: 2\r\n\r\n{}";

/// The requests a backend received, as read (but gpulb's `GET /v1/models`).
type Seen = Arc<Mutex<Vec<String>>>;

/// A backend that answers every request with [`ANSWER`] and notes what it received.
async fn recording_backend() -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve(socket, Arc::clone(&record)));
        }
    });
    (format!("http://{addr}"), seen)
}

async fn serve(mut socket: TcpStream, seen: Seen) {
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match tokio::time::timeout(WAIT, socket.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(len) = message_len(&pending) {
            let request: Vec<u8> = pending.drain(..len).collect();
            if !request.starts_with(b"GET /v1/models ") {
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&request).into_owned());
            }
            if socket.write_all(ANSWER).await.is_err() {
                return;
            }
        }
    }
}

/// Sends [`REQUEST`] through a gpulb whose config is `preserve`, and returns what the backend
/// received and what the client got back.
async fn round_trip(preserve: Option<bool>) -> (String, String) {
    round_trip_of(REQUEST, preserve).await
}

/// Sends `request` through a gpulb whose config is `preserve`, and returns what the backend
/// received and what the client got back.
async fn round_trip_of(request: &[u8], preserve: Option<bool>) -> (String, String) {
    let (url, seen) = recording_backend().await;
    let mut config = Config::new().backend(
        Backend::at("b0", &url)
            .unchecked()
            .set("models", "[sim-model]"),
    );
    if let Some(preserve) = preserve {
        config = config.set("preserve_header_case", preserve);
    }
    let proxy = Proxy::start(config).await;
    let mut client = Raw::connect(&proxy.url).await;
    client.send(request).await;
    let answer = client.answer().await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "the backend saw {seen:?}");
    (seen[0].clone(), answer.text)
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
