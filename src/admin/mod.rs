//! Admin listener: `GET /metrics` (Prometheus), `GET /status` (JSON view of the live state),
//! `GET /dashboard` (live charts) and the `GET /history` it draws from, and `POST /reload`.
//!
//! `POST /reload` needs `Authorization: Bearer <token>` (token from `admin.token_env` or
//! `admin.token_file`); on a non-loopback listener every data endpoint needs it (`/metrics`
//! not with `admin.public_metrics`; the probes `/livez` and `/readyz` never). The decision
//! lives in one place, [`auth::decide`]; refusals are counted in `gpulb_admin_auth_failures_total`.

pub mod auth;
mod exposition;
pub mod history;
mod routes;

pub use exposition::Exposition;

use crate::lifecycle::{Lifecycle, Phase};
use crate::metrics::Metrics;
use crate::reload::{Outcome, Reloader, Trigger};
use crate::routing::Registry;
use crate::view::{FleetView, STATUS_LATENCY_SPAN_S};
use async_trait::async_trait;
use auth::Access;
use history::History;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use routes::Endpoint;
use serde::Serialize;
use std::sync::Arc;

/// The dashboard page: self-contained HTML, CSS and JS (no CDN, works offline).
const DASHBOARD: &str = include_str!("dashboard.html");

/// The admin HTTP application.
pub struct AdminApp {
    registry: Arc<Registry>,
    reloader: Option<Arc<Reloader>>,
    token: Option<String>,
    /// Which reads need the token.
    guard: auth::Guard,
    metrics: Arc<Metrics>,
    exposition: Exposition,
    history: Arc<History>,
    lifecycle: Arc<Lifecycle>,
}

/// `GET /status` body: the fleet view and the reload history.
#[derive(Serialize)]
struct StatusPage {
    /// Reload history (with the last error, if any), when serving from a config file.
    reload: Option<crate::reload::ReloadStatus>,
    #[serde(flatten)]
    fleet: FleetView,
}

impl AdminApp {
    /// Admin endpoints over `registry`; `reloader` is absent when there is no config file.
    pub fn new(
        registry: Arc<Registry>,
        reloader: Option<Arc<Reloader>>,
        token: Option<String>,
        guard: auth::Guard,
        metrics: Arc<Metrics>,
        history: Arc<History>,
        lifecycle: Arc<Lifecycle>,
    ) -> Self {
        AdminApp {
            registry,
            reloader,
            token,
            guard,
            metrics,
            exposition: Exposition::default(),
            history,
            lifecycle,
        }
    }

    /// `GET /readyz`: 200 while serving with at least one eligible backend in every pool; 503
    /// with the reason while draining or when a pool has none.
    fn readiness(&self) -> Response<Vec<u8>> {
        if self.lifecycle.phase() != Phase::Serving {
            return error(StatusCode::SERVICE_UNAVAILABLE, "draining", "shutting down");
        }
        let snapshot = self.registry.load();
        let now = crate::health::now_ms();
        let empty = snapshot.pools.iter().find(|p| {
            !p.members
                .iter()
                .any(|&i| snapshot.backends[i].state.eligible(now))
        });
        match empty {
            Some(pool) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_eligible_backend",
                &format!("pool {:?} has no backend that may take traffic", pool.name),
            ),
            None => json(StatusCode::OK, &serde_json::json!({"status": "ready"})),
        }
    }

    fn fleet(&self) -> FleetView {
        let mut view = FleetView::read(&self.registry.load(), &self.metrics, STATUS_LATENCY_SPAN_S);
        view.discovery = self.registry.discovery();
        view
    }

    /// Runs a reload on a blocking thread: the admin's one event-loop thread keeps answering
    /// `/status` and `/metrics` meanwhile.
    async fn reload(&self) -> Response<Vec<u8>> {
        let Some(reloader) = &self.reloader else {
            return error(
                StatusCode::CONFLICT,
                "not_reloadable",
                "this process was not started from a config file",
            );
        };
        let reloader = Arc::clone(reloader);
        let outcome =
            match tokio::task::spawn_blocking(move || reloader.reload(Trigger::Admin)).await {
                Ok(outcome) => outcome,
                Err(e) => {
                    let message = format!("the reload failed: {e}");
                    return error(StatusCode::INTERNAL_SERVER_ERROR, "reload_failed", &message);
                }
            };
        let status = match outcome {
            Outcome::Rejected { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Outcome::Abandoned { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::OK,
        };
        json(status, &outcome)
    }

    fn metrics(&self) -> Response<Vec<u8>> {
        let reload = self.reloader.as_ref().map(|r| r.status());
        let text = self
            .exposition
            .render(&self.metrics, &self.fleet(), reload.as_ref());
        body(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            text.into_bytes(),
        )
    }

    fn status(&self) -> Response<Vec<u8>> {
        let page = StatusPage {
            reload: self.reloader.as_ref().map(|r| r.status()),
            fleet: self.fleet(),
        };
        json(StatusCode::OK, &page)
    }

    fn history(&self, query: Option<&str>) -> Response<Vec<u8>> {
        let since = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|kv| kv.strip_prefix("since="));
        let since = match since.map(|v| (v, v.parse())) {
            None => 0,
            Some((_, Ok(seq))) => seq,
            Some((v, Err(_))) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    &format!("since={v:?}: expected a sample's seq, a whole number from 0"),
                )
            }
        };
        let bytes = serde_json::to_vec(&self.history.since(since)).unwrap_or_default();
        body(StatusCode::OK, "application/json", bytes)
    }
}

fn body(status: StatusCode, content_type: &str, bytes: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-length", bytes.len())
        .header("cache-control", "no-store")
        .body(bytes)
        .unwrap_or_default()
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Vec<u8>> {
    let bytes = serde_json::to_vec_pretty(value).unwrap_or_default();
    body(status, "application/json", bytes)
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Vec<u8>> {
    json(
        status,
        &serde_json::json!({"error": {"message": message, "type": "admin_error", "code": code}}),
    )
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_string();
        let query = req.uri.query().map(str::to_string);
        let authorization = req
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let endpoint = Endpoint::at(&path);
        if let Some(endpoint) = endpoint.filter(|e| !e.answers(&method)) {
            let mut answer = error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                &format!("{path} answers {}", endpoint.allow()),
            );
            answer.headers_mut().insert(
                http::header::ALLOW,
                http::HeaderValue::from_static(endpoint.allow()),
            );
            return answer;
        }
        let access = auth::decide(
            &method,
            &path,
            self.guard,
            self.token.as_deref(),
            authorization,
        );
        match access {
            Access::Allow => {}
            Access::NoTokenConfigured => {
                return error(
                    StatusCode::FORBIDDEN,
                    "admin_token_not_configured",
                    "set admin.token_env or admin.token_file to enable this endpoint",
                )
            }
            Access::Unauthorized => {
                self.metrics.auth_failure();
                return error(StatusCode::UNAUTHORIZED, "unauthorized", "unauthorized");
            }
        }
        match endpoint {
            Some(Endpoint::Livez) => json(StatusCode::OK, &serde_json::json!({"status": "live"})),
            Some(Endpoint::Readyz) => self.readiness(),
            Some(Endpoint::Metrics) => self.metrics(),
            Some(Endpoint::Status) => self.status(),
            Some(Endpoint::History) => self.history(query.as_deref()),
            Some(Endpoint::Dashboard) => body(
                StatusCode::OK,
                "text/html; charset=utf-8",
                DASHBOARD.as_bytes().to_vec(),
            ),
            Some(Endpoint::Root) => Response::builder()
                .status(StatusCode::FOUND)
                .header("location", "/dashboard")
                .header("content-length", 0)
                .body(Vec::new())
                .unwrap_or_default(),
            Some(Endpoint::Reload) => self.reload().await,
            None => error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
        }
    }
}
