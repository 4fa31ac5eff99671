//! Header rewriting at the proxy boundary: hop-by-hop removal (RFC 9110 §7.6.1),
//! `X-Forwarded-*`, and request ids.

use http::header::{CONNECTION, TE, TRAILER, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue};
use rand::Rng;

/// Hop-by-hop headers that are always dropped; `Transfer-Encoding` framing is pingora's job.
const ALWAYS_HOP_BY_HOP: [&str; 3] = ["keep-alive", "proxy-connection", "proxy-authorization"];

/// Names of the hop-by-hop headers in `headers` that must not be forwarded.
///
/// That is `Connection` itself, every header it names, `Keep-Alive`, `Proxy-Connection`,
/// `TE`, `Trailer` and `Upgrade` — except that a protocol upgrade (`Connection: upgrade` with
/// an `Upgrade` header) keeps both so pingora can switch protocols.
pub fn hop_by_hop(headers: &HeaderMap) -> Vec<HeaderName> {
    // The common case, no hop-by-hop header at all, costs a few lookups and no allocation.
    let any = [CONNECTION, TE, TRAILER, UPGRADE]
        .iter()
        .any(|n| headers.contains_key(n))
        || ALWAYS_HOP_BY_HOP.iter().any(|n| headers.contains_key(*n));
    if !any {
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

/// The `X-Forwarded-For` value to send: the client's address appended to any existing chain.
pub fn forwarded_for(existing: Option<&HeaderValue>, client_ip: &str) -> String {
    match existing.and_then(|v| v.to_str().ok()).map(str::trim) {
        Some(chain) if !chain.is_empty() => format!("{chain}, {client_ip}"),
        _ => client_ip.to_string(),
    }
}

/// A fresh random request id: 32 lowercase hex digits.
pub fn new_request_id() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
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
        assert_eq!(forwarded_for(None, "127.0.0.1"), "127.0.0.1");
        let prior = HeaderValue::from_static("10.0.0.1");
        assert_eq!(
            forwarded_for(Some(&prior), "127.0.0.1"),
            "10.0.0.1, 127.0.0.1"
        );
    }

    #[test]
    fn request_ids_are_unique_hex() {
        let (a, b) = (new_request_id(), new_request_id());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
