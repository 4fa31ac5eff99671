//! A backend's refusal of work it has not started (a status in `retry_statuses`, such as TGI's
//! `429` past `--max-concurrent-requests`), or its `404` for a stored response (Responses API)
//! that gpulb does not know the holder of (another replica's, or from before a restart): while
//! nothing has reached the client, the request goes to another backend of its pool instead,
//! the way a connect failure does — within `connect_retries` for a refusal, on every backend
//! with room in turn for a stored response.

use super::ctx::RequestCtx;
use crate::health::now_ms;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;
use std::time::Duration;

/// How long a refusing backend is passed over when its answer has no `Retry-After` in seconds.
pub const REFUSAL_COOLDOWN: Duration = Duration::from_secs(1);

/// The longest `Retry-After` honoured: a refusing backend is tried again this soon at the latest.
pub const MAX_REFUSAL_COOLDOWN: Duration = Duration::from_secs(60);

/// The type of the error that ends a refused attempt: pingora retries it
/// (`error_while_proxy`) and does not log it as a failure (`suppress_proxy_warn_log`).
pub const BACKEND_REFUSED: ErrorType = ErrorType::new("BackendRefused");

/// Whether `e` ends an attempt [`retry_elsewhere`] turned into a retry.
pub fn is_refusal(e: &Error) -> bool {
    *e.etype() == BACKEND_REFUSED
}

/// The error that ends this attempt so that pingora tries again, when the backend's `response`
/// is a refusal to retry and another backend can take the request now (its lease is taken here,
/// the refusing backend's released and never chosen again for this request). `None`: the
/// answer goes to the client as it is — not a refusal, the retries spent, a body that cannot
/// be sent again, or no other backend free. A refusal, retried or not, also keeps the backend
/// out of first choice for a while ([`cooldown`]); any other answer ends that.
pub fn retry_elsewhere(
    session: &mut Session,
    response: &ResponseHeader,
    ctx: &mut RequestCtx,
) -> Option<Box<Error>> {
    let status = response.status.as_u16();
    let refusing = ctx.lease.as_ref()?.backend;
    let snapshot = ctx.snapshot.as_ref()?;
    let state = &snapshot.backends[refusing].state;
    // A stored response nobody is known to hold is looked for on every backend in turn.
    let not_held_here = status == 404 && ctx.seeking_response.is_some();
    if !not_held_here {
        if !snapshot.config.retry_statuses.contains(&status) {
            state.note_accepted();
            return None;
        }
        state.note_refusal(now_ms(), cooldown(response));
        if ctx.failed.len() >= snapshot.config.connect_retries {
            return None;
        }
    }
    let snapshot = std::sync::Arc::clone(snapshot);
    let state = &snapshot.backends[refusing].state;
    // The body goes again from what gpulb holds; one that streamed through is gone.
    if ctx.held_body.is_none() && !session.as_mut().is_body_empty() {
        return None;
    }
    let mut excluded = ctx.failed.clone();
    excluded.push(refusing);
    let next = snapshot.acquire_for_class(ctx.class, &ctx.demand, &excluded)?;
    if !not_held_here {
        let counter = &state.refusals_retried_total;
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
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

/// How long a backend that answered `response` (a refusal) is passed over while others have
/// room: its `Retry-After` in seconds, at most [`MAX_REFUSAL_COOLDOWN`], else
/// [`REFUSAL_COOLDOWN`] (an HTTP date is not read).
fn cooldown(response: &ResponseHeader) -> Duration {
    response
        .headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .map_or(REFUSAL_COOLDOWN, |s| {
            Duration::from_secs(s).min(MAX_REFUSAL_COOLDOWN)
        })
}
