//! Whose fault a failed exchange was: a backend that went silent while the client had not
//! finished sending its body was waiting on the client, so the client is answered 408 and the
//! backend is not counted against (no outlier ejection for a client's stall). A tunnel (an
//! upgraded connection) cut for its quietness is nobody's fault either.

use crate::error::ProxyError;
use crate::routing::Snapshot;
use pingora::proxy::Session;
use pingora::{Error, ErrorSource, ErrorType};

/// `failure` as the client should see it: a timeout on either side while the request body is
/// still incomplete becomes `body_timeout` (408), never an upstream fault; after a `101`, the
/// backend's silence is a quiet tunnel (`tunnel_idle`), whose client side never ends.
pub fn client_or_backend(
    session: &mut Session,
    error: &Error,
    failure: Option<ProxyError>,
    snapshot: Option<&Snapshot>,
) -> Option<ProxyError> {
    let client_body = snapshot.map_or_else(Default::default, |s| s.config.timeouts.client_body);
    let downstream_stalled =
        error.esource() == &ErrorSource::Downstream && error.etype() == &ErrorType::ReadTimedout;
    let upgraded = session.as_downstream().was_upgraded();
    match failure {
        Some(ProxyError::UpstreamTimeout(cause)) if upgraded => Some(ProxyError::TunnelIdle(cause)),
        None if downstream_stalled => Some(ProxyError::BodyTimeout(client_body)),
        Some(ProxyError::UpstreamTimeout(_)) if !session.as_downstream_mut().is_body_done() => {
            Some(ProxyError::BodyTimeout(client_body))
        }
        other => other,
    }
}
