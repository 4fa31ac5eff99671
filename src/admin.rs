//! Admin listener: `GET /status` (JSON view of the live routing state).

use crate::registry::{Registry, Snapshot};
use async_trait::async_trait;
use http::{Method, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The admin HTTP application.
pub struct AdminApp {
    registry: Arc<Registry>,
}

impl AdminApp {
    /// Admin endpoints over the live state of `registry`.
    pub fn new(registry: Arc<Registry>) -> Self {
        AdminApp { registry }
    }
}

/// `GET /status` body.
#[derive(Debug, Serialize)]
pub struct Status {
    /// Generation of the config in force.
    pub generation: u64,
    /// Every backend with its live counters.
    pub backends: Vec<BackendStatus>,
    /// Every class with its live counters.
    pub classes: Vec<ClassStatus>,
}

/// One backend in [`Status`].
#[derive(Debug, Serialize)]
pub struct BackendStatus {
    /// Backend name.
    pub name: String,
    /// Backend URL.
    pub url: String,
    /// Relative capacity.
    pub weight: u32,
    /// In-flight cap.
    pub max_outstanding: u32,
    /// Requests in flight now.
    pub outstanding: u32,
    /// Attempts ever sent.
    pub attempts_total: u64,
}

/// One class in [`Status`].
#[derive(Debug, Serialize)]
pub struct ClassStatus {
    /// Class name.
    pub name: String,
    /// Its pool.
    pub pool: String,
    /// Requests in flight now.
    pub outstanding: u32,
}

impl Status {
    /// The status of one snapshot's live state.
    pub fn of(snapshot: &Snapshot) -> Status {
        Status {
            generation: snapshot.generation,
            backends: snapshot
                .backends
                .iter()
                .map(|b| BackendStatus {
                    name: b.state.name.clone(),
                    url: b.url.clone(),
                    weight: b.weight,
                    max_outstanding: b.max_outstanding,
                    outstanding: b.state.outstanding.get(),
                    attempts_total: b.state.attempts_total.load(Ordering::Relaxed),
                })
                .collect(),
            classes: snapshot
                .classes
                .iter()
                .map(|c| ClassStatus {
                    name: c.name.clone(),
                    pool: snapshot.pools[c.pool].name.clone(),
                    outstanding: c.state.outstanding.get(),
                })
                .collect(),
        }
    }
}

fn json(status: StatusCode, body: &impl Serialize) -> Response<Vec<u8>> {
    let bytes = serde_json::to_vec_pretty(body).unwrap_or_default();
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("content-length", bytes.len())
        .body(bytes)
        .unwrap_or_default()
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        match (&req.method, req.uri.path()) {
            (&Method::GET, "/status") => json(StatusCode::OK, &Status::of(&self.registry.load())),
            _ => json(
                StatusCode::NOT_FOUND,
                &serde_json::json!({"error": {"message": "no such admin endpoint", "type": "invalid_request_error", "code": "not_found"}}),
            ),
        }
    }
}
