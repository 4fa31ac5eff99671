//! The batching step of `request_filter`: a request its class batches joins a batch, waits for
//! its reply (leaving the batch if its client goes away first), and is answered by gpulb itself;
//! the batch's runner holds the one backend lease.

use super::ctx::RequestCtx;
use super::respond::respond_error;
use crate::batching::runner::{run, BatchJob};
use crate::batching::{Answer, BatchInput, Member, Reply};
use crate::client_watch::client_gone;
use crate::config::BatchingConfig;
use crate::error::ProxyError;
use crate::routing::Snapshot;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;
use std::sync::Arc;
use tokio::sync::oneshot;

/// The only path batched: OpenAI's embeddings.
pub const BATCH_PATH: &str = "/v1/embeddings";

/// What of the request of `ctx` a batch can carry, when its class batches it: a non-streaming
/// `POST /v1/embeddings` whose body was read, is mergeable, and fits a batch alone.
fn batchable(session: &Session, ctx: &RequestCtx, settings: &BatchingConfig) -> Option<BatchInput> {
    let req = session.req_header();
    if req.method != http::Method::POST || req.uri.path() != BATCH_PATH {
        return None;
    }
    if ctx.facts.as_ref().is_none_or(|f| f.stream) {
        return None;
    }
    let credentials = req.headers.get(http::header::AUTHORIZATION);
    let input = BatchInput::parse(ctx.held_body.as_deref()?, credentials.map(|v| v.as_bytes()))?;
    let fits = input.items.len() <= settings.max_batch
        && settings
            .max_batch_tokens
            .is_none_or(|max| input.tokens() <= max);
    fits.then_some(input)
}

/// Answers the request of `ctx` from a batch when its class batches it: `Ok(true)` when it was
/// answered here, `Ok(false)` when it goes on alone, `Err` when its client left while it waited.
pub async fn batch(
    session: &mut Session,
    ctx: &mut RequestCtx,
    snapshot: &Arc<Snapshot>,
    client: &reqwest::Client,
) -> Result<bool> {
    let Some(settings) = snapshot.config.classes[ctx.class].batching else {
        return Ok(false);
    };
    let class = &snapshot.classes[ctx.class];
    let batched = batchable(session, ctx, &settings).filter(|input| {
        // A backend slot free and no batch forming: waiting for company would only add
        // latency, so the request goes alone, as if its class did not batch. Batches form
        // when the backends are busy, which is when they pay.
        let idle = settings.send_when_idle
            && !class.state.batches.is_open(snapshot.generation, &input.key)
            && snapshot.has_room(ctx.class, &ctx.demand.route);
        !idle
    });
    let (Some(metrics), Some(input)) = (ctx.class_metrics.clone(), batched) else {
        if let Some(metrics) = &ctx.class_metrics {
            metrics.batching_request(false);
        }
        return Ok(false);
    };
    let (reply, answer) = oneshot::channel();
    let member = Member {
        input,
        tenant: ctx.tenant.to_string(),
        body: ctx.held_body.clone().unwrap_or_default(),
        reply,
    };
    let joined = class
        .state
        .batches
        .join(snapshot.generation, settings, member);
    if let Some(batch) = joined.opened {
        tokio::spawn(run(BatchJob {
            batch,
            snapshot: Arc::clone(snapshot),
            class: ctx.class,
            route: ctx.demand.route.clone(),
            path: BATCH_PATH.to_string(),
            authorization: session
                .req_header()
                .headers
                .get(http::header::AUTHORIZATION)
                .cloned(),
            metrics: Arc::clone(&metrics),
            client: client.clone(),
        }));
    }
    let membership = joined.membership;
    // `biased`: an answer already there is taken before the client watch starts.
    let reply = tokio::select! {
        biased;
        reply = answer => reply,
        () = client_gone(session) => {
            drop(membership);
            ctx.failure = Some(ProxyError::ClientGone);
            return Error::e_explain(ErrorType::ConnectionClosed, "client went away while its batch formed")
                .map_err(|e| e.into_down());
        }
    };
    drop(membership);
    metrics.batching_request(true);
    let Reply { backend, outcome } = reply.unwrap_or_else(|_| Reply {
        backend: None,
        outcome: Err(ProxyError::Internal(
            "its batch ended without an answer".into(),
        )),
    });
    ctx.backend = backend;
    match outcome {
        Ok(answer) => respond(session, ctx, answer).await?,
        Err(error) => {
            respond_error(session, ctx, &error).await?;
            ctx.failure = Some(error);
        }
    }
    Ok(true)
}

/// Writes a member's own answer, with its request id.
async fn respond(session: &mut Session, ctx: &mut RequestCtx, answer: Answer) -> Result<()> {
    let mut resp = ResponseHeader::build(answer.status, Some(answer.headers.len() + 2))?;
    for (name, value) in answer.headers {
        resp.append_header(name, value)?;
    }
    resp.insert_header(http::header::CONTENT_LENGTH, answer.body.len())?;
    if let Some(id) = &ctx.request_id {
        resp.insert_header_name(&ctx.id_header(), id.value())?;
    }
    ctx.tail.feed(&answer.body);
    ctx.first_body_byte = Some(std::time::Instant::now());
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::clone(&answer.body)), true)
        .await
}
