//! Answers the proxy writes itself: OpenAI-shaped errors, with request id and `Retry-After`.

use super::ctx::RequestCtx;
use crate::error::ProxyError;
use crate::headers::RequestId;
use bytes::Bytes;
use http::HeaderValue;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;

/// The final response header written to the client, if one was: a `100 Continue` gpulb sent
/// before reading the body is not the answer, and an error can still follow it; a `101
/// Switching Protocols` is (what follows it is the upgraded protocol's, never an HTTP error).
pub fn answer_written(session: &Session) -> Option<&ResponseHeader> {
    session.response_written().filter(|resp| {
        !resp.status.is_informational() || resp.status == http::StatusCode::SWITCHING_PROTOCOLS
    })
}

/// Writes an answer of gpulb's own: `status`, the JSON `body`, the request id and, when given,
/// `Retry-After`.
pub async fn respond_json(
    session: &mut Session,
    ctx: &RequestCtx,
    status: u16,
    body: Bytes,
    retry_after: Option<u64>,
) -> Result<()> {
    let mut resp = ResponseHeader::build(status, Some(4))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", body.len().to_string())?;
    if let Some(seconds) = retry_after {
        resp.insert_header("retry-after", seconds.to_string())?;
    }
    if let Some(id) = &ctx.request_id {
        resp.insert_header_name(&ctx.id_header(), id.value())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    // For a HEAD request pingora sends the header alone (its body writer takes no bytes).
    session.write_response_body(Some(body), true).await
}

/// Writes the error response for `error`.
pub async fn respond_error(
    session: &mut Session,
    ctx: &RequestCtx,
    error: &ProxyError,
) -> Result<()> {
    let body = Bytes::from(error.body());
    respond_json(session, ctx, error.status(), body, error.retry_after()).await
}

/// Answers `error` as the end of the request (recorded as its failure); `Ok(true)` tells
/// pingora the response is written.
pub async fn refuse(
    session: &mut Session,
    ctx: &mut RequestCtx,
    error: ProxyError,
) -> Result<bool> {
    respond_error(session, ctx, &error).await?;
    ctx.failure = Some(error);
    Ok(true)
}

/// The client's request id (`client`, the request id field's value: up to 128 bytes) or a
/// fresh one; `upstream_request_filter` sends it on.
pub fn request_id(client: Option<&HeaderValue>) -> RequestId {
    client
        .and_then(RequestId::from_client)
        .unwrap_or_else(RequestId::fresh)
}
