//! GPU telemetry steers routing: guards exclude loaded GPUs, stale readings count as unknown,
//! and the model server's own queue counts fold into the least-outstanding score.

mod common;

use common::{eventually, start_workers, Backend, Class, Config, Pool, Proxy, Req, WAIT};
use gpulb::tools::sim::SimWorker;
use std::collections::BTreeSet;
use std::time::Duration;

/// A backend for each worker, reading its GPU from `exporter_of(i)`'s dcgm page.
fn with_dcgm(workers: &[SimWorker], exporter_of: impl Fn(usize) -> String) -> Config {
    workers.iter().enumerate().fold(Config::new(), |c, (i, w)| {
        c.backend(Backend::of(w).dcgm(&exporter_of(i)))
    })
}

/// GPU memory use of backend `i`'s first GPU in a status document, 0..1.
fn memory_fraction(status: &serde_json::Value, i: usize) -> Option<f64> {
    let gpu = &status["backends"][i]["telemetry"]["gpus"][0];
    Some(gpu["memory_used_bytes"].as_f64()? / gpu["memory_total_bytes"].as_f64()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_over_the_memory_guard_gets_no_new_requests() {
    let workers = start_workers(2, |_| {}).await;
    let config = with_dcgm(&workers, |i| workers[i].url())
        .pool(Pool::new("gpus", &["w0", "w1"]).max_gpu_memory(0.95));
    let proxy = Proxy::start(config).await;
    workers[0].set_gpu_memory_override(Some(0.99));
    // Wait for the 99% reading itself (five requests that all happen to pick w1 prove nothing).
    proxy
        .wait_status("gpulb to read w0's GPU memory at 99%", |s| {
            (memory_fraction(s, 0)? > 0.95).then_some(())
        })
        .await;
    assert!(proxy.route(20).await.iter().all(|w| w == "w1"));
    workers[0].set_gpu_memory_override(None);
    eventually(
        WAIT,
        "w0 back once its memory is below the guard",
        || async {
            proxy
                .route(6)
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
    let config = with_dcgm(&workers, |i| workers[i].url())
        .pool(Pool::new("gpus", &["w0"]).max_gpu_memory(0.5))
        .class(Class::new("chat", "gpus").max_wait("300ms"));
    let proxy = Proxy::start(config).await;
    workers[0].set_gpu_memory_override(Some(0.9));
    let resp = eventually(WAIT, "the guard to refuse", || async {
        let resp = proxy.send(&Req::completion(1)).await;
        (resp.status == 503).then_some(resp)
    })
    .await;
    assert_eq!(resp.json()["error"]["code"], "wait_timeout");
    let seen_by_w0 = workers[0].stats().received_total;
    for resp in proxy.send_n(3, &Req::completion(1)).await {
        assert_eq!(resp.status, 503);
        assert!(resp.headers.contains_key("retry-after"));
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
    let config = with_dcgm(&workers, |i| {
        if i == 0 {
            exporter.url()
        } else {
            workers[i].url()
        }
    })
    .set("telemetry", "{stale_after: 400ms}")
    .pool(Pool::new("gpus", &["w0", "w1"]).max_gpu_memory(0.95));
    let proxy = Proxy::start(config).await;
    eventually(WAIT, "w0 excluded while its reading is fresh", || async {
        (!proxy.route(5).await.contains(&"w0".to_string())).then_some(())
    })
    .await;
    exporter.kill_and_wait().await;
    // The last reading (99%) ages past stale_after and stops counting.
    proxy
        .wait_status("w0's last reading to go stale", |s| {
            (s["backends"][0]["telemetry"]["stale"] == true).then_some(())
        })
        .await;
    let seen: BTreeSet<String> = proxy.route(20).await.into_iter().collect();
    assert!(
        seen.contains("w0"),
        "a stale reading must not keep w0 out: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_the_proxy_did_not_send_is_seen_through_the_servers_metrics() {
    let workers = start_workers(2, |p| p.decode_step = Duration::from_millis(50)).await;
    let proxy = Proxy::start(Config::fleet(&workers).each_backend(Backend::vllm)).await;
    // Six long requests straight to w0, bypassing the proxy (another replica, say).
    let direct = reqwest::Client::new();
    let bypass: Vec<_> = (0..6)
        .map(|_| {
            let req = Req::completion(200);
            let (direct, url) = (direct.clone(), workers[0].url());
            tokio::spawn(async move { req.send(&direct, &url).await })
        })
        .collect();
    eventually(WAIT, "w0 running the bypassing requests", || async {
        (workers[0].stats().running == 6).then_some(())
    })
    .await;
    // The 100 ms poller has seen them.
    proxy
        .wait_status("gpulb to read the six running on w0", |s| {
            (s["backends"][0]["telemetry"]["server"]["running"] == 6.0).then_some(())
        })
        .await;
    let seen = proxy.route(10).await;
    assert!(
        seen.iter().all(|w| w == "w1"),
        "the busy server got proxied work: {seen:?}"
    );
    for b in bypass {
        b.abort();
    }
}
