//! Active health checks: one task per backend, each on its own interval. Each round resolves
//! the backend's name again first, so a backend whose name did not resolve (or whose address
//! changed) is picked up without a reload, as HAProxy's `init-addr none` does. An https
//! backend is checked over TLS, trusting what its `tls` keys say.

use super::{BackendLoop, Stop};
use crate::config::{HealthCheck, ResolveError, Upstream};
use crate::health::{now_ms, CheckFailure, CheckStatus};
use crate::routing::{Backend, BackendState, Snapshot};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// The health check loop of every checked backend, and of every unresolved one.
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
    upstream: Upstream,
    check: HealthCheck,
}

/// One GET of the health path of `upstream` at `addr`: Ok for a 2xx answer, else the cause.
async fn check_once(
    client: &reqwest::Client,
    upstream: &Upstream,
    addr: SocketAddr,
    check: &HealthCheck,
) -> Result<(), CheckFailure> {
    let target =
        crate::tls::target(upstream, addr, client).map_err(|cause| CheckFailure::Other {
            url: format!("{upstream}{}", check.path),
            cause,
        })?;
    let url = format!("{}{}", target.base, check.path);
    let request = target.request(reqwest::Method::GET, &url);
    match request.timeout(check.timeout).send().await {
        Ok(resp) if resp.status().is_success() => Ok(()),
        Ok(resp) => Err(CheckFailure::Status {
            url,
            status: resp.status().as_u16(),
        }),
        Err(e) if e.is_timeout() => Err(CheckFailure::Timeout {
            url,
            timeout: check.timeout,
        }),
        Err(e) if e.is_connect() => Err(CheckFailure::Connect { url }),
        Err(e) => Err(CheckFailure::Other {
            url,
            cause: e.to_string(),
        }),
    }
}

/// The first address `upstream` resolves to now, within `check.timeout`.
async fn resolve(upstream: &Upstream, check: &HealthCheck) -> Result<SocketAddr, ResolveError> {
    let authority = upstream.to_string();
    let failed = |cause: String| ResolveError::Failed {
        authority: authority.clone(),
        cause,
    };
    let lookup = tokio::net::lookup_host(authority.clone());
    match tokio::time::timeout(check.timeout, lookup).await {
        Ok(Ok(mut addrs)) => addrs.next().ok_or(ResolveError::Empty(authority.clone())),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(_) => Err(failed(format!("no answer within {:?}", check.timeout))),
    }
}

async fn check_loop(
    client: reqwest::Client,
    state: Arc<BackendState>,
    upstream: Upstream,
    check: HealthCheck,
    mut shutdown: Stop,
) {
    loop {
        let was_resolved = state.address.get().is_some();
        let resolved = resolve(&upstream, &check).await;
        let failure = resolved.as_ref().err().cloned();
        state.address.update(resolved, false);
        let now_resolved = state.address.get();
        if !was_resolved && now_resolved.is_some() {
            tracing::info!(backend = %state.name, "backend name resolves again");
            state.outstanding.signal_capacity();
        }
        if check.enabled {
            let result = match now_resolved {
                Some(addr) => check_once(&client, &upstream, addr, &check).await,
                None => {
                    Err(CheckFailure::Unresolved(failure.unwrap_or_else(|| {
                        ResolveError::Empty(upstream.to_string())
                    })))
                }
            };
            let change = state
                .health
                .observe_check(&state.name, result, &check, now_ms());
            if change == Some(CheckStatus::Healthy) {
                state.outstanding.signal_capacity();
            }
        } else if now_resolved.is_some() {
            // Checks are off: this task only waited for the name to resolve.
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(check.interval) => {}
            () = crate::telemetry::stopped(&mut shutdown) => return,
        }
    }
}

impl BackendLoop for HealthChecks {
    type Spec = CheckSpec;

    fn spec(&self, _snapshot: &Snapshot, backend: &Backend) -> Option<CheckSpec> {
        (backend.health_check.enabled || backend.state.address.get().is_none()).then(|| CheckSpec {
            upstream: backend.upstream.clone(),
            check: backend.health_check.clone(),
        })
    }

    fn spawn(&self, backend: &Backend, spec: &CheckSpec, shutdown: Stop) -> JoinHandle<()> {
        tokio::spawn(check_loop(
            self.client.clone(),
            Arc::clone(&backend.state),
            spec.upstream.clone(),
            spec.check.clone(),
            shutdown,
        ))
    }
}
