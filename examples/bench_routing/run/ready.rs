//! Waiting for a freshly started target: it must answer completions and, for gpulb, see every
//! worker healthy with telemetry, before the trace is sent.

use crate::client;
use crate::procs::ChildGuard;
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;

/// Waits until the target answers a tiny completion three times in a row (and, for gpulb, sees
/// every worker healthy with telemetry), bounded.
pub async fn wait_ready(
    child: &mut ChildGuard,
    base: &str,
    admin: Option<&str>,
    workers: usize,
    log: &Path,
) -> Result<(), String> {
    let client = client::client(Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut oks = 0;
    loop {
        if let Some(how) = child.exited() {
            return Err(format!(
                "{} exited ({how}); log tail:\n{}",
                child.name,
                tail(log)
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} not ready after 60 s; log tail:\n{}",
                child.name,
                tail(log)
            ));
        }
        oks = if answers(&client, base).await {
            oks + 1
        } else {
            0
        };
        let status_ok = match admin {
            None => true,
            Some(a) => sees_fleet(&client, a, workers).await,
        };
        if oks >= 3 && status_ok {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the target answers a one-token completion with 200.
async fn answers(client: &reqwest::Client, base: &str) -> bool {
    client
        .post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model":"sim-model","prompt":"ready?","max_tokens":1}"#)
        .send()
        .await
        .map(|r| r.status().as_u16() == 200)
        .unwrap_or(false)
}

/// Whether gpulb's /status lists `workers` backends, each eligible and with server telemetry.
async fn sees_fleet(client: &reqwest::Client, admin: &str, workers: usize) -> bool {
    client::gpulb_status(client, admin)
        .await
        .and_then(|v| v["backends"].as_array().cloned())
        .is_some_and(|b| {
            b.len() == workers
                && b.iter().all(|b| {
                    b["eligible"].as_bool() == Some(true) && !b["telemetry"]["server"].is_null()
                })
        })
}

/// The last 15 lines of a log file (empty if unreadable).
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
