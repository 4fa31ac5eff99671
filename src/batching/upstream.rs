//! One HTTP exchange between gpulb and a backend on behalf of a batch (or of one of its members
//! sent alone): the body goes out whole, the answer comes back whole.

use super::assembly::Answer;
use crate::config::{Timeouts, Upstream};
use crate::error::ProxyError;
use crate::health::AttemptFailure;
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::HeaderValue;
use std::net::SocketAddr;

/// Headers of a backend's answer that describe its framing on that connection, not the answer.
fn is_framing(name: &http::HeaderName) -> bool {
    [CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING].contains(name) || name.as_str() == "keep-alive"
}

/// How an exchange failed: for the outlier detector, and for the clients.
#[derive(Debug)]
pub struct CallFailed {
    /// Nothing was sent (the connection could not be made): another backend may be tried.
    pub connect: bool,
    /// What the outlier detector hears.
    pub attempt: AttemptFailure,
    /// What the members are answered.
    pub error: ProxyError,
}

/// The client every batch's exchanges share (one connection pool per process).
pub fn client(timeouts: &Timeouts) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(timeouts.connect)
        .pool_idle_timeout(timeouts.upstream_keepalive)
        .build()
        .unwrap_or_default()
}

/// POSTs `body` as JSON to `path` on backend `upstream` at `addr` (with `client`, or over TLS
/// as its `tls` keys say), with the client's `authorization`.
pub async fn post(
    client: &reqwest::Client,
    upstream: &Upstream,
    addr: SocketAddr,
    path: &str,
    body: Vec<u8>,
    authorization: Option<&HeaderValue>,
    timeouts: &Timeouts,
) -> Result<Answer, CallFailed> {
    let target = crate::tls::target(upstream, addr, client).map_err(|detail| CallFailed {
        connect: true,
        attempt: AttemptFailure::Connect(detail.clone()),
        error: ProxyError::UpstreamUnreachable(detail),
    })?;
    let mut request = target
        .request(reqwest::Method::POST, &format!("{}{path}", target.base))
        .header(http::header::CONTENT_TYPE, "application/json")
        .timeout(timeouts.first_byte() + timeouts.idle())
        .body(body);
    // The members' own key goes on unless the backend has one of its own.
    if let (Some(value), false) = (authorization, target.has_auth()) {
        request = request.header(http::header::AUTHORIZATION, value.clone());
    }
    let failed = |e: reqwest::Error| {
        let detail = e.to_string();
        if e.is_connect() {
            CallFailed {
                connect: true,
                attempt: AttemptFailure::Connect(detail.clone()),
                error: ProxyError::UpstreamUnreachable(detail),
            }
        } else if e.is_timeout() {
            CallFailed {
                connect: false,
                attempt: AttemptFailure::Broken(detail.clone()),
                error: ProxyError::UpstreamTimeout(detail),
            }
        } else {
            CallFailed {
                connect: false,
                attempt: AttemptFailure::Broken(detail.clone()),
                error: ProxyError::UpstreamFailed(detail),
            }
        }
    };
    let response = request.send().await.map_err(failed)?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .filter(|(name, _)| !is_framing(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let body = response.bytes().await.map_err(failed)?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}
