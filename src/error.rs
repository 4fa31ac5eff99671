//! Errors the proxy answers to clients, each mapped to a status in one place.

use pingora::{ErrorSource, ErrorType};

/// Why a request could not be served; each variant maps to one HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// Every backend of the class's pool is at its cap or unusable.
    #[error("no backend of pool {pool:?} can take a request of class {class:?} now")]
    NoBackendAvailable {
        /// The request's class.
        class: String,
        /// The class's pool.
        pool: String,
    },
    /// The class already has its maximum number of requests in flight.
    #[error("class {class:?} is at its limit of {limit} requests in flight")]
    ClassSaturated {
        /// The request's class.
        class: String,
        /// The class's in-flight cap.
        limit: u32,
    },
    /// No backend could be connected to, after retries.
    #[error("could not connect to a backend: {0}")]
    UpstreamUnreachable(String),
    /// The backend went silent for longer than the read timeout.
    #[error("backend timed out: {0}")]
    UpstreamTimeout(String),
    /// The backend broke the exchange (reset, malformed response).
    #[error("backend failed: {0}")]
    UpstreamFailed(String),
    /// The client sent something that could not be proxied.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A fault inside the proxy.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ProxyError {
    /// HTTP status sent to the client.
    pub fn status(&self) -> u16 {
        match self {
            ProxyError::NoBackendAvailable { .. } | ProxyError::ClassSaturated { .. } => 503,
            ProxyError::UpstreamUnreachable(_) | ProxyError::UpstreamFailed(_) => 502,
            ProxyError::UpstreamTimeout(_) => 504,
            ProxyError::BadRequest(_) => 400,
            ProxyError::Internal(_) => 500,
        }
    }

    /// Machine-readable code for the OpenAI-shaped error body.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::NoBackendAvailable { .. } => "no_backend_available",
            ProxyError::ClassSaturated { .. } => "class_saturated",
            ProxyError::UpstreamUnreachable(_) => "upstream_unreachable",
            ProxyError::UpstreamTimeout(_) => "upstream_timeout",
            ProxyError::UpstreamFailed(_) => "upstream_failed",
            ProxyError::BadRequest(_) => "bad_request",
            ProxyError::Internal(_) => "internal_error",
        }
    }

    /// Error type for the OpenAI-shaped error body.
    fn kind(&self) -> &'static str {
        match self.status() {
            400 => "invalid_request_error",
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

    /// Maps an error pingora raised while proxying; `None` when the client side failed
    /// (nobody is left to answer).
    pub fn from_pingora(error: &pingora::Error) -> Option<ProxyError> {
        let detail = error.to_string();
        let mapped = match (error.esource(), error.etype()) {
            (ErrorSource::Downstream, ErrorType::InvalidHTTPHeader)
            | (ErrorSource::Downstream, ErrorType::H1Error)
            | (ErrorSource::Downstream, ErrorType::InvalidH2) => ProxyError::BadRequest(detail),
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
            (ErrorSource::Upstream, ErrorType::ReadTimedout | ErrorType::WriteTimedout) => {
                ProxyError::UpstreamTimeout(detail)
            }
            (ErrorSource::Upstream, _) => ProxyError::UpstreamFailed(detail),
            (ErrorSource::Internal | ErrorSource::Unset, _) => ProxyError::Internal(detail),
        };
        Some(mapped)
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
        };
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["code"], "no_backend_available");
        assert_eq!(v["error"]["type"], "overloaded_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("\"chat\""));
        assert_eq!(e.status(), 503);
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
