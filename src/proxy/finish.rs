//! The end of a request: one metrics record and one access-log line, whatever happened.

use super::ctx::RequestCtx;
use crate::access_log::{self, AccessRecord};
use crate::error::ProxyError;
use crate::headers::RequestId;
use pingora::prelude::*;
use pingora::proxy::Session;
use std::time::Instant;

/// Feeds a successful request's time on its backend, and its size, to speed-aware placement
/// (every class records: a class placed by speed borrows what the others measured of a backend).
fn record_service_time(session: &Session, ctx: &RequestCtx, now: Instant) {
    let (Some(snapshot), Some(lease)) = (&ctx.snapshot, &ctx.lease) else {
        return;
    };
    if let (Some(class), Some(backend)) = (
        snapshot.classes.get(ctx.class),
        snapshot.backends.get(lease.backend),
    ) {
        class.state.service_times.record(
            &backend.state.name,
            now.saturating_duration_since(lease.taken_at),
            session.body_bytes_sent() as u64,
            now,
        );
    }
}

/// Records the finished request of `ctx` in the metrics and, when `access_log`, the access log.
pub fn record(session: &Session, e: Option<&Error>, ctx: &RequestCtx, access_log: bool) {
    let now = Instant::now();
    let started = ctx.started.unwrap_or(now);
    let duration = now.saturating_duration_since(started);
    let ttfb = ctx
        .first_body_byte
        .map(|t| t.saturating_duration_since(started));
    let status = match (super::respond::answer_written(session), &ctx.failure) {
        (Some(resp), _) => resp.status.as_u16(),
        (None, Some(failure)) => failure.status(),
        // Nothing was answered: the client left (nginx's 499).
        (None, None) => 499,
    };
    let snapshot = ctx.snapshot.as_deref();
    let backend = ctx
        .backend
        .zip(snapshot)
        .and_then(|(i, s)| s.backends.get(i))
        .map(|b| b.state.name.as_str());
    if let Some(class) = &ctx.class_metrics {
        class.request_finished(backend, status, duration, ttfb);
        if let Some(facts) = &ctx.facts {
            let usage = ctx.tail.usage();
            class.body_finished(ctx.model.as_deref(), facts.prompt_tokens, usage);
        }
    }
    if ctx.failure.is_none() && e.is_none() && (200..300).contains(&status) {
        record_service_time(session, ctx, now);
    }
    if !access_log {
        return;
    }
    let reason = match (&ctx.failure, e) {
        (Some(failure), _) => Some(failure.code()),
        (None, Some(error)) => {
            Some(ProxyError::from_pingora(error).map_or("client_gone", |f| f.code()))
        }
        (None, None) => None,
    };
    let class = snapshot
        .and_then(|s| s.classes.get(ctx.class))
        .map_or("", |c| c.name.as_str());
    let req = session.req_header();
    access_log::log(&AccessRecord {
        request_id: ctx.request_id.as_ref().map_or("", RequestId::as_str),
        method: req.method.as_str(),
        path: req.uri.path(),
        class,
        tenant: &ctx.tenant,
        backend,
        status,
        queue_wait: ctx.class_slot.as_ref().map(|_| ctx.queued_for),
        ttfb,
        duration,
        bytes_sent: session.body_bytes_sent() as u64,
        attempts: ctx.attempts,
        reason,
        model: ctx.model.as_deref(),
        body: ctx.facts.as_ref(),
    });
}
