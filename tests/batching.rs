//! Dynamic batching of `/v1/embeddings` through the real proxy, in front of simulated embedding
//! workers: what each client gets back, what is merged and what never is, `max_wait`, a bad
//! item, a client that leaves, and reloads with batches in flight.

mod common;

use common::{metric, start_workers, Class, Config, Proxy, Req};
use gpulb::tools::sim::{EmbeddingProfile, SimWorker, REJECT_MARKER};
use serde_json::{json, Value};
use std::time::Duration;

/// Embedding workers serving models `e` and `f` that answer fast: 2 ms a call, nothing per
/// item, 4 calls at once.
async fn embedders(n: usize) -> Vec<SimWorker> {
    start_workers(n, |p| {
        p.models = vec!["e".into(), "f".into()];
        p.embedding = EmbeddingProfile {
            call_cost: Duration::from_millis(2),
            item_cost: Duration::ZERO,
            max_batch: 64,
            concurrency: 4,
            dimensions: 16,
        }
    })
    .await
}

/// One class, `default`, batching with `batching` (YAML), over `workers`; unless `batching`
/// says otherwise, every batch waits its `max_wait` even with a backend idle (what most tests
/// here look at is how batches form).
fn batching(workers: &[SimWorker], batching: &str) -> Config {
    let batching = match batching.contains("send_when_idle") {
        true => batching.to_string(),
        false => batching.replacen('}', ", send_when_idle: false}", 1),
    };
    Config::fleet(workers).class(Class::new("default", "default").set("batching", batching))
}

/// One worker taking 400 ms a call behind a proxy that gives it one slot, its class batching
/// with `batching` (YAML, as written).
async fn one_slow_slot(batching: &str) -> (Vec<SimWorker>, Proxy) {
    let workers = start_workers(1, |p| {
        p.models = vec!["e".into()];
        p.embedding.call_cost = Duration::from_millis(400);
    })
    .await;
    let config = Config::fleet(&workers)
        .each_backend(|b| b.max_outstanding(1))
        .class(Class::new("default", "default").set("batching", batching));
    let proxy = Proxy::start(config).await;
    (workers, proxy)
}

/// `POST /v1/embeddings` with `body`.
fn embed(body: Value) -> Req {
    Req::post("/v1/embeddings", body.to_string()).header("content-type", "application/json")
}

/// Upstream calls answered 200, and the items they embedded, over `workers`.
fn calls_and_items(workers: &[SimWorker]) -> (u64, u64) {
    workers.iter().fold((0, 0), |(c, i), w| {
        let s = w.stats();
        (c + s.embedding_calls_total, i + s.embedding_items_total)
    })
}

/// The embedding a worker answers for `input` asked alone (vectors are deterministic).
async fn alone(worker: &SimWorker, input: &str) -> Value {
    let v: Value = reqwest::Client::new()
        .post(format!("{}/v1/embeddings", worker.url()))
        .json(&json!({"model": "e", "input": input}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["data"][0]["embedding"].clone()
}

#[tokio::test]
async fn each_client_gets_its_own_items_renumbered_and_its_share_of_usage() {
    let workers = embedders(1).await;
    // Full at 6 items: the batch goes as soon as all three requests are in.
    let proxy = Proxy::start(batching(&workers, "{max_batch: 6, max_wait: 5s}")).await;
    let long = "x".repeat(40);
    let requests = [
        embed(json!({"model": "e", "input": "one"})),
        embed(json!({"model": "e", "input": ["two", long, "three"], "user": "u2"})),
        embed(json!({"model": "e", "input": ["four", "five!"]})),
    ];
    let answers = futures_util::future::join_all(requests.iter().map(|r| proxy.send(r))).await;
    assert_eq!(
        calls_and_items(&workers),
        (1, 6),
        "one upstream call for all"
    );
    let reference = embedders(1).await;
    let inputs: [Vec<&str>; 3] = [
        vec!["one"],
        vec!["two", &long, "three"],
        vec!["four", "five!"],
    ];
    let mut usage = 0;
    for (answer, inputs) in answers.iter().zip(&inputs) {
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.worker, "w0");
        let body = answer.json();
        assert_eq!(
            (body["object"].as_str(), body["model"].as_str()),
            (Some("list"), Some("e"))
        );
        let data = body["data"].as_array().unwrap();
        assert_eq!(data.len(), inputs.len());
        for (i, (item, input)) in data.iter().zip(inputs).enumerate() {
            assert_eq!(item["index"], i, "{body}");
            assert_eq!(
                item["embedding"],
                alone(&reference[0], input).await,
                "input {input:?}"
            );
        }
        let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(body["usage"]["total_tokens"], prompt);
        usage += prompt;
    }
    // The sim counts ceil(chars / 4) per item: 1 + (1 + 10 + 2) + (1 + 2).
    assert_eq!(usage, 17, "the shares add up to the backend's usage");
    let long_share = answers[1].json()["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        long_share >= 12,
        "shares follow each request's tokens: {long_share}"
    );
    let page = proxy.metrics().await;
    assert_eq!(
        metric(&page, r#"gpulb_batch_size_sum{class="default"}"#),
        6.0
    );
    assert_eq!(
        metric(
            &page,
            r#"gpulb_batching_requests_total{class="default",mode="batched"}"#
        ),
        3.0
    );
}

#[tokio::test]
async fn incompatible_requests_are_never_merged() {
    let workers = embedders(2).await;
    let proxy = Proxy::start(batching(&workers, "{max_batch: 64, max_wait: 400ms}")).await;
    let requests = [
        embed(json!({"model": "e", "input": "a"})),
        embed(json!({"model": "e", "input": ["b", "c"], "user": "someone"})), // joins the first
        embed(json!({"model": "f", "input": "d"})),
        embed(json!({"model": "e", "input": "e", "dimensions": 4})),
        embed(json!({"model": "e", "input": "f", "encoding_format": "base64"})),
        embed(json!({"model": "e", "input": [[1, 2, 3], [4]]})),
        embed(json!({"model": "e", "input": "g"})).header("authorization", "Bearer other"),
    ];
    let answers = futures_util::future::join_all(requests.iter().map(|r| proxy.send(r))).await;
    for (answer, items) in answers.iter().zip([1, 2, 1, 1, 1, 2, 1]) {
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.json()["data"].as_array().unwrap().len(), items);
    }
    assert_eq!(
        answers[3].json()["data"][0]["embedding"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    assert!(answers[4].json()["data"][0]["embedding"].is_string());
    assert_eq!(answers[2].json()["model"], "f");
    assert_eq!(
        calls_and_items(&workers),
        (6, 9),
        "only the first two shared a call"
    );
    // A request that is not an embedding goes alone, counted as unbatched.
    let completion = json!({"model": "e", "prompt": "hi", "max_tokens": 1});
    let completion = Req::post("/v1/completions", completion.to_string())
        .header("content-type", "application/json");
    assert_eq!(proxy.send(&completion).await.status, 200);
    let page = proxy.metrics().await;
    assert_eq!(
        metric(&page, r#"gpulb_batch_size_count{class="default"}"#),
        6.0
    );
    assert_eq!(
        metric(
            &page,
            r#"gpulb_batching_requests_total{class="default",mode="unbatched"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn a_lone_request_waits_for_company_at_most_max_wait() {
    let workers = embedders(1).await;
    let proxy = Proxy::start(batching(&workers, "{max_batch: 32, max_wait: 100ms}")).await;
    for i in 0..5 {
        let answer = proxy
            .send(&embed(json!({"model": "e", "input": format!("lone {i}")})))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    assert_eq!(calls_and_items(&workers), (5, 5));
    let page = proxy.metrics().await;
    let delays = |le: &str| {
        let series =
            format!(r#"gpulb_batch_assembly_delay_seconds_bucket{{class="default",le="{le}"}}"#);
        metric(&page, &series)
    };
    assert_eq!(delays("+Inf"), 5.0);
    // Each batch was closed by its max_wait alarm: not before half of it, not long after it.
    // (How close to max_wait a wake-up comes depends on the machine's scheduling, which a
    // busy test machine delays: that is measured by `bench_batching`, not asserted here.)
    assert_eq!(delays("0.05"), 0.0, "each waited for company first");
    assert_eq!(delays("0.25"), 5.0, "every batch closed about at max_wait");
    // Each timer fired, set early: its wake-up's lateness past that time is counted.
    let woke = r#"gpulb_batch_timer_lateness_seconds_count{class="default"}"#;
    assert_eq!(metric(&page, woke), 5.0, "{page}");
}

#[tokio::test]
async fn with_a_backend_slot_free_a_request_goes_alone_at_once() {
    let workers = embedders(1).await;
    let config = "{max_batch: 32, max_wait: 5s, send_when_idle: true}";
    let proxy = Proxy::start(batching(&workers, config)).await;
    let started = std::time::Instant::now();
    for i in 0..3 {
        let answer = proxy
            .send(&embed(json!({"model": "e", "input": format!("lone {i}")})))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a lone request waited out the 5 s max_wait"
    );
    assert_eq!(calls_and_items(&workers), (3, 3));
    let page = proxy.metrics().await;
    let requests = |mode: &str| {
        metric(
            &page,
            &format!(r#"gpulb_batching_requests_total{{class="default",mode="{mode}"}}"#),
        )
    };
    assert_eq!(requests("unbatched"), 3.0, "each went alone: {page}");
    assert_eq!(requests("batched"), 0.0);
}

#[tokio::test]
async fn with_the_backends_busy_a_batch_goes_when_the_first_slot_frees() {
    // send_when_idle: a batch that opens with every slot taken asks for one at once and is
    // sent, with whoever joined meanwhile, as soon as a slot frees, not at its max_wait (10 s).
    let (workers, proxy) =
        one_slow_slot("{max_batch: 32, max_wait: 10s, send_when_idle: true}").await;
    let started = std::time::Instant::now();
    let busy = proxy.spawn(embed(json!({"model": "e", "input": "takes the only slot"})));
    proxy.wait_outstanding("w0", 1).await;
    let opens = proxy.spawn(embed(json!({"model": "e", "input": "opens a batch"})));
    proxy.wait_queued("default", 1).await;
    let joins = proxy.spawn(embed(json!({"model": "e", "input": "joins it"})));
    common::eventually(common::WAIT, "two requests in the open batch", || async {
        let status = proxy.status().await;
        (status["classes"][0]["batching"]["waiting"] == 2).then_some(())
    })
    .await;
    for answer in [busy, opens, joins] {
        let answer = answer.await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the batch waited for its max_wait: {:?}",
        started.elapsed()
    );
    assert_eq!(
        calls_and_items(&workers),
        (2, 3),
        "two calls: 1 item, then 2"
    );
}

#[tokio::test]
async fn a_batch_waiting_for_a_backend_slot_keeps_taking_members() {
    let (workers, proxy) =
        one_slow_slot("{max_batch: 32, max_wait: 20ms, send_when_idle: false}").await;
    let busy = proxy.spawn(embed(json!({"model": "e", "input": "takes the only slot"})));
    proxy.wait_outstanding("w0", 1).await;
    // The next batch's max_wait runs out while the slot is taken: it waits in the queue...
    let waiting = proxy.spawn(embed(
        json!({"model": "e", "input": "opens the next batch"}),
    ));
    proxy.wait_queued("default", 1).await;
    // ...and whoever comes meanwhile joins it instead of queueing behind it.
    let late = [
        proxy.spawn(embed(json!({"model": "e", "input": "late one"}))),
        proxy.spawn(embed(json!({"model": "e", "input": ["late", "two"]}))),
    ];
    common::eventually(
        common::WAIT,
        "the late requests in the waiting batch",
        || async {
            let status = proxy.status().await;
            (status["classes"][0]["batching"]["waiting"] == 3).then_some(())
        },
    )
    .await;
    for answer in [busy, waiting].into_iter().chain(late) {
        let answer = answer.await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    assert_eq!(
        calls_and_items(&workers),
        (2, 5),
        "two calls: 1 item, then 4"
    );
}

#[tokio::test]
async fn one_bad_item_does_not_fail_the_other_clients() {
    let workers = embedders(1).await;
    let proxy = Proxy::start(batching(&workers, "{max_batch: 4, max_wait: 5s}")).await;
    let requests = [
        embed(json!({"model": "e", "input": "fine"})),
        embed(json!({"model": "e", "input": format!("poisoned {REJECT_MARKER}")})),
        embed(json!({"model": "e", "input": ["also", "fine"]})),
    ];
    let answers = futures_util::future::join_all(requests.iter().map(|r| proxy.send(r))).await;
    assert_eq!(answers[0].status, 200, "{}", answers[0].body);
    assert_eq!(answers[2].status, 200, "{}", answers[2].body);
    assert_eq!(answers[2].json()["data"].as_array().unwrap().len(), 2);
    assert_eq!(answers[1].status, 400);
    let message = answers[1].json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("input[0] is rejected"),
        "the backend's own error: {message}"
    );
    // The batch's call was refused; each good request then went alone.
    assert_eq!(calls_and_items(&workers), (2, 3));
}

#[tokio::test]
async fn a_client_gone_while_its_batch_forms_is_left_out() {
    let workers = embedders(1).await;
    let proxy = Proxy::start(batching(&workers, "{max_batch: 32, max_wait: 2s}")).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gone = embed(json!({"model": "e", "input": ["left", "early"]}))
        .request(&impatient, &proxy.url)
        .send()
        .await;
    assert!(gone.is_err(), "the client gave up before the batch went");
    let answer = proxy
        .send(&embed(json!({"model": "e", "input": "stayed"})))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["data"].as_array().unwrap().len(), 1);
    assert_eq!(
        calls_and_items(&workers),
        (1, 1),
        "the batch carried only the one left"
    );
}

#[tokio::test]
async fn a_reload_changing_batching_leaves_batches_in_flight_their_settings() {
    let workers = embedders(1).await;
    let config = |b: &str| batching(&workers, b);
    let proxy = Proxy::start(config("{max_batch: 32, max_wait: 3s}")).await;
    let first = proxy.spawn(embed(json!({"model": "e", "input": "first"})));
    let second = proxy.spawn(embed(json!({"model": "e", "input": ["second", "too"]})));
    // Both are in the open batch when the new settings arrive.
    common::eventually(common::WAIT, "two requests waiting in a batch", || async {
        let classes = proxy.status().await["classes"].clone();
        (classes[0]["batching"]["waiting"] == 2).then_some(())
    })
    .await;
    let generation = proxy.generation().await;
    proxy.rewrite_config(config("{max_batch: 1, max_wait: 1ms}"));
    proxy.wait_generation(generation + 1).await;
    let third = proxy
        .send(&embed(json!({"model": "e", "input": "third"})))
        .await;
    assert_eq!(third.status, 200, "{}", third.body);
    assert!(!first.is_finished(), "the old batch keeps its max_wait");
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!((first.status, second.status), (200, 200));
    assert_eq!(second.json()["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        calls_and_items(&workers),
        (2, 4),
        "the old batch of 3 items, the new of 1"
    );
    // Batching turned off: requests go alone.
    proxy.rewrite_config(Config::fleet(&workers));
    proxy.wait_generation(generation + 2).await;
    let plain = proxy
        .send(&embed(json!({"model": "e", "input": ["x", "y"]})))
        .await;
    assert_eq!(plain.status, 200, "{}", plain.body);
    assert_eq!(calls_and_items(&workers), (3, 6));
}
