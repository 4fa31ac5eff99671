//! Header rewriting at the proxy boundary: hop-by-hop removal (RFC 9110 §7.6.1),
//! `X-Forwarded-*`, and request ids.

use http::header::{CONNECTION, TE, TRAILER, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue};
use rand::Rng;
use std::cell::RefCell;
use std::net::IpAddr;

/// Hop-by-hop headers that are always dropped; `Transfer-Encoding` framing is pingora's job.
const ALWAYS_HOP_BY_HOP: [&str; 3] = ["keep-alive", "proxy-connection", "proxy-authorization"];

/// Whether `name` is a hop-by-hop header or may start the hop-by-hop scan (`Connection`).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == CONNECTION
        || name == TE
        || name == TRAILER
        || name == UPGRADE
        || ALWAYS_HOP_BY_HOP.contains(&name.as_str())
}

/// Names of the hop-by-hop headers in `headers` that must not be forwarded.
///
/// That is `Connection` itself, every header it names, `Keep-Alive`, `Proxy-Connection`,
/// `TE`, `Trailer` and `Upgrade` — except that a protocol upgrade (`Connection: upgrade` with
/// an `Upgrade` header) keeps both so pingora can switch protocols.
pub fn hop_by_hop(headers: &HeaderMap) -> Vec<HeaderName> {
    // The common case, no hop-by-hop header at all, is one pass over the few names present
    // (seven hashed lookups cost several times more) and no allocation.
    if !headers.keys().any(is_hop_by_hop) {
        return Vec::new();
    }
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    let upgrading = headers.contains_key(UPGRADE) && listed.contains(&UPGRADE);
    let mut drop: Vec<HeaderName> = ALWAYS_HOP_BY_HOP
        .iter()
        .map(|n| HeaderName::from_static(n))
        .chain([TE, TRAILER])
        .chain(listed)
        .filter(|name| headers.contains_key(name))
        .collect();
    if upgrading {
        drop.retain(|name| name != UPGRADE);
    } else {
        drop.extend(
            [CONNECTION, UPGRADE]
                .into_iter()
                .filter(|n| headers.contains_key(n)),
        );
    }
    // `Transfer-Encoding` and `Content-Length` frame the body; pingora owns them.
    drop.retain(|name| {
        name != http::header::TRANSFER_ENCODING && name != http::header::CONTENT_LENGTH
    });
    drop.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    drop.dedup();
    drop
}

/// Whether an answer to a client speaking `client` must lose its chunked coding: an HTTP/1.0
/// (or 0.9) client does not know it, and a server must not send such a client
/// `Transfer-Encoding` (RFC 9112 §6.1). Its body then goes as it is, ended by closing the
/// connection, as nginx and HAProxy answer such a client.
pub fn must_unchunk(client: http::Version, response: &HeaderMap) -> bool {
    client < http::Version::HTTP_11 && response.contains_key(http::header::TRANSFER_ENCODING)
}

/// Whether an answer with `status` must carry no body framing: a server must not send
/// `Content-Length` or `Transfer-Encoding` with a `1xx` or `204` (RFC 9110 §8.6, RFC 9112
/// §6.1), which have no body; a backend that does gets them removed, as nginx removes them.
pub fn framing_forbidden(status: http::StatusCode) -> bool {
    status.is_informational() || status == http::StatusCode::NO_CONTENT
}

/// `X-Forwarded-For`, as gpulb writes it.
pub const X_FORWARDED_FOR: &str = "x-forwarded-for";
/// `X-Forwarded-Proto`, as gpulb writes it.
pub const X_FORWARDED_PROTO: &str = "x-forwarded-proto";

/// The `X-Forwarded-Proto` value for a client connection with or without TLS.
pub fn forwarded_proto(tls: bool) -> HeaderValue {
    HeaderValue::from_static(if tls { "https" } else { "http" })
}

/// The `X-Forwarded-For` value to send: the client's address appended to any existing chain.
pub fn forwarded_for(existing: Option<&HeaderValue>, client: IpAddr) -> HeaderValue {
    match existing.and_then(|v| v.to_str().ok()).map(str::trim) {
        Some(chain) if !chain.is_empty() => {
            HeaderValue::try_from(format!("{chain}, {client}")).unwrap_or_else(|_| address(client))
        }
        _ => address(client),
    }
}

thread_local! {
    /// The address last formatted on this thread: a keep-alive client sends many requests.
    static LAST_ADDRESS: RefCell<Option<(IpAddr, HeaderValue)>> = const { RefCell::new(None) };
}

/// `ip` as a header value; formatted once per client in a row, then shared.
fn address(ip: IpAddr) -> HeaderValue {
    LAST_ADDRESS.with_borrow_mut(|last| match last {
        Some((seen, value)) if *seen == ip => value.clone(),
        _ => {
            let value = HeaderValue::try_from(ip.to_string())
                .expect("an IP address is a valid header value");
            *last = Some((ip, value.clone()));
            value
        }
    })
}

/// A request id: the header value sent both ways, and the text logs show.
#[derive(Clone, PartialEq, Eq)]
pub struct RequestId(HeaderValue, Origin);

/// Where a request id came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The client's own header.
    Client,
    /// Made here: the client sent none, or one that could not be used.
    Fresh,
}

impl RequestId {
    /// A fresh random id: 32 lowercase hex digits.
    pub fn fresh() -> RequestId {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let n = rand::rng().random::<u128>();
        let mut text = [0u8; 32];
        for (i, digit) in text.iter_mut().enumerate() {
            *digit = HEX[(n >> (4 * (31 - i)) & 0xf) as usize];
        }
        RequestId(
            HeaderValue::from_bytes(&text).expect("hex digits are a valid header value"),
            Origin::Fresh,
        )
    }

    /// A client's id, when it is one gpulb keeps: visible ASCII, 1 to 128 bytes.
    pub fn from_client(value: &HeaderValue) -> Option<RequestId> {
        let text = value.to_str().ok()?;
        (!text.is_empty() && text.len() <= 128).then(|| RequestId(value.clone(), Origin::Client))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        // Both constructors checked it is visible ASCII.
        self.0.to_str().unwrap_or_default()
    }

    /// The id as a header value (shared, not copied).
    pub fn value(&self) -> HeaderValue {
        self.0.clone()
    }

    /// Whether the id was made here rather than taken from the client's header: the request
    /// may still carry a header of that name the client sent (unusable as an id).
    pub fn is_fresh(&self) -> bool {
        self.1 == Origin::Fresh
    }

    /// Whether `values` (a request's values of the id header) say exactly this id.
    pub fn is_alone_in(&self, values: http::header::GetAll<'_, HeaderValue>) -> bool {
        let mut values = values.iter();
        values.next() == Some(&self.0) && values.next().is_none()
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    #[test]
    fn only_a_chunked_answer_to_an_http10_client_is_unchunked() {
        let chunked = map(&[("transfer-encoding", "chunked")]);
        let sized = map(&[("content-length", "5")]);
        assert!(must_unchunk(http::Version::HTTP_10, &chunked));
        assert!(must_unchunk(http::Version::HTTP_09, &chunked));
        assert!(!must_unchunk(http::Version::HTTP_10, &sized));
        assert!(!must_unchunk(http::Version::HTTP_11, &chunked));
        assert!(!must_unchunk(http::Version::HTTP_2, &chunked));
    }

    #[test]
    fn only_bodiless_statuses_lose_their_framing() {
        use http::StatusCode;
        for status in [StatusCode::CONTINUE, StatusCode::from_u16(103).unwrap()] {
            assert!(framing_forbidden(status), "{status}");
        }
        assert!(framing_forbidden(StatusCode::NO_CONTENT));
        for status in [
            StatusCode::OK,
            StatusCode::NOT_MODIFIED,
            StatusCode::RESET_CONTENT,
        ] {
            assert!(!framing_forbidden(status), "{status}");
        }
    }

    fn names(headers: &HeaderMap) -> Vec<String> {
        hop_by_hop(headers).iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn drops_connection_and_what_it_lists() {
        let h = map(&[
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
            ("content-type", "application/json"),
            ("transfer-encoding", "chunked"),
        ]);
        assert_eq!(
            names(&h),
            ["connection", "keep-alive", "te", "x-secret-hop"]
        );
    }

    #[test]
    fn keeps_an_upgrade_handshake() {
        let h = map(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert!(names(&h).is_empty());
        let stray = map(&[("upgrade", "h2c")]);
        assert_eq!(names(&stray), ["upgrade"]);
    }

    #[test]
    fn never_drops_body_framing() {
        let h = map(&[
            ("connection", "content-length, transfer-encoding"),
            ("content-length", "3"),
        ]);
        assert_eq!(names(&h), ["connection"]);
    }

    #[test]
    fn forwarded_for_appends() {
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(forwarded_for(None, local), "127.0.0.1");
        let prior = HeaderValue::from_static("10.0.0.1");
        assert_eq!(forwarded_for(Some(&prior), local), "10.0.0.1, 127.0.0.1");
        let other: IpAddr = "::1".parse().unwrap();
        assert_eq!(forwarded_for(None, other), "::1");
        assert_eq!(forwarded_for(None, local), "127.0.0.1");
        let blank = HeaderValue::from_static("  ");
        assert_eq!(forwarded_for(Some(&blank), local), "127.0.0.1");
    }

    #[test]
    fn forwarded_proto_names_the_scheme() {
        assert_eq!(forwarded_proto(false), "http");
        assert_eq!(forwarded_proto(true), "https");
    }

    #[test]
    fn request_ids_are_unique_lowercase_hex() {
        let (a, b) = (RequestId::fresh(), RequestId::fresh());
        assert_eq!(a.as_str().len(), 32);
        assert!(a
            .as_str()
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
        assert_ne!(a, b);
        assert_eq!(a.value(), a.as_str());
        assert_eq!(format!("{a:?}"), format!("{:?}", a.as_str()));
    }

    #[test]
    fn a_client_id_is_kept_only_when_short_visible_ascii() {
        let id = RequestId::from_client(&HeaderValue::from_static("client-id-7")).unwrap();
        assert_eq!(id.as_str(), "client-id-7");
        assert!(RequestId::from_client(&HeaderValue::from_static("")).is_none());
        let long = HeaderValue::try_from("x".repeat(129)).unwrap();
        assert!(RequestId::from_client(&long).is_none());
        let ok = HeaderValue::try_from("x".repeat(128)).unwrap();
        assert!(RequestId::from_client(&ok).is_some());
        let opaque = HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap();
        assert!(RequestId::from_client(&opaque).is_none());
    }

    #[test]
    fn an_id_is_alone_only_as_the_single_value() {
        let id = RequestId::from_client(&HeaderValue::from_static("a")).unwrap();
        let name = HeaderName::from_static("x-request-id");
        let mut h = HeaderMap::new();
        assert!(!id.is_alone_in(h.get_all(&name)));
        h.append(&name, HeaderValue::from_static("a"));
        assert!(id.is_alone_in(h.get_all(&name)));
        h.append(&name, HeaderValue::from_static("b"));
        assert!(!id.is_alone_in(h.get_all(&name)));
        let mut other = HeaderMap::new();
        other.append(&name, HeaderValue::from_static("b"));
        assert!(!id.is_alone_in(other.get_all(&name)));
    }

    #[test]
    fn hop_by_hop_fast_path_sees_each_name() {
        for name in [
            "connection",
            "te",
            "trailer",
            "keep-alive",
            "proxy-connection",
        ] {
            let h = map(&[(name, "x"), ("content-type", "text/plain")]);
            assert!(!names(&h).is_empty(), "{name}");
        }
        assert!(names(&map(&[("content-type", "text/plain"), ("host", "a")])).is_empty());
    }
}
