//! Requests refused for their form before anything else is done with them.

use crate::error::ProxyError;
use pingora::http::RequestHeader;

/// Why `req` is not a request gpulb forwards: an HTTP/1.1 request must name its `Host`
/// (RFC 9112 §3.2); a backend or a virtual-host router behind gpulb must not guess it.
/// `has_host` says whether it has a `Host` field.
pub fn malformed(req: &RequestHeader, has_host: bool) -> Option<ProxyError> {
    let missing_host = req.version == http::Version::HTTP_11 && !has_host;
    missing_host.then(|| ProxyError::BadRequest("an HTTP/1.1 request needs a Host header".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn malformed(req: &RequestHeader) -> Option<ProxyError> {
        super::malformed(req, req.headers.contains_key(http::header::HOST))
    }

    #[test]
    fn http11_without_host_is_malformed_and_http10_is_not() {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        req.set_version(http::Version::HTTP_11);
        assert!(malformed(&req).is_some());
        req.insert_header("host", "gpulb").unwrap();
        assert!(malformed(&req).is_none());
        let mut old = RequestHeader::build("GET", b"/", None).unwrap();
        old.set_version(http::Version::HTTP_10);
        assert!(malformed(&old).is_none());
    }
}
