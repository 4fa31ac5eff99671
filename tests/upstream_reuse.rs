//! gpulb keeps an upstream connection for the next request exactly when the backend's answer
//! allows it: a keep-alive answer is reused, `Connection: close` and an HTTP/1.0 answer without
//! keep-alive are not, and the answer to a `HEAD` (a length, no body) leaves the connection
//! usable. The session decides this from what it kept of the request and response headers
//! after handing them on (vendor/README.md, fifth change).

mod common;

use common::{message_len, Backend, Config, Proxy, Req, WAIT};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// For each request a backend answered (gpulb's `GET /v1/models` aside): the number of the
/// connection it came on.
type Seen = Arc<Mutex<Vec<usize>>>;

/// A backend that answers every request with `answer` and then leaves the connection open
/// (even after `Connection: close`, so that a request gpulb should not have sent on it would
/// still arrive and be counted).
async fn backend(answer: &'static [u8]) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut connection = 0;
        while let Ok((socket, _)) = listener.accept().await {
            connection += 1;
            tokio::spawn(serve(socket, connection, answer, Arc::clone(&record)));
        }
    });
    (format!("http://{addr}"), seen)
}

async fn serve(mut socket: TcpStream, connection: usize, answer: &[u8], seen: Seen) {
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
                seen.lock().unwrap().push(connection);
            }
            if socket.write_all(answer).await.is_err() {
                return;
            }
        }
    }
}

/// Sends `requests` of `req` one after the other through a proxy in front of a backend that
/// answers `answer`; the connection number of each request as the backend saw it.
async fn connections_used(answer: &'static [u8], req: Req, requests: usize) -> Vec<usize> {
    let (url, seen) = backend(answer).await;
    let proxy = Proxy::start(Config::new().backend(Backend::at("b0", &url).unchecked())).await;
    for _ in 0..requests {
        let got = proxy.send(&req).await;
        assert_eq!(got.status, 200, "{}", got.body);
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), requests, "{seen:?}");
    seen
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
