//! HTTP routes of the simulated worker: OpenAI endpoints, health, metrics, dcgm telemetry, echo and sleep.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Map, Value};
use tokio::sync::watch;

use super::body::{full, json_response, Body, Counted};
use super::embeddings::{self, Embedder};
use super::engine::Engine;
use super::models::{NotServed, ServedModels};
use super::openai::{self, Kind};
use super::responses::{self, Store};
use super::{completions, dcgm, metrics, Fault};

/// Largest accepted generation request body: above gpulb's own default limit
/// (`request_body.max_bytes`, 4 MiB), as for vLLM and SGLang, which set none, so a body the demo
/// refuses is refused by gpulb, in gpulb's words.
pub(crate) const MAX_BODY: usize = 8 << 20;
/// Largest accepted `/echo` body.
const MAX_ECHO_BODY: usize = 8 << 20;
/// How much of an oversized body is read and discarded before answering 413.
const MAX_DRAIN: usize = 16 << 20;

/// Lifecycle of a worker, broadcast to the accept loop, connections and hung requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Serving normally.
    Running,
    /// Stop accepting, let connections finish (bounded).
    Graceful,
    /// Stop accepting and drop every connection now.
    Kill,
}

/// State shared by all connections of one worker.
pub(crate) struct Shared {
    pub name: String,
    pub header: HeaderValue,
    pub engine: Engine,
    pub default_max_tokens: u32,
    pub fault: Mutex<Fault>,
    pub received: AtomicU64,
    pub served: Arc<AtomicU64>,
    pub control: AtomicU64,
    pub next_id: AtomicU64,
    pub ctl: watch::Receiver<Mode>,
    pub gpu: dcgm::SimGpu,
    pub models: ServedModels,
    pub embedder: Embedder,
    /// `Authorization` every `/v1/` request must carry, when set.
    pub api_key: Option<Vec<u8>>,
    /// The Responses API answers stored here.
    pub responses: Store,
}

impl Shared {
    /// Current fault mode.
    pub fn fault(&self) -> Fault {
        self.fault
            .lock()
            .map(|f| *f)
            .unwrap_or_else(|p| *p.into_inner())
    }
}

/// An OpenAI-style JSON error response.
pub(crate) fn error(status: StatusCode, message: &str, code: &str) -> Response<Body> {
    let typ = if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    json_response(status, &openai::error_body(message, typ, json!(code)))
}

/// vLLM's answer to a request for a model the worker does not serve.
pub(crate) fn model_not_found(e: &NotServed) -> Response<Body> {
    let status = StatusCode::NOT_FOUND;
    let body = openai::error_body(&e.to_string(), "NotFoundError", json!(status.as_u16()));
    json_response(status, &body)
}

/// Entry point for every request: counts it, routes it and tags the response.
pub(crate) async fn handle(
    sh: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if *sh.ctl.borrow() == Mode::Kill {
        // Killed: never answer; the connection is about to be dropped.
        std::future::pending::<()>().await;
    }
    // What a load balancer polls (health, telemetry, model lists) is not traffic.
    let control = matches!(
        req.uri().path(),
        "/health" | "/metrics" | "/dcgm/metrics" | "/v1/models"
    );
    if control {
        sh.control.fetch_add(1, Ordering::Relaxed);
    } else {
        sh.received.fetch_add(1, Ordering::Relaxed);
    }
    let mut resp = route(&sh, req).await;
    resp.headers_mut().insert("x-sim-worker", sh.header.clone());
    let counter = if control {
        None
    } else {
        Some(sh.served.clone())
    };
    Ok(resp.map(|b| Counted::new(b, counter).boxed()))
}

async fn route(sh: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path == "/metrics" && req.method() == Method::GET {
        let text = metrics::render(&sh.name, sh.engine.state(), sh.engine.kv_budget());
        let mut r = Response::new(full(text));
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static(metrics::CONTENT_TYPE),
        );
        return r;
    }
    if path == "/dcgm/metrics" && req.method() == Method::GET {
        let text = dcgm::render(&sh.gpu, sh.engine.state(), sh.engine.kv_budget(), &sh.name);
        let mut r = Response::new(full(text));
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static(metrics::CONTENT_TYPE),
        );
        return r;
    }
    if path == "/echo" || path.starts_with("/echo/") {
        return echo(sh, req).await;
    }
    if let (Some(key), true) = (&sh.api_key, path.starts_with("/v1/")) {
        let sent = req.headers().get(http::header::AUTHORIZATION);
        if sent.is_none_or(|v| v.as_bytes() != key.as_slice()) {
            // vLLM's answer, word for word.
            return json_response(StatusCode::UNAUTHORIZED, &json!({"error": "Unauthorized"}));
        }
    }
    let fault = sh.fault();
    match fault {
        Fault::Hang => {
            let mut ctl = sh.ctl.clone();
            // Held until the worker shuts down (or forever, if its handle is gone).
            if ctl.wait_for(|m| *m != Mode::Running).await.is_err() {
                std::future::pending::<()>().await;
            }
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "worker shutting down",
                "shutting_down",
            );
        }
        Fault::ServerError => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "simulated server error",
                "simulated_fault",
            )
        }
        Fault::Overloaded if path.starts_with("/v1/") => {
            // TGI's answer, word for word.
            let body = json!({"error": "Model is overloaded", "error_type": "overloaded"});
            return json_response(StatusCode::TOO_MANY_REQUESTS, &body);
        }
        _ => {}
    }
    let method = req.method().clone();
    match (method, path.as_str()) {
        (Method::POST, "/v1/completions") => {
            completions::generate(sh, req, Kind::Completion, fault).await
        }
        (Method::POST, "/v1/chat/completions") => {
            completions::generate(sh, req, Kind::Chat, fault).await
        }
        (Method::POST, "/v1/responses") => {
            completions::generate(sh, req, Kind::Response, fault).await
        }
        (Method::GET, p) if p.starts_with("/v1/responses/") => {
            responses::retrieve(&sh.responses, &p["/v1/responses/".len()..])
        }
        (Method::POST, "/v1/embeddings") => {
            let slow = if let Fault::Slow(f) = fault { f } else { 1.0 };
            embeddings::embed(sh, req, slow).await
        }
        (Method::GET, "/v1/models") => json_response(StatusCode::OK, &sh.models.list_body()),
        (Method::GET, "/health") => json_response(StatusCode::OK, &json!({"status": "ok"})),
        (Method::GET, p) if p.starts_with("/sleep/") => {
            sleep(sh, &p["/sleep/".len()..], fault).await
        }
        (m, p) => error(
            StatusCode::NOT_FOUND,
            &format!("no route for {m} {p}"),
            "not_found",
        ),
    }
}

/// Reads the whole body; past `limit` it keeps draining (up to [`MAX_DRAIN`]) so the 413 reaches the client cleanly.
pub(crate) async fn read_body(
    req: Request<Incoming>,
    limit: usize,
) -> Result<Bytes, Response<Body>> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body exceeds {limit} bytes"),
            "payload_too_large",
        )
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > (limit + MAX_DRAIN) as u64) {
        return Err(too_large());
    }
    let mut body = req.into_body();
    let mut buf = BytesMut::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                &format!("could not read body: {e}"),
                "bad_body",
            )
        })?;
        if let Ok(data) = frame.into_data() {
            total += data.len();
            if total <= limit {
                buf.extend_from_slice(&data);
            } else if total > limit + MAX_DRAIN {
                break;
            }
        }
    }
    if total > limit {
        return Err(too_large());
    }
    Ok(buf.freeze())
}

async fn echo(sh: &Shared, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let mut headers = Map::new();
    for (name, value) in req.headers() {
        let v = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match headers.get_mut(name.as_str()) {
            Some(Value::String(prev)) => {
                prev.push_str(", ");
                prev.push_str(&v);
            }
            _ => {
                headers.insert(name.as_str().to_string(), Value::String(v));
            }
        }
    }
    let body = match read_body(req, MAX_ECHO_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    json_response(
        StatusCode::OK,
        &json!({"worker": sh.name, "method": method, "path": path, "query": query, "headers": headers,
                "body": String::from_utf8_lossy(&body), "body_len": body.len()}),
    )
}

async fn sleep(sh: &Shared, ms: &str, fault: Fault) -> Response<Body> {
    let Ok(ms) = ms.parse::<u64>() else {
        return error(
            StatusCode::BAD_REQUEST,
            "expected /sleep/{milliseconds}",
            "bad_sleep",
        );
    };
    let factor = if let Fault::Slow(f) = fault { f } else { 1.0 };
    let d = Duration::from_millis(ms);
    let scaled = Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(d);
    tokio::time::sleep(scaled).await;
    json_response(StatusCode::OK, &json!({"worker": sh.name, "slept_ms": ms}))
}
