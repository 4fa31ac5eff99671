//! The request header fields gpulb reads itself, found in one pass over the client's header
//! instead of a hashed lookup each (a request carries a handful of fields; six lookups cost more
//! than walking them once).

use crate::config::Compiled;
use http::{header, HeaderValue};
use pingora::http::RequestHeader;

/// The first value of each field gpulb reads, as `HeaderMap::get` would answer it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Heads<'a> {
    /// Whether the request has a `Host` field.
    pub host: bool,
    /// `Content-Type`.
    pub content_type: Option<&'a HeaderValue>,
    /// `Content-Length`.
    pub content_length: Option<&'a HeaderValue>,
    /// `Authorization`.
    pub authorization: Option<&'a HeaderValue>,
    /// The configured `tenant_header`.
    pub tenant: Option<&'a HeaderValue>,
    /// The configured `request_id_header`.
    pub request_id: Option<&'a HeaderValue>,
    /// Whether an HTTP/1.1 request waits for `100 Continue` before it sends its body
    /// (`Expect: 100-continue`, RFC 9110 section 10.1.1).
    pub expect_continue: bool,
}

impl<'a> Heads<'a> {
    /// The fields of `req`, with the tenant and request id names of `compiled`.
    pub fn of(req: &'a RequestHeader, compiled: &Compiled) -> Self {
        let mut heads = Heads::default();
        for (name, value) in req.headers.iter() {
            let slot = if name == header::HOST {
                heads.host = true;
                None
            } else if name == header::CONTENT_TYPE {
                Some(&mut heads.content_type)
            } else if name == header::CONTENT_LENGTH {
                Some(&mut heads.content_length)
            } else if name == header::AUTHORIZATION {
                Some(&mut heads.authorization)
            } else if name == header::EXPECT {
                heads.expect_continue |= value.as_bytes().eq_ignore_ascii_case(b"100-continue");
                None
            } else {
                None
            };
            if let Some(slot) = slot {
                slot.get_or_insert(value);
            }
            // The configured names may be any of the above (a tenant from `authorization`).
            if name == compiled.tenant_header {
                heads.tenant.get_or_insert(value);
            }
            if name == compiled.request_id_header {
                heads.request_id.get_or_insert(value);
            }
        }
        // An HTTP/1.0 client is never sent a 1xx answer (RFC 9110 section 15.2).
        heads.expect_continue &= req.version == http::Version::HTTP_11;
        heads
    }

    /// What the body reader needs of them, owned, so the session can be borrowed again.
    pub fn body(&self) -> BodyHeads {
        BodyHeads {
            content_length: self
                .content_length
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse().ok()),
            may_be_json: self.content_type.is_none_or(may_be_json),
            expect_continue: self.expect_continue,
        }
    }
}

/// The body's framing and type, as its header says.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BodyHeads {
    /// The `Content-Length` of the request, when it has one (else it is chunked).
    pub content_length: Option<usize>,
    /// Whether its content type can be JSON (clients such as `curl -d` label JSON as a form;
    /// uploads are not).
    pub may_be_json: bool,
    /// Whether the client waits for `100 Continue` before it sends the body.
    pub expect_continue: bool,
}

/// Whether a body of `content_type` may be a JSON request: anything but a multipart upload or
/// raw bytes.
fn may_be_json(content_type: &HeaderValue) -> bool {
    let Ok(t) = content_type.to_str() else {
        return true;
    };
    let t = t.trim_start().as_bytes();
    let starts = |prefix: &str| {
        t.get(..prefix.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(prefix.as_bytes()))
    };
    !(starts("multipart/") || starts("application/octet-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;

    fn request(fields: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("POST", b"/v1/completions", None).unwrap();
        for (name, value) in fields {
            req.append_header(name.to_string(), *value).unwrap();
        }
        req
    }

    #[test]
    fn each_field_is_its_first_value_as_a_lookup_answers() {
        let req = request(&[
            ("Host", "gpulb"),
            ("Content-Type", "application/json"),
            ("X-Tenant", "team-a"),
            ("x-tenant", "team-b"),
            ("Content-Length", " 42 "),
            ("X-Request-Id", "abc"),
            ("Authorization", "Bearer k"),
        ]);
        let heads = Heads::of(&req, &Compiled::default());
        assert!(heads.host);
        for (name, got) in [
            ("content-type", heads.content_type),
            ("x-tenant", heads.tenant),
            ("content-length", heads.content_length),
            ("x-request-id", heads.request_id),
            ("authorization", heads.authorization),
        ] {
            assert_eq!(got, req.headers.get(name), "{name}");
        }
        assert_eq!(
            heads.body(),
            BodyHeads {
                content_length: Some(42),
                may_be_json: true,
                expect_continue: false,
            }
        );
    }

    #[test]
    fn a_configured_name_may_be_one_gpulb_reads_anyway() {
        let req = request(&[
            ("authorization", "Bearer k"),
            ("content-type", "text/plain"),
        ]);
        let compiled = Compiled {
            tenant_header: HeaderName::from_static("authorization"),
            request_id_header: HeaderName::from_static("content-type"),
            ..Compiled::default()
        };
        let heads = Heads::of(&req, &compiled);
        assert_eq!(heads.tenant, heads.authorization);
        assert!(heads.tenant.is_some());
        assert_eq!(heads.request_id, heads.content_type);
        assert!(!heads.host);
    }

    #[test]
    fn absent_fields_and_uploads() {
        let empty = request(&[]);
        let none = Heads::of(&empty, &Compiled::default());
        assert_eq!(
            none.body(),
            BodyHeads {
                content_length: None,
                may_be_json: true,
                expect_continue: false,
            }
        );
        for (value, json) in [
            ("multipart/form-data; boundary=x", false),
            (" Application/Octet-Stream", false),
            ("application/x-www-form-urlencoded", true),
            ("application/json", true),
        ] {
            let req = request(&[("content-type", value), ("content-length", "x")]);
            let body = Heads::of(&req, &Compiled::default()).body();
            assert_eq!(body.may_be_json, json, "{value}");
            assert_eq!(body.content_length, None);
        }
    }

    #[test]
    fn only_an_http11_request_waits_for_100_continue() {
        for (value, version, waits) in [
            ("100-continue", http::Version::HTTP_11, true),
            ("100-Continue", http::Version::HTTP_11, true),
            ("100-continue", http::Version::HTTP_10, false),
            ("something-else", http::Version::HTTP_11, false),
        ] {
            let mut req = request(&[("expect", value)]);
            req.set_version(version);
            let body = Heads::of(&req, &Compiled::default()).body();
            assert_eq!(body.expect_continue, waits, "{value} {version:?}");
        }
        assert!(!Heads::of(&request(&[]), &Compiled::default()).expect_continue);
    }
}
