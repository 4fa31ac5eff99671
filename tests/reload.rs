//! Zero-downtime reload: file rename, SIGHUP and `POST /reload`; bad files never replace good ones.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

async fn wait_generation(proxy: &Proxy, generation: u64) {
    eventually(WAIT, &format!("generation {generation}"), || async {
        (proxy.generation().await == generation).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_traffic_lose_no_request() {
    let workers = start_workers(3, |_| {}).await;
    let only = |i: usize| {
        format!(
            "backends:\n  - {{name: {}, url: \"{}\"}}\n",
            workers[i].name(),
            workers[i].url()
        )
    };
    let proxy = Proxy::start(&only(0)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (url, stop) = (proxy.url.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let (mut ok, mut failed, mut seen) =
                    (0u32, Vec::new(), std::collections::BTreeSet::new());
                for _ in 0..2000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    match client
                        .post(format!("{url}/v1/completions"))
                        .body(completion(2, true))
                        .send()
                        .await
                    {
                        Ok(resp) if resp.status() == 200 => {
                            seen.insert(worker_of(&resp));
                            match resp.bytes().await {
                                Ok(body) if body.ends_with(b"data: [DONE]\n\n") => ok += 1,
                                other => failed.push(format!("{other:?}")),
                            }
                        }
                        other => failed.push(format!("{other:?}")),
                    }
                }
                (ok, failed, seen)
            })
        })
        .collect();
    // Cycle the backend set while the load runs: every reload swaps all backends.
    for round in 1..=6u64 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        proxy.rewrite_config(&only(round as usize % 3));
        wait_generation(&proxy, round + 1).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (mut total, mut seen) = (0, std::collections::BTreeSet::new());
    for task in load {
        let (ok, failed, workers_seen) = task.await.unwrap();
        assert!(
            failed.is_empty(),
            "requests failed during reloads: {failed:?}"
        );
        total += ok;
        seen.extend(workers_seen);
    }
    assert!(total > 50, "too little traffic to mean anything: {total}");
    assert_eq!(
        seen.len(),
        3,
        "traffic should have followed the reloads: {seen:?}"
    );
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_triggers_exactly_one_reload() {
    let workers = start_workers(1, |_| {}).await;
    let body = backends_yaml(&workers, |_| String::new());
    let proxy = Proxy::start(&body).await;
    proxy.rewrite_config(&backends_yaml(&workers, |_| ", weight: 2".into()));
    wait_generation(&proxy, 2).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let status = proxy.status().await;
    assert_eq!(status["generation"], 2);
    assert_eq!(status["reload"]["applied_total"], 1);
    assert_eq!(status["backends"][0]["weight"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_is_refused_and_traffic_keeps_the_old_config() {
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start(&backends_yaml(&workers, |_| String::new())).await;
    proxy.rewrite_config("backends:\n  - {name: w0, url: \"http://127.0.0.1:1\", weigth: 3}\n");
    let error = eventually(WAIT, "the refusal to show", || async {
        proxy.status().await["reload"]["last_error"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    assert!(
        error.contains("backends[0]") && error.contains("weigth"),
        "{error}"
    );
    assert_eq!(proxy.generation().await, 1);
    let resp = proxy.complete(&reqwest::Client::new(), 1, false).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(worker_of(&resp), "w0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_when_watching_is_off() {
    let workers = start_workers(2, |_| {}).await;
    let body = |i: usize| {
        format!(
            "reload: {{watch: false}}\nbackends:\n  - {{name: {}, url: \"{}\"}}\n",
            workers[i].name(),
            workers[i].url()
        )
    };
    let proxy = Proxy::start(&body(0)).await;
    proxy.rewrite_config(&body(1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(proxy.generation().await, 1, "file watching was off");
    let killed = std::process::Command::new("kill")
        .args(["-HUP", &proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_generation(&proxy, 2).await;
    let resp = proxy.complete(&reqwest::Client::new(), 1, false).await;
    assert_eq!(worker_of(&resp), "w1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reload_needs_the_token() {
    let workers = start_workers(1, |_| {}).await;
    let body = |w: u32| {
        format!(
            "reload: {{watch: false}}\n{}",
            backends_yaml(&workers, move |_| format!(", weight: {w}"))
        )
    };
    let proxy = Proxy::start_with(
        &body(1),
        ", token_env: GPULB_TEST_ADMIN_TOKEN",
        &[("GPULB_TEST_ADMIN_TOKEN", "s3cret")],
    )
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/reload", proxy.admin);
    assert_eq!(client.post(&url).send().await.unwrap().status(), 401);
    let wrong = client.post(&url).bearer_auth("guess").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    assert!(!wrong.text().await.unwrap().contains("s3cret"));

    proxy.rewrite_config(&body(4));
    let ok = client
        .post(&url)
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let outcome: serde_json::Value = ok.json().await.unwrap();
    assert_eq!(outcome["result"], "applied");
    assert_eq!(outcome["generation"], 2);
    assert_eq!(outcome["changes"][0], "backend w0 changed");

    proxy.rewrite_config("backends: []\n");
    let bad = client
        .post(&url)
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);
    let outcome: serde_json::Value = bad.json().await.unwrap();
    assert_eq!(outcome["result"], "rejected");
    assert!(outcome["error"]
        .as_str()
        .unwrap()
        .contains("backends: at least one backend is required"));
    assert_eq!(proxy.generation().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reload_is_refused_without_a_configured_token() {
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start(&backends_yaml(&workers, |_| String::new())).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/reload", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
}
