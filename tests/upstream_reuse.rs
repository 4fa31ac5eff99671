//! gpulb keeps an upstream connection for the next request exactly when the backend's answer
//! allows it: a keep-alive answer is reused, `Connection: close` and an HTTP/1.0 answer without
//! keep-alive are not, and the answer to a `HEAD` (a length, no body) leaves the connection
//! usable. The session decides this from what it kept of the request and response headers
//! after handing them on (vendor/README.md, fifth change). A kept connection the backend closes
//! is not taken again, and one idle past `timeouts.upstream_keepalive` is closed by gpulb's
//! pool without a request to take it (seventh change).

mod common;

use common::{message_len, recording_backend, Backend, Config, Proxy, Req, WAIT};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Sends `requests` of `req` one after the other through a proxy in front of a backend that
/// answers `answer`; the connection number of each request as the backend saw it.
async fn connections_used(answer: &'static [u8], req: Req, requests: usize) -> Vec<usize> {
    let (url, received) = recording_backend(answer).await;
    let proxy = Proxy::start(Config::new().backend(Backend::at("b0", &url).unchecked())).await;
    for _ in 0..requests {
        let got = proxy.send(&req).await;
        assert_eq!(got.status, 200, "{}", got.body);
    }
    let connections: Vec<usize> = received
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.connection)
        .collect();
    assert_eq!(connections.len(), requests, "{connections:?}");
    connections
}

fn distinct(connections: &[usize]) -> usize {
    let mut sorted = connections.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sorted.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_answer_leaves_the_connection_for_the_next_request() {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\nkeep-alive: timeout=30\r\n\r\n{\"ok\":true}";
    let used = connections_used(ANSWER, Req::get("/v1/anything"), 6).await;
    assert_eq!(
        distinct(&used),
        1,
        "a kept-alive connection was not reused: {used:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_close_answer_ends_the_connection() {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok";
    let used = connections_used(ANSWER, Req::get("/v1/anything"), 4).await;
    assert_eq!(
        distinct(&used),
        4,
        "a connection the backend closed was reused: {used:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_answer_without_keep_alive_ends_the_connection() {
    const ANSWER: &[u8] = b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let used = connections_used(ANSWER, Req::get("/v1/anything"), 4).await;
    assert_eq!(
        distinct(&used),
        4,
        "an HTTP/1.0 connection was reused: {used:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_to_a_head_has_no_body_and_leaves_the_connection_usable() {
    // The length is that of the body a GET would get; no body follows. Read as a body, it
    // would hold the request until the upstream read timeout and spoil the connection.
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n";
    let started = std::time::Instant::now();
    let used = connections_used(ANSWER, Req::head("/v1/anything"), 3).await;
    assert!(
        started.elapsed() < WAIT,
        "HEAD answers took {:?}",
        started.elapsed()
    );
    assert_eq!(
        distinct(&used),
        1,
        "the connection was not reused after a HEAD: {used:?}"
    );
}

/// A backend that answers each request with a keep-alive `200` and, after `close_after`, closes
/// the connection (as a server's own idle timeout would); it records each proxied request's
/// connection number in `seen`, and in `closed` each such connection that ended with the other
/// side (gpulb) closing it, with how long after its last answer.
async fn closing_backend(close_after: Option<std::time::Duration>) -> (String, Seen, Closed) {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, closed): (Seen, Closed) = Default::default();
    let (record_seen, record_closed) = (Arc::clone(&seen), Arc::clone(&closed));
    tokio::spawn(async move {
        let mut connection = 0;
        while let Ok((mut socket, _)) = listener.accept().await {
            connection += 1;
            let (seen, closed) = (Arc::clone(&record_seen), Arc::clone(&record_closed));
            tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut buf = vec![0u8; 16 * 1024];
                let mut answered = None;
                loop {
                    let wait = close_after.unwrap_or(WAIT);
                    let n = match tokio::time::timeout(wait, socket.read(&mut buf)).await {
                        Ok(Ok(n)) if n > 0 => n,
                        Ok(_) => {
                            if let Some(at) = answered {
                                let idle = std::time::Instant::now() - at;
                                closed.lock().unwrap().push((connection, idle));
                            }
                            return;
                        }
                        Err(_) => return, // our own idle timeout: drop (close) the socket
                    };
                    pending.extend_from_slice(&buf[..n]);
                    while let Some(len) = message_len(&pending) {
                        let request: Vec<u8> = pending.drain(..len).collect();
                        if socket.write_all(ANSWER).await.is_err() {
                            return;
                        }
                        if !request.starts_with(b"GET /v1/models ") {
                            seen.lock().unwrap().push(connection);
                            answered = Some(std::time::Instant::now());
                        }
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), seen, closed)
}

/// For each request a [`closing_backend`] answered (gpulb's `GET /v1/models` aside): the number
/// of the connection it came on.
type Seen = Arc<Mutex<Vec<usize>>>;

/// Connections a backend saw closed by gpulb, with how long after their last answer.
type Closed = Arc<Mutex<Vec<(usize, std::time::Duration)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_backend_closed_while_it_waited_is_not_used_again() {
    let (url, seen, _) = closing_backend(Some(std::time::Duration::from_millis(50))).await;
    let proxy = Proxy::start(Config::new().backend(Backend::at("b0", &url).unchecked())).await;
    for _ in 0..3 {
        let got = proxy.send(&Req::get("/v1/anything")).await;
        assert_eq!(got.status, 200, "{}", got.body);
        // The backend closes the connection while it waits in gpulb's pool.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        distinct(&seen),
        3,
        "a closed connection was taken again: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_idle_past_upstream_keepalive_is_closed_without_a_request_to_take_it() {
    let (url, seen, closed) = closing_backend(None).await;
    let proxy = Proxy::start(
        Config::new()
            .set("timeouts", "{upstream_keepalive: 300ms}")
            .backend(Backend::at("b0", &url).unchecked()),
    )
    .await;
    let got = proxy.send(&Req::get("/v1/anything")).await;
    assert_eq!(got.status, 200, "{}", got.body);
    let deadline = std::time::Instant::now() + WAIT;
    while closed.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let closed = closed.lock().unwrap().clone();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let [(connection, idle)] = closed[..] else {
        panic!("gpulb did not close its idle connection within {WAIT:?}: {closed:?}");
    };
    assert_eq!(connection, seen[0]);
    assert!(
        idle >= std::time::Duration::from_millis(300),
        "closed before upstream_keepalive had passed: {idle:?}"
    );
}
