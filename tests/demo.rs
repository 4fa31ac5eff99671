//! `gpulb demo` — the README's first command — serves real traffic through the proxy.

mod common;

use common::{eventually, free_port, Answer, Killed, Req, WAIT};
use std::process::{Command, Stdio};

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
    eventually(WAIT, "the demo fleet to be healthy", || async {
        let status: serde_json::Value = reqwest::get(&status_url).await.ok()?.json().await.ok()?;
        let backends = status["backends"].as_array()?;
        (backends.len() == 4 && backends.iter().all(|b| b["eligible"] == true)).then_some(())
    })
    .await;
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let resp = Answer::read(Req::chat_stream(8).send(&client, &base).await).await;
    assert_eq!(resp.status, 200);
    assert!(resp.header("x-sim-worker").unwrap().starts_with("gpu"));
    assert_eq!(resp.body.matches("data: {").count(), 8);
    assert!(resp.body.ends_with("data: [DONE]\n\n"));
}
