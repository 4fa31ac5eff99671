//! Learning which backend stored each response of the Responses API: the id at the start of a
//! successful answer to `POST /v1/responses` is recorded with the backend that gave it, so the
//! requests that name it later go there ([`crate::routing::responses`]).

use super::ctx::RequestCtx;
use crate::routing::responses::{self, ResponseIdScan};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

/// Starts looking for the response id in an answer that creates a stored response; remembers
/// the backend that took a request naming a stored response nobody was known to hold.
pub fn watch(session: &Session, response: &ResponseHeader, ctx: &mut RequestCtx) {
    if let (Some(id), true) = (&ctx.seeking_response, response.status.is_success()) {
        if let (Some(lease), Some(snapshot)) = (&ctx.lease, &ctx.snapshot) {
            snapshot
                .responses
                .record(id, snapshot.backends[lease.backend].state.id);
        }
    }
    let req = session.req_header();
    if response.status.is_success()
        && req.method == http::Method::POST
        && responses::creates_responses(req.uri.path())
    {
        ctx.response_id = Some(ResponseIdScan::default());
    }
}

/// Looks through the next chunk of the answer for its id; records it once found.
pub fn feed(chunk: &[u8], ctx: &mut RequestCtx) {
    let Some(scan) = ctx.response_id.as_mut() else {
        return;
    };
    let Some(found) = scan.feed(chunk) else {
        return;
    };
    ctx.response_id = None;
    if let (Ok(id), Some(lease), Some(snapshot)) = (found, &ctx.lease, &ctx.snapshot) {
        let owner = snapshot.backends[lease.backend].state.id;
        snapshot.responses.record(&id, owner);
    }
}
