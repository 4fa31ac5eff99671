//! The first step of `request_filter`: read the body when configured, classify the request,
//! and find which backends its model allows. Anything wrong here is the client's to fix.

use super::body::{self, Body};
use super::ctx::RequestCtx;
use super::heads::BodyHeads;
use crate::error::ProxyError;
use crate::request::BodyFacts;
use crate::routing::classify::{BodyView, Envelope};
use crate::routing::{responses, Demand, ModelRefusal, Snapshot};
use pingora::prelude::*;
use pingora::proxy::Session;

/// Replaces the held body's `model` with `model` (an alias's target); the upstream request's
/// `Content-Length` follows in `upstream_request_filter`.
fn rewrite_model(ctx: &mut RequestCtx, model: &str) {
    let rewritten = ctx
        .held_body
        .as_deref()
        .and_then(|body| crate::request::with_model(body, model));
    if let Some(body) = rewritten {
        ctx.held_body = Some(body.into());
        ctx.body_rewritten = true;
    }
}

/// Fills `ctx` with the request's body (framed as `heads` says), facts, class and model route;
/// the error to answer when the body or the model is refused. `Err` is a failure of the client
/// connection.
pub async fn intake(
    session: &mut Session,
    ctx: &mut RequestCtx,
    snapshot: &Snapshot,
    heads: BodyHeads,
) -> Result<Option<ProxyError>> {
    let config = &snapshot.config;
    let read = body::read(session, config, heads, &mut ctx.body_budget).await?;
    ctx.continue_answered =
        heads.expect_continue && matches!(read, Ok(Body::Buffered(_) | Body::Held { .. }));
    let (body_error, refusal) = match read {
        Ok(Body::Unread) => (None, None),
        Ok(Body::Buffered(bytes)) => {
            ctx.held_body = Some(bytes);
            (None, None)
        }
        Ok(Body::Held { bytes, facts }) => {
            ctx.held_body = Some(bytes);
            match facts {
                Ok(facts) => {
                    let asked = facts.model.as_deref().or(config.models.default.as_deref());
                    let alias = asked.and_then(|m| config.models.aliases.get(m));
                    ctx.model = alias.map(String::as_str).or(asked).map(str::to_string);
                    if let (Some(model), true) = (alias, config.models.rewrite_aliases) {
                        rewrite_model(ctx, model);
                    }
                    ctx.facts = Some(facts);
                    (None, None)
                }
                Err(e) => (Some(e), None),
            }
        }
        Err(refusal) => (None, Some(refusal)),
    };
    let view = match (&ctx.facts, &body_error) {
        (Some(facts), _) => BodyView::Read {
            facts,
            model: ctx.model.as_deref(),
        },
        (None, Some(e)) => BodyView::Invalid(e),
        (None, None) => BodyView::Unread,
    };
    let req = session.req_header();
    let envelope = Envelope {
        method: &req.method,
        path: req.uri.path(),
        headers: &req.headers,
    };
    // A refused body still gets a class (by its envelope), for the metrics.
    let view = if refusal.is_some() {
        BodyView::Unread
    } else {
        view
    };
    ctx.class = match snapshot.classify(&envelope, view) {
        Ok(class) => class,
        Err(invalid) => {
            let error = ProxyError::InvalidBody(invalid.to_string());
            ctx.class = snapshot.default_class;
            return Ok(Some(error));
        }
    };
    if refusal.is_some() {
        return Ok(refusal);
    }
    let route = match (&ctx.facts, ctx.model.as_deref()) {
        (Some(_), None) => snapshot.unnamed_model_route(ctx.class),
        (_, model) => snapshot.model_route(ctx.class, model),
    };
    match route {
        Ok(route) => {
            let stored = stored_response(session, ctx).map(|id| {
                let owner = snapshot.responses.owner(id);
                (id.to_string(), owner)
            });
            let route = match stored {
                Some((_, Some(owner))) => snapshot
                    .stored_response_route(ctx.class, owner)
                    .unwrap_or(route),
                Some((id, None)) => {
                    ctx.seeking_response = Some(id);
                    route
                }
                None => route,
            };
            let tokens = ctx.facts.as_ref().map_or(0, BodyFacts::estimated_tokens);
            if tokens > 0 {
                snapshot.classes[ctx.class].state.note_tokens(tokens);
            }
            let prefix = ctx
                .facts
                .as_ref()
                .map_or_else(|| std::sync::Arc::from([]), |f| f.prefix.as_slice().into());
            ctx.demand = Demand {
                route,
                tokens,
                prefix,
            };
            Ok(None)
        }
        Err(ModelRefusal::NotServed(served)) => Ok(Some(ProxyError::ModelNotFound {
            model: ctx.model.clone().unwrap_or_default(),
            served,
        })),
        Err(ModelRefusal::Required(served)) => Ok(Some(ProxyError::ModelRequired(served))),
    }
}

/// The stored response (Responses API) the request names: its body's `previous_response_id`,
/// or the id in its path (`/v1/responses/{id}`).
fn stored_response<'a>(session: &'a Session, ctx: &'a RequestCtx) -> Option<&'a str> {
    let named = ctx
        .facts
        .as_ref()
        .and_then(|f| f.previous_response_id.as_deref());
    named.or_else(|| responses::id_in_path(session.req_header().uri.path()))
}
