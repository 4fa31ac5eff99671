//! A backend's refusal of work it has not started (a status in `retry_statuses`, such as TGI's
//! `429` past `--max-concurrent-requests`): while nothing has reached the client, the request
//! goes to another backend of its pool instead, the way a connect failure does.

use super::ctx::RequestCtx;
use pingora::prelude::*;
use pingora::proxy::Session;

/// The type of the error that ends a refused attempt: pingora retries it
/// (`error_while_proxy`) and does not log it as a failure (`suppress_proxy_warn_log`).
pub const BACKEND_REFUSED: ErrorType = ErrorType::new("BackendRefused");

/// Whether `e` ends an attempt [`retry_elsewhere`] turned into a retry.
pub fn is_refusal(e: &Error) -> bool {
    *e.etype() == BACKEND_REFUSED
}

/// The error that ends this attempt so that pingora tries again, when the backend's `status` is
/// a refusal to retry and another backend can take the request now (its lease is taken here,
/// the refusing backend's released and never chosen again for this request). `None`: the
/// answer goes to the client as it is — not a refusal, the retries spent, a body that cannot
/// be sent again, or no other backend free.
pub fn retry_elsewhere(
    session: &mut Session,
    status: u16,
    ctx: &mut RequestCtx,
) -> Option<Box<Error>> {
    let config = &ctx.snapshot.as_ref()?.config;
    if !config.retry_statuses.contains(&status) || ctx.failed.len() >= config.connect_retries {
        return None;
    }
    let snapshot = std::sync::Arc::clone(ctx.snapshot.as_ref()?);
    let refusing = ctx.lease.as_ref()?.backend;
    // The body goes again from what gpulb holds; one that streamed through is gone.
    if ctx.held_body.is_none() && !session.as_mut().is_body_empty() {
        return None;
    }
    let mut excluded = ctx.failed.clone();
    excluded.push(refusing);
    let next = snapshot.acquire_for_class(ctx.class, &ctx.demand, &excluded)?;
    let counter = &snapshot.backends[refusing].state.refusals_retried_total;
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ctx.failed = excluded;
    ctx.lease = Some(next);
    ctx.first_byte = None;
    // Counted in `gpulb_backend_refusals_retried_total` (pingora's retry warning is not logged).
    tracing::debug!(request_id = ?ctx.request_id, status, backend = refusing, "backend refused; trying another");
    Some(Error::explain(
        BACKEND_REFUSED,
        format!("backend answered {status} before starting the request"),
    ))
}
