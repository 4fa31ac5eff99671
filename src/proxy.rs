//! The pingora `ProxyHttp` implementation: filters only, delegating to registry, balance and
//! headers.
//!
//! A request loads the routing snapshot once, in `request_filter`, and keeps it to the end. The
//! class slot and the backend lease are RAII guards in the request context, so they are released
//! exactly once however the request ends (response done, error, client gone, shutdown).

use crate::backend::{Lease, Slot};
use crate::error::ProxyError;
use crate::headers;
use crate::registry::{Registry, Snapshot};
use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use std::sync::Arc;

/// The proxy: routes each request by class to the least loaded backend of its pool.
pub struct Gpulb {
    registry: Arc<Registry>,
}

impl Gpulb {
    /// A proxy routing with the snapshots of `registry`.
    pub fn new(registry: Arc<Registry>) -> Self {
        Gpulb { registry }
    }
}

/// Per-request state, carried through pingora's filters.
#[derive(Default)]
pub struct RequestCtx {
    snapshot: Option<Arc<Snapshot>>,
    class: usize,
    class_slot: Option<Slot>,
    lease: Option<Lease>,
    /// Backends whose connect failed for this request; never chosen again for it.
    failed: Vec<usize>,
    request_id: Option<String>,
    failure: Option<ProxyError>,
}

impl RequestCtx {
    fn class_and_pool(&self) -> (String, String) {
        match &self.snapshot {
            Some(snap) => {
                let class = &snap.classes[self.class];
                (class.name.clone(), snap.pools[class.pool].name.clone())
            }
            None => (String::new(), String::new()),
        }
    }

    fn no_backend(&self) -> ProxyError {
        let (class, pool) = self.class_and_pool();
        ProxyError::NoBackendAvailable { class, pool }
    }
}

/// Writes the OpenAI-shaped error response for `error`.
async fn respond_error(
    session: &mut Session,
    ctx: &RequestCtx,
    id_header: &str,
    error: &ProxyError,
) -> Result<()> {
    let body = Bytes::from(error.body());
    let mut resp = ResponseHeader::build(error.status(), Some(4))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", body.len().to_string())?;
    if error.status() == 503 {
        resp.insert_header("retry-after", "1")?;
    }
    if let Some(id) = &ctx.request_id {
        resp.insert_header(id_header.to_string(), id.as_str())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

impl Gpulb {
    /// Answers `error` from `request_filter` and tells pingora the response is sent.
    async fn reject(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        id_header: &str,
        error: ProxyError,
    ) -> Result<bool> {
        tracing::debug!(request_id = ?ctx.request_id, %error, "rejected");
        respond_error(session, ctx, id_header, &error).await?;
        ctx.failure = Some(error);
        Ok(true)
    }

    /// Takes the client's request id or adds a fresh one; returns it.
    fn ensure_request_id(session: &mut Session, id_header: &str) -> Result<String> {
        let existing = session
            .req_header()
            .headers
            .get(id_header)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= 128)
            .map(str::to_string);
        match existing {
            Some(id) => Ok(id),
            None => {
                let id = headers::new_request_id();
                session
                    .req_header_mut()
                    .insert_header(id_header.to_string(), id.as_str())?;
                Ok(id)
            }
        }
    }
}

#[async_trait]
impl ProxyHttp for Gpulb {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let snapshot = self.registry.load();
        let id_header = snapshot.config.request_id_header.clone();
        ctx.request_id = Some(Self::ensure_request_id(session, &id_header)?);
        let req = session.req_header();
        ctx.class = snapshot.classify(&req.method, req.uri.path(), &req.headers);
        ctx.snapshot = Some(Arc::clone(&snapshot));
        let class = &snapshot.classes[ctx.class];
        ctx.class_slot = class.state.outstanding.try_acquire(class.max_outstanding);
        if ctx.class_slot.is_none() {
            let error = ProxyError::ClassSaturated {
                class: class.name.clone(),
                limit: class.max_outstanding,
            };
            return self.reject(session, ctx, &id_header, error).await;
        }
        // Admit and pick in one step: the slot taken here is the one `upstream_peer` uses.
        ctx.lease = snapshot.acquire(class.pool, &[]);
        if ctx.lease.is_none() {
            let error = ctx.no_backend();
            return self.reject(session, ctx, &id_header, error).await;
        }
        Ok(false)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let snapshot = ctx
            .snapshot
            .clone()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "request has no snapshot"))?;
        if ctx.lease.is_none() {
            // A retry: the failed attempt's lease was released in `fail_to_connect`.
            let pool = snapshot.classes[ctx.class].pool;
            ctx.lease = snapshot.acquire(pool, &ctx.failed);
        }
        let Some(lease) = &ctx.lease else {
            ctx.failure = Some(ctx.no_backend());
            return Error::e_explain(ErrorType::HTTPStatus(503), "no backend available");
        };
        let backend = &snapshot.backends[lease.backend];
        let timeouts = &snapshot.config.timeouts;
        let mut peer = HttpPeer::new(backend.addr, false, String::new());
        peer.options.connection_timeout = Some(timeouts.connect);
        peer.options.read_timeout = Some(timeouts.read);
        peer.options.write_timeout = Some(timeouts.write);
        peer.options.idle_timeout = Some(timeouts.upstream_keepalive);
        Ok(Box::new(peer))
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let Some(lease) = ctx.lease.take() {
            ctx.failed.push(lease.backend);
        }
        let retries = ctx
            .snapshot
            .as_ref()
            .map_or(0, |s| s.config.connect_retries);
        if ctx.failed.len() <= retries {
            e.set_retry(true);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        _ctx: &mut RequestCtx,
    ) -> Result<()> {
        for name in headers::hop_by_hop(&upstream_request.headers) {
            upstream_request.remove_header(&name);
        }
        if let Some(client) = session.client_addr().and_then(|a| a.as_inet()) {
            let chain = headers::forwarded_for(
                upstream_request.headers.get("x-forwarded-for"),
                &client.ip().to_string(),
            );
            upstream_request.insert_header("x-forwarded-for", chain)?;
        }
        upstream_request.insert_header("x-forwarded-proto", "http")?;
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        for name in headers::hop_by_hop(&upstream_response.headers) {
            upstream_response.remove_header(&name);
        }
        if let (Some(id), Some(snap)) = (&ctx.request_id, &ctx.snapshot) {
            upstream_response.insert_header(snap.config.request_id_header.clone(), id.as_str())?;
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let failure = ctx.failure.take().or_else(|| ProxyError::from_pingora(e));
        let code = match &failure {
            Some(error) if session.response_written().is_none() => {
                let id_header = ctx
                    .snapshot
                    .as_ref()
                    .map_or("x-request-id".to_string(), |s| {
                        s.config.request_id_header.clone()
                    });
                if let Err(write_error) = respond_error(session, ctx, &id_header, error).await {
                    tracing::debug!(%write_error, "could not send the error response");
                }
                error.status()
            }
            Some(error) => error.status(),
            None => 0,
        };
        tracing::debug!(request_id = ?ctx.request_id, error = %e, code, "request failed");
        ctx.failure = failure;
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, _session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        // Release now rather than when pingora drops the context; `Drop` covers the paths
        // (shutdown, cancelled futures) where this hook never runs.
        ctx.lease = None;
        ctx.class_slot = None;
    }
}
