//! OpenAI generation endpoints (completions, chat, responses): submit to the engine, answer as
//! one JSON body or as SSE events.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::mpsc;

use super::body::{json_response, Body, BoxError};
use super::engine::SubmitError;
use super::http::{error, model_not_found, read_body, Shared, MAX_BODY};
use super::openai::{self, GenRequest, Kind, RequestError};
use super::responses;
use super::Fault;

/// Handles `/v1/completions`, `/v1/chat/completions` and `/v1/responses`.
pub(crate) async fn generate(
    sh: &Shared,
    req: Request<Incoming>,
    kind: Kind,
    fault: Fault,
) -> Response<Body> {
    let body = match read_body(req, MAX_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut greq = match openai::parse_request(&body, kind, sh.default_max_tokens, &sh.models) {
        Ok(g) => g,
        Err(RequestError::Invalid(msg)) => {
            return error(StatusCode::BAD_REQUEST, &msg, "invalid_request")
        }
        Err(RequestError::NotServed(e)) => return model_not_found(&e),
    };
    if let Some(previous) = greq.previous_response_id.as_deref() {
        if !sh.responses.has(previous) {
            return responses::not_found(previous);
        }
    }
    let blocks = std::mem::take(&mut greq.prompt_blocks);
    let mut rx = match sh
        .engine
        .submit(greq.prompt_tokens, blocks, greq.max_tokens)
    {
        Ok(rx) => rx,
        Err(e @ SubmitError::TooLarge { .. }) => {
            return error(
                StatusCode::BAD_REQUEST,
                &e.to_string(),
                "context_length_exceeded",
            )
        }
        Err(e @ SubmitError::Closed) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &e.to_string(),
                "engine_stopped",
            )
        }
    };
    let prefix = match kind {
        Kind::Chat => "chatcmpl-",
        Kind::Completion => "cmpl-",
        Kind::Response => "resp_",
    };
    let id = format!(
        "{prefix}{}-{}",
        sh.name,
        sh.next_id.fetch_add(1, Ordering::Relaxed)
    );
    if kind == Kind::Response && greq.store {
        sh.responses.keep(&id);
    }
    if greq.stream {
        let die_after = match fault {
            Fault::DieMidStream { after_tokens } => Some(after_tokens),
            _ => None,
        };
        return sse_response(SseState {
            rx,
            sent: 0,
            id,
            req: greq,
            kind,
            die_after,
            usage_sent: false,
            ended: false,
        });
    }
    let mut n = 0u32;
    while rx.recv().await.is_some() {
        n += 1;
    }
    if n < greq.max_tokens {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "engine stopped mid-generation",
            "engine_stopped",
        );
    }
    json_response(StatusCode::OK, &openai::full_response(&id, &greq, kind, n))
}

struct SseState {
    rx: mpsc::UnboundedReceiver<u32>,
    sent: u32,
    id: String,
    req: GenRequest,
    kind: Kind,
    die_after: Option<u32>,
    /// The `usage` chunk of a stream asked for it went out (before `[DONE]`).
    usage_sent: bool,
    ended: bool,
}

fn sse_response(state: SseState) -> Response<Body> {
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        if st.ended {
            return None;
        }
        if st.die_after.is_some_and(|n| st.sent >= n) {
            st.ended = true;
            // Die when the next token would be emitted; yield first so hyper flushes what was sent.
            let _ = st.rx.recv().await;
            tokio::task::yield_now().await;
            let err: BoxError = "simulated worker death mid-stream".into();
            return Some((Err(err), st));
        }
        let item = match st.rx.recv().await {
            Some(i) => {
                st.sent += 1;
                Ok(openai::stream_event(&st.id, &st.req, st.kind, i))
            }
            None if st.sent >= st.req.max_tokens && st.req.include_usage && !st.usage_sent => {
                st.usage_sent = true;
                Ok(openai::usage_event(&st.id, &st.req, st.kind, st.sent))
            }
            None if st.sent >= st.req.max_tokens => {
                st.ended = true;
                Ok(openai::end_event(&st.id, &st.req, st.kind, st.sent))
            }
            None => {
                st.ended = true;
                Err(BoxError::from("engine stopped mid-stream"))
            }
        };
        Some((item.map(|s| Frame::data(Bytes::from(s))), st))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed());
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
