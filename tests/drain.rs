//! SIGTERM drains: readiness turns false at once, traffic is served through `drain_delay`, then
//! the listener stops accepting (a new connection is refused) while a stream in flight runs to
//! its `[DONE]`, and only then does the process exit; a client connection silent when the
//! listener closes is closed after its last call (half a second) and one whose request comes
//! just then is answered. Probes answer without a token. The stream's drain runs with two proxy
//! threads (two current-thread runtimes, each keeping its connections) and with one.

mod common;

use common::{eventually, start_workers, Config, Proxy, Req, WAIT};
use gpulb::tools::sim::SimWorker;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_flight_completes_across_sigterm() {
    stream_in_flight_across_sigterm(2).await;
}

/// One proxy thread, one runtime: the same drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_flight_completes_across_sigterm_on_one_thread() {
    stream_in_flight_across_sigterm(1).await;
}

async fn stream_in_flight_across_sigterm(threads: u32) {
    // 40 tokens at 50 ms each: a stream of about two seconds.
    let workers = start_workers(1, |p| p.decode_step = Duration::from_millis(50)).await;
    let config = Config::fleet(&workers)
        .set("threads", threads)
        .set("drain_delay", "500ms")
        .set("shutdown_timeout", "20s");
    let mut proxy = Proxy::start(config).await;
    let probe = |path: &'static str| {
        let url = format!("{}{path}", proxy.admin);
        async move { reqwest::get(url).await.map(|r| r.status().as_u16()) }
    };
    assert_eq!(probe("/livez").await.unwrap(), 200);
    assert_eq!(probe("/readyz").await.unwrap(), 200);

    let stream = proxy.spawn(Req::completion_stream(40));
    proxy.wait_outstanding("w0", 1).await;
    proxy.signal(libc::SIGTERM);
    let signalled = Instant::now();
    // Not ready as soon as the signal is handled, but still serving during the delay.
    eventually(WAIT, "/readyz to say 503", || async {
        (probe("/readyz").await.ok()? == 503).then_some(())
    })
    .await;
    assert_eq!(proxy.send(&Req::completion(1)).await.status, 200);
    // After the delay the listener is closed: a new connection is refused.
    tokio::time::sleep(Duration::from_millis(700).saturating_sub(signalled.elapsed())).await;
    let addr = proxy.url.trim_start_matches("http://").to_string();
    let refused = eventually(WAIT, "the listener to close", || async {
        match tokio::net::TcpStream::connect(&addr).await {
            Err(e) => Some(e.kind()),
            Ok(_) => None,
        }
    })
    .await;
    assert_eq!(refused, std::io::ErrorKind::ConnectionRefused);
    assert!(
        !stream.is_finished(),
        "the listener closed while the stream ran"
    );
    // The admin listener still answers (metrics are scraped through the drain).
    assert_eq!(probe("/readyz").await.unwrap(), 503);

    let answer = stream.await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.body.matches("data: {").count(),
        40,
        "{}",
        answer.body
    );
    assert!(answer.body.ends_with("data: [DONE]\n\n"), "{}", answer.body);
    let status = proxy.wait_exit().await;
    assert!(status.success(), "{status:?}");
    assert!(signalled.elapsed() < WAIT);
}

/// A proxy (`shutdown_timeout: 30s`, client `timeouts` as given) in front of a worker taking
/// 100 ms a token, and a raw client connection it has answered once and keeps alive.
async fn kept_alive_client_of_a_slow_fleet(timeouts: &str) -> (Vec<SimWorker>, Proxy, common::Raw) {
    let workers = start_workers(1, |p| p.decode_step = Duration::from_millis(100)).await;
    let config = Config::fleet(&workers)
        .set("shutdown_timeout", "30s")
        .set("timeouts", timeouts);
    let proxy = Proxy::start(config).await;
    let mut raw = common::Raw::connect(&proxy.url).await;
    raw.send("GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(raw.answer().await.status, 200);
    (workers, proxy, raw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keepalive_client_is_closed_on_sigterm_while_a_stream_drains() {
    // The connection waits for its next request in gpulb's own keep-alive loop, not pingora's:
    // stopping must close it there too, while a stream still drains, long before
    // `timeouts.client_idle`.
    // 40 tokens at 100 ms each: a stream of about four seconds keeps the drain going.
    let (_workers, mut proxy, mut raw) =
        kept_alive_client_of_a_slow_fleet("{client_idle: 60s}").await;
    let stream = proxy.spawn(Req::completion_stream(40));
    proxy.wait_outstanding("w0", 1).await;
    proxy.signal(libc::SIGTERM);
    assert!(
        raw.closed_within(Duration::from_secs(2)).await,
        "the idle keep-alive connection stayed open through the drain"
    );
    assert!(!stream.is_finished(), "the stream ended before the check");
    assert_eq!(stream.await.unwrap().status, 200);
    assert!(proxy.wait_exit().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_as_the_listener_closes_is_answered_not_cut() {
    // HTTP/1 cannot tell a connection cut as its request went out from a request lost, so a
    // connection open when the listener closes still answers a request sent just then (its last
    // call): a kept-alive one between requests and a fresh one not asked anything yet. Both get
    // the drain's 503 and are closed after it. Nothing else is in flight: the process waits for
    // these connections before it exits.
    let timeouts = "{client_idle: 60s, client_header: 60s}";
    let (_workers, mut proxy, mut kept) = kept_alive_client_of_a_slow_fleet(timeouts).await;
    let mut fresh = common::Raw::connect(&proxy.url).await;
    // Both accepted before the listener closes.
    eventually(WAIT, "two client connections open", || async {
        (proxy.metric("gpulb_client_connections").await >= 2.0).then_some(())
    })
    .await;
    proxy.signal(libc::SIGTERM);
    let addr = proxy.url.trim_start_matches("http://").to_string();
    eventually(WAIT, "the listener to close", || async {
        tokio::net::TcpStream::connect(&addr).await.err()
    })
    .await;
    // Both requests go out at once, well inside the half-second last call.
    for raw in [&mut kept, &mut fresh] {
        raw.send("GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n").await;
    }
    for (name, raw) in [("kept-alive", &mut kept), ("fresh", &mut fresh)] {
        let answer = raw.answer().await;
        assert_eq!(answer.status, 503, "{name}: {}", answer.text);
        let head = answer.text.to_ascii_lowercase();
        assert!(head.contains("connection: close"), "{name}: {head}");
        assert!(
            raw.closed_within(Duration::from_secs(2)).await,
            "{name}: still open after its last answer"
        );
    }
    assert!(proxy.wait_exit().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_proxy_stops_at_once_on_sigterm() {
    let workers = start_workers(1, |_| {}).await;
    let mut proxy = Proxy::start(Config::fleet(&workers)).await;
    let started = Instant::now();
    proxy.signal(libc::SIGTERM);
    assert!(proxy.wait_exit().await.success());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
