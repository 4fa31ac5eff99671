//! Errors the proxy answers to clients, each mapped to a status in one place.

use crate::admission::ShedReason;
use pingora::{ErrorSource, ErrorType};

/// pingora's error type for a malformed chunk in a chunked body.
const INVALID_CHUNK: ErrorType = ErrorType::new("InvalidChunk");

/// Why a request could not be served; each variant maps to one HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// Every backend of the class's pool is at its cap or unusable, and the class does not queue.
    #[error("no backend of pool {pool:?} can take a request of class {class:?} now")]
    NoBackendAvailable {
        /// The request's class.
        class: String,
        /// The class's pool.
        pool: String,
        /// Seconds the client should wait before retrying.
        retry_after: u64,
    },
    /// Admission control refused the request.
    #[error("class {class:?} shed the request: {}", shed_text(*reason, tenant))]
    Shed {
        /// The request's class.
        class: String,
        /// The request's tenant.
        tenant: String,
        /// Why.
        reason: ShedReason,
        /// Seconds the client should wait before retrying, from the queue's drain rate.
        retry_after: u64,
    },
    /// No backend could be connected to, after retries. Carries pingora's detail until
    /// [`ProxyError::naming_backend`] replaces it with the backend's configured name.
    #[error("could not connect to backend {0}")]
    UpstreamUnreachable(String),
    /// The TLS handshake with an https backend failed: its certificate is not trusted (or does
    /// not name its host), or it does not speak TLS. Named like [`ProxyError::UpstreamUnreachable`].
    #[error("TLS handshake with backend {0} failed: its certificate is not trusted by this gpulb's tls settings, or it does not speak TLS")]
    UpstreamTls(String),
    /// The backend went silent for longer than the read timeout.
    #[error("backend {0} timed out")]
    UpstreamTimeout(String),
    /// An upgraded connection (WebSocket) whose backend stayed silent past `timeouts.first_byte`
    /// or `timeouts.idle`: closed, as nginx's `proxy_read_timeout` closes one. The `101` was the
    /// answer, so nothing is written; a quiet tunnel is nobody's failure.
    #[error("the upgraded connection to backend {0} was quiet past its timeout")]
    TunnelIdle(String),
    /// The backend broke the exchange (reset, malformed response).
    #[error("backend {0} failed")]
    UpstreamFailed(String),
    /// The client went away before an answer (nothing is sent; logged as 499).
    #[error("the client went away")]
    ClientGone,
    /// The client sent something that could not be proxied.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The request body is larger than `request_body.max_bytes`.
    #[error("request body is {size} bytes{}; this server reads at most {limit} (request_body.max_bytes)", if *.chunked { " or more (chunked)" } else { "" })]
    BodyTooLarge {
        /// The body's size, or the bytes read when it stopped (a chunked body).
        size: usize,
        /// `request_body.max_bytes`.
        limit: usize,
        /// The body came without a `Content-Length`.
        chunked: bool,
    },
    /// Reading the body would take the request bodies held in memory past
    /// `request_body.max_held_bytes`.
    #[error("gpulb holds as many request body bytes as it may ({0}, request_body.max_held_bytes); retry shortly")]
    BodyMemoryFull(usize),
    /// The client did not send its whole body within `timeouts.client_body`.
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(std::time::Duration),
    /// A class rule needs the body, and the body is not a JSON request.
    #[error("{0}")]
    InvalidBody(String),
    /// No backend serves the model asked for.
    #[error("The model `{model}` does not exist or is not served here; served: {}", served.join(", "))]
    ModelNotFound {
        /// The model named in the request.
        model: String,
        /// The models served now, sorted.
        served: Vec<String>,
    },
    /// The body names no model, and the backends of its class serve different ones.
    #[error("The request names no model, and this address serves several: {}; name one in the body's \"model\"", .0.join(", "))]
    ModelRequired(Vec<String>),
    /// Tenants come from API keys, and the request has no known key (`tenants.reject_unknown`).
    #[error("missing or unknown API key; send Authorization: Bearer <key>")]
    Unauthorized,
    /// The process is shutting down and takes no new requests.
    #[error("this gpulb is shutting down; retry on another")]
    ShuttingDown,
    /// A fault inside the proxy.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ProxyError {
    /// HTTP status sent to the client.
    pub fn status(&self) -> u16 {
        match self {
            ProxyError::NoBackendAvailable { .. } => 503,
            ProxyError::Shed { reason, .. } => reason.status(),
            ProxyError::UpstreamUnreachable(_)
            | ProxyError::UpstreamTls(_)
            | ProxyError::UpstreamFailed(_) => 502,
            ProxyError::UpstreamTimeout(_) | ProxyError::TunnelIdle(_) => 504,
            ProxyError::BadRequest(_)
            | ProxyError::InvalidBody(_)
            | ProxyError::ModelRequired(_) => 400,
            ProxyError::ModelNotFound { .. } => 404,
            ProxyError::BodyTimeout(_) => 408,
            ProxyError::BodyTooLarge { .. } => 413,
            ProxyError::ShuttingDown | ProxyError::BodyMemoryFull(_) => 503,
            ProxyError::ClientGone => 499,
            ProxyError::Unauthorized => 401,
            ProxyError::Internal(_) => 500,
        }
    }

    /// Machine-readable code for the OpenAI-shaped error body.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::NoBackendAvailable { .. } => "no_backend_available",
            ProxyError::Shed { reason, .. } => reason.as_str(),
            ProxyError::UpstreamUnreachable(_) => "upstream_unreachable",
            ProxyError::UpstreamTls(_) => "upstream_tls_failed",
            ProxyError::UpstreamTimeout(_) => "upstream_timeout",
            ProxyError::TunnelIdle(_) => "tunnel_idle",
            ProxyError::UpstreamFailed(_) => "upstream_failed",
            ProxyError::BadRequest(_) => "bad_request",
            ProxyError::InvalidBody(_) => "invalid_body",
            ProxyError::ModelNotFound { .. } => "model_not_found",
            ProxyError::ModelRequired(_) => "model_required",
            ProxyError::BodyTimeout(_) => "body_timeout",
            ProxyError::BodyTooLarge { .. } => "body_too_large",
            ProxyError::BodyMemoryFull(_) => "body_memory_full",
            ProxyError::ShuttingDown => "shutting_down",
            ProxyError::ClientGone => "client_gone",
            ProxyError::Unauthorized => "invalid_api_key",
            ProxyError::Internal(_) => "internal_error",
        }
    }

    /// Seconds for the `Retry-After` header, for refusals a client should retry later.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ProxyError::NoBackendAvailable { retry_after, .. }
            | ProxyError::Shed { retry_after, .. } => Some(*retry_after),
            ProxyError::ShuttingDown | ProxyError::BodyMemoryFull(_) => Some(1),
            _ => None,
        }
    }

    /// Error type for the OpenAI-shaped error body.
    fn kind(&self) -> &'static str {
        match self.status() {
            400 | 401 | 404 | 408 | 413 => "invalid_request_error",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            500 => "server_error",
            _ => "upstream_error",
        }
    }

    /// `{"error": {"message", "type", "code"}}`, as OpenAI-compatible clients expect.
    pub fn body(&self) -> Vec<u8> {
        let body = serde_json::json!({
            "error": {"message": self.to_string(), "type": self.kind(), "code": self.code()}
        });
        body.to_string().into_bytes()
    }

    /// The answer to a request (or batch) of `tenant` that admission into `class` (served by
    /// `pool`, queued by `policy`) refused with `shed`.
    pub fn refused(
        class: &str,
        pool: &str,
        tenant: &str,
        shed: &crate::admission::Shed,
        policy: &crate::admission::QueuePolicy,
    ) -> ProxyError {
        let retry_after = shed.retry_after_secs();
        if shed.reason == ShedReason::QueueFull && policy.max_depth == 0 {
            // Queueing is off: the plain truth is that nothing was free.
            ProxyError::NoBackendAvailable {
                class: class.to_string(),
                pool: pool.to_string(),
                retry_after,
            }
        } else {
            ProxyError::Shed {
                class: class.to_string(),
                tenant: tenant.to_string(),
                reason: shed.reason,
                retry_after,
            }
        }
    }

    /// The same error naming the backend by `name` (its configured name) instead of pingora's
    /// detail, which holds its address and may quote its raw bytes: what a client is shown.
    pub fn naming_backend(self, name: &str) -> ProxyError {
        self.with_backend_text(format!("{name:?}"))
    }

    /// The same error with `text` in place of the backend detail it carries (the variants
    /// about a backend; others are returned as they are).
    pub fn with_backend_text(self, text: String) -> ProxyError {
        match self {
            ProxyError::UpstreamUnreachable(_) => ProxyError::UpstreamUnreachable(text),
            ProxyError::UpstreamTls(_) => ProxyError::UpstreamTls(text),
            ProxyError::UpstreamTimeout(_) => ProxyError::UpstreamTimeout(text),
            ProxyError::TunnelIdle(_) => ProxyError::TunnelIdle(text),
            ProxyError::UpstreamFailed(_) => ProxyError::UpstreamFailed(text),
            other => other,
        }
    }

    /// Maps an error pingora raised while proxying; `None` when the client side failed
    /// (nobody is left to answer).
    pub fn from_pingora(error: &pingora::Error) -> Option<ProxyError> {
        let detail = error.to_string();
        let mapped = match (error.esource(), error.etype()) {
            (ErrorSource::Downstream, ErrorType::InvalidHTTPHeader)
            | (ErrorSource::Downstream, ErrorType::H1Error)
            | (ErrorSource::Downstream, ErrorType::InvalidH2) => ProxyError::BadRequest(detail),
            // A body read before routing fails with no source set; only a client sends one.
            (ErrorSource::Downstream | ErrorSource::Unset | ErrorSource::Internal, kind)
                if *kind == INVALID_CHUNK =>
            {
                ProxyError::BadRequest("malformed chunked request body".into())
            }
            (ErrorSource::Downstream, _) => return None,
            (_, ErrorType::HTTPStatus(503)) => ProxyError::UpstreamUnreachable(detail),
            (
                ErrorSource::Upstream,
                ErrorType::ConnectTimedout
                | ErrorType::ConnectRefused
                | ErrorType::ConnectNoRoute
                | ErrorType::ConnectError
                | ErrorType::SocketError
                | ErrorType::BindError,
            ) => ProxyError::UpstreamUnreachable(detail),
            (ErrorSource::Upstream, ErrorType::TLSHandshakeFailure | ErrorType::InvalidCert) => {
                ProxyError::UpstreamTls(detail)
            }
            (ErrorSource::Upstream, ErrorType::ReadTimedout | ErrorType::WriteTimedout) => {
                ProxyError::UpstreamTimeout(detail)
            }
            (ErrorSource::Upstream, _) => ProxyError::UpstreamFailed(detail),
            (ErrorSource::Internal | ErrorSource::Unset, _) => ProxyError::Internal(detail),
        };
        Some(mapped)
    }
}

/// What a shed reason means, for the error message.
fn shed_text(reason: ShedReason, tenant: &str) -> String {
    match reason {
        ShedReason::QueueFull => "its queue is full".to_string(),
        ShedReason::WaitTimeout => "no backend slot freed within the queue's max_wait".to_string(),
        ShedReason::TenantOverShare => format!("tenant {tenant:?} is over its share of the queue"),
        ShedReason::TenantCap => {
            format!("tenant {tenant:?} is at its limit of requests in this class")
        }
        ShedReason::ShuttingDown => "this gpulb is shutting down; retry on another".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_the_openai_error_shape() {
        let e = ProxyError::NoBackendAvailable {
            class: "chat".into(),
            pool: "gpus".into(),
            retry_after: 1,
        };
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["code"], "no_backend_available");
        assert_eq!(v["error"]["type"], "overloaded_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("\"chat\""));
        assert_eq!(e.status(), 503);
    }

    #[test]
    fn sheds_map_to_429_or_503_with_their_reason() {
        let shed = |reason| ProxyError::Shed {
            class: "bulk".into(),
            tenant: "acme".into(),
            reason,
            retry_after: 7,
        };
        let over = shed(ShedReason::TenantOverShare);
        assert_eq!(
            (over.status(), over.code(), over.retry_after()),
            (429, "tenant_over_share", Some(7))
        );
        assert!(over.to_string().contains("\"acme\""));
        let full = shed(ShedReason::QueueFull);
        assert_eq!((full.status(), full.code()), (503, "queue_full"));
        let v: serde_json::Value = serde_json::from_slice(&over.body()).unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_error");
    }

    #[test]
    fn body_and_model_errors_are_client_errors_in_openai_shape() {
        let missing = ProxyError::ModelNotFound {
            model: "gpt-5".into(),
            served: vec!["llama".into(), "qwen".into()],
        };
        let v: serde_json::Value = serde_json::from_slice(&missing.body()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("served: llama, qwen"));
        let big = ProxyError::BodyTooLarge {
            size: 10,
            limit: 5,
            chunked: false,
        };
        assert_eq!(
            big.to_string(),
            "request body is 10 bytes; this server reads at most 5 (request_body.max_bytes)"
        );
        let chunked = ProxyError::BodyTooLarge {
            size: 70_000,
            limit: 65_536,
            chunked: true,
        };
        assert_eq!(
            chunked.to_string(),
            "request body is 70000 bytes or more (chunked); this server reads at most 65536 (request_body.max_bytes)"
        );
        assert_eq!((big.status(), big.code()), (413, "body_too_large"));
        assert_eq!(ProxyError::InvalidBody("x".into()).status(), 400);
        assert_eq!(
            ProxyError::BodyTimeout(std::time::Duration::ZERO).status(),
            408
        );
    }

    #[test]
    fn pingora_errors_map_by_source_and_type() {
        let refused = pingora::Error::new(ErrorType::ConnectRefused).into_up();
        assert_eq!(ProxyError::from_pingora(&refused).unwrap().status(), 502);
        let slow = pingora::Error::new(ErrorType::ReadTimedout).into_up();
        assert_eq!(ProxyError::from_pingora(&slow).unwrap().status(), 504);
        let gone = pingora::Error::new(ErrorType::ConnectionClosed).into_down();
        assert_eq!(ProxyError::from_pingora(&gone), None);
    }
}
