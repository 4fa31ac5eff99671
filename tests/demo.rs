//! `gpulb demo` — the README's first command — serves real traffic through the proxy.

mod common;

use common::{eventually, free_port_pair, Answer, Killed, Req, WAIT};
use std::process::{Command, Stdio};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_routes_a_streamed_chat_completion() {
    let (port, admin) = free_port_pair();
    let _demo = Killed(
        Command::new(env!("CARGO_BIN_EXE_gpulb"))
            .args([
                "demo",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin",
                &format!("127.0.0.1:{admin}"),
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status_url = format!("http://127.0.0.1:{admin}/status");
    eventually(WAIT, "the demo fleet to be healthy", || async {
        let status: serde_json::Value = reqwest::get(&status_url).await.ok()?.json().await.ok()?;
        let backends = status["backends"].as_array()?;
        let ready = |b: &serde_json::Value| b["eligible"] == true && b["models"].is_object();
        (backends.len() == 4 && backends.iter().all(ready)).then_some(())
    })
    .await;
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    // The demo serves two models, each on two GPUs, and an OpenAI name as an alias.
    for (model, gpus) in [
        ("qwen2.5-32b", ["gpu2", "gpu3"]),
        ("gpt-4o-mini", ["gpu0", "gpu1"]),
    ] {
        let body = format!(
            r#"{{"model":"{model}","stream":true,"max_tokens":8,"messages":[{{"role":"user","content":"hi"}}]}}"#
        );
        let chat = Req::post("/v1/chat/completions", body);
        let resp = Answer::read(chat.send(&client, &base).await).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        assert!(
            gpus.contains(&resp.header("x-sim-worker").unwrap()),
            "{model}"
        );
        assert_eq!(resp.body.matches("data: {").count(), 8);
        assert!(resp.body.ends_with("data: [DONE]\n\n"));
    }
}
