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

/// Which reads a listener guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Guard {
    /// Every read but the [`PUBLIC`] pages needs the token (a non-loopback listener).
    pub all: bool,
    /// `/metrics` is public too (`admin.public_metrics`), so Prometheus scrapes without one.
    pub public_metrics: bool,
}

/// Decides access: mutating methods always need the token; on a guarded listener
/// (`guard.all`) every read but the [`PUBLIC`] pages (and `/metrics` with
/// `guard.public_metrics`) does. `authorization` is the header's value.
pub fn decide(
    method: &Method,
    path: &str,
    guard: Guard,
    token: Option<&str>,
    authorization: Option<&str>,
) -> Access {
    let mutating = method != Method::GET && method != Method::HEAD;
    let public =
        !mutating && (PUBLIC.contains(&path) || (guard.public_metrics && path == "/metrics"));
    let guard_all = guard.all;
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
    const OPEN: Guard = Guard {
        all: false,
        public_metrics: false,
    };
    const GUARDED: Guard = Guard {
        all: true,
        public_metrics: false,
    };

    #[test]
    fn loopback_reads_are_open_and_writes_need_the_token() {
        assert_eq!(decide(&GET, "/metrics", OPEN, None, None), Allow);
        assert_eq!(decide(&GET, "/status", OPEN, Some("t"), None), Allow);
        assert_eq!(
            decide(&POST, "/reload", OPEN, None, None),
            NoTokenConfigured
        );
        assert_eq!(
            decide(&POST, "/reload", OPEN, Some("t"), None),
            Unauthorized
        );
        assert_eq!(
            decide(&POST, "/reload", OPEN, Some("t"), Some("Bearer x")),
            Unauthorized
        );
        assert_eq!(
            decide(&POST, "/reload", OPEN, Some("t"), Some("Bearer t")),
            Allow
        );
        assert_eq!(
            decide(&POST, "/reload", OPEN, Some("t"), Some("t")),
            Unauthorized
        );
    }

    #[test]
    fn a_guarded_listener_guards_every_data_endpoint() {
        for path in ["/metrics", "/status", "/history", "/nope"] {
            assert_eq!(
                decide(&GET, path, GUARDED, Some("t"), None),
                Unauthorized,
                "{path}"
            );
            assert_eq!(
                decide(&GET, path, GUARDED, None, None),
                NoTokenConfigured,
                "{path}"
            );
            assert_eq!(
                decide(&GET, path, GUARDED, Some("t"), Some("Bearer t")),
                Allow,
                "{path}"
            );
        }
        // The dashboard page itself holds no data; its fetches carry the token.
        assert_eq!(decide(&GET, "/dashboard", GUARDED, Some("t"), None), Allow);
        assert_eq!(
            decide(&POST, "/dashboard", GUARDED, Some("t"), None),
            Unauthorized
        );
    }

    #[test]
    fn public_metrics_opens_metrics_only() {
        let guard = Guard {
            all: true,
            public_metrics: true,
        };
        assert_eq!(decide(&GET, "/metrics", guard, Some("t"), None), Allow);
        assert_eq!(decide(&GET, "/metrics", guard, None, None), Allow);
        for path in ["/status", "/history", "/metricsx"] {
            assert_eq!(
                decide(&GET, path, guard, Some("t"), None),
                Unauthorized,
                "{path}"
            );
        }
        assert_eq!(
            decide(&POST, "/metrics", guard, Some("t"), None),
            Unauthorized
        );
        assert_eq!(
            decide(&POST, "/reload", guard, Some("t"), None),
            Unauthorized
        );
    }
}
