//! Active health checks: one task per backend, each on its own interval.

use super::{now_ms, CheckStatus};
use crate::backend::BackendState;
use crate::config::HealthCheck;
use crate::registry::{Backend, Snapshot};
use crate::supervise::BackendLoop;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// The health check loop of every checked backend.
pub struct HealthChecks {
    client: reqwest::Client,
}

impl HealthChecks {
    /// Health checks sharing one HTTP client (no proxy from the environment).
    pub fn new() -> Result<Self, reqwest::Error> {
        Ok(HealthChecks {
            client: reqwest::Client::builder().no_proxy().build()?,
        })
    }
}

/// What a check task was started with.
#[derive(PartialEq)]
pub struct CheckSpec {
    addr: SocketAddr,
    check: HealthCheck,
}

/// One GET of the health path: Ok for a 2xx answer, else the cause.
async fn check_once(
    client: &reqwest::Client,
    url: &str,
    check: &HealthCheck,
) -> Result<(), String> {
    match client.get(url).timeout(check.timeout).send().await {
        Ok(resp) if resp.status().is_success() => Ok(()),
        Ok(resp) => Err(format!("GET {url} answered {}", resp.status())),
        Err(e) if e.is_timeout() => Err(format!("GET {url} timed out after {:?}", check.timeout)),
        Err(e) if e.is_connect() => Err(format!("GET {url}: cannot connect")),
        Err(e) => Err(format!("GET {url}: {e}")),
    }
}

async fn check_loop(
    client: reqwest::Client,
    state: Arc<BackendState>,
    url: String,
    check: HealthCheck,
) {
    loop {
        let result = check_once(&client, &url, &check).await;
        let change = state
            .health
            .observe_check(&state.name, result, &check, now_ms());
        if change == Some(CheckStatus::Healthy) {
            state.outstanding.signal_capacity();
        }
        tokio::time::sleep(check.interval).await;
    }
}

impl BackendLoop for HealthChecks {
    type Spec = CheckSpec;

    fn spec(&self, _snapshot: &Snapshot, backend: &Backend) -> Option<CheckSpec> {
        backend.health_check.enabled.then(|| CheckSpec {
            addr: backend.addr,
            check: backend.health_check.clone(),
        })
    }

    fn spawn(&self, backend: &Backend, spec: &CheckSpec) -> JoinHandle<()> {
        let url = format!("http://{}{}", spec.addr, spec.check.path);
        tokio::spawn(check_loop(
            self.client.clone(),
            Arc::clone(&backend.state),
            url,
            spec.check.clone(),
        ))
    }
}
