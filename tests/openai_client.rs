//! The official OpenAI Python client works through gpulb unchanged: it lists the fleet's models,
//! gets a chat completion and a streamed one routed by model, and an unknown model's 404; and
//! it holds a Responses API conversation whose turns each reach the backend storing the last.
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
    run_script("openai_client.py", &proxy).await;
    // Each request went to the GPU serving its model.
    assert!(workers[1].stats().received_total >= 1);
    assert!(workers[0].stats().received_total >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_client_holds_a_responses_conversation_through_gpulb() {
    let workers = start_workers(3, |_| {}).await;
    let proxy = Proxy::start(Config::fleet(&workers)).await;
    run_script("openai_responses.py", &proxy).await;
    // One worker stored the conversation and answered every turn of it.
    let served: Vec<u64> = workers.iter().map(|w| w.stats().received_total).collect();
    assert_eq!(served.iter().filter(|&&n| n >= 8).count(), 1, "{served:?}");
}

/// Runs `tests/data/<script>` against `proxy`, which prints "ok" when its checks hold.
async fn run_script(script: &str, proxy: &Proxy) {
    let script = format!("{}/tests/data/{script}", env!("CARGO_MANIFEST_DIR"));
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
}
