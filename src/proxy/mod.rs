//! The pingora `ProxyHttp` implementation: hooks only, in pingora's order, delegating to
//! [`crate::routing`], [`crate::admission`] and the header helpers.
//!
//! A request loads the routing snapshot once, in `request_filter`, and keeps it to the end. The
//! class slot and the backend lease are RAII guards in the request context, so they are released
//! exactly once however the request ends (response done, error, client gone, shutdown).

mod admit;
mod batch;
mod blame;
mod body;
pub mod body_budget;
mod catalog;
mod ctx;
mod finish;
mod heads;
mod hygiene;
mod intake;
mod refused;
mod respond;
mod stored;
mod sweeper;
mod tenant;
mod usage_tail;
mod watch;

pub use ctx::RequestCtx;

use crate::error::ProxyError;
use crate::headers;
use crate::health::AttemptFailure;
use crate::lifecycle::{Lifecycle, Phase};
use crate::metrics::Metrics;
use crate::routing::Registry;
use async_trait::async_trait;
use heads::Heads;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, ProxyWarnLogContext, Session};
use respond::{refuse, request_id, respond_error};
use std::sync::Arc;
use std::time::Instant;

/// The proxy: routes each request by class to the least loaded backend of its pool.
pub struct Gpulb {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    access_log: bool,
    lifecycle: Arc<Lifecycle>,
    /// The client batches make their upstream calls with.
    batch_client: reqwest::Client,
}

impl Gpulb {
    /// A proxy routing with the snapshots of `registry`, recording into `metrics`, writing an
    /// access line per request when `access_log`, and refusing new requests once `lifecycle`
    /// is closing.
    pub fn new(
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        access_log: bool,
        lifecycle: Arc<Lifecycle>,
    ) -> Self {
        let batch_client = crate::batching::upstream::client(&registry.load().config.timeouts);
        Gpulb {
            registry,
            metrics,
            access_log,
            lifecycle,
            batch_client,
        }
    }
}

#[async_trait]
impl ProxyHttp for Gpulb {
    /// Boxed: pingora-proxy keeps the context in the per-request future it boxes and holds
    /// until the response ends; a pointer there instead of the ~600-byte context makes every
    /// open stream's future smaller and the move into its box shorter.
    type CTX = Box<RequestCtx>;

    fn new_ctx(&self) -> Box<RequestCtx> {
        Box::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        ctx.started = Some(Instant::now());
        crate::connections::mark_active(session);
        let snapshot = self.registry.load();
        let compiled = &snapshot.config.compiled;
        let heads = Heads::of(session.req_header(), compiled);
        ctx.request_id = Some(request_id(heads.request_id));
        ctx.snapshot = Some(Arc::clone(&snapshot));
        let tenant = tenant::identify(&heads, compiled, &snapshot.config.tenants);
        let malformed = hygiene::malformed(session.req_header(), heads.host);
        let body_heads = heads.body();
        match tenant {
            Ok(tenant) => ctx.tenant = tenant,
            Err(error) => return refuse(session, ctx, error).await,
        }
        match self.lifecycle.phase() {
            Phase::Serving => {}
            // Told to stop: serve, but let the client reconnect elsewhere for the next one.
            Phase::Draining => session.set_keepalive(None),
            Phase::Closing => {
                session.set_keepalive(None);
                return refuse(session, ctx, ProxyError::ShuttingDown).await;
            }
        }
        if let Some(error) = malformed {
            session.set_keepalive(None);
            return refuse(session, ctx, error).await;
        }
        if let Some(asked) = catalog::asked(session, &snapshot) {
            return catalog::answer(session, ctx, &snapshot, asked).await;
        }
        let refused = intake::intake(session, ctx, &snapshot, body_heads).await?;
        // A body streamed past this point (chunked, or over the read limit) is bounded per read.
        session
            .as_downstream_mut()
            .set_read_timeout(Some(snapshot.config.timeouts.client_body));
        let class = &snapshot.classes[ctx.class];
        let class_metrics = Arc::clone(
            class
                .state
                .metrics
                .get_or_init(|| self.metrics.class(&class.name)),
        );
        ctx.class_metrics = Some(Arc::clone(&class_metrics));
        if let Some(error) = refused {
            tracing::debug!(request_id = ?ctx.request_id, %error, "refused");
            // A body left partly unread (refused by its size, stalled) means this connection
            // cannot carry another request; one read whole (a model or JSON refused) can.
            if !session.is_body_done() {
                session.set_keepalive(None);
            }
            let answered = refuse(session, ctx, error).await;
            body::linger(session).await;
            return answered;
        }
        if batch::batch(session, ctx, &snapshot, &self.batch_client).await? {
            return Ok(true);
        }
        // Admit and pick in one step: the lease granted here is the one `upstream_peer` uses.
        let refusal = admit::admit(session, ctx, &snapshot).await?;
        match refusal {
            None => {
                class_metrics.queue_wait(ctx.queued_for);
                Ok(false)
            }
            Some(error) => {
                tracing::debug!(request_id = ?ctx.request_id, %error, "refused");
                class_metrics.shed(&ctx.tenant, error.code());
                refuse(session, ctx, error).await
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        let snapshot = ctx
            .snapshot
            .clone()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "request has no snapshot"))?;
        if ctx.lease.is_none() {
            // A retry: the failed attempt's lease was released in `fail_to_connect`.
            ctx.lease = snapshot.acquire_for_class(ctx.class, &ctx.demand, &ctx.failed);
            ctx.outcome_reported = false;
        }
        let Some(lease) = &ctx.lease else {
            ctx.failure = Some(ctx.no_backend());
            return Error::e_explain(ErrorType::HTTPStatus(503), "no backend available");
        };
        ctx.attempts += 1;
        ctx.backend = Some(lease.backend);
        let backend = &snapshot.backends[lease.backend];
        let Some(addr) = backend.state.address.get() else {
            // Its name stopped resolving since the lease was taken (a reload moved it).
            ctx.failure = Some(ctx.no_backend());
            return Error::e_explain(ErrorType::HTTPStatus(503), "backend has no address");
        };
        let timeouts = &snapshot.config.timeouts;
        let mut peer = crate::tls::http_peer(addr, &backend.upstream);
        peer.options.connection_timeout = Some(timeouts.connect);
        // pingora's one per-read timeout: the larger of the two; `watch` enforces both.
        peer.options.read_timeout = Some(timeouts.first_byte().max(timeouts.idle()));
        peer.options.write_timeout = Some(timeouts.write);
        peer.options.idle_timeout = Some(timeouts.upstream_keepalive);
        peer.options.keep_h1_response_header_case = snapshot.config.preserve_header_case;
        Ok(Box::new(peer))
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Self::CTX,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let Some(lease) = ctx.lease.take() {
            if let Some(snapshot) = &ctx.snapshot {
                snapshot.report(lease.backend, Err(AttemptFailure::Connect(e.to_string())));
            }
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

    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        _reused: bool,
        _peer: &HttpPeer,
        fd: std::os::unix::io::RawFd,
        digest: Option<&pingora::protocols::Digest>,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        let timeouts = ctx.snapshot.as_ref().map(|s| &s.config.timeouts);
        ctx.upstream_watch = timeouts.filter(|t| !t.per_read()).and_then(|t| {
            // The connection's own digest, so that its duplicate descriptor is made once per
            // connection; a stream without one gets a digest for this attempt alone.
            let socket = digest
                .and_then(|d| d.socket_digest.clone())
                .unwrap_or_else(|| Arc::new(pingora::protocols::SocketDigest::from_raw_fd(fd)));
            watch::UpstreamWatch::start(socket, t.first_byte(), t.idle())
        });
        Ok(())
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if let (true, Some(body)) = (ctx.body_rewritten, &ctx.held_body) {
            if upstream_request
                .headers
                .contains_key(http::header::CONTENT_LENGTH)
            {
                upstream_request.insert_header(http::header::CONTENT_LENGTH, body.len())?;
            }
        }
        if ctx.continue_answered {
            upstream_request.remove_header(&http::header::EXPECT);
        }
        // A backend with an API key of its own gets it in place of the client's.
        let auth = ctx.lease.as_ref().zip(ctx.snapshot.as_ref());
        if let Some(auth) = auth.and_then(|(l, s)| s.backends[l.backend].upstream.auth.as_ref()) {
            upstream_request.insert_header(http::header::AUTHORIZATION, auth.header().clone())?;
        }
        // Hop-by-hop fields, and those the client's `Connection` header names, are gone
        // already: pingora strips them before this hook (its standard upstream request policy,
        // vendor/README.md, pingora-proxy's second change).
        // The id goes on as the header's one value: gpulb's own, or the client's unless its
        // `Connection` header listed it (then it is put back).
        if let (Some(id), Some(snap)) = (&ctx.request_id, &ctx.snapshot) {
            let name = &snap.config.compiled.request_id_header;
            // A fresh id replaces whatever the client sent under that name, unlooked at.
            if id.is_fresh() || !id.is_alone_in(upstream_request.headers.get_all(name)) {
                upstream_request.insert_header_name(name, id.value())?;
            }
        }
        if let Some(client) = session.client_addr().and_then(|a| a.as_inet()) {
            const XFF: http::HeaderName = http::HeaderName::from_static(headers::X_FORWARDED_FOR);
            let chain = headers::forwarded_for(upstream_request.headers.get(XFF), client.ip());
            upstream_request.insert_header_name(&XFF, chain)?;
        }
        const XFP: http::HeaderName = http::HeaderName::from_static(headers::X_FORWARDED_PROTO);
        let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        upstream_request.insert_header_name(&XFP, headers::forwarded_proto(tls))?;
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if let Some(retry) = refused::retry_elsewhere(session, upstream_response, ctx) {
            return Err(retry);
        }
        ctx.first_byte = Some(Instant::now());
        stored::watch(session, upstream_response, ctx);
        for name in headers::hop_by_hop(&upstream_response.headers) {
            upstream_response.remove_header(&name);
        }
        if headers::framing_forbidden(upstream_response.status) {
            upstream_response.remove_header(&http::header::CONTENT_LENGTH);
            upstream_response.remove_header(&http::header::TRANSFER_ENCODING);
        } else if headers::must_unchunk(session.req_header().version, &upstream_response.headers) {
            upstream_response.remove_header(&http::header::TRANSFER_ENCODING);
            // The body ends where the connection does; the answer says `Connection: close`.
            session.set_keepalive(None);
        }
        if let (Some(lease), Some(snap)) = (&ctx.lease, &ctx.snapshot) {
            let status = upstream_response.status;
            if status.is_server_error() {
                snap.report(
                    lease.backend,
                    Err(AttemptFailure::ServerError(status.as_u16())),
                );
            } else {
                snap.report(lease.backend, Ok(()));
            }
            ctx.outcome_reported = true;
        }
        if let Some(id) = &ctx.request_id {
            upstream_response.insert_header_name(&ctx.id_header(), id.value())?;
        }
        Ok(())
    }

    /// A backend's refusal sent to another backend is counted
    /// (`gpulb_backend_refusals_retried_total`), not logged as pingora's retry warning.
    fn suppress_proxy_warn_log(
        &self,
        _session: &Session,
        _ctx: &Self::CTX,
        error: &Error,
        context: ProxyWarnLogContext,
    ) -> bool {
        matches!(context, ProxyWarnLogContext::UpstreamRetry) && refused::is_refusal(error)
    }

    /// pingora's own rule (no retry once a non-idempotent request was sent, or when its body
    /// cannot be sent again), except for a backend's refusal that [`refused::retry_elsewhere`]
    /// turned into a retry: that one goes to the backend it chose.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        _ctx: &mut Self::CTX,
        client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        if refused::is_refusal(&e) {
            e.set_retry(true);
        } else if !session.req_header().method.is_idempotent()
            || session.as_ref().retry_buffer_truncated()
        {
            e.set_retry(false);
        } else {
            e.retry.decide_reuse(client_reused);
        }
        e
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Self::CTX,
    ) -> FailToProxy {
        let expired = ctx.upstream_watch.as_ref().and_then(|w| w.expired());
        let failure = match expired {
            Some(expired) => Some(ProxyError::UpstreamTimeout(expired.to_string())),
            None => ctx.failure.take().or_else(|| ProxyError::from_pingora(e)),
        };
        let failure = blame::client_or_backend(session, e, failure, ctx.snapshot.as_deref());
        if failure == Some(ProxyError::ClientGone) {
            ctx.failure = failure;
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        if let (
            Some(ProxyError::UpstreamTimeout(cause) | ProxyError::UpstreamFailed(cause)),
            Some(lease),
            Some(snap),
            false,
        ) = (&failure, &ctx.lease, &ctx.snapshot, ctx.outcome_reported)
        {
            snap.report(lease.backend, Err(AttemptFailure::Broken(cause.clone())));
        }
        // The client learns which backend failed by its configured name, never its address
        // or the bytes it sent; the detail stays in the debug log below.
        let backend_name = ctx
            .backend
            .zip(ctx.snapshot.as_deref())
            .and_then(|(i, s)| s.backends.get(i))
            .map_or("(none)", |b| b.state.name.as_str());
        let failure = failure.map(|f| match (f, expired) {
            // gpulb's own deadline: its cause, which holds no address, is worth saying.
            (f @ (ProxyError::UpstreamTimeout(_) | ProxyError::TunnelIdle(_)), Some(expired)) => {
                f.with_backend_text(format!("{backend_name:?} ({expired})"))
            }
            (f, _) => f.naming_backend(backend_name),
        });
        let code = match &failure {
            Some(error) if respond::answer_written(session).is_none() => {
                // The connection closes after this answer: say so, or a client reusing it
                // would meet a reset.
                session.set_keepalive(None);
                if let Err(write_error) = respond_error(session, ctx, error).await {
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

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        _end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        body::replay(ctx.held_body.as_ref(), body);
        if let Some(watch) = &ctx.upstream_watch {
            watch.request_sent();
        }
        Ok(())
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<std::time::Duration>> {
        if let Some(watch) = &ctx.upstream_watch {
            watch.received(body.as_ref().is_some_and(|b| !b.is_empty()), end_of_stream);
        }
        Ok(None)
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        _end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<std::time::Duration>> {
        let non_empty = body.as_ref().is_some_and(|b| !b.is_empty());
        if ctx.first_body_byte.is_none() && non_empty {
            ctx.first_body_byte = Some(Instant::now());
        }
        if let Some(watch) = &ctx.upstream_watch {
            watch.forwarded(non_empty);
        }
        if let (Some(_), Some(chunk)) = (&ctx.facts, body.as_ref()) {
            ctx.tail.feed(chunk);
        }
        if let Some(chunk) = body.as_ref() {
            stored::feed(chunk, ctx);
        }
        Ok(None)
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Self::CTX) {
        finish::record(session, e, ctx, self.access_log);
        crate::connections::mark_idle(session);
        // Release now rather than when pingora drops the context; `Drop` covers the paths
        // (shutdown, cancelled futures) where this hook never runs.
        ctx.upstream_watch = None;
        ctx.lease = None;
        ctx.class_slot = None;
        ctx.tenant_slot = None;
    }
}

#[cfg(test)]
mod tests {
    use pingora::connectors::http::Connector;
    use pingora::upstreams::peer::HttpPeer;

    /// The vendored pingora-core boxes the TLS handshake (vendor/README.md, fourth change):
    /// without it the connect future is about 8.8 KiB, and every request's future, held for a
    /// whole response stream, reserves that much room for it.
    #[test]
    fn the_upstream_connect_future_does_not_carry_the_tls_handshake() {
        let connector = Connector::new(None);
        let peer = HttpPeer::new("127.0.0.1:1", false, String::new());
        let connect = connector.get_http_session(&peer);
        let size = std::mem::size_of_val(&connect);
        assert!(size < 4096, "connect future is {size} bytes");
    }
}
