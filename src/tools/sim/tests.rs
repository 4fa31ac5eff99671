//! End-to-end tests of the simulated worker over real loopback HTTP.

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use super::{SimWorker, WorkerProfile};

pub(super) async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("test step timed out")
}

/// GETs `url` and reads the answer as JSON, within the step limit.
pub(super) async fn get_json(c: &reqwest::Client, url: String) -> Value {
    within(async { c.get(url).send().await?.json().await })
        .await
        .unwrap()
}

/// POSTs `body` as JSON to `url` and reads the answer as JSON, within the step limit.
pub(super) async fn post_json(c: &reqwest::Client, url: String, body: &Value) -> Value {
    within(async { c.post(url).json(body).send().await?.json().await })
        .await
        .unwrap()
}

pub(super) fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

pub(super) async fn worker(name: &str) -> SimWorker {
    SimWorker::bind_loopback(WorkerProfile::new(name))
        .await
        .unwrap()
}

#[tokio::test]
async fn completion_and_chat_shapes() {
    let w = worker("w1").await;
    let c = client();
    let r = within(
        c.post(format!("{}/v1/completions", w.url()))
            .json(&json!({"model": "m", "prompt": "hello world!", "max_tokens": 3}))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-sim-worker"], "w1");
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: Value = within(r.json()).await.unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "m");
    assert_eq!(v["choices"][0]["text"], " tok0 tok1 tok2");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6})
    );
    assert!(v["id"].is_string() && v["created"].is_u64());

    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let v = post_json(&c, format!("{}/v1/chat/completions", w.url()), &body).await;
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["completion_tokens"], 16);
    let s = w.stats();
    assert_eq!(
        (s.received_total, s.served_total, s.running, s.waiting),
        (2, 2, 0, 0)
    );

    let v = get_json(&c, format!("{}/v1/models", w.url())).await;
    assert_eq!(v["data"][0]["id"], "sim-model");
    assert_eq!(v["data"][0]["owned_by"], "gpulb-sim");
}

#[tokio::test]
async fn sse_stream_is_incremental_and_ends_with_done() {
    let mut p = WorkerProfile::new("s");
    p.decode_step = Duration::from_millis(40);
    let w = SimWorker::bind_loopback(p).await.unwrap();
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true});
    let r = within(
        client()
            .post(format!("{}/v1/chat/completions", w.url()))
            .json(&body)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert_eq!(r.headers()["cache-control"], "no-cache");
    let mut stream = r.bytes_stream();
    let mut text = String::new();
    let mut arrivals = Vec::new();
    while let Some(chunk) = within(stream.next()).await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        arrivals.push(Instant::now());
    }
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 5);
    let mut stamps = Vec::new();
    for (i, e) in events[..4].iter().enumerate() {
        let v: Value = serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        assert_eq!(v["choices"][0]["delta"]["content"], format!(" tok{i}"));
        stamps.push(v["sim_emitted_at_ms"].as_u64().unwrap());
    }
    // Tokens are 40ms apart at the source and were not buffered on the way.
    assert!(stamps[3] - stamps[0] >= 100, "{stamps:?}");
    assert!(arrivals.len() >= 4);
    assert!(arrivals[arrivals.len() - 1] - arrivals[0] >= Duration::from_millis(100));
    assert_eq!(w.stats().served_total, 1);
}

#[tokio::test]
async fn metrics_use_vllm_names() {
    let w = worker("gpu-a").await;
    let r = within(client().get(format!("{}/metrics", w.url())).send())
        .await
        .unwrap();
    assert_eq!(r.headers()["x-sim-worker"], "gpu-a");
    let text = within(r.text()).await.unwrap();
    for name in [
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
    ] {
        assert!(
            text.contains(&format!("# TYPE vllm:{name} gauge")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "vllm:{name}{{engine=\"0\",model_name=\"gpu-a\"}} 0.0\n"
            )),
            "{text}"
        );
    }
    assert!(text.contains("vllm:prompt_tokens_total{"));
    assert!(text.contains("vllm:generation_tokens_total{"));
    assert_eq!(w.stats().control_total, 1);
    assert_eq!(w.stats().received_total, 0);
}

#[tokio::test]
async fn echo_reflects_request() {
    let w = worker("e").await;
    let c = client();
    let r = c
        .put(format!("{}/echo/a/b?x=1&y=2", w.url()))
        .header("x-foo", "one")
        .header("X-Custom", "v")
        .header("x-foo", "two");
    let r = within(r.body("hello body").send()).await.unwrap();
    let v: Value = within(r.json()).await.unwrap();
    assert_eq!(v["worker"], "e");
    assert_eq!(v["method"], "PUT");
    assert_eq!(v["path"], "/echo/a/b");
    assert_eq!(v["query"], "x=1&y=2");
    assert_eq!(v["headers"]["x-foo"], "one, two");
    assert_eq!(v["headers"]["x-custom"], "v");
    assert_eq!(v["body"], "hello body");
    assert_eq!(v["body_len"], 10);

    // Chunked request body, no query.
    let parts: Vec<Result<&'static str, std::io::Error>> = vec![Ok("ab"), Ok("cd")];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(parts));
    let r = within(c.post(format!("{}/echo", w.url())).body(body).send())
        .await
        .unwrap();
    let v: Value = within(r.json()).await.unwrap();
    assert_eq!(v["headers"]["transfer-encoding"], "chunked");
    assert_eq!(
        (v["body"].as_str(), v["query"].is_null()),
        (Some("abcd"), true)
    );
}

#[tokio::test]
async fn errors_have_openai_shape() {
    let w = worker("x").await;
    let c = client();
    let url = format!("{}/v1/completions", w.url());
    let r = within(c.post(&url).body("{not json").send()).await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = within(r.json()).await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let huge = "x".repeat(200_000);
    let r = within(c.post(&url).json(&json!({"prompt": huge})).send())
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        400,
        "prompt exceeding the KV budget is rejected"
    );
    let r = within(
        c.post(&url)
            .body(vec![b' '; super::http::MAX_BODY + 1])
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 413);
    let r = within(c.get(format!("{}/nope", w.url())).send())
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["x-sim-worker"], "x");
    let v = get_json(&c, format!("{}/sleep/20", w.url())).await;
    assert_eq!(v, json!({"worker": "x", "slept_ms": 20}));
}

#[tokio::test]
async fn chat_and_completion_share_the_prefix_cache() {
    let w = worker("p").await;
    let c = client();
    // 300 characters: 75 tokens, of which 4 full blocks (64 tokens) can be cached.
    let prompt: String = (0..300)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let body = json!({"prompt": prompt, "max_tokens": 1});
    let v = post_json(&c, format!("{}/v1/completions", w.url()), &body).await;
    assert_eq!(v["usage"]["prompt_tokens"], 75);
    // The same text split over two messages is the same prompt.
    let (head, tail) = prompt.split_at(100);
    let body = json!({"max_tokens": 1, "messages": [
        {"role": "system", "content": head}, {"role": "user", "content": tail}]});
    let v = post_json(&c, format!("{}/v1/chat/completions", w.url()), &body).await;
    assert_eq!(v["usage"]["prompt_tokens"], 75);
    let s = w.stats();
    assert_eq!(
        (s.prefix_cache_queries_total, s.prefix_cache_hits_total),
        (150, 64)
    );
    let r = within(c.get(format!("{}/metrics", w.url())).send())
        .await
        .unwrap();
    let text = within(r.text()).await.unwrap();
    assert!(text.contains("vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"p\"} 150.0\n"));
    assert!(text.contains("vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"p\"} 64.0\n"));
}
