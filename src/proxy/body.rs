//! Reading a request's body before a backend is chosen, and replaying it upstream.
//!
//! Every body whose `Content-Length` is within `request_body.max_bytes` is read whole before the
//! request takes a backend slot (nginx's way), under the `timeouts.client_body` deadline: a
//! client that stalls its upload gets 408 and never holds a GPU slot. Only the bodies of
//! `request_body.paths` are parsed as JSON requests; the rest are held as bytes.
//!
//! pingora forwards a body read in `request_filter` only through its retry buffer, which holds
//! 64 KiB and is dropped whole once more is written to it. So once the body is in, the buffer is
//! made to hold the body's last byte (vendor/README.md, pingora-core's fifteenth change), pingora
//! sends it as the first (and, the body being done, only) piece of the upstream body, and
//! `request_body_filter` puts the whole held body in its place ([`replay`]). The bytes are
//! forwarded exactly as received, chunked bodies (whose end is known only once read) up to the
//! same limit as the others.

use super::body_budget::BodyBudget;
use super::heads::BodyHeads;
use crate::config::{Config, OverLimit};
use crate::error::ProxyError;
use crate::request::{self, BodyError, BodyFacts};
use bytes::{Bytes, BytesMut};
use pingora::prelude::*;
use pingora::proxy::Session;
use tokio::time::{timeout_at, Instant};

/// A request body as read before routing.
#[derive(Debug)]
pub enum Body {
    /// Not read: no body, chunked on a path whose body is not parsed, or over the limit and
    /// forwarded as is.
    Unread,
    /// Read whole and held for the upstream, not parsed (not a JSON request path).
    Buffered(Bytes),
    /// Read whole and held for the upstream; what it says, or why it is not a request.
    Held {
        /// The bytes received.
        bytes: Bytes,
        /// Its facts, or why it could not be read as a request.
        facts: Result<BodyFacts, BodyError>,
    },
}

/// Whether `config` has gpulb parse the body of this request: a configured path, and a content
/// type that can be JSON (`heads`).
fn parsed(session: &Session, config: &Config, heads: BodyHeads) -> bool {
    let path = session.req_header().uri.path();
    heads.may_be_json && config.request_body.paths.iter().any(|p| p == path)
}

/// Reads the body of a request `config` wants read, framed as `heads` says, its bytes taken
/// from the process's body budget into `budget`. `Ok(Err(..))` is an answer for the client
/// (413, 408, 503); `Err` is a failure of the client connection.
pub async fn read(
    session: &mut Session,
    config: &Config,
    heads: BodyHeads,
    budget: &mut BodyBudget,
) -> Result<Result<Body, ProxyError>> {
    if session.as_downstream_mut().is_body_empty() {
        return Ok(Ok(Body::Unread));
    }
    let parse = parsed(session, config, heads);
    let max = config.request_body.max_bytes;
    let length = heads.content_length;
    match length {
        Some(size) if size > max => {
            return Ok(match config.request_body.over_limit {
                OverLimit::Reject if parse => Err(ProxyError::BodyTooLarge {
                    size,
                    limit: max,
                    chunked: false,
                }),
                _ => Ok(Body::Unread),
            });
        }
        // A chunked upload has no known end: it streams, its stalls bounded per read.
        None if !parse => return Ok(Ok(Body::Unread)),
        _ => {}
    }
    let held_limit = config.request_body.held_limit();
    // A body of known length takes its share before a byte is read (or a `100 Continue` asks for
    // it); a chunked one as its pieces come.
    if length.is_some_and(|n| !budget.take(n, held_limit)) {
        return Ok(Err(ProxyError::BodyMemoryFull(held_limit)));
    }
    if heads.expect_continue {
        continue_upload(session).await?;
    }
    let limit = length.map_or(max, |n| n.min(max));
    let started = Instant::now();
    let mut left = config.timeouts.client_body;
    let mut held = BytesMut::with_capacity(length.unwrap_or(0).min(limit));
    loop {
        // pingora's timeout makes its timer only if the read waits: a body that came in with
        // the header (most of them) is read without one.
        let chunk = match pingora_timeout::timeout(left, session.read_request_body()).await {
            Err(_) => return Ok(Err(ProxyError::BodyTimeout(config.timeouts.client_body))),
            Ok(read) => read?,
        };
        let Some(chunk) = chunk else { break };
        if held.len() + chunk.len() > limit {
            let size = held.len() + chunk.len();
            let chunked = length.is_none();
            return Ok(Err(ProxyError::BodyTooLarge {
                size,
                limit,
                chunked,
            }));
        }
        if length.is_none() && !budget.take(chunk.len(), held_limit) {
            return Ok(Err(ProxyError::BodyMemoryFull(held_limit)));
        }
        held.extend_from_slice(&chunk);
        // All of the announced length is in and pingora has marked the body done: the read that
        // would answer `None` is not needed.
        if length == Some(held.len()) && session.is_body_done() {
            break;
        }
        left = config
            .timeouts
            .client_body
            .saturating_sub(started.elapsed());
    }
    let bytes = held.freeze();
    if let Some(last) = bytes.len().checked_sub(1) {
        // pingora needs a piece in its buffer to send; `replay` swaps in the whole body, so one
        // byte is enough, and copying more would cost as much again as the read.
        session
            .as_downstream_mut()
            .reset_retry_buffer(&bytes.slice(last..));
    }
    if !parse {
        return Ok(Ok(Body::Buffered(bytes)));
    }
    let facts = request::parse(&bytes);
    Ok(Ok(Body::Held { bytes, facts }))
}

/// Tells a client that waits for `100 Continue` before it sends its body (curl does for bodies
/// over 1 MiB, and so do .NET's and Java's HTTP clients) to send it now: gpulb reads the body
/// before any backend is asked, so no backend's `100` could reach the client, which would wait
/// out its own timeout (1 s for curl) first. nginx answers the expectation the same way when it
/// reads a body. pingora closes a connection whose answer is written before the request body
/// ended; a `100` is not the answer, so that rule is lifted while it is written.
async fn continue_upload(session: &mut Session) -> Result<()> {
    let downstream = session.as_downstream_mut();
    downstream.set_close_on_response_before_downstream_finish(false);
    let written = downstream.write_continue_response().await;
    downstream.set_close_on_response_before_downstream_finish(true);
    written
}

/// Puts the held body in place of what pingora is about to send upstream (the one byte of it
/// left in its retry buffer); nothing changes for a body that was not held.
pub fn replay(held: Option<&Bytes>, body: &mut Option<Bytes>) {
    if let (Some(held), Some(piece)) = (held, body.as_mut()) {
        *piece = held.clone();
    }
}

/// How long a refused request's unread body is read and dropped before the connection closes.
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);
/// The most of a refused request's unread body read and dropped before the connection closes.
const LINGER_BYTES: usize = 1024 * 1024;

/// After an answer that left part of the request body unread, reads and drops what the client
/// still sends (at most [`LINGER_BYTES`], for at most [`LINGER`]) before the connection closes:
/// closing on unread bytes resets the connection, and a client still sending would meet the
/// reset instead of the answer (nginx's lingering close).
pub async fn linger(session: &mut Session) {
    let deadline = Instant::now() + LINGER;
    let mut left = LINGER_BYTES;
    while left > 0 && !session.is_body_done() {
        match timeout_at(deadline, session.read_request_body()).await {
            Ok(Ok(Some(chunk))) => left = left.saturating_sub(chunk.len()),
            _ => return,
        }
    }
}
