//! Active health checks and passive ejection take failing backends out of rotation and back.

mod common;

use common::{start_workers, Config, Proxy, Req};
use gpulb::tools::sim::{Fault, SimWorker, WorkerProfile};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_backend_leaves_within_fall_and_returns_after_rise() {
    let mut workers = start_workers(2, |_| {}).await;
    let config = Config::fleet(&workers).set(
        "health_check",
        "{interval: 100ms, timeout: 200ms, fall: 2, rise: 2}",
    );
    let proxy = Proxy::start(config).await;
    let addr = workers[0].addr();
    workers[0].kill_and_wait().await;
    let killed_at = std::time::Instant::now();
    proxy
        .wait_status("w0 unhealthy", |s| {
            (s["backends"][0]["health"] == "unhealthy").then_some(())
        })
        .await;
    // Two failed checks 100 ms apart, each failing fast (connection refused), plus poll slack.
    assert!(
        killed_at.elapsed() < Duration::from_secs(2),
        "took {:?}",
        killed_at.elapsed()
    );
    for worker in proxy.route(10).await {
        assert_eq!(worker, "w1");
    }
    // The same backend comes back on the same address.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    workers[0] = SimWorker::start(listener, WorkerProfile::new("w0")).unwrap();
    proxy
        .wait_status("w0 healthy again", |s| {
            (s["backends"][0]["health"] == "healthy").then_some(())
        })
        .await;
    let seen: std::collections::BTreeSet<String> = proxy.route(20).await.into_iter().collect();
    assert!(
        seen.contains("w0"),
        "w0 got no traffic after returning: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_failing_its_first_check_gets_no_traffic() {
    let workers = start_workers(2, |_| {}).await;
    workers[1].set_fault(Fault::ServerError);
    let config = Config::fleet(&workers).set("health_check", "{interval: 100ms, fall: 1}");
    let proxy = Proxy::launch(config).await;
    proxy
        .wait_status("w0 eligible, w1 unhealthy", |s| {
            (s["backends"][0]["eligible"] == true && s["backends"][1]["health"] == "unhealthy")
                .then_some(())
        })
        .await;
    for worker in proxy.route(10).await {
        assert_eq!(worker, "w0");
    }
    assert_eq!(
        workers[1].stats().received_total,
        0,
        "w1 must never see a request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_backend_is_ejected_and_the_rest_is_unaffected() {
    let workers = start_workers(3, |_| {}).await;
    // Checks are slow here so that passive ejection, not the checker, takes w0 out.
    let config = Config::fleet(&workers)
        .set("timeouts", "{read: 300ms}")
        .set("health_check", "{interval: 1m}")
        .set(
            "outlier_detection",
            "{consecutive_failures: 2, base_ejection: 1m}",
        );
    let proxy = Proxy::start(config).await;
    workers[0].set_fault(Fault::Hang);
    let mut timeouts = 0;
    for _ in 0..30 {
        let resp = proxy.send(&Req::completion(1)).await;
        match resp.status {
            200 => assert_ne!(resp.worker, "w0"),
            504 => {
                assert_eq!(resp.json()["error"]["code"], "upstream_timeout");
                timeouts += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(
        (1..=2).contains(&timeouts),
        "w0 should be ejected after 2 timeouts, saw {timeouts}"
    );
    let status = proxy.status().await;
    assert_eq!(status["backends"][0]["ejected"], true);
    assert_eq!(status["backends"][0]["ejections_total"], 1);
    assert_eq!(status["backends"][0]["eligible"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ejection_never_takes_more_than_the_allowed_share() {
    let workers = start_workers(2, |_| {}).await;
    let config = Config::fleet(&workers)
        .set("health_check", "{interval: 1m}")
        .set(
            "outlier_detection",
            "{consecutive_failures: 1, max_ejected_percent: 50}",
        );
    let proxy = Proxy::start(config).await;
    for w in &workers {
        w.set_fault(Fault::ServerError);
    }
    for resp in proxy.send_n(10, &Req::completion(1)).await {
        assert_eq!(resp.status, 500);
    }
    let status = proxy.status().await;
    let ejected: Vec<_> = status["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["ejected"] == true)
        .collect();
    assert_eq!(
        ejected.len(),
        1,
        "one of two (50%) may be ejected: {status}"
    );
}
