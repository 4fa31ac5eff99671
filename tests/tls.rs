//! TLS at both ends: clients over HTTPS through gpulb to plain workers (under the same client
//! deadlines), gpulb to https backends verified against a CA file (and refused with another
//! CA), and the listener's certificate replaced on reload, a bad one refused.

mod common;

use common::{
    https_client, start_workers, tls_connect, worker_of, Backend, Config, Proxy, Req, TestCa,
    TlsFront, WAIT,
};
use serde_json::Value;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `listen_tls` serving `cert` and `key`.
fn listen_tls(cert: &Path, key: &Path) -> String {
    format!("{{cert: '{}', key: '{}'}}", cert.display(), key.display())
}

/// The proxy's HTTPS base URL and its address.
fn https_of(proxy: &Proxy) -> (String, SocketAddr) {
    let authority = proxy.url.trim_start_matches("http://");
    (
        format!("https://{authority}"),
        authority.parse().expect("proxy address"),
    )
}

/// Whether a new connection trusting only `ca` is served at `base`.
async fn served_trusting(base: &str, ca: &TestCa) -> bool {
    let sent = Req::get("/echo").request(&https_client(ca), base).send();
    sent.await.is_ok_and(|resp| resp.status() == 200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_reach_plain_workers_over_tls_under_the_client_deadlines() {
    let ca = TestCa::new("listener CA");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.issue().write(dir.path(), "listener");
    let workers = start_workers(2, |_| {}).await;
    let config = Config::fleet(&workers)
        .set("listen_tls", listen_tls(&cert, &key))
        .set("timeouts", "{client_header: 1s}");
    let proxy = Proxy::start(config).await;
    let (base, addr) = https_of(&proxy);
    let client = https_client(&ca);
    // Two streams at once: the second goes to the worker the first does not hold.
    let mut seen = BTreeSet::new();
    let first = Req::completion_stream(50).send(&client, &base).await;
    let second = Req::completion_stream(50).send(&client, &base).await;
    for resp in [first, second] {
        assert_eq!(resp.status(), 200);
        seen.insert(worker_of(&resp));
        let body = resp.bytes().await.expect("streamed body");
        assert!(body.ends_with(b"data: [DONE]\n\n"), "{body:?}");
    }
    assert_eq!(seen.len(), 2, "both workers served over TLS: {seen:?}");
    // The backend learns the client came over TLS.
    let echoed: serde_json::Value = Req::get("/echo")
        .request(&client, &base)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(echoed["headers"]["x-forwarded-proto"], "https", "{echoed}");
    // Plain HTTP on the TLS listener is not served.
    let plain = Req::get("/echo").request(&reqwest::Client::new(), &proxy.url);
    assert!(plain.send().await.is_err());

    // The connection guard still applies under TLS: a header that never ends is cut off after
    // `timeouts.client_header`, not pingora's minute.
    let mut stalled = tls_connect(addr, &ca).await.expect("TLS handshake");
    stalled
        .write_all(b"GET /echo HTTP/1.1\r\nhost: gpulb\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let read = tokio::time::timeout(WAIT, stalled.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "a stalled header over TLS was not closed: {read:?}"
    );
    let closed = "gpulb_client_connections_closed_total{reason=\"header\"}";
    assert!(proxy.metric(closed).await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_backends_are_verified_against_their_ca_file() {
    let (ours, other) = (TestCa::new("backend CA"), TestCa::new("another CA"));
    let dir = tempfile::tempdir().unwrap();
    let ours_file = ours.write(dir.path(), "ours.pem");
    let other_file = other.write(dir.path(), "other.pem");
    let workers = start_workers(1, |_| {}).await;
    let front = TlsFront::start(&ours.issue(), workers[0].addr()).await;
    let url = format!("https://{}", front.addr);
    let trusting = |ca: &Path| {
        Backend::at("secure", &url).set("tls", format!("{{ca_file: '{}'}}", ca.display()))
    };

    // Trusted: health checks (start waits for the first), model lists, telemetry and requests
    // all reach the worker through TLS.
    let config = Config::new()
        .backend(trusting(&ours_file).vllm())
        .set("models", "{interval: 100ms}");
    let proxy = Proxy::start(config).await;
    let answer = proxy.send(&Req::completion(2)).await;
    assert_eq!(
        (answer.status, answer.worker.as_str()),
        (200, "w0"),
        "{}",
        answer.body
    );
    proxy
        .wait_status("models and telemetry read over TLS", |s| {
            let b = &s["backends"][0];
            let read = b["models"]["source"] == "discovered" && !b["telemetry"]["server"].is_null();
            read.then_some(())
        })
        .await;
    drop(proxy);

    // Another CA: the handshake is refused; the client learns which backend by name only.
    let config = Config::new()
        .backend(trusting(&other_file).unchecked())
        .set("connect_retries", 0);
    let proxy = Proxy::start(config).await;
    let answer = proxy.send(&Req::completion(2)).await;
    assert_eq!(answer.status, 502, "{}", answer.body);
    let error: Value = answer.json()["error"].clone();
    assert_eq!(error["code"], "upstream_tls_failed");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("backend \"secure\""), "{message}");
    assert!(!answer.body.contains("127.0.0.1"), "{}", answer.body);
    drop(proxy);

    // `verify: false` takes any certificate (self-signed development setups).
    let config = Config::new().backend(
        Backend::at("secure", &url)
            .set("tls", "{verify: false}")
            .unchecked(),
    );
    let proxy = Proxy::start(config).await;
    assert_eq!(proxy.send(&Req::completion(2)).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_certificate_is_replaced_on_reload_and_a_bad_one_refused() {
    let (first, second) = (TestCa::new("first CA"), TestCa::new("second CA"));
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = first.issue().write(dir.path(), "listener");
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers).set("listen_tls", listen_tls(&cert, &key));
    let proxy = Proxy::start_with_token(config, "tok").await;
    let (base, _) = https_of(&proxy);
    assert!(served_trusting(&base, &first).await);
    assert!(!served_trusting(&base, &second).await);

    // Renewed files, same config text: the reload serves them to new handshakes.
    second.issue().write(dir.path(), "listener");
    let resp = proxy.post_reload(Some("tok")).await;
    assert_eq!(resp.status(), 200);
    let outcome: Value = resp.json().await.unwrap();
    assert_eq!(outcome["result"], "applied", "{outcome}");
    assert_eq!(outcome["changes"][0], "listen_tls certificate replaced");
    assert!(served_trusting(&base, &second).await);
    assert!(!served_trusting(&base, &first).await);

    // A file that cannot serve refuses the reload, naming it; the certificate in force stays.
    std::fs::write(&cert, "not a certificate\n").unwrap();
    let resp = proxy.post_reload(Some("tok")).await;
    assert_eq!(resp.status(), 422);
    let outcome: Value = resp.json().await.unwrap();
    assert_eq!(
        outcome["error"],
        format!(
            "listen_tls.cert: {} holds no PEM certificate",
            cert.display()
        )
    );
    let mismatched = first.issue();
    std::fs::write(&cert, &mismatched.cert).unwrap();
    let outcome: Value = proxy.post_reload(Some("tok")).await.json().await.unwrap();
    let error = outcome["error"].as_str().unwrap();
    assert!(error.starts_with("listen_tls.key: "), "{error}");
    assert!(
        error.contains("is not the private key of the certificate"),
        "{error}"
    );
    assert!(served_trusting(&base, &second).await);

    // SIGHUP takes the same path.
    first.issue().write(dir.path(), "listener");
    proxy.signal(libc::SIGHUP);
    common::eventually(WAIT, "the SIGHUP-reloaded certificate", || async {
        served_trusting(&base, &first).await.then_some(())
    })
    .await;
}
