//! The admin listener's one access decision, kept pure so every case is unit-tested.

use http::Method;

/// What the admin listener does with a request before routing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Serve it.
    Allow,
    /// It needs a token and none is configured: 403.
    NoTokenConfigured,
    /// It needs the token and did not offer it: 401, counted.
    Unauthorized,
}

/// Paths served without a token even on a guarded (non-loopback) listener: static assets that
/// carry no data (the dashboard page sends the token itself when it fetches data), and the
/// probes an orchestrator calls.
const PUBLIC: &[&str] = &["/dashboard", "/livez", "/readyz"];

/// Decides access: mutating methods always need the token; on a guarded listener (`guard_all`,
/// non-loopback) everything but [`PUBLIC`] pages does. `authorization` is the header's value.
pub fn decide(
    method: &Method,
    path: &str,
    guard_all: bool,
    token: Option<&str>,
    authorization: Option<&str>,
) -> Access {
    let mutating = method != Method::GET && method != Method::HEAD;
    let public = !mutating && PUBLIC.contains(&path);
    if !mutating && (!guard_all || public) {
        return Access::Allow;
    }
    let Some(token) = token else {
        return Access::NoTokenConfigured;
    };
    let offered = authorization
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(offered.as_bytes(), token.as_bytes()) {
        Access::Allow
    } else {
        Access::Unauthorized
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use Access::*;

    const GET: Method = Method::GET;
    const POST: Method = Method::POST;

    #[test]
    fn loopback_reads_are_open_and_writes_need_the_token() {
        assert_eq!(decide(&GET, "/metrics", false, None, None), Allow);
        assert_eq!(decide(&GET, "/status", false, Some("t"), None), Allow);
        assert_eq!(
            decide(&POST, "/reload", false, None, None),
            NoTokenConfigured
        );
        assert_eq!(
            decide(&POST, "/reload", false, Some("t"), None),
            Unauthorized
        );
        assert_eq!(
            decide(&POST, "/reload", false, Some("t"), Some("Bearer x")),
            Unauthorized
        );
        assert_eq!(
            decide(&POST, "/reload", false, Some("t"), Some("Bearer t")),
            Allow
        );
        assert_eq!(
            decide(&POST, "/reload", false, Some("t"), Some("t")),
            Unauthorized
        );
    }

    #[test]
    fn a_guarded_listener_guards_every_data_endpoint() {
        for path in ["/metrics", "/status", "/history", "/nope"] {
            assert_eq!(
                decide(&GET, path, true, Some("t"), None),
                Unauthorized,
                "{path}"
            );
            assert_eq!(
                decide(&GET, path, true, None, None),
                NoTokenConfigured,
                "{path}"
            );
            assert_eq!(
                decide(&GET, path, true, Some("t"), Some("Bearer t")),
                Allow,
                "{path}"
            );
        }
        // The dashboard page itself holds no data; its fetches carry the token.
        assert_eq!(decide(&GET, "/dashboard", true, Some("t"), None), Allow);
        assert_eq!(
            decide(&POST, "/dashboard", true, Some("t"), None),
            Unauthorized
        );
    }
}
