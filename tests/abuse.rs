//! Hostile and careless clients: stalled uploads, slowloris, idle floods, protocol abuse. Each
//! case asserts the status the client gets, that nothing leaked (slots, queue places, file
//! descriptors) and that no healthy backend was ejected for a client's fault.

mod common;

use common::{metric, start_workers, Config, Proxy, Raw, Req, WAIT};
use serde_json::Value;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Whether backend `name` is ejected in a `/status` document.
fn ejected(status: &Value, name: &str) -> bool {
    status["backends"]
        .as_array()
        .and_then(|all| all.iter().find(|b| b["name"] == name))
        .map(|b| b["ejected"] == true)
        .expect("backend in status")
}

/// A POST to the sim's `/echo` announcing `length` body bytes and sending `sent` of them.
fn partial_upload(length: usize, sent: usize) -> String {
    format!(
        "POST /echo HTTP/1.1\r\nhost: gpulb\r\ncontent-type: application/octet-stream\r\n\
         content-length: {length}\r\n\r\n{}",
        "x".repeat(sent)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_uploads_get_408_and_never_hold_a_slot() {
    let workers = start_workers(1, |_| {}).await;
    // One slot and no queue: a stalled upload holding the slot would turn the real request
    // below into a 503. One failure would eject the backend.
    let config = Config::fleet(&workers)
        .each_backend(|b| b.max_outstanding(1))
        .set("timeouts", "{client_body: 1s}")
        .set("outlier_detection", "{consecutive_failures: 1}")
        .set(
            "classes",
            "[{name: default, pool: default, queue: {max_depth: 0}}]",
        );
    let proxy = Proxy::start(config).await;
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut raw = Raw::connect(&proxy.url).await;
        raw.send(partial_upload(1000, 10)).await;
        stalled.push(raw);
    }
    let served = proxy.send(&Req::post("/echo", "whole body")).await;
    assert_eq!(served.status, 200, "the stalled uploads took no slot");
    for raw in &mut stalled {
        let answer = raw.answer().await;
        assert_eq!(answer.status, 408, "{}", answer.text);
        assert!(answer.text.contains("body_timeout"), "{}", answer.text);
    }
    proxy.wait_idle().await;
    assert!(!ejected(&proxy.status().await, "w0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_in_past_client_body_gets_408() {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers).set("timeouts", "{client_body: 1s}");
    let proxy = Proxy::start(config).await;
    let mut raw = Raw::connect(&proxy.url).await;
    raw.send(partial_upload(400, 0)).await;
    // A piece every 200 ms, each well within a second of the one before, for 1.6 s: only a
    // deadline for the whole body, not one per read, answers before the pieces stop.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = raw.0.write_all(&[b'x'; 10]).await;
    }
    // Answered at about 1 s, so already here; a per-read deadline would answer at about 2.6 s.
    let answer = raw.answer_within(Duration::from_millis(300)).await;
    assert_eq!(answer.status, 408, "{}", answer.text);
    assert!(answer.text.contains("body_timeout"), "{}", answer.text);
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_in_a_streamed_upload_is_the_clients_fault() {
    let workers = start_workers(1, |_| {}).await;
    // Bodies over 1 KiB stream to the backend; the backend's read timeout is short, so it
    // expires while the backend waits on the client's body.
    let config = Config::fleet(&workers)
        .set("request_body", "{max_bytes: 1024}")
        .set("timeouts", "{read: 300ms, client_body: 5s}")
        .set("outlier_detection", "{consecutive_failures: 1}");
    let proxy = Proxy::start(config).await;
    let chunked =
        "POST /echo HTTP/1.1\r\nhost: gpulb\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n";
    for request in [partial_upload(100_000, 2000), chunked.to_string()] {
        let mut raw = Raw::connect(&proxy.url).await;
        raw.send(&request).await;
        let answer = raw.answer().await;
        assert_eq!(answer.status, 408, "{}", answer.text);
        proxy.wait_idle().await;
        let status = proxy.status().await;
        assert!(!ejected(&status, "w0"), "a client's stall ejected {status}");
    }
    let served = proxy.send(&Req::completion(2)).await;
    assert_eq!(served.status, 200);
}

const GET_ECHO: &str = "GET /echo HTTP/1.1\r\nhost: gpulb\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keepalive_connection_is_closed_after_client_idle() {
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start(Config::fleet(&workers).set("timeouts", "{client_idle: 1s}")).await;
    let mut raw = Raw::connect(&proxy.url).await;
    raw.send(GET_ECHO).await;
    assert_eq!(raw.answer().await.status, 200);
    assert!(
        raw.closed_within(WAIT).await,
        "the idle connection stayed open"
    );
    let page = proxy.metrics().await;
    assert!(
        metric(
            &page,
            "gpulb_client_connections_closed_total{reason=\"idle\"}"
        ) >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_closed_after_client_header() {
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start(Config::fleet(&workers).set("timeouts", "{client_header: 1s}")).await;
    let mut raw = Raw::connect(&proxy.url).await;
    raw.send("GET /echo HTTP/1.1\r\n").await;
    // One header byte every 100 ms: each read is quick, the header never ends.
    let drip = async {
        for _ in 0..(WAIT.as_millis() / 100) {
            if raw.0.write_all(b"x").await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    let cut = drip.await || raw.closed_within(Duration::from_secs(1)).await;
    assert!(cut, "a header dripping a byte at a time was never cut off");
    let page = proxy.metrics().await;
    assert!(
        metric(
            &page,
            "gpulb_client_connections_closed_total{reason=\"header\"}"
        ) >= 1.0
    );
    assert_eq!(proxy.send(&Req::get("/echo")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_over_max_header_bytes_is_refused() {
    let workers = start_workers(1, |_| {}).await;
    let proxy =
        Proxy::start(Config::fleet(&workers).set("limits", "{max_header_bytes: 2048}")).await;
    let mut raw = Raw::connect(&proxy.url).await;
    let big = format!(
        "GET /echo HTTP/1.1\r\nhost: gpulb\r\nx-big: {}\r\n\r\n",
        "a".repeat(8192)
    );
    let _ = raw.0.write_all(big.as_bytes()).await;
    let answer = raw.answer().await;
    assert_ne!(answer.status, 200, "{}", answer.text);
    let page = proxy.metrics().await;
    assert!(
        metric(
            &page,
            "gpulb_client_connections_closed_total{reason=\"header_too_large\"}"
        ) >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_max_connections_are_refused_and_counted() {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers)
        .set("limits", "{max_connections: 5}")
        .set("timeouts", "{client_header: 60s, client_idle: 60s}");
    let proxy = Proxy::start(config).await;
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut raw = Raw::connect(&proxy.url).await;
        raw.send(GET_ECHO).await;
        assert_eq!(raw.answer().await.status, 200);
        held.push(raw);
    }
    // A flood beyond the cap: each is closed at once, nothing is served.
    for _ in 0..20 {
        let mut raw = Raw::connect(&proxy.url).await;
        let _ = raw.0.write_all(GET_ECHO.as_bytes()).await;
        let answer = raw.answer().await;
        assert_eq!(answer.status, 0, "served over the cap: {}", answer.text);
    }
    let page = proxy.metrics().await;
    assert!(metric(&page, "gpulb_client_connections_refused_total") >= 20.0);
    assert_eq!(metric(&page, "gpulb_client_connections"), 5.0);
    drop(held);
    common::eventually(WAIT, "a connection slot to free", || async {
        let resp = reqwest::get(format!("{}/echo", proxy.url)).await.ok()?;
        (resp.status() == 200).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reload_never_blocks_status_or_metrics_and_is_abandoned() {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers).set("reload", "{watch: false, timeout: 5s}");
    let token = "reload-token";
    let proxy = Proxy::start_with_token(config.clone(), token).await;
    // A deeply nested value: the YAML parser takes far longer than reload.timeout over it.
    let depth = 60_000;
    let deep = format!("{config}\nx: {}{}\n", "[".repeat(depth), "]".repeat(depth));
    proxy.rewrite_config(deep);
    let reload = {
        let (client, url) = (proxy.client.clone(), format!("{}/reload", proxy.admin));
        tokio::spawn(async move { client.post(url).bearer_auth(token).send().await })
    };
    // Generous bounds, far below what the reload takes: these answer from the current snapshot.
    let bound = Duration::from_secs(3);
    for _ in 0..3 {
        let status = tokio::time::timeout(bound, proxy.status()).await;
        assert!(status.is_ok(), "/status waited on the reload");
        let metrics = tokio::time::timeout(bound, proxy.metrics()).await;
        assert!(metrics.is_ok(), "/metrics waited on the reload");
        assert_eq!(proxy.send(&Req::get("/echo")).await.status, 200);
    }
    assert!(!reload.is_finished(), "the reload was not slow after all");
    let answer = tokio::time::timeout(WAIT, reload)
        .await
        .expect("the reload ends at reload.timeout")
        .unwrap()
        .expect("reload answer");
    assert_eq!(answer.status(), 503);
    let outcome: Value = answer.json().await.unwrap();
    assert_eq!(outcome["result"], "abandoned", "{outcome}");
    let status = proxy.status().await;
    assert_eq!(status["reload"]["abandoned_total"], 1, "{status}");
    assert!(status["reload"]["last_error"]
        .as_str()
        .is_some_and(|e| e.contains("reload.timeout")));
    assert_eq!(status["generation"], 1);
    let page = proxy.metrics().await;
    assert_eq!(
        metric(&page, "gpulb_config_reloads_total{result=\"abandoned\"}"),
        1.0
    );
}

/// The JSON body of a raw answer.
fn json_body(answer: &common::RawAnswer) -> Value {
    serde_json::from_str(answer.head_and_body().1)
        .unwrap_or_else(|e| panic!("{e}: {}", answer.text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_header_cannot_strip_what_gpulb_adds() {
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start(Config::fleet(&workers)).await;
    let mut raw = Raw::connect(&proxy.url).await;
    raw.send(
        "GET /echo HTTP/1.1\r\nhost: gpulb\r\nx-request-id: abc123\r\n\
         connection: x-request-id\r\n\r\n",
    )
    .await;
    let answer = raw.answer().await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    let echoed = json_body(&answer);
    let headers = &echoed["headers"];
    assert_eq!(headers["x-request-id"], "abc123", "{echoed}");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1", "{echoed}");
    assert_eq!(headers["x-forwarded-proto"], "http", "{echoed}");
    assert!(headers.get("connection").is_none(), "{echoed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400() {
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start(Config::fleet(&workers)).await;
    let bad_chunk = "transfer-encoding: chunked\r\n\r\nzz\r\nnot a chunk\r\n0\r\n\r\n";
    let cases = [
        // A body gpulb reads before routing, and one that streams to the backend.
        format!("POST /v1/completions HTTP/1.1\r\nhost: gpulb\r\ncontent-type: application/json\r\n{bad_chunk}"),
        format!("POST /echo HTTP/1.1\r\nhost: gpulb\r\n{bad_chunk}"),
        "GET /echo HTTP/1.1\r\n\r\n".to_string(),
        // Content-Length framing that cannot be resolved to one length (RFC 9110 8.6).
        "POST /echo HTTP/1.1\r\nhost: gpulb\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!".to_string(),
        "POST /echo HTTP/1.1\r\nhost: gpulb\r\ncontent-length: 5, 6\r\n\r\nhello!".to_string(),
        "POST /echo HTTP/1.1\r\nhost: gpulb\r\ncontent-length: +5\r\n\r\nhello".to_string(),
    ];
    for request in cases {
        let mut raw = Raw::connect(&proxy.url).await;
        raw.send(&request).await;
        let answer = raw.answer().await;
        assert_eq!(answer.status, 400, "{request:?} got {}", answer.text);
        assert_eq!(json_body(&answer)["error"]["code"], "bad_request");
        if request.contains("content-length") {
            let message = json_body(&answer)["error"]["message"].to_string();
            assert!(message.contains("Content-Length"), "{message}");
        }
    }
    // Identical values on repeated lines are one length, and the body is forwarded.
    let mut raw = Raw::connect(&proxy.url).await;
    let twice = "content-length: 5\r\ncontent-length: 5";
    raw.send(&format!(
        "POST /echo HTTP/1.1\r\nhost: gpulb\r\n{twice}\r\n\r\nhello"
    ))
    .await;
    let answer = raw.answer().await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(json_body(&answer)["body"], "hello", "{}", answer.text);
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_bodies_name_the_backend_never_its_address_or_bytes() {
    let workers = start_workers(1, |_| {}).await;
    workers[0].set_fault(gpulb::tools::sim::Fault::Hang);
    let junk = common::canned_backend(b"SECRET-BACKEND-BYTES \x01\x02\r\n\r\n").await;
    let config = Config::new()
        .backend(common::Backend::of(&workers[0]).unchecked())
        .backend(common::Backend::at("junk", &junk).unchecked())
        .set(
            "pools",
            "[{name: hung, backends: [w0]}, {name: junk, backends: [junk]}]",
        )
        .set(
            "classes",
            "[{name: hung, pool: hung, match: {path_prefix: /v1}}, {name: junk, pool: junk}]",
        )
        .default_class("junk")
        .set("timeouts", "{read: 300ms}");
    let proxy = Proxy::start(config).await;
    for (req, status, name) in [
        (Req::completion(2), 504, "w0"),
        (Req::get("/other"), 502, "junk"),
    ] {
        let answer = proxy.send(&req).await;
        assert_eq!(answer.status, status, "{}", answer.body);
        assert!(answer.body.contains(name), "{}", answer.body);
        for leak in ["127.0.0.1", "SECRET", "Peer"] {
            assert!(!answer.body.contains(leak), "{leak} in {}", answer.body);
        }
    }
}

#[test]
fn polling_intervals_have_a_floor_named_in_the_error() {
    let yaml = "backends:\n  - {name: a, url: 'http://127.0.0.1:9', telemetry: [{kind: model_server, server: vllm, interval: 5ms}]}\nhealth_check: {interval: 1ms}\nmodels: {interval: 10ms}\n";
    let (ok, _, stderr) = common::gpulb_check(yaml);
    assert!(!ok);
    for key in [
        "health_check.interval",
        "backends[0].telemetry[0].interval",
        "models.interval",
    ] {
        assert!(
            stderr.contains(&format!("{key}: must be at least 100ms")),
            "{key}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_choose_the_tenant_and_never_reach_logs_or_labels() {
    let workers = start_workers(1, |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.yaml");
    std::fs::write(&keys, "sk-team-a-secret: team-a\n").unwrap();
    let config = Config::fleet(&workers).set(
        "tenants",
        format!(
            "{{from: api_key, keys_file: {:?}, reject_unknown: true}}",
            keys
        ),
    );
    let proxy = Proxy::start(config).await;
    let anonymous = proxy.send(&Req::completion(2)).await;
    assert_eq!(anonymous.status, 401, "{}", anonymous.body);
    assert_eq!(anonymous.json()["error"]["code"], "invalid_api_key");
    let stranger = Req::completion(2).header("authorization", "Bearer sk-rotated-1");
    assert_eq!(proxy.send(&stranger).await.status, 401);
    // The key decides: a client-chosen tenant header does not.
    let known = Req::completion(2)
        .header("authorization", "Bearer sk-team-a-secret")
        .tenant("someone-else");
    assert_eq!(proxy.send(&known).await.status, 200);
    let log = common::eventually(WAIT, "the access log line", || async {
        let log = proxy.stdout();
        log.contains("\"team-a\"").then_some(log)
    })
    .await;
    let page = proxy.metrics().await;
    for secret in ["sk-team-a-secret", "sk-rotated-1"] {
        assert!(!log.contains(secret), "{secret} in the access log");
        assert!(!page.contains(secret), "{secret} in the metrics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_tenant_header_is_hashed_in_logs_and_labels() {
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start(Config::fleet(&workers).set("tenant_header", "authorization")).await;
    let req = Req::completion(2).header("authorization", "Bearer sk-bearer-secret");
    assert_eq!(proxy.send(&req).await.status, 200);
    let log = common::eventually(WAIT, "the access log line", || async {
        let log = proxy.stdout();
        log.contains("\"key-").then_some(log)
    })
    .await;
    assert!(!log.contains("sk-bearer-secret"), "{log}");
    assert!(!proxy.metrics().await.contains("sk-bearer-secret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_with_streamed_bodies_lose_their_place_when_the_client_leaves() {
    let workers = start_workers(1, |_| {}).await;
    // One slot, a queue that would keep them past the test's wait, and bodies over 1 KiB
    // streamed unread.
    let config = Config::fleet(&workers)
        .each_backend(|b| b.max_outstanding(1))
        .set("request_body", "{max_bytes: 1024}")
        .set(
            "classes",
            "[{name: default, pool: default, queue: {max_wait: 60s}}]",
        );
    let proxy = Proxy::start(config).await;
    let busy = proxy.spawn(Req::sleep(3000));
    proxy.wait_outstanding("w0", 1).await;
    let large = partial_upload(100_000, 70_000);
    let chunked = format!(
        "POST /echo HTTP/1.1\r\nhost: gpulb\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{}\r\n",
        70_000,
        "y".repeat(70_000)
    );
    for (i, request) in [large, chunked].into_iter().enumerate() {
        let mut raw = Raw::connect(&proxy.url).await;
        raw.send(&request).await;
        proxy.wait_queued("default", 1).await;
        drop(raw);
        proxy.wait_queued("default", 0).await;
        assert_eq!(proxy.outstanding("w0").await, 1, "case {i}: took a slot");
    }
    assert_eq!(busy.await.unwrap().status, 200);
    proxy.wait_idle().await;
    assert_eq!(
        workers[0].stats().received_total,
        1,
        "an abandoned request reached the backend"
    );
}

/// Open file descriptors of process `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .expect("/proc/<pid>/fd readable")
}

/// What process `pid`'s descriptors point at, counted by kind (`socket`, `pipe`, a path...),
/// for a failure message.
fn fd_targets(pid: u32) -> String {
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for entry in dir.flatten() {
            let target = std::fs::read_link(entry.path())
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default();
            let kind = target.split(':').next().unwrap_or_default().to_owned();
            *kinds.entry(kind).or_default() += 1;
        }
    }
    format!("{kinds:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abusive_clients_leave_no_descriptor_connection_or_slot_behind() {
    let workers = start_workers(1, |_| {}).await;
    // Idle upstream connections close after a second too: how many the pool holds at the end
    // depends on timing (an answer can reach the client before its connection is back in the
    // pool, so the next request opens another), and is not what this test counts.
    let config = Config::fleet(&workers).set(
        "timeouts",
        "{client_header: 1s, client_idle: 1s, client_body: 1s, upstream_keepalive: 1s}",
    );
    let proxy = Proxy::start(config).await;
    // Warm: the upstream connection pool holds what the served requests below will use.
    assert_eq!(proxy.send(&Req::post("/echo", "warm")).await.status, 200);
    let before = open_fds(proxy.pid());

    let mut abuse = Vec::new();
    for i in 0..30 {
        let mut raw = Raw::connect(&proxy.url).await;
        match i % 3 {
            0 => raw.send("GET /echo HTTP/1.1\r\nhost: gpu").await, // a header that never ends
            1 => raw.send(partial_upload(1000, 10)).await,          // an upload that stalls
            _ => {
                raw.send(GET_ECHO).await; // one request, then silence
                assert_eq!(raw.answer().await.status, 200);
            }
        }
        abuse.push(raw);
    }
    assert_eq!(proxy.send(&Req::post("/echo", "served")).await.status, 200);
    for raw in &mut abuse {
        assert!(
            raw.closed_within(WAIT).await,
            "an abusive connection stayed open"
        );
    }
    drop(abuse);

    proxy.wait_idle().await;
    // Every client connection closes (the test client's kept-alive one too, after client_idle)
    // and the descriptors come back.
    // The descriptors are counted before the metrics request, whose own admin connection the
    // proxy may not have closed yet when the page has arrived.
    common::eventually_or(
        WAIT,
        "the connections and descriptors to come back",
        || async {
            let fds = open_fds(proxy.pid());
            let page = proxy.metrics().await;
            let connections = metric(&page, "gpulb_client_connections");
            if connections == 0.0 && fds <= before {
                return Ok(());
            }
            Err(format!(
                "{connections} client connections, {fds} descriptors open ({before} before): {}",
                fd_targets(proxy.pid())
            ))
        },
    )
    .await;
    assert!(!ejected(&proxy.status().await, "w0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_body_is_read_on_a_while_so_a_client_still_sending_meets_no_reset() {
    let workers = start_workers(1, |_| {}).await;
    let proxy =
        Proxy::start(Config::fleet(&workers).set("request_body", "{max_bytes: 65536}")).await;
    // A chunked completion body over `request_body.max_bytes` is refused (413) with part of it
    // unread.
    let chunk = |n: usize| format!("{n:x}\r\n{}\r\n", "z".repeat(n));
    let mut raw = Raw::connect(&proxy.url).await;
    raw.send(format!(
        "POST /v1/completions HTTP/1.1\r\nhost: gpulb\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\n\r\n{}",
        chunk(80_000)
    ))
    .await;
    let answer = raw.answer().await;
    assert_eq!(answer.status, 413, "{}", answer.text);
    // The client goes on sending, as one that writes its body before reading would: the
    // proxy still reads (and drops) it, so no write meets a reset.
    for i in 0..6 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let sent = raw.0.write_all(chunk(4_000).as_bytes()).await;
        assert!(sent.is_ok(), "write {i} after the answer: {sent:?}");
    }
}

/// A completion body of exactly `len` bytes (a prompt of `x`s).
fn completion_of_len(len: usize) -> String {
    let shell = r#"{"model":"sim-model","max_tokens":1,"prompt":""}"#;
    let prompt = "x".repeat(len - shell.len());
    format!(r#"{{"model":"sim-model","max_tokens":1,"prompt":"{prompt}"}}"#)
}

fn completion_header(len: usize) -> String {
    format!(
        "POST /v1/completions HTTP/1.1\r\nhost: gpulb\r\ncontent-type: application/json\r\n\
         content-length: {len}\r\n\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_the_held_bytes_budget_get_503_before_they_are_read() {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers).set(
        "request_body",
        "{max_bytes: 100000, max_held_bytes: 150000}",
    );
    let proxy = Proxy::start(config).await;
    // A holds 100,000 bytes of the budget while its upload is half sent.
    let first = completion_of_len(100_000);
    let mut a = Raw::connect(&proxy.url).await;
    a.send(completion_header(first.len())).await;
    a.send(&first[..50_000]).await;
    common::eventually(WAIT, "A's body in the budget", || async {
        let held = proxy.metric("gpulb_request_body_held_bytes").await;
        (held == 100_000.0).then_some(())
    })
    .await;
    // B's 60,000 would take the total past 150,000: refused at once, nothing read.
    let second = completion_of_len(60_000);
    let mut b = Raw::connect(&proxy.url).await;
    b.send(completion_header(second.len())).await;
    let refused = b.answer().await;
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert!(
        refused.text.contains("body_memory_full"),
        "{}",
        refused.text
    );
    assert!(
        refused.text.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        refused.text
    );
    // A finishes and is served; its share comes back, and B's body now fits.
    a.send(&first[50_000..]).await;
    assert_eq!(a.answer().await.status, 200);
    common::eventually(WAIT, "A's share given back", || async {
        let held = proxy.metric("gpulb_request_body_held_bytes").await;
        (held == 0.0).then_some(())
    })
    .await;
    let again = proxy.send(&Req::post("/v1/completions", second)).await;
    assert_eq!(again.status, 200, "{}", again.body);
}
