//! The admin listener's endpoints by path, and the methods each answers: a read answers `GET`
//! and `HEAD` alike (a load balancer's health check often sends `HEAD`), `/reload` only `POST`.

use http::Method;

/// One admin endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/livez`.
    Livez,
    /// `/readyz`.
    Readyz,
    /// `/metrics`.
    Metrics,
    /// `/status`.
    Status,
    /// `/history`.
    History,
    /// `/dashboard`.
    Dashboard,
    /// `/`, sent on to the dashboard.
    Root,
    /// `/reload`.
    Reload,
}

impl Endpoint {
    /// The endpoint at `path`, if there is one.
    pub fn at(path: &str) -> Option<Endpoint> {
        Some(match path {
            "/livez" => Endpoint::Livez,
            "/readyz" => Endpoint::Readyz,
            "/metrics" => Endpoint::Metrics,
            "/status" => Endpoint::Status,
            "/history" => Endpoint::History,
            "/dashboard" => Endpoint::Dashboard,
            "/" => Endpoint::Root,
            "/reload" => Endpoint::Reload,
            _ => return None,
        })
    }

    /// Whether it answers `method`.
    pub fn answers(self, method: &Method) -> bool {
        match self {
            Endpoint::Reload => method == Method::POST,
            _ => method == Method::GET || method == Method::HEAD,
        }
    }

    /// The methods it answers, as a `405`'s `Allow` header lists them.
    pub fn allow(self) -> &'static str {
        match self {
            Endpoint::Reload => "POST",
            _ => "GET, HEAD",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_answer_get_and_head_and_reload_only_post() {
        for path in [
            "/livez",
            "/readyz",
            "/metrics",
            "/status",
            "/history",
            "/dashboard",
            "/",
        ] {
            let endpoint = Endpoint::at(path).unwrap();
            assert!(endpoint.answers(&Method::GET), "{path}");
            assert!(endpoint.answers(&Method::HEAD), "{path}");
            assert!(!endpoint.answers(&Method::POST), "{path}");
            assert_eq!(endpoint.allow(), "GET, HEAD");
        }
        let reload = Endpoint::at("/reload").unwrap();
        assert!(reload.answers(&Method::POST));
        assert!(!reload.answers(&Method::GET));
        assert_eq!(reload.allow(), "POST");
        assert_eq!(Endpoint::at("/status/"), None);
        assert_eq!(Endpoint::at("/metricsx"), None);
    }
}
