//! A backend whose name does not resolve stays in its pool, gets no traffic, and says why in
//! `/status` and `/metrics`; `gpulb check` warns about it but passes.

mod common;

use common::{eventually, start_workers, worker_of, Proxy};
use std::process::Command;
use std::time::Duration;

/// A name that never resolves (`.invalid` is reserved for that, RFC 6761).
const GHOST: &str = "http://ghost.invalid:8000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_backend_waits_unhealthy_and_the_rest_serve() {
    let workers = start_workers(1, |_| {}).await;
    let body = format!(
        "health_check: {{interval: 100ms, timeout: 200ms}}\nbackends:\n  - {{name: w0, url: '{}'}}\n  - {{name: ghost, url: '{GHOST}'}}\n",
        workers[0].url()
    );
    let proxy = Proxy::launch(&body, "", &[]).await;
    let status = eventually(Duration::from_secs(15), "w0 eligible", || async {
        let status = proxy.status().await;
        let w0 = status["backends"]
            .as_array()?
            .iter()
            .find(|b| b["name"] == "w0")?;
        (w0["eligible"] == true).then_some(status)
    })
    .await;
    let ghost = status["backends"]
        .as_array()
        .and_then(|bs| bs.iter().find(|b| b["name"] == "ghost"))
        .expect("ghost is kept in the pool");
    assert_eq!(ghost["eligible"], false, "{ghost}");
    let reason = ghost["unresolved"].as_str().unwrap_or_default();
    assert!(
        reason.contains("ghost.invalid:8000"),
        "the reason names the address: {ghost}"
    );

    let client = reqwest::Client::new();
    for _ in 0..6 {
        let resp = proxy.complete(&client, 2, false).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(worker_of(&resp), "w0");
    }
    // Health checks keep trying to resolve it: it stays out, and says so in /metrics.
    let metrics = reqwest::get(format!("{}/metrics", proxy.admin))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("gpulb_backend_unresolved{backend=\"ghost\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("gpulb_backend_unresolved{backend=\"w0\"} 0"));
}

#[test]
fn check_warns_about_an_unresolvable_backend_but_passes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    let yaml = format!(
        "backends:\n  - {{name: w0, url: 'http://127.0.0.1:9001'}}\n  - {{name: ghost, url: '{GHOST}'}}\n"
    );
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpulb"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning") && stderr.contains("\"ghost\""),
        "{stderr}"
    );
    assert!(!stderr.contains("\"w0\""), "{stderr}");
}
