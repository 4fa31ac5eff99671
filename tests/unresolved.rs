//! A backend whose name does not resolve stays in its pool, gets no traffic, and says why in
//! `/status` and `/metrics`; `gpulb check` warns about it but passes.

mod common;

use common::{gpulb_check, served_by, start_workers, Backend, Config, Proxy, Req};

/// A name that never resolves (`.invalid` is reserved for that, RFC 6761).
const GHOST: &str = "http://ghost.invalid:8000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_backend_waits_unhealthy_and_the_rest_serve() {
    let workers = start_workers(1, |_| {}).await;
    let config = Config::fleet(&workers)
        .set("health_check", "{interval: 100ms, timeout: 200ms}")
        .backend(Backend::at("ghost", GHOST));
    let proxy = Proxy::launch(config).await;
    let status = proxy
        .wait_status("w0 eligible", |status| {
            let backends = status["backends"].as_array()?;
            let w0 = backends.iter().find(|b| b["name"] == "w0")?;
            (w0["eligible"] == true).then(|| status.clone())
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

    let answers = proxy.send_n(6, &Req::completion(2)).await;
    assert_eq!(served_by(&answers), vec!["w0"; 6]);
    // Health checks keep trying to resolve it: it stays out, and says so in /metrics.
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("gpulb_backend_unresolved{backend=\"ghost\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("gpulb_backend_unresolved{backend=\"w0\"} 0"));
}

#[test]
fn check_warns_about_an_unresolvable_backend_but_passes() {
    let yaml = format!(
        "backends:\n  - {{name: w0, url: 'http://127.0.0.1:9001'}}\n  - {{name: ghost, url: '{GHOST}'}}\n"
    );
    let (ok, _, stderr) = gpulb_check(&yaml);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("warning") && stderr.contains("\"ghost\""),
        "{stderr}"
    );
    assert!(!stderr.contains("\"w0\""), "{stderr}");
}
