//! The official OpenAI Python client works through gpulb unchanged: it lists the fleet's models,
//! gets a chat completion and a streamed one routed by model, and an unknown model's 404.
//! Needs `python3` with the `openai` package (`.ci/setup test` installs it).

mod common;

use common::{start_workers, Config, Proxy};
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_client_works_through_gpulb() {
    let workers = start_workers(2, |p| {
        let model = if p.name == "w0" { "llama" } else { "qwen" };
        *p = p.clone().serving(&[model]);
    })
    .await;
    let proxy = Proxy::start(Config::fleet(&workers).set("models", "{interval: 100ms}")).await;
    proxy.wait_models_known().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/openai_client.py");
    let url = proxy.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .arg(url)
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "stdout: {stdout}\nstderr: {stderr}"
    );
    // Each request went to the GPU serving its model.
    assert!(workers[1].stats().received_total >= 1);
    assert!(workers[0].stats().received_total >= 1);
}
