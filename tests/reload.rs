//! Zero-downtime reload: file rename, SIGHUP and `POST /reload`; bad files never replace good ones.

mod common;

use common::{
    eventually, start_fleet, start_workers, worker_of, Backend, Config, Proxy, Req, WAIT,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_traffic_lose_no_request() {
    let workers = start_workers(3, |_| {}).await;
    let only = |i: usize| Config::new().backend(Backend::of(&workers[i]));
    let proxy = Proxy::start(only(0)).await;
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
                    match Req::completion_stream(2)
                        .request(&client, &url)
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
    // Cycle the backend set while the load runs: every reload swaps all backends, once the
    // backend in force has served ten requests (six rounds: more than the 50 asserted below).
    let mut since = workers[0].stats().served_total;
    for round in 1..=6usize {
        let serving = &workers[(round - 1) % 3];
        eventually(WAIT, "the backend in force to serve its share", || async {
            (serving.stats().served_total >= since + 10).then_some(())
        })
        .await;
        since = workers[round % 3].stats().served_total;
        proxy.rewrite_config(only(round % 3));
        proxy.wait_generation(round as u64 + 1).await;
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
    let (workers, proxy) = start_fleet(1).await;
    proxy.rewrite_config(Config::fleet(&workers).each_backend(|b| b.weight(2)));
    proxy.wait_generation(2).await;
    // What is tested is that nothing more happens: a quiet window, well past the 200 ms
    // debounce, in which a second reload would show.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let status = proxy.status().await;
    assert_eq!(status["generation"], 2);
    assert_eq!(status["reload"]["applied_total"], 1);
    assert_eq!(status["backends"][0]["weight"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_is_refused_and_traffic_keeps_the_old_config() {
    let (_workers, proxy) = start_fleet(1).await;
    // Raw YAML: the misspelt key is the point.
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
    let resp = proxy.send(&Req::completion(1)).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.worker, "w0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_when_watching_is_off() {
    let workers = start_workers(2, |_| {}).await;
    let body = |i: usize| {
        Config::new()
            .set("reload", "{watch: false}")
            .backend(Backend::of(&workers[i]))
    };
    let proxy = Proxy::start(body(0)).await;
    proxy.rewrite_config(body(1));
    // What is tested is that nothing happens: a window, well past the 200 ms debounce, in which
    // a file watcher would have reloaded.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(proxy.generation().await, 1, "file watching was off");
    let killed = std::process::Command::new("kill")
        .args(["-HUP", &proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    proxy.wait_generation(2).await;
    let resp = proxy.send(&Req::completion(1)).await;
    assert_eq!(resp.worker, "w1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reload_needs_the_token() {
    let workers = start_workers(1, |_| {}).await;
    let body = |w: u32| {
        Config::fleet(&workers)
            .set("reload", "{watch: false}")
            .each_backend(|b| b.weight(w))
    };
    let proxy = Proxy::start_with_token(body(1), "s3cret").await;
    assert_eq!(proxy.post_reload(None).await.status(), 401);
    let wrong = proxy.post_reload(Some("guess")).await;
    assert_eq!(wrong.status(), 401);
    assert!(!wrong.text().await.unwrap().contains("s3cret"));

    proxy.rewrite_config(body(4));
    let ok = proxy.post_reload(Some("s3cret")).await;
    assert_eq!(ok.status(), 200);
    let outcome: serde_json::Value = ok.json().await.unwrap();
    assert_eq!(outcome["result"], "applied");
    assert_eq!(outcome["generation"], 2);
    assert_eq!(outcome["changes"][0], "backend w0 changed");

    // Raw YAML: an empty fleet is the point.
    proxy.rewrite_config("backends: []\n");
    let bad = proxy.post_reload(Some("s3cret")).await;
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
    let (_workers, proxy) = start_fleet(1).await;
    assert_eq!(proxy.post_reload(None).await.status(), 403);
}
