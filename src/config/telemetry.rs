//! Typed config of a telemetry source: where a backend's GPU and load figures come from.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::{defaults, duration, ConfigError};

/// Which model server's metric names to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// vLLM (`vllm:*`).
    Vllm,
    /// SGLang (`sglang:*`, needs `--enable-metrics`).
    Sglang,
    /// Hugging Face text-generation-inference (`tgi_*`).
    Tgi,
    /// NVIDIA Triton (`nv_*`, port 8002 by default).
    Triton,
    /// llama.cpp server (`llamacpp:*`, needs `--metrics`).
    Llamacpp,
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerKind::Vllm => "vllm",
            ServerKind::Sglang => "sglang",
            ServerKind::Tgi => "tgi",
            ServerKind::Triton => "triton",
            ServerKind::Llamacpp => "llamacpp",
        })
    }
}

/// Which GPU: its index on the host, or its `GPU-…` UUID (YAML: an integer or a string).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GpuSelector {
    /// NVML / dcgm index (`gpu="0"`).
    Index(u32),
    /// UUID (`UUID="GPU-…"`), compared ignoring ASCII case.
    Uuid(String),
}

impl fmt::Display for GpuSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuSelector::Index(i) => write!(f, "{i}"),
            GpuSelector::Uuid(u) => f.write_str(u),
        }
    }
}

impl std::str::FromStr for GpuSelector {
    type Err = String;

    /// `"3"` is an index, anything else a UUID; empty text and `"-1"` are refused.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Err("empty GPU selector".to_string());
        }
        if s.starts_with('-')
            && s.get(1..)
                .is_some_and(|r| r.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(format!("GPU index {s} is negative"));
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return s
                .parse()
                .map(GpuSelector::Index)
                .map_err(|_| format!("GPU index {s} out of range"));
        }
        Ok(GpuSelector::Uuid(s.to_string()))
    }
}

impl<'de> Deserialize<'de> for GpuSelector {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = GpuSelector;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a GPU index (0, 1, ...) or a UUID string (\"GPU-...\")")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<GpuSelector, E> {
                u32::try_from(v)
                    .map(GpuSelector::Index)
                    .map_err(|_| E::custom(format!("GPU index {v} out of range")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<GpuSelector, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("GPU index {v} is negative")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<GpuSelector, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// Where one telemetry source reads from, and how often.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "RawSource")]
pub struct SourceConfig {
    /// What is read.
    pub kind: SourceKind,
    /// Time between two reads.
    pub interval: Duration,
    /// Longest a read may take.
    pub timeout: Duration,
}

/// The kinds of source.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceKind {
    /// NVML on this host (the proxy runs beside the GPUs); empty `gpus` = every GPU.
    Nvml {
        /// The GPUs of this backend.
        gpus: Vec<GpuSelector>,
    },
    /// A dcgm-exporter (or `gpulb agent`) endpoint; empty `gpus` = every GPU it reports.
    Dcgm {
        /// Full URL of the metrics page, e.g. `http://host:9400/metrics`.
        url: String,
        /// The GPUs of this backend.
        gpus: Vec<GpuSelector>,
    },
    /// The model server's own `/metrics`.
    ModelServer {
        /// Which server's metric names to read.
        server: ServerKind,
        /// Metrics URL; `None` means the backend's URL + `/metrics`.
        url: Option<String>,
    },
}

impl SourceConfig {
    /// The URL this source scrapes for a backend at `backend_url` (`None` for NVML).
    pub fn url(&self, backend_url: &str) -> Option<String> {
        match &self.kind {
            SourceKind::Nvml { .. } => None,
            SourceKind::Dcgm { url, .. } => Some(url.clone()),
            SourceKind::ModelServer { url: Some(url), .. } => Some(url.clone()),
            SourceKind::ModelServer { url: None, .. } => {
                Some(format!("{}/metrics", backend_url.trim_end_matches('/')))
            }
        }
    }

    /// Checks values serde cannot: a problem is returned as `field: message`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let error = |path: &str, message: String| ConfigError {
            path: path.to_string(),
            message,
        };
        let least = super::defaults::MIN_POLL_INTERVAL;
        if self.interval < least {
            return Err(error("interval", format!("must be at least {least:?}")));
        }
        if self.timeout.is_zero() {
            return Err(error("timeout", "must be > 0".into()));
        }
        let url = match &self.kind {
            SourceKind::Dcgm { url, .. } => Some(url),
            SourceKind::ModelServer { url, .. } => url.as_ref(),
            SourceKind::Nvml { .. } => None,
        };
        match url {
            Some(u) if !u.starts_with("http://") && !u.starts_with("https://") => Err(error(
                "url",
                format!("{u:?} must start with http:// or https://"),
            )),
            _ => Ok(()),
        }
    }

    /// A short name for logs: `nvml`, `dcgm`, `vllm`...
    pub fn label(&self) -> String {
        match &self.kind {
            SourceKind::Nvml { .. } => "nvml".to_string(),
            SourceKind::Dcgm { .. } => "dcgm".to_string(),
            SourceKind::ModelServer { server, .. } => server.to_string(),
        }
    }
}

/// The YAML shape: tagged by `kind`, timing keys beside the kind's own keys.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum RawSource {
    Nvml {
        #[serde(default)]
        gpus: Vec<GpuSelector>,
        #[serde(default = "defaults::telemetry_interval", with = "duration")]
        interval: Duration,
        #[serde(default = "defaults::telemetry_timeout", with = "duration")]
        timeout: Duration,
    },
    Dcgm {
        url: String,
        #[serde(default)]
        gpus: Vec<GpuSelector>,
        #[serde(default = "defaults::telemetry_interval", with = "duration")]
        interval: Duration,
        #[serde(default = "defaults::telemetry_timeout", with = "duration")]
        timeout: Duration,
    },
    ModelServer {
        server: ServerKind,
        #[serde(default)]
        url: Option<String>,
        #[serde(default = "defaults::telemetry_interval", with = "duration")]
        interval: Duration,
        #[serde(default = "defaults::telemetry_timeout", with = "duration")]
        timeout: Duration,
    },
}

impl From<RawSource> for SourceConfig {
    fn from(raw: RawSource) -> Self {
        let (kind, interval, timeout) = match raw {
            RawSource::Nvml {
                gpus,
                interval,
                timeout,
            } => (SourceKind::Nvml { gpus }, interval, timeout),
            RawSource::Dcgm {
                url,
                gpus,
                interval,
                timeout,
            } => (SourceKind::Dcgm { url, gpus }, interval, timeout),
            RawSource::ModelServer {
                server,
                url,
                interval,
                timeout,
            } => (SourceKind::ModelServer { server, url }, interval, timeout),
        };
        SourceConfig {
            kind,
            interval,
            timeout,
        }
    }
}
