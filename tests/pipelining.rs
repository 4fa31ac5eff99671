//! HTTP/1.1 pipelining: a client that sends its next requests before reading the answers gets
//! every answer, in order, on the one connection (RFC 9112 section 9.3.2), whether the next
//! request arrived with the first or while the first was being served.

mod common;

use common::{json_post, message_len, start_workers, Backend, Config, Proxy, Raw, WAIT};
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Reads `n` whole responses (each with a `Content-Length` body) from `conn`, bounded by
/// [`WAIT`]; their texts in order. Fewer come back when the connection closes or time runs out.
async fn answers(conn: &mut Raw, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    let mut texts = Vec::new();
    let _ = tokio::time::timeout(WAIT, async {
        while texts.len() < n {
            while let Some(len) = message_len(&got) {
                texts.push(String::from_utf8_lossy(&got[..len]).into_owned());
                got.drain(..len);
            }
            if texts.len() == n {
                break;
            }
            match conn.0.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(read) => got.extend_from_slice(&buf[..read]),
            }
        }
    })
    .await;
    texts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_all_answered_in_order() {
    let workers = start_workers(2, |_| {}).await;
    let config = Config::new()
        .set("models", "{discover: false}")
        .backend(Backend::of(&workers[0]).set("models", "[m]"))
        .backend(Backend::of(&workers[1]).set("models", "[m]"));
    let proxy = Proxy::start(config).await;

    // Sent in one write: a completion, one whose model gpulb refuses (its body read whole),
    // one gpulb answers itself, a GET proxied to a worker, and a completion again.
    let mut conn = Raw::connect(&proxy.url).await;
    let completion = json_post(
        "/v1/chat/completions",
        r#"{"model":"m","max_tokens":1,"messages":[]}"#,
    );
    let batch = [
        completion.clone(),
        json_post("/v1/chat/completions", r#"{"model":"gpt-5","messages":[]}"#),
        "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        "GET /sleep/1 HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        completion.clone(),
    ];
    conn.send(batch.concat()).await;
    let got = answers(&mut conn, 5).await;
    let statuses: Vec<&str> = got.iter().map(|t| &t[9..12]).collect();
    assert_eq!(statuses, ["200", "404", "200", "200", "200"], "{got:#?}");
    assert!(got[0].contains("chat.completion") && got[4].contains("chat.completion"));
    assert!(got[1].contains("model_not_found"), "{}", got[1]);
    assert!(got[2].contains("\"object\":\"list\""), "{}", got[2]);
    assert!(got[3].contains("\"slept_ms\":1"), "{}", got[3]);

    // The next request sent while the first is still being served (a 300 ms sleep on the
    // worker): answered after it, on the same connection.
    conn.send("GET /sleep/300 HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    conn.send(completion).await;
    let got = answers(&mut conn, 2).await;
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got[0].contains("\"slept_ms\":300"), "{}", got[0]);
    assert!(got[1].contains("chat.completion"), "{}", got[1]);
}
