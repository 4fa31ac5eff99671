//! End-to-end tests of served models (`/v1/models`, 404 for unknown models, run-time changes) over real loopback HTTP.

use serde_json::{json, Value};

use super::tests::{client, get_json, within};
use super::{SimWorker, WorkerProfile};

async fn serving(models: &[&str]) -> SimWorker {
    SimWorker::bind_loopback(WorkerProfile::new("m").serving(models))
        .await
        .unwrap()
}

/// POSTs a body to a generation endpoint; returns the status and the JSON answer.
async fn post(w: &SimWorker, path: &str, body: Value) -> (u16, Value) {
    let r = within(
        client()
            .post(format!("{}{path}", w.url()))
            .json(&body)
            .send(),
    )
    .await
    .unwrap();
    (r.status().as_u16(), within(r.json()).await.unwrap())
}

/// A one-token completion naming `model` (or none); returns the status and the `model` answered.
async fn completion_model(w: &SimWorker, model: Option<&str>) -> (u16, String) {
    let body = json!({"model": model, "prompt": "hi", "max_tokens": 1});
    let (status, v) = post(w, "/v1/completions", body).await;
    (status, v["model"].as_str().unwrap_or_default().to_string())
}

fn ids(list: &Value) -> Vec<&str> {
    let data = list["data"].as_array().unwrap();
    data.iter().map(|m| m["id"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn models_are_listed_in_vllm_shape() {
    let w = serving(&["llama", "qwen"]).await;
    let v = get_json(&client(), format!("{}/v1/models", w.url())).await;
    assert_eq!(v["object"], "list");
    assert_eq!(ids(&v), ["llama", "qwen"]);
    let created = v["data"][0]["created"].as_u64().unwrap();
    assert!(created > 0);
    assert_eq!(
        v["data"][1],
        json!({"id": "qwen", "object": "model", "created": created, "owned_by": "gpulb-sim",
               "root": "qwen", "parent": null, "max_model_len": 32768})
    );
}

#[tokio::test]
async fn unknown_model_is_404_in_vllm_shape() {
    let w = serving(&["llama"]).await;
    let chat = json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]});
    for (path, body) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", json!({"model": "gpt-x", "prompt": "hi"})),
    ] {
        let (status, v) = post(&w, path, body).await;
        assert_eq!(status, 404, "{path}");
        assert_eq!(
            v,
            json!({"error": {"message": "The model `gpt-x` does not exist.",
                             "type": "NotFoundError", "param": null, "code": 404}})
        );
    }
}

#[tokio::test]
async fn request_without_model_gets_the_first_and_named_model_is_echoed() {
    let w = serving(&["llama", "qwen"]).await;
    assert_eq!(completion_model(&w, None).await, (200, "llama".into()));
    assert_eq!(
        completion_model(&w, Some("qwen")).await,
        (200, "qwen".into())
    );
}

#[tokio::test]
async fn set_models_takes_effect_at_once() {
    let w = serving(&["llama", "qwen"]).await;
    w.set_models(vec!["qwen".to_string()]);
    assert_eq!(w.models(), ["qwen"]);
    let v = get_json(&client(), format!("{}/v1/models", w.url())).await;
    assert_eq!(ids(&v), ["qwen"]);
    assert_eq!(completion_model(&w, Some("llama")).await.0, 404);
    assert_eq!(completion_model(&w, None).await, (200, "qwen".into()));
}

#[tokio::test]
async fn default_profile_serves_any_named_model() {
    let w = SimWorker::bind_loopback(WorkerProfile::new("d"))
        .await
        .unwrap();
    let v = get_json(&client(), format!("{}/v1/models", w.url())).await;
    assert_eq!(ids(&v), ["sim-model"]);
    assert_eq!(completion_model(&w, Some("sim")).await, (200, "sim".into()));
}
