//! What validation compiles a config into: typed values (methods, header names, backend
//! addresses) that the runtime uses as they are and never parses again.

use super::{ApiKeys, CountRange, ModelPatterns, ServingCert, UpstreamTls};
use http::{HeaderName, HeaderValue, Method};
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

/// The typed values of one validated config, in config order.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    /// `tenant_header`.
    pub tenant_header: HeaderName,
    /// `tenants.keys_file`, read, when tenants come from API keys.
    pub api_keys: Option<ApiKeys>,
    /// `request_id_header`.
    pub request_id_header: HeaderName,
    /// Each backend's `url`.
    pub upstreams: Vec<Upstream>,
    /// Each class's `match`.
    pub class_rules: Vec<MatchRule>,
    /// `listen_tls`'s certificate and key, read.
    pub listener_cert: Option<ServingCert>,
}

impl Default for Compiled {
    fn default() -> Self {
        Compiled {
            tenant_header: HeaderName::from_static("x-tenant"),
            api_keys: None,
            request_id_header: HeaderName::from_static("x-request-id"),
            upstreams: Vec::new(),
            class_rules: Vec::new(),
            listener_cert: None,
        }
    }
}

/// A class's match rules, typed; every part given must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatchRule {
    /// The request path starts with this.
    pub path_prefix: Option<String>,
    /// The method is one of these (any when empty).
    pub methods: Vec<Method>,
    /// Header name and the exact value wanted (`None`: present with any value).
    pub headers: Vec<(HeaderName, Option<HeaderValue>)>,
    /// `Content-Length` is at least this.
    pub min_content_length: Option<u64>,
    /// `Content-Length` is below this.
    pub max_content_length: Option<u64>,
    /// What the request body must say, when the rule looks at it.
    pub body: Option<BodyRule>,
}

/// The body-aware part of a class rule; every part given must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BodyRule {
    /// `model` patterns.
    pub model: Option<ModelPatterns>,
    /// `stream` wanted.
    pub stream: Option<bool>,
    /// `max_tokens` range.
    pub max_tokens: Option<CountRange>,
    /// Estimated prompt tokens range.
    pub prompt_tokens: Option<CountRange>,
}

/// Where a backend listens: `http(s)://host:port` parsed, not yet resolved.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Upstream {
    /// Host name or address literal (IPv6 in brackets).
    pub host: String,
    /// TCP port (80, or 443 for https, when the URL names none).
    pub port: u16,
    /// How to speak TLS to it: `Some` for an `https://` URL.
    pub tls: Option<UpstreamTls>,
    /// The `Authorization` its model server requires (its `auth`, or its pool's).
    pub auth: Option<super::Credential>,
}

/// Why a backend's name gave no address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The resolver failed.
    #[error("cannot resolve {authority}: {cause}")]
    Failed {
        /// `host:port`.
        authority: String,
        /// What the resolver said.
        cause: String,
    },
    /// The resolver answered with no address.
    #[error("{0} resolves to no address")]
    Empty(String),
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl Upstream {
    /// Parses a backend URL of the form `http[s]://host[:port][/]`; the message names the
    /// problem. An https backend's certificate is checked against the system's roots until
    /// its `tls` keys say otherwise.
    pub fn parse(url: &str) -> Result<Upstream, String> {
        let (rest, https, default_port) = if let Some(rest) = url.strip_prefix("http://") {
            (rest, false, 80)
        } else if let Some(rest) = url.strip_prefix("https://") {
            (rest, true, 443)
        } else {
            return Err(format!(
                "{url:?}: expected http://host:port or https://host:port"
            ));
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return Err(format!(
                "{url:?}: expected http(s)://host:port with no path, query or credentials"
            ));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => {
                let port = port
                    .parse()
                    .map_err(|_| format!("{url:?}: {port:?} is not a port number"))?;
                (host, port)
            }
            _ => (authority, default_port),
        };
        if host.is_empty() {
            return Err(format!("{url:?}: expected http(s)://host:port"));
        }
        let tls = https.then(|| UpstreamTls {
            server_name: host.trim_matches(['[', ']']).to_string(),
            verify: super::defaults::backend_tls_verify(),
            ca: None,
        });
        Ok(Upstream {
            host: host.to_string(),
            port,
            tls,
            auth: None,
        })
    }

    /// Whether `other` is the same server spoken to the same way: its credential aside, which
    /// may be replaced without the server being a new one.
    pub fn same_server(&self, other: &Upstream) -> bool {
        (&self.host, self.port, &self.tls) == (&other.host, other.port, &other.tls)
    }

    /// The first address the system resolver gives for it within `limit`; an address literal
    /// needs no lookup. A lookup that outlives `limit` is left to finish on its own thread.
    pub fn resolve_within(&self, limit: std::time::Duration) -> Result<SocketAddr, ResolveError> {
        if let Ok(ip) = self
            .host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
        {
            return Ok(SocketAddr::new(ip, self.port));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let upstream = self.clone();
        let spawned = std::thread::Builder::new()
            .name("gpulb-resolve".into())
            .spawn(move || {
                let _ = tx.send(upstream.resolve());
            });
        let failed = |cause: String| ResolveError::Failed {
            authority: self.to_string(),
            cause,
        };
        if let Err(e) = spawned {
            return Err(failed(format!("cannot start a resolver thread: {e}")));
        }
        rx.recv_timeout(limit)
            .unwrap_or_else(|_| Err(failed(format!("no answer within {limit:?}"))))
    }

    /// The first address the system resolver gives for it (blocking for a name).
    pub fn resolve(&self) -> Result<SocketAddr, ResolveError> {
        let authority = self.to_string();
        let mut addrs = authority
            .to_socket_addrs()
            .map_err(|e| ResolveError::Failed {
                authority: authority.clone(),
                cause: e.to_string(),
            })?;
        addrs.next().ok_or(ResolveError::Empty(authority))
    }
}
