//! `timeouts.first_byte` bounds the wait for a backend's first body byte (the first token),
//! `timeouts.idle` the silence between chunks after it; a cut exchange gives its slot back.
//! The deadlines hold on a pooled connection too, where the watchdog's duplicate descriptor
//! was made by an earlier request (vendor/README.md, pingora-core's tenth change).

mod common;

use common::{message_len, start_workers, Backend, Config, Proxy, Req, WAIT};
use gpulb::tools::sim::Fault;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the one-shot backend saw: for each request (gpulb's `GET /v1/models` aside) the number
/// of its connection, and whether a connection was closed or shut down by gpulb.
#[derive(Debug, Default)]
struct Seen {
    requests: Vec<usize>,
    closed: Vec<usize>,
}

/// A backend that answers the first request with a keep-alive 200 and never answers another
/// (gpulb's `GET /v1/models` always answered, and not counted).
async fn answers_once() -> (String, Arc<Mutex<Seen>>) {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut connection = 0;
        while let Ok((mut socket, _)) = listener.accept().await {
            connection += 1;
            let seen = Arc::clone(&record);
            tokio::spawn(async move {
                let (mut pending, mut buf) = (Vec::new(), vec![0u8; 16 * 1024]);
                loop {
                    let n = match tokio::time::timeout(WAIT, socket.read(&mut buf)).await {
                        Ok(Ok(n)) if n > 0 => n,
                        Ok(_) => break seen.lock().unwrap().closed.push(connection),
                        Err(_) => return,
                    };
                    pending.extend_from_slice(&buf[..n]);
                    while let Some(len) = message_len(&pending) {
                        let request: Vec<u8> = pending.drain(..len).collect();
                        let answer = request.starts_with(b"GET /v1/models ") || {
                            let mut seen = seen.lock().unwrap();
                            seen.requests.push(connection);
                            seen.requests.len() == 1
                        };
                        if answer && socket.write_all(ANSWER).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, seen)
}

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
async fn a_pooled_connection_is_cut_at_first_byte_too() {
    let (url, seen) = answers_once().await;
    let config = Config::new()
        .backend(Backend::at("b0", &url).unchecked())
        .set("timeouts", "{first_byte: 300ms}")
        .set("outlier_detection", "{consecutive_failures: 0}");
    let proxy = Proxy::start(config).await;
    assert_eq!(proxy.send(&Req::completion(5)).await.status, 200);
    let answer = tokio::time::timeout(WAIT, proxy.send(&Req::completion(5)))
        .await
        .expect("no answer: the first-byte deadline did not cut the exchange");
    assert_eq!(answer.status, 504, "{}", answer.body);
    assert!(
        answer.body.contains("timeouts.first_byte, 300ms"),
        "the cause is not named: {}",
        answer.body
    );
    let requests = seen.lock().unwrap().requests.clone();
    assert!(
        requests.len() == 2 && requests[0] == requests[1],
        "the second request was not on the pooled connection: {requests:?}"
    );
    let cut_closed = || seen.lock().unwrap().closed.contains(&requests[0]);
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cut_closed() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(common::POLL).await;
    }
    assert!(cut_closed(), "the cut connection was not closed");
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
