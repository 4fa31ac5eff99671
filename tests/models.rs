//! Request-aware routing: the body's `model` picks the backends (listed in config or discovered
//! from their `/v1/models`), body-aware class rules, and the body forwarded exactly as sent.

mod common;

use common::{served_by, start_workers, Backend, Class, Config, Pool, Proxy, Req};
use gpulb::tools::sim::SimWorker;
use serde_json::Value;

/// A chat completion for `model`.
fn chat(model: &str) -> Req {
    Req::post(
        "/v1/chat/completions",
        format!(
            r#"{{"messages":[{{"role":"user","content":"hi"}}],"model":"{model}","max_tokens":2}}"#
        ),
    )
}

/// Four workers: w0 and w1 serve `llama`, w2 and w3 serve `qwen` (refusing other models).
async fn two_model_fleet() -> Vec<SimWorker> {
    start_workers(4, |p| {
        let model = if p.name.as_str() < "w2" {
            "llama"
        } else {
            "qwen"
        };
        *p = p.clone().serving(&[model]);
    })
    .await
}

/// Discovery every 100 ms.
fn discovering(workers: &[SimWorker]) -> Config {
    Config::fleet(workers).set("models", "{interval: 100ms}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_models_route_requests_and_unknown_models_get_404() {
    let workers = two_model_fleet().await;
    let proxy = Proxy::start(discovering(&workers)).await;
    let status = proxy.wait_models_known().await;
    assert_eq!(status["backends"][0]["models"]["source"], "discovered");

    let llama = served_by(&proxy.send_n(8, &chat("llama")).await);
    assert!(llama.iter().all(|w| w == "w0" || w == "w1"), "{llama:?}");
    let qwen = served_by(&proxy.send_n(8, &chat("qwen")).await);
    assert!(qwen.iter().all(|w| w == "w2" || w == "w3"), "{qwen:?}");

    // Per-model counts, and the prompt estimate beside what the backends reported.
    let metrics = proxy.metrics().await;
    let value = |series: &str| -> f64 {
        let line = metrics.lines().find(|l| l.starts_with(series));
        line.and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
    };
    assert_eq!(
        value("gpulb_model_requests_total{class=\"default\",model=\"llama\"}"),
        8.0
    );
    assert_eq!(
        value("gpulb_model_requests_total{class=\"default\",model=\"qwen\"}"),
        8.0
    );
    assert_eq!(
        value("gpulb_tokens_total{class=\"default\",kind=\"completion_reported\"}"),
        32.0
    );
    assert!(value("gpulb_tokens_total{class=\"default\",kind=\"prompt_estimated\"}") >= 16.0);
    assert!(value("gpulb_tokens_total{class=\"default\",kind=\"prompt_reported\"}") >= 16.0);

    let missing = proxy.send(&chat("gpt-5")).await;
    assert_eq!(missing.status, 404, "{}", missing.body);
    assert_eq!(missing.worker, "", "answered by gpulb");
    let error = &missing.json()["error"];
    assert_eq!(error["code"], "model_not_found");
    assert_eq!(error["type"], "invalid_request_error");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("served: llama, qwen"));

    // `GET /v1/models` through gpulb: the fleet's union, in OpenAI's shape.
    let list = proxy.send(&Req::get("/v1/models")).await;
    assert_eq!(list.status, 200);
    let page = list.json();
    let ids: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["llama", "qwen"]);
    assert_eq!(page["data"][0]["owned_by"], "gpulb-sim");
    assert_eq!(page["object"], "list");

    // `GET /v1/models/{id}` (the clients' `models.retrieve`): one of them, answered by gpulb
    // whichever backend serves it, or OpenAI's 404.
    let one = proxy.send(&Req::get("/v1/models/qwen")).await;
    assert_eq!((one.status, one.worker.as_str()), (200, ""), "{}", one.body);
    assert_eq!(one.json(), page["data"][1]);
    // The context length the server states comes through (the OpenAI shape has no such
    // field; vLLM adds it, and clients that size prompts read it).
    let direct: Value = reqwest::get(format!("{}/v1/models", workers[2].url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let stated = &direct["data"][0]["max_model_len"];
    assert!(stated.is_u64(), "{direct}");
    assert_eq!(&one.json()["max_model_len"], stated);
    let none = proxy.send(&Req::get("/v1/models/gpt-5")).await;
    assert_eq!(none.status, 404, "{}", none.body);
    assert_eq!(none.json()["error"]["code"], "model_not_found");
    // HEAD: the same header, no body; a HEAD answered 404 leaves the connection in step (one
    // client, so the requests share a kept-alive connection).
    let client = reqwest::Client::new();
    let head = client
        .head(format!("{}/v1/models", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    assert!(
        head.headers().get("x-sim-worker").is_none(),
        "went to a backend"
    );
    assert_eq!(
        head.headers()["content-length"],
        list.body.len().to_string().as_str()
    );
    assert_eq!(head.bytes().await.unwrap().len(), 0);
    let missing = client
        .head(format!("{}/v1/models/gpt-5", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.bytes().await.unwrap().len(), 0);
    let after = client
        .get(format!("{}/v1/models", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 200);
    assert_eq!(after.text().await.unwrap(), list.body);
    // A model server's own endpoint that names a model goes by it too (the sim has no
    // tokenizer and answers 404; which worker answered is what counts).
    let tokenize = Req::post("/tokenize", r#"{"model":"qwen","prompt":"hi"}"#);
    let tokenized = proxy.send_n(4, &tokenize).await;
    let workers_seen: Vec<&str> = tokenized.iter().map(|a| a.worker.as_str()).collect();
    assert!(
        workers_seen.iter().all(|w| *w == "w2" || *w == "w3"),
        "{workers_seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_disappears_from_a_backend_stops_going_there() {
    let workers = two_model_fleet().await;
    let proxy = Proxy::start(discovering(&workers)).await;
    proxy.wait_models_known().await;
    workers[1].set_models(vec!["mistral".into()]);
    proxy
        .wait_status("w1 to list mistral", |s| {
            (s["backends"][1]["models"]["models"][0]["id"] == "mistral").then_some(())
        })
        .await;
    let llama = served_by(&proxy.send_n(6, &chat("llama")).await);
    assert_eq!(llama, vec!["w0"; 6]);
    assert_eq!(served_by(&[proxy.send(&chat("mistral")).await]), ["w1"]);
    workers[0].set_models(Vec::new());
    proxy
        .wait_status("w0 to list nothing", |s| {
            (s["backends"][0]["models"]["models"] == serde_json::json!([])).then_some(())
        })
        .await;
    assert_eq!(proxy.send(&chat("llama")).await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_models_and_aliases_route_without_discovery() {
    // Workers that take any model: only gpulb's config decides.
    let workers = start_workers(2, |_| {}).await;
    let config = Config::new()
        .set("models", "{discover: false, aliases: {gpt-4o-mini: small}}")
        .backend(Backend::of(&workers[0]).set("models", "[small]"))
        .backend(Backend::of(&workers[1]).set("models", "[big, huge]"));
    let proxy = Proxy::start(config).await;
    let status = proxy.status().await;
    assert_eq!(status["backends"][1]["models"]["source"], "config");
    assert_eq!(
        served_by(&proxy.send_n(4, &chat("big")).await),
        vec!["w1"; 4]
    );
    assert_eq!(
        served_by(&proxy.send_n(4, &chat("small")).await),
        vec!["w0"; 4]
    );
    // The alias routes as its model; the body goes on untouched (the sim echoes the name).
    let aliased = proxy.send(&chat("gpt-4o-mini")).await;
    assert_eq!(served_by(std::slice::from_ref(&aliased)), ["w0"]);
    assert_eq!(aliased.json()["model"], "gpt-4o-mini");
    assert_eq!(proxy.send(&chat("medium")).await.status, 404);
    // An alias is retrieved under its own name, with its model's facts.
    let retrieved = proxy.send(&Req::get("/v1/models/gpt-4o-mini")).await;
    assert_eq!(retrieved.status, 200, "{}", retrieved.body);
    assert_eq!(retrieved.json()["id"], "gpt-4o-mini");
    assert_eq!(retrieved.json()["owned_by"], "gpulb");
}

/// A chat completion whose body names no model.
fn chat_without_model() -> Req {
    Req::post(
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_naming_no_model_is_refused_where_the_answer_would_depend_on_the_backend() {
    let workers = two_model_fleet().await;
    let proxy = Proxy::start(discovering(&workers)).await;
    proxy.wait_models_known().await;
    let refused = proxy.send(&chat_without_model()).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "model_required");
    assert!(
        refused.body.contains("serves several: llama, qwen"),
        "{}",
        refused.body
    );
    // A body not read (off request_body.paths) is not looked at, as before.
    let unread = proxy.send(&Req::post("/other", "{}")).await;
    assert_eq!(unread.status, 404, "the sim's own answer: {}", unread.body);

    // With models.default, such a request goes where that model is served, body untouched.
    let config = discovering(&workers).set("models", "{interval: 100ms, default: qwen}");
    let defaulting = Proxy::start(config).await;
    defaulting.wait_models_known().await;
    let defaulted = served_by(&defaulting.send_n(6, &chat_without_model()).await);
    assert!(
        defaulted.iter().all(|w| w == "w2" || w == "w3"),
        "{defaulted:?}"
    );

    // Where every backend serves the same models, any backend answers it, as before.
    let same = start_workers(2, |p| *p = p.clone().serving(&["llama"])).await;
    let one_model = Proxy::start(discovering(&same)).await;
    one_model.wait_models_known().await;
    let answered = one_model.send_n(4, &chat_without_model()).await;
    assert!(answered.iter().all(|r| r.status == 200), "{answered:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_model_keeps_the_connection_for_the_next_request() {
    let workers = two_model_fleet().await;
    let proxy = Proxy::start(discovering(&workers)).await;
    proxy.wait_models_known().await;
    let mut conn = common::Raw::connect(&proxy.url).await;
    let post = |body: &str| common::json_post("/v1/chat/completions", body);
    // A whole body read and its model refused (404), then one with no model (400): the
    // connection carries on to the next request, as a backend's own refusal would leave it.
    conn.send(post(r#"{"model":"gpt-5","messages":[]}"#)).await;
    let missing = conn.answer().await;
    assert_eq!(missing.status, 404, "{}", missing.text);
    assert!(
        !missing
            .text
            .to_ascii_lowercase()
            .contains("connection: close"),
        "{}",
        missing.text
    );
    conn.send(post(r#"{"messages":[],"max_tokens":1}"#)).await;
    let unnamed = conn.answer().await;
    assert_eq!(unnamed.status, 400, "{}", unnamed.text);
    conn.send(post(r#"{"model":"qwen","messages":[],"max_tokens":1}"#))
        .await;
    let served = conn.answer().await;
    assert_eq!(served.status, 200, "{}", served.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classes_are_chosen_from_the_body_alone() {
    let workers = start_workers(2, |_| {}).await;
    let config = Config::fleet(&workers)
        .set("models", "{discover: false}")
        .pool(Pool::new("fast", &["w0"]))
        .pool(Pool::new("batch", &["w1"]))
        .class(
            Class::new("interactive", "fast")
                .matching("stream", true)
                .matching("max_tokens", "{max: 100}"),
        )
        .class(Class::new("bulk", "batch"))
        .default_class("bulk");
    let proxy = Proxy::start(config).await;
    let streamed = proxy.send(&Req::chat_stream(8)).await;
    assert_eq!(served_by(&[streamed]), ["w0"]);
    assert_eq!(served_by(&[proxy.send(&Req::completion(8)).await]), ["w1"]);
    let long_stream = Req::post(
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"max_tokens":500,"messages":[]}"#,
    );
    assert_eq!(served_by(&[proxy.send(&long_stream).await]), ["w1"]);
    // A rule needs the body and this one is not JSON: 400 from gpulb, naming the problem.
    let bad = proxy
        .send(&Req::post("/v1/chat/completions", "{\"model\": oops"))
        .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.json()["error"]["code"], "invalid_body");
    assert!(bad.body.contains("not a JSON object"), "{}", bad.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_forwarded_byte_for_byte_and_limits_hold() {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers)
        .set("request_body", "{paths: [/echo], max_bytes: 300000}")
        .set("models", "{discover: false}");
    let proxy = Proxy::start(config).await;
    // Small, over pingora's 64 KiB retry buffer, and not JSON at all: each arrives as sent.
    let big = format!(
        r#"{{"model":"m","prompt":"{}","n":1}}"#,
        "ab\u{e9}c".repeat(50_000)
    );
    for body in [
        r#"{"model": "m",  "stream":false}"#.to_string(),
        big,
        "not json".into(),
    ] {
        let echoed = proxy.send(&Req::post("/echo", body.clone())).await;
        assert_eq!(echoed.status, 200);
        let json = echoed.json();
        assert_eq!(json["body_len"], body.len());
        assert!(json["body"] == body.as_str(), "body changed on the way");
    }
    // A chunked body.
    let parts: Vec<Result<&'static str, std::io::Error>> =
        vec![Ok("{\"model\":"), Ok("\"m\",\"x\":"), Ok("[1,2]}")];
    let resp = reqwest::Client::new()
        .post(format!("{}/echo", proxy.url))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            parts,
        )))
        .send()
        .await
        .unwrap();
    let json: Value = resp.json().await.unwrap();
    assert_eq!(json["body"], "{\"model\":\"m\",\"x\":[1,2]}");
    assert_eq!(json["headers"]["transfer-encoding"], "chunked");
    // A chunked body longer than pingora's 64 KiB retry buffer arrives whole too; one over
    // `max_bytes` gets 413, saying so.
    // 7,500 bytes each: a letter and an e-acute, 2,500 times.
    let part = |i: usize| format!("{}\u{e9}", char::from(b'a' + (i % 26) as u8)).repeat(2_500);
    let chunked_body = |parts: usize| {
        let chunks: Vec<Result<String, std::io::Error>> = (0..parts).map(|i| Ok(part(i))).collect();
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
    };
    let expected: String = (0..30).map(part).collect();
    let resp = reqwest::Client::new()
        .post(format!("{}/echo", proxy.url))
        .body(chunked_body(30))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let json: Value = resp.json().await.unwrap();
    assert_eq!(json["body_len"], expected.len());
    assert!(json["body"] == expected.as_str(), "chunked body changed");
    assert_eq!(json["headers"]["transfer-encoding"], "chunked");
    let resp = reqwest::Client::new()
        .post(format!("{}/echo", proxy.url))
        .body(chunked_body(60))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let text = resp.text().await.unwrap();
    assert!(text.contains("or more (chunked)"), "{text}");
    // Over the limit: 413 in OpenAI's shape, and nothing reaches the worker.
    let huge = Req::post("/echo", "x".repeat(300_001));
    let refused = proxy.send(&huge).await;
    assert_eq!(refused.status, 413);
    assert_eq!(refused.worker, "");
    assert_eq!(refused.json()["error"]["code"], "body_too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_may_be_forwarded_unread() {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers).set(
        "request_body",
        "{paths: [/echo], max_bytes: 10, over_limit: forward}",
    );
    let proxy = Proxy::start(config).await;
    let body = "y".repeat(100_000);
    let echoed = proxy.send(&Req::post("/echo", body.clone())).await;
    assert_eq!(echoed.status, 200);
    assert_eq!(echoed.json()["body_len"], body.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_is_rewritten_to_its_model_when_asked() {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::new()
        .set("request_body", "{paths: [/echo]}")
        .set(
            "models",
            "{discover: false, aliases: {short: a-much-longer-model-name}, rewrite_aliases: true}",
        )
        .backend(Backend::of(&workers[0]).set("models", "[a-much-longer-model-name]"));
    let proxy = Proxy::start(config).await;
    let sent = r#"{"model": "short", "prompt": "model: short"}"#;
    let echoed = proxy.send(&Req::post("/echo", sent)).await.json();
    let expected = r#"{"model": "a-much-longer-model-name", "prompt": "model: short"}"#;
    assert_eq!(echoed["body"], expected);
    assert_eq!(echoed["body_len"], expected.len());
    assert_eq!(
        echoed["headers"]["content-length"],
        expected.len().to_string()
    );
    // A name that is no alias goes on untouched.
    let plain = r#"{"model":"a-much-longer-model-name"}"#;
    assert_eq!(
        proxy.send(&Req::post("/echo", plain)).await.json()["body"],
        plain
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_job_goes_where_the_kv_cache_has_room_for_it() {
    // w1 holds 2,000 tokens of KV-cache; w0 fifty times that. Both say so in their /metrics.
    let workers = start_workers(2, |p| {
        p.kv_budget_tokens = if p.name == "w1" { 2_000 } else { 100_000 };
    })
    .await;
    let config = Config::telemetry_fleet(&workers).set("models", "{discover: false}");
    let proxy = Proxy::start(config).await;
    proxy
        .wait_status("both KV capacities known", |s| {
            let backends = s["backends"].as_array()?;
            backends
                .iter()
                .all(|b| b["telemetry"]["server"]["kv_capacity_tokens"].is_number())
                .then_some(())
        })
        .await;
    // 10,000 characters of prompt (about 2,500 tokens) does not fit w1's cache.
    let long = Req::post(
        "/v1/completions",
        format!(
            r#"{{"model":"m","prompt":"{}","max_tokens":2}}"#,
            "x".repeat(10_000)
        ),
    );
    assert_eq!(served_by(&proxy.send_n(6, &long).await), vec!["w0"; 6]);
    // Short ones still use both.
    let mut short = served_by(&proxy.send_n(12, &chat("m")).await);
    short.sort();
    short.dedup();
    assert_eq!(short, ["w0", "w1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_reports_its_usage_is_counted_as_reported() {
    // `stream_options.include_usage`: the stream's last chunk before `[DONE]` carries `usage`
    // (vLLM and OpenAI do this, and so does the sim), and gpulb reads it from the stream's tail.
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start(Config::fleet(&workers)).await;
    let body = r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":5,
        "stream":true,"stream_options":{"include_usage":true}}"#;
    let answer = proxy
        .send(&Req::post("/v1/chat/completions", body).header("content-type", "application/json"))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let events: Vec<&str> = answer
        .body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{}", answer.body);
    let usage: Value = serde_json::from_str(events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 5, "{usage}");
    let reported = "gpulb_tokens_total{class=\"default\",kind=\"completion_reported\"}";
    common::eventually(
        common::WAIT,
        "the stream's reported tokens counted",
        || async { (proxy.metric(reported).await == 5.0).then_some(()) },
    )
    .await;
}
