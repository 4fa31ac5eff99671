//! Streaming and transparency: SSE events pass one by one; requests and responses pass intact.

mod common;

use common::{start_fleet, start_workers, Config, Proxy, Raw, Req, WAIT};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_events_arrive_as_the_backend_emits_them() {
    let workers = start_workers(1, |p| p.decode_step = Duration::from_millis(60)).await;
    let proxy = Proxy::start(Config::fleet(&workers)).await;
    let mut resp = proxy.open(&Req::chat_stream(20)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut buffer = String::new();
    let mut lags = Vec::new();
    let mut done = false;
    let started = now_ms();
    while let Some(chunk) = tokio::time::timeout(WAIT, resp.chunk())
        .await
        .unwrap()
        .unwrap()
    {
        let received = now_ms();
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let data = event.trim().strip_prefix("data: ").unwrap();
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let json: serde_json::Value = serde_json::from_str(data).unwrap();
            let emitted = json["sim_emitted_at_ms"].as_u64().unwrap();
            lags.push(received.saturating_sub(emitted));
        }
    }
    let duration = now_ms() - started;
    assert!(done, "stream ended without [DONE]");
    assert_eq!(lags.len(), 20);
    let worst = *lags.iter().max().unwrap();
    assert!(
        duration >= 1000,
        "stream too short to tell buffering apart: {duration} ms"
    );
    assert!(
        worst < duration / 4,
        "an event was held back {worst} ms in a {duration} ms stream: {lags:?}"
    );
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_hop_by_hop_request_fields_are_not_forwarded() {
    let (_workers, proxy) = start_fleet(1).await;
    const HOP_BY_HOP: [(&str, &str); 7] = [
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("proxy-authenticate", "Basic"),
        ("proxy-authorization", "Basic Zm9vOmJhcg=="),
        ("te", "trailers"),
        ("trailer", "x-checksum"),
        ("http2-settings", "AAMAAABkAAQAAP__"),
    ];
    let mut req = Req::get("/echo/hops").header("x-custom", "kept");
    for (name, value) in HOP_BY_HOP {
        req = req.header(name, value);
    }
    let resp = proxy.send(&req).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let seen = resp.json();
    let headers = &seen["headers"];
    assert_eq!(headers["x-custom"], "kept", "{headers}");
    for (name, _) in HOP_BY_HOP {
        assert!(
            headers.get(name).is_none(),
            "{name} was forwarded: {headers}"
        );
    }
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_forwarded_transparently() {
    let (_workers, proxy) = start_fleet(1).await;

    // A chunked request body (no content-length), a query string, a hop-by-hop header.
    let parts: Vec<Result<&'static str, std::io::Error>> = vec![Ok("{\"a\":"), Ok("1}")];
    let resp = proxy
        .client
        .put(format!("{}/echo/some/path?x=1&y=two", proxy.url))
        .header("x-custom", "kept")
        .header("connection", "x-hop-secret")
        .header("x-hop-secret", "dropped")
        .header("x-forwarded-for", "10.1.2.3")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            parts,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let echoed_id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let seen: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(seen["method"], "PUT");
    assert_eq!(seen["path"], "/echo/some/path");
    assert_eq!(seen["query"], "x=1&y=two");
    assert_eq!(seen["body"], "{\"a\":1}");
    let headers = &seen["headers"];
    assert_eq!(headers["x-custom"], "kept");
    assert!(
        headers.get("x-hop-secret").is_none(),
        "hop-by-hop header leaked: {headers}"
    );
    assert_eq!(headers["x-forwarded-for"], "10.1.2.3, 127.0.0.1");
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert_eq!(headers["x-request-id"], echoed_id.as_str());
    assert_eq!(echoed_id.len(), 32);

    // A client's own request id is kept and echoed.
    let resp = proxy
        .send(&Req::get("/echo").header("x-request-id", "client-id-7"))
        .await;
    assert_eq!(resp.header("x-request-id"), Some("client-id-7"));
    let seen = resp.json();
    assert_eq!(seen["headers"]["x-request-id"], "client-id-7");
    assert_eq!(seen["method"], "GET");
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_pass_both_ways() {
    let (_workers, proxy) = start_fleet(1).await;
    let big = "x".repeat(512 * 1024);
    let resp = proxy.send(&Req::post("/echo", big.clone())).await;
    assert_eq!(resp.status, 200);
    let seen = resp.json();
    assert_eq!(seen["body_len"], big.len());
    assert_eq!(seen["body"].as_str().unwrap().len(), big.len());
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_client_gets_its_stream_unchunked_and_ended_by_the_close() {
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start(Config::fleet(&workers)).await;
    let body = r#"{"model":"sim-model","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = |version: &str, connection: &str| {
        format!(
            "POST /v1/chat/completions {version}\r\nHost: x\r\nContent-Type: application/json\r\n\
             Connection: {connection}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    // HTTP/1.1 (the control): chunked coding, as the backend sent it.
    let mut raw = Raw::connect(&proxy.url).await;
    raw.send(request("HTTP/1.1", "close")).await;
    let answer = raw.answer().await;
    let (head, chunked) = answer.head_and_body();
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(!chunked.starts_with("data: "), "{chunked:?}");
    // HTTP/1.0, even asking to keep the connection: no chunked coding (RFC 9112 §6.1); the
    // events as the backend wrote them (five tokens and `[DONE]`), ended by the close the
    // answer announces.
    let mut raw = Raw::connect(&proxy.url).await;
    raw.send(request("HTTP/1.0", "keep-alive")).await;
    let answer = raw.answer().await;
    assert!(raw.closed_within(Duration::from_millis(200)).await);
    let (head, events) = answer.head_and_body();
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    assert!(events.starts_with("data: {"), "{events:?}");
    assert!(events.ends_with("data: [DONE]\n\n"), "{events:?}");
    assert_eq!(events.matches("data: ").count(), 6, "{events:?}");
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_204_reaches_the_client_without_the_length_its_backend_gave_it() {
    // RFC 9110 §8.6: no `Content-Length` (nor `Transfer-Encoding`) on a 204; the backend's
    // stray one is removed, and no body follows the head.
    let url = common::canned_backend(
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\nX-Kept: yes\r\n\r\n",
    )
    .await;
    let proxy =
        Proxy::start(Config::new().backend(common::Backend::at("b0", &url).unchecked())).await;
    let mut raw = Raw::connect(&proxy.url).await;
    raw.send("DELETE /v1/files/f1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let answer = raw.answer().await;
    let (head, body) = answer.head_and_body();
    assert_eq!(answer.status, 204, "{}", answer.text);
    assert!(head.contains("x-kept: yes"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert_eq!(body, "", "{}", answer.text);
    proxy.wait_idle().await;
}
