//! GPU telemetry steers routing: guards exclude loaded GPUs, stale readings count as unknown,
//! and the model server's own queue counts fold into the least-outstanding score.

mod common;

use common::*;
use gpulb::tools::sim::SimWorker;
use std::collections::BTreeSet;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// Workers of the answers to `n` sequential requests through the proxy.
async fn route(proxy: &Proxy, n: usize) -> Vec<String> {
    let client = reqwest::Client::new();
    let mut seen = Vec::new();
    for _ in 0..n {
        let resp = proxy.complete(&client, 1, false).await;
        assert_eq!(resp.status(), 200);
        seen.push(worker_of(&resp));
    }
    seen
}

/// A backends block where each worker reads its GPU from `telemetry_of(i)`'s dcgm endpoint.
fn with_dcgm(workers: &[SimWorker], telemetry_of: impl Fn(usize) -> String) -> String {
    backends_yaml(workers, |i| {
        format!(
            ", telemetry: [{{kind: dcgm, url: \"{}/dcgm/metrics\", interval: 100ms}}]",
            telemetry_of(i)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_over_the_memory_guard_gets_no_new_requests() {
    let workers = start_workers(2, |_| {}).await;
    let urls: Vec<String> = workers.iter().map(SimWorker::url).collect();
    let config = format!(
        "pools:\n  - {{name: gpus, backends: [w0, w1], guards: {{max_gpu_memory: 0.95}}}}\n{}",
        with_dcgm(&workers, |i| urls[i].clone())
    );
    let proxy = Proxy::start(&config).await;
    workers[0].set_gpu_memory_override(Some(0.99));
    // Wait for the 99% reading itself (five requests that all happen to pick w1 prove nothing).
    eventually(WAIT, "gpulb to read w0's GPU memory at 99%", || async {
        let status = proxy.status().await;
        let gpu = &status["backends"][0]["telemetry"]["gpus"][0];
        let used = gpu["memory_used_bytes"].as_f64()?;
        let total = gpu["memory_total_bytes"].as_f64()?;
        (used / total > 0.95).then_some(())
    })
    .await;
    assert!(route(&proxy, 20).await.iter().all(|w| w == "w1"));
    workers[0].set_gpu_memory_override(None);
    eventually(
        WAIT,
        "w0 back once its memory is below the guard",
        || async {
            route(&proxy, 6)
                .await
                .contains(&"w0".to_string())
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_over_its_guard_means_waiting_then_shedding_not_blind_sending() {
    let workers = start_workers(1, |_| {}).await;
    let urls: Vec<String> = workers.iter().map(SimWorker::url).collect();
    let config = format!(
        "pools:\n  - {{name: gpus, backends: [w0], guards: {{max_gpu_memory: 0.5}}}}\n\
         classes:\n  - {{name: chat, pool: gpus, queue: {{max_wait: 300ms}}}}\n{}",
        with_dcgm(&workers, |i| urls[i].clone())
    );
    let proxy = Proxy::start(&config).await;
    workers[0].set_gpu_memory_override(Some(0.9));
    let client = reqwest::Client::new();
    let resp = eventually(WAIT, "the guard to refuse", || async {
        let resp = client
            .post(format!("{}/v1/completions", proxy.url))
            .body(completion(1, false))
            .send()
            .await
            .ok()?;
        (resp.status() == 503).then_some(resp)
    })
    .await;
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "wait_timeout");
    let seen_by_w0 = workers[0].stats().received_total;
    for _ in 0..3 {
        let resp = proxy.complete(&client, 1, false).await;
        assert_eq!(resp.status(), 503);
        assert!(resp.headers().contains_key("retry-after"));
    }
    assert_eq!(
        workers[0].stats().received_total,
        seen_by_w0,
        "nothing is sent to the guarded GPU"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_telemetry_neither_excludes_nor_favours() {
    let workers = start_workers(2, |_| {}).await;
    // w0's GPU figures come from a separate exporter that will die.
    let exporter = SimWorker::bind_loopback(gpulb::tools::sim::WorkerProfile::new("exporter"))
        .await
        .unwrap();
    exporter.set_gpu_memory_override(Some(0.99));
    let urls: Vec<String> = workers.iter().map(SimWorker::url).collect();
    let exporter_url = exporter.url();
    let config = format!(
        "telemetry: {{stale_after: 400ms}}\npools:\n  - {{name: gpus, backends: [w0, w1], guards: {{max_gpu_memory: 0.95}}}}\n{}",
        with_dcgm(&workers, |i| if i == 0 { exporter_url.clone() } else { urls[i].clone() })
    );
    let proxy = Proxy::start(&config).await;
    eventually(WAIT, "w0 excluded while its reading is fresh", || async {
        (!route(&proxy, 5).await.contains(&"w0".to_string())).then_some(())
    })
    .await;
    exporter.kill_and_wait().await;
    // The last reading (99%) ages past stale_after and stops counting.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let seen: BTreeSet<String> = route(&proxy, 20).await.into_iter().collect();
    assert!(
        seen.contains("w0"),
        "a stale reading must not keep w0 out: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_the_proxy_did_not_send_is_seen_through_the_servers_metrics() {
    let workers = start_workers(2, |p| p.decode_step = Duration::from_millis(50)).await;
    let config = backends_yaml(&workers, |_| {
        ", telemetry: [{kind: model_server, server: vllm, interval: 100ms}]".into()
    });
    let proxy = Proxy::start(&config).await;
    // Six long requests straight to w0, bypassing the proxy (another replica, say).
    let direct = reqwest::Client::new();
    let bypass: Vec<_> = (0..6)
        .map(|_| {
            let req = direct
                .post(format!("{}/v1/completions", workers[0].url()))
                .body(completion(200, false));
            tokio::spawn(async move { req.send().await })
        })
        .collect();
    eventually(WAIT, "w0 running the bypassing requests", || async {
        (workers[0].stats().running == 6).then_some(())
    })
    .await;
    // Give the 100 ms poller time to see them.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let seen = route(&proxy, 10).await;
    assert!(
        seen.iter().all(|w| w == "w1"),
        "the busy server got proxied work: {seen:?}"
    );
    for b in bypass {
        b.abort();
    }
}
