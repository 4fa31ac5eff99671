//! Backends whose model servers want an API key (`auth` on a backend or its pool): gpulb sends
//! the key in place of the client's on proxied requests and on its own model-list polls, and
//! shows it nowhere.

mod common;

use common::{served_by, start_workers, Backend, Config, Pool, Proxy, Req};

const KEY_ENV: &str = "GPULB_TEST_BACKEND_KEY";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_api_key_replaces_the_clients_and_reaches_model_discovery() {
    // w0 wants sk-w0 (its own auth, from the environment); w1 wants sk-pool (its pool's, from a file).
    let workers = start_workers(2, |p| {
        let key = if p.name == "w0" { "sk-w0" } else { "sk-pool" };
        p.api_key = Some(key.to_string());
        *p = p
            .clone()
            .serving(&[if p.name == "w0" { "llama" } else { "qwen" }]);
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("pool-key");
    std::fs::write(&key_file, "sk-pool\n").unwrap();
    let config = Config::new()
        .set("models", "{interval: 100ms}")
        .backend(Backend::of(&workers[0]).set("auth", format!("{{token_env: {KEY_ENV}}}")))
        .backend(Backend::of(&workers[1]))
        .pool(Pool::new("all", &["w0", "w1"]).set(
            "auth",
            format!("{{token_file: {:?}}}", key_file.display().to_string()),
        ));
    let proxy = Proxy::start_with_env(config, &[(KEY_ENV, "sk-w0")]).await;

    // The model lists are behind the key: discovery knows them only if it sent it.
    proxy.wait_models_known().await;
    let chat = |model: &str| {
        Req::post(
            "/v1/chat/completions",
            format!(r#"{{"model":"{model}","max_tokens":2,"messages":[]}}"#),
        )
        .header("authorization", "Bearer client-key")
    };
    let llama = proxy.send_n(3, &chat("llama")).await;
    assert!(llama.iter().all(|a| a.status == 200), "{llama:?}");
    assert_eq!(served_by(&llama), ["w0"; 3]);
    let qwen = proxy.send_n(3, &chat("qwen")).await;
    assert!(qwen.iter().all(|a| a.status == 200), "{qwen:?}");
    assert_eq!(served_by(&qwen), ["w1"; 3]);

    // What the backend received: its key, once; the client's is gone.
    let echoed = proxy
        .send(&Req::get("/echo").header("authorization", "Bearer client-key"))
        .await;
    let sent = echoed.json()["headers"]["authorization"].clone();
    assert!(sent == "Bearer sk-w0" || sent == "Bearer sk-pool", "{sent}");

    // Nowhere to be read back; `/status` says only that a key is sent.
    let status = proxy.status().await;
    assert_eq!(status["backends"][0]["auth"], true);
    let status = status.to_string();
    assert!(!status.contains("sk-w0") && !status.contains("sk-pool"));
    assert!(!proxy.stderr().contains("sk-"), "{}", proxy.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auth_the_clients_key_goes_through_and_a_missing_key_refuses_the_config() {
    let workers = start_workers(1, |p| p.api_key = Some("sk-right".into())).await;
    let proxy = Proxy::start(Config::fleet(&workers).set("models", "{discover: false}")).await;
    assert_eq!(proxy.status().await["backends"][0]["auth"], false);
    let chat = |key: &str| {
        Req::post("/v1/chat/completions", r#"{"max_tokens":2,"messages":[]}"#)
            .header("authorization", &format!("Bearer {key}"))
    };
    assert_eq!(proxy.send(&chat("sk-right")).await.status, 200);
    let wrong = proxy.send(&chat("sk-wrong")).await;
    assert_eq!(wrong.status, 401, "the server's own answer: {}", wrong.body);

    // A key that cannot be read refuses the config, naming where it was asked for.
    let missing = Config::new()
        .backend(Backend::of(&workers[0]).set("auth", "{token_file: /nonexistent/gpulb-key}"));
    let (ok, _, stderr) = common::gpulb_check(&missing.to_string());
    assert!(!ok);
    assert!(
        stderr.contains("backends[0].auth: token_file: cannot read /nonexistent/gpulb-key"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_gpulb_sends_itself_carries_the_backend_key() {
    let workers = start_workers(1, |p| {
        p.models = vec!["e".into()];
        p.api_key = Some("sk-embed".into());
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "sk-embed").unwrap();
    let auth = format!("{{token_file: {:?}}}", key_file.display().to_string());
    let batching = "{max_batch: 8, max_wait: 200ms, send_when_idle: false}";
    let config = Config::fleet(&workers)
        .set("models", "{discover: false}")
        .each_backend(|b| b.set("auth", &auth))
        .class(common::Class::new("default", "default").set("batching", batching));
    let proxy = Proxy::start(config).await;
    let embed = |input: &str| {
        let body = format!(r#"{{"model":"e","input":"{input}"}}"#);
        Req::post("/v1/embeddings", body)
            .header("content-type", "application/json")
            .header("authorization", "Bearer client-key")
    };
    let (first, second) = (embed("a"), embed("b"));
    let (a, b) = tokio::join!(proxy.send(&first), proxy.send(&second));
    assert_eq!((a.status, b.status), (200, 200), "{} {}", a.body, b.body);
    let stats = workers[0].stats();
    assert_eq!(
        (stats.embedding_calls_total, stats.embedding_items_total),
        (1, 2),
        "one call carried both"
    );
}
