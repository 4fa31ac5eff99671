//! `gpulb demo` — the README's first command — serves real traffic through the proxy.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_routes_a_streamed_chat_completion() {
    let (port, admin) = (free_port(), free_port());
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
    eventually(
        Duration::from_secs(15),
        "the demo fleet to be healthy",
        || async {
            let status: serde_json::Value =
                reqwest::get(&status_url).await.ok()?.json().await.ok()?;
            let backends = status["backends"].as_array()?;
            (backends.len() == 4 && backends.iter().all(|b| b["eligible"] == true)).then_some(())
        },
    )
    .await;
    let body = r#"{"model":"sim","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["x-sim-worker"]
        .to_str()
        .unwrap()
        .starts_with("gpu"));
    let text = resp.text().await.unwrap();
    assert_eq!(text.matches("data: {").count(), 8);
    assert!(text.ends_with("data: [DONE]\n\n"));
}
