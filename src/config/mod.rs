//! Typed YAML configuration: what the file may say, its defaults, and loading it.
//!
//! Every key is documented in `conf/gpulb.yaml`; defaults live in [`defaults`] only.

mod admission;
mod auth;
mod batching;
mod compiled;
pub mod defaults;
mod diff;
mod discover;
pub mod duration;
mod guards;
mod health;
mod process;
mod request;
mod telemetry;
mod tenants;
mod tls;
mod validate;

pub use admission::{FairnessConfig, FairnessPolicy, QueueConfig};
pub use auth::{read_token, BackendAuth, Credential, TokenError};
pub use batching::BatchingConfig;
pub use compiled::{Compiled, MatchRule, ResolveError, Upstream};
pub use diff::describe_changes;
pub use discover::{BackendTemplate, DiscoverConfig, Found};
pub use guards::{Guards, TelemetrySettings};
pub use health::{HealthCheck, HealthCheckOverride, OutlierDetection};
pub use process::{
    AccessLogConfig, AccessLogFormat, AdminConfig, Limits, MetricsConfig, ReloadConfig, Timeouts,
};
pub use request::{
    glob_matches, CountRange, ModelPatterns, ModelsConfig, OverLimit, RequestBodyConfig,
};
pub use telemetry::{GpuSelector, ServerKind, SourceConfig, SourceKind};
pub use tenants::{ApiKeys, TenantSource, TenantsConfig};
pub use tls::{BackendTls, CaBundle, CertError, CertFile, ListenTls, ServingCert, UpstreamTls};
pub use validate::{ConfigError, ConfigErrors};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address the proxy listens on for client traffic.
    #[serde(default = "defaults::listen")]
    pub listen: SocketAddr,
    /// Serve HTTPS on `listen` with this certificate; absent means plain HTTP. Turning it on
    /// or off takes a restart; the files are read again on every reload.
    #[serde(default)]
    pub listen_tls: Option<ListenTls>,
    /// Worker threads of the proxy's runtime.
    #[serde(default = "defaults::threads")]
    pub threads: usize,
    /// The admin listener (status JSON); absent means none.
    #[serde(default)]
    pub admin: Option<AdminConfig>,
    /// Upstream timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Limits on client connections.
    #[serde(default)]
    pub limits: Limits,
    /// How often a request whose connect failed is tried again on another backend.
    #[serde(default = "defaults::connect_retries")]
    pub connect_retries: usize,
    /// Statuses a backend answers when it refuses work it has not started (TGI's `429` past
    /// `--max-concurrent-requests`): such an answer, before anything reached the client, sends
    /// the request to another backend of its pool instead, within `connect_retries`.
    #[serde(default = "defaults::retry_statuses")]
    pub retry_statuses: Vec<u16>,
    /// Time in-flight and queued requests get to finish on graceful shutdown (SIGTERM), after
    /// `drain_delay`.
    #[serde(default = "defaults::shutdown_timeout", with = "duration")]
    pub shutdown_timeout: Duration,
    /// On SIGTERM, how long gpulb keeps serving normally while reporting not-ready (so a load
    /// balancer in front, or Kubernetes, stops sending it traffic) before it refuses new
    /// requests and waits for those in flight.
    #[serde(default, with = "duration")]
    pub drain_delay: Duration,
    /// Header carrying the request id; added when the client sent none, echoed back.
    #[serde(default = "defaults::request_id_header")]
    pub request_id_header: String,
    /// Whether HTTP/1 header names are forwarded in the case they arrived in (both ways), or
    /// in lower case with the common ones titled (`Host`, `Content-Type`...), as HAProxy and
    /// Envoy forward them; keeping the case costs a second header map per request and response.
    #[serde(default)]
    pub preserve_header_case: bool,
    /// The inference workers.
    pub backends: Vec<BackendConfig>,
    /// Named sets of backends; when absent, one pool `default` holds every backend.
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    /// Request classes, matched in order; when absent, one class `default` uses the only pool.
    #[serde(default)]
    pub classes: Vec<ClassConfig>,
    /// Class of requests no rule matches; may be omitted when there is one class.
    #[serde(default)]
    pub default_class: Option<String>,
    /// How config changes are picked up while serving.
    #[serde(default)]
    pub reload: ReloadConfig,
    /// Active health check defaults for every backend (each may override any field).
    #[serde(default)]
    pub health_check: HealthCheck,
    /// Passive outlier ejection from live traffic.
    #[serde(default)]
    pub outlier_detection: OutlierDetection,
    /// How telemetry readings are trusted.
    #[serde(default)]
    pub telemetry: TelemetrySettings,
    /// Header naming the request's tenant, for fairness and per-tenant caps.
    #[serde(default = "defaults::tenant_header")]
    pub tenant_header: String,
    /// Where a request's tenant comes from (its header, or its API key).
    #[serde(default)]
    pub tenants: TenantsConfig,
    /// One structured line per request on stdout.
    #[serde(default)]
    pub access_log: AccessLogConfig,
    /// Prometheus metrics settings.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Which request bodies are read before routing, and their size limit.
    #[serde(default)]
    pub request_body: RequestBodyConfig,
    /// Where backends' served models come from, and model aliases.
    #[serde(default)]
    pub models: ModelsConfig,
    /// The typed values validation compiled from the keys above (not a key itself).
    #[serde(skip)]
    pub compiled: Compiled,
}

/// One inference worker.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Unique name; live state (outstanding counts) is kept by name across reloads.
    pub name: String,
    /// `http://host:port` or `https://host:port` of the worker.
    pub url: String,
    /// How an `https://` backend's certificate is checked (over its pool's `tls`).
    #[serde(default)]
    pub tls: Option<BackendTls>,
    /// The API key its model server requires, sent as `Authorization: Bearer` (over its
    /// pool's `auth`).
    #[serde(default)]
    pub auth: Option<BackendAuth>,
    /// Relative capacity: a weight-2 backend is given twice the outstanding requests.
    #[serde(default = "defaults::weight")]
    pub weight: u32,
    /// Most requests in flight on this backend at once; beyond it the backend is skipped.
    #[serde(default = "defaults::max_outstanding")]
    pub max_outstanding: u32,
    /// Overrides of the top-level `health_check` for this backend.
    #[serde(default)]
    pub health_check: HealthCheckOverride,
    /// Where this backend's GPU and load figures are read (several sources merge).
    #[serde(default)]
    pub telemetry: Vec<SourceConfig>,
    /// The models it serves; absent = discovered from its `GET /v1/models` (`models.discover`),
    /// or unknown (it may get any model).
    #[serde(default)]
    pub models: Option<Vec<String>>,
}

/// A named set of backends.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Unique pool name, referred to by classes.
    pub name: String,
    /// Names of the backends in this pool.
    pub backends: Vec<String>,
    /// Telemetry limits beyond which a backend of this pool gets no new requests.
    #[serde(default)]
    pub guards: Guards,
    /// Backends found by DNS, added to `backends` while their records last.
    #[serde(default)]
    pub discover: Option<DiscoverConfig>,
    /// How the certificates of this pool's `https://` backends are checked, where a backend
    /// does not say.
    #[serde(default)]
    pub tls: Option<BackendTls>,
    /// The API key of this pool's backends' model servers, where a backend does not say
    /// (discovered backends included).
    #[serde(default)]
    pub auth: Option<BackendAuth>,
}

/// A class of requests: which requests belong to it, where they go, and its limits.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Unique class name.
    pub name: String,
    /// Rules a request must all satisfy to join this class; empty matches everything.
    #[serde(default, rename = "match")]
    pub matcher: MatchConfig,
    /// Pool serving this class.
    pub pool: String,
    /// Most requests of this class in flight at once across its pool; absent means no cap.
    #[serde(default)]
    pub max_outstanding: Option<u32>,
    /// Telemetry guards for this class, replacing its pool's.
    #[serde(default)]
    pub guards: Option<Guards>,
    /// Queue for requests that find no free slot.
    #[serde(default)]
    pub queue: QueueConfig,
    /// How tenants share the queue.
    #[serde(default)]
    pub fairness: FairnessConfig,
    /// Most requests one tenant may have queued or in flight in this class; absent = no cap.
    #[serde(default)]
    pub tenant_max_outstanding: Option<u32>,
    /// Pool used only when the class's own pool has no free slot.
    #[serde(default)]
    pub fallback_pool: Option<String>,
    /// Share (0..=1] of each backend's `max_outstanding` this class may fill, leaving the rest
    /// to other classes; absent = all of it.
    #[serde(default)]
    pub backend_share: Option<f64>,
    /// How a backend is chosen among those with a free slot, and whether to wait for a faster one.
    #[serde(default)]
    pub placement: PlacementKind,
    /// Merge compatible `/v1/embeddings` requests into one upstream call; absent = never.
    #[serde(default)]
    pub batching: Option<BatchingConfig>,
}

/// How a class chooses among the backends of its pool.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PlacementKind {
    /// Least outstanding requests relative to weight.
    #[default]
    LeastLoaded,
    /// As `least_loaded`, with each backend's weight divided by how much slower than the
    /// fastest its measured service time for this class is.
    SpeedWeighted,
    /// The fastest backend (by measured service time for this class) with a free slot; a
    /// request is held for a faster backend when the faster ones are expected to free a slot
    /// for it sooner than the slower one would finish it.
    EarliestFinish,
    /// The least estimated work in tokens (prompt + max_tokens of what is in flight, or the
    /// KV-cache its server reports in use), relative to weight and measured speed.
    LeastWork,
    /// The backend that was last sent the longest part of the prompt's prefix (its KV-cache
    /// likely holds it), within a bounded load; unseen prompts by rendezvous hash.
    PrefixAffinity,
}

/// Match rules of a class; every rule given must hold.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MatchConfig {
    /// The request path starts with this prefix.
    #[serde(default)]
    pub path_prefix: Option<String>,
    /// The request method is one of these (case-insensitive).
    #[serde(default)]
    pub methods: Vec<String>,
    /// Each header is present with exactly this value (`"*"`: present with any value).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `Content-Length` is at least this many bytes (a body without one counts as 0).
    #[serde(default)]
    pub min_content_length: Option<u64>,
    /// `Content-Length` is below this many bytes (a body without one counts as 0).
    #[serde(default)]
    pub max_content_length: Option<u64>,
    /// The body's `model` (after aliases) matches one of these patterns (`*` globs).
    #[serde(default)]
    pub model: Option<ModelPatterns>,
    /// The body's `stream` is this (absent in the body counts as `false`).
    #[serde(default)]
    pub stream: Option<bool>,
    /// The body's `max_tokens` (or `max_completion_tokens`) lies in this range (absent: 0).
    #[serde(default)]
    pub max_tokens: Option<CountRange>,
    /// The prompt's estimated tokens (its text's bytes / 4) lie in this range.
    #[serde(default)]
    pub prompt_tokens: Option<CountRange>,
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The text is not valid YAML for this schema.
    #[error("{0}")]
    Parse(String),
    /// The file parsed but its values are inconsistent.
    #[error("{0}")]
    Invalid(ConfigErrors),
}

impl Config {
    /// Reads, parses, fills implied pools/classes and validates a config file.
    pub fn load(path: &Path) -> Result<Config, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_yaml(&text)
    }

    /// Parses and validates config text.
    pub fn from_yaml(text: &str) -> Result<Config, LoadError> {
        let deserializer = serde_yaml::Deserializer::from_str(text);
        let mut config: Config = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            // serde_yaml names the path itself for some errors (a value of the wrong type).
            if path == "." || path.is_empty() || inner.starts_with(&format!("{path}: ")) {
                LoadError::Parse(inner)
            } else {
                LoadError::Parse(format!("{path}: {inner}"))
            }
        })?;
        config.fill_implied();
        config.compiled = config.validate().map_err(LoadError::Invalid)?;
        config.validate_discovery()?;
        Ok(config)
    }

    /// Adds the pool and class a minimal file implies, so later code sees them spelled out.
    fn fill_implied(&mut self) {
        if self.pools.is_empty() {
            self.pools.push(PoolConfig {
                name: defaults::POOL.to_string(),
                backends: self.backends.iter().map(|b| b.name.clone()).collect(),
                guards: Guards::default(),
                discover: None,
                tls: None,
                auth: None,
            });
        }
        if self.classes.is_empty() && self.pools.len() == 1 {
            self.classes.push(ClassConfig {
                name: defaults::CLASS.to_string(),
                matcher: MatchConfig::default(),
                pool: self.pools[0].name.clone(),
                max_outstanding: None,
                guards: None,
                queue: QueueConfig::default(),
                fairness: FairnessConfig::default(),
                tenant_max_outstanding: None,
                fallback_pool: None,
                backend_share: None,
                placement: PlacementKind::default(),
                batching: None,
            });
        }
        if self.default_class.is_none() && self.classes.len() == 1 {
            self.default_class = Some(self.classes[0].name.clone());
        }
    }

    /// One line saying what this config holds, printed by `gpulb check`.
    pub fn summary(&self) -> String {
        format!(
            "listen {}, {} backends, {} pools, {} classes (default {}), {} threads",
            self.listen,
            self.backends.len(),
            self.pools.len(),
            self.classes.len(),
            self.default_class.as_deref().unwrap_or("-"),
            self.threads
        )
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
