//! Process-level settings: admin listener, timeouts, reload, access log and metrics.

use super::{defaults, duration};
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

/// The access log.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AccessLogConfig {
    /// Write it at all.
    #[serde(default = "defaults::access_log_enabled")]
    pub enabled: bool,
    /// `json` (one object per line) or `text`.
    #[serde(default)]
    pub format: AccessLogFormat,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            enabled: defaults::access_log_enabled(),
            format: Default::default(),
        }
    }
}

impl AccessLogConfig {
    /// The format to write in, or `None` when the access log is off.
    pub fn format(&self) -> Option<AccessLogFormat> {
        self.enabled.then_some(self.format)
    }
}

/// Prometheus metrics settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Tenants given their own label value; the rest fold into `other`.
    #[serde(default = "defaults::max_tenants")]
    pub max_tenants: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            max_tenants: defaults::max_tenants(),
        }
    }
}

/// Live reload of the config file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReloadConfig {
    /// Reload when the file changes on disk (SIGHUP and `POST /reload` always work).
    #[serde(default = "defaults::reload_watch")]
    pub watch: bool,
    /// Quiet time after the last file event before reloading, so one save is one reload.
    #[serde(default = "defaults::reload_debounce", with = "duration")]
    pub debounce: Duration,
    /// Longest one reload may take (reading, parsing, validating, resolving); past it the
    /// reload is abandoned, reported, and the running config keeps serving.
    #[serde(default = "defaults::reload_timeout", with = "duration")]
    pub timeout: Duration,
    /// Longest the lookup of one backend host name may take when a config is loaded; a name
    /// with no answer by then starts unresolved (no traffic) and health checks retry it.
    #[serde(default = "defaults::resolve_timeout", with = "duration")]
    pub resolve_timeout: Duration,
}

impl Default for ReloadConfig {
    fn default() -> Self {
        ReloadConfig {
            watch: defaults::reload_watch(),
            debounce: defaults::reload_debounce(),
            timeout: defaults::reload_timeout(),
            resolve_timeout: defaults::resolve_timeout(),
        }
    }
}

/// The admin listener.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin listener (keep it on loopback).
    pub listen: SocketAddr,
    /// Environment variable holding the bearer token that mutating endpoints require.
    #[serde(default)]
    pub token_env: Option<String>,
    /// File holding that token (first line), as an alternative to `token_env`.
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
    /// Serve `/metrics` without the token on a non-loopback listener, so Prometheus scrapes
    /// without credentials; every other data endpoint stays guarded.
    #[serde(default)]
    pub public_metrics: bool,
}

/// Upstream timeouts.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// Longest wait for a TCP connection to a backend.
    #[serde(default = "defaults::connect_timeout", with = "duration")]
    pub connect: Duration,
    /// Longest wait from the request sent to the response's first body byte (the first token
    /// when streaming); `read` when unset, else 300s.
    #[serde(default, with = "duration::option")]
    pub first_byte: Option<Duration>,
    /// Longest silence between two body chunks of a response; `read` when unset, else 60s.
    #[serde(default, with = "duration::option")]
    pub idle: Option<Duration>,
    /// Both of the above at once, as one per-read timeout (the key before they were split).
    #[serde(default, with = "duration::option")]
    pub read: Option<Duration>,
    /// Longest wait for one write of the request to a backend.
    #[serde(default = "defaults::write_timeout", with = "duration")]
    pub write: Duration,
    /// How long an idle upstream keep-alive connection is kept for reuse.
    #[serde(default = "defaults::upstream_idle_timeout", with = "duration")]
    pub upstream_keepalive: Duration,
    /// Longest a client may take to send a request body that gpulb reads before routing
    /// (`request_body.paths`); past it the client gets 408.
    #[serde(default = "defaults::client_body_timeout", with = "duration")]
    pub client_body: Duration,
    /// Longest a client may take to send a whole request header, from its first byte (or the
    /// connection's start); a slowloris client is closed past it.
    #[serde(default = "defaults::client_header_timeout", with = "duration")]
    pub client_header: Duration,
    /// Longest a keep-alive client connection may sit idle between two requests.
    #[serde(default = "defaults::client_idle_timeout", with = "duration")]
    pub client_idle: Duration,
}

impl Timeouts {
    /// `first_byte` in force.
    pub fn first_byte(&self) -> Duration {
        self.first_byte
            .or(self.read)
            .unwrap_or_else(defaults::first_byte_timeout)
    }

    /// `idle` in force.
    pub fn idle(&self) -> Duration {
        self.idle
            .or(self.read)
            .unwrap_or_else(defaults::idle_timeout)
    }

    /// Whether the two are one per-read timeout, as pingora applies it on its own: `read`
    /// alone, or both set equal.
    pub fn per_read(&self) -> bool {
        self.first_byte() == self.idle()
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: defaults::connect_timeout(),
            first_byte: None,
            idle: None,
            read: None,
            write: defaults::write_timeout(),
            upstream_keepalive: defaults::upstream_idle_timeout(),
            client_body: defaults::client_body_timeout(),
            client_header: defaults::client_header_timeout(),
            client_idle: defaults::client_idle_timeout(),
        }
    }
}

/// How access lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFormat {
    /// One JSON object per line, fields flattened.
    #[default]
    Json,
    /// `tracing`'s human-readable `key=value` text.
    Text,
}

/// Limits on client connections.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Most client connections open at once; beyond it new ones are closed at once (logged and
    /// counted). Absent: derived from the open-file limit at start.
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Largest request header (request line included), bytes; a client sending more is closed.
    #[serde(default = "defaults::max_header_bytes")]
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: None,
            max_header_bytes: defaults::max_header_bytes(),
        }
    }
}
