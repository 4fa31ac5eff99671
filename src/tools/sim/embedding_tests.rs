//! End-to-end tests of the simulated embedding endpoint over real loopback HTTP.

use serde_json::{json, Value};
use std::time::Duration;

use super::tests::{client, within};
use super::{EmbeddingProfile, SimWorker, WorkerProfile, REJECT_MARKER};

async fn embedder(max_batch: usize) -> SimWorker {
    let mut profile = WorkerProfile::new("e0");
    profile.embedding = EmbeddingProfile {
        call_cost: Duration::from_millis(1),
        item_cost: Duration::ZERO,
        max_batch,
        ..EmbeddingProfile::default()
    };
    SimWorker::bind_loopback(profile).await.unwrap()
}

/// POSTs `body` to the worker's `/v1/embeddings`: the status and the JSON answer.
async fn embed(w: &SimWorker, body: Value) -> (u16, Value) {
    within(async {
        let r = client()
            .post(format!("{}/v1/embeddings", w.url()))
            .json(&body)
            .send()
            .await?;
        let status = r.status().as_u16();
        Ok::<_, reqwest::Error>((status, r.json().await?))
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn answers_in_openai_shape_with_deterministic_vectors() {
    let w = embedder(8).await;
    let (status, one) = embed(&w, json!({"model": "m", "input": "twelve chars"})).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(
        (one["object"].as_str(), one["model"].as_str()),
        (Some("list"), Some("m"))
    );
    assert_eq!(one["data"][0]["object"], "embedding");
    assert_eq!(one["data"][0]["embedding"].as_array().unwrap().len(), 16);
    assert_eq!(one["usage"], json!({"prompt_tokens": 3, "total_tokens": 3}));
    let (_, many) = embed(
        &w,
        json!({"model": "m", "input": ["x", "twelve chars", [1, 2, 3, 4, 5]]}),
    )
    .await;
    let data = many["data"].as_array().unwrap();
    let indexes: Vec<_> = data.iter().map(|d| d["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, [0, 1, 2]);
    assert_eq!(
        data[1]["embedding"], one["data"][0]["embedding"],
        "a text's vector does not depend on its place in the call"
    );
    assert_eq!(many["usage"]["prompt_tokens"], 1 + 3 + 5);
    let (_, short) = embed(
        &w,
        json!({"input": "x", "dimensions": 4, "encoding_format": "base64"}),
    )
    .await;
    let encoded = short["data"][0]["embedding"].as_str().unwrap();
    assert_eq!(
        encoded.len(),
        24,
        "4 f32s are 16 bytes, 24 base64 characters"
    );
    let stats = w.stats();
    assert_eq!(
        (stats.embedding_calls_total, stats.embedding_items_total),
        (3, 5)
    );
}

#[tokio::test]
async fn a_call_over_the_cap_or_with_a_rejected_item_is_refused_whole() {
    let w = embedder(2).await;
    let (status, over) = embed(&w, json!({"input": ["a", "b", "c"]})).await;
    assert_eq!(status, 400);
    assert!(
        over["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 2"),
        "{over}"
    );
    let poisoned = format!("bad {REJECT_MARKER} item");
    let (status, bad) = embed(&w, json!({"input": ["fine", poisoned]})).await;
    assert_eq!(status, 400);
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("input[1]"),
        "{bad}"
    );
    for wrong in [
        json!({}),
        json!({"input": []}),
        json!({"input": "x", "dimensions": 99}),
    ] {
        assert_eq!(embed(&w, wrong).await.0, 400);
    }
    assert_eq!(w.stats().embedding_calls_total, 0);
}
