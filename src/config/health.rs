//! Health check and outlier ejection settings.

use super::{defaults, duration};
use serde::Deserialize;
use std::time::Duration;

/// Active health checks of one backend.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// Check at all; an unchecked backend counts as healthy.
    #[serde(default = "defaults::health_enabled")]
    pub enabled: bool,
    /// HTTP path that answers 2xx when the backend is healthy.
    #[serde(default = "defaults::health_path")]
    pub path: String,
    /// Time between checks.
    #[serde(default = "defaults::health_interval", with = "duration")]
    pub interval: Duration,
    /// Longest wait for a check's answer.
    #[serde(default = "defaults::health_timeout", with = "duration")]
    pub timeout: Duration,
    /// Consecutive passes that make an unhealthy backend healthy.
    #[serde(default = "defaults::health_rise")]
    pub rise: u32,
    /// Consecutive failures that make a healthy backend unhealthy.
    #[serde(default = "defaults::health_fall")]
    pub fall: u32,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            enabled: defaults::health_enabled(),
            path: defaults::health_path(),
            interval: defaults::health_interval(),
            timeout: defaults::health_timeout(),
            rise: defaults::health_rise(),
            fall: defaults::health_fall(),
        }
    }
}

/// Per-backend overrides of [`HealthCheck`]; absent fields take the top-level value.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckOverride {
    /// See [`HealthCheck::enabled`].
    pub enabled: Option<bool>,
    /// See [`HealthCheck::path`].
    pub path: Option<String>,
    /// See [`HealthCheck::interval`].
    #[serde(default, with = "duration::option")]
    pub interval: Option<Duration>,
    /// See [`HealthCheck::timeout`].
    #[serde(default, with = "duration::option")]
    pub timeout: Option<Duration>,
    /// See [`HealthCheck::rise`].
    pub rise: Option<u32>,
    /// See [`HealthCheck::fall`].
    pub fall: Option<u32>,
}

impl HealthCheck {
    /// These defaults with a backend's overrides applied.
    pub fn with(&self, o: &HealthCheckOverride) -> HealthCheck {
        HealthCheck {
            enabled: o.enabled.unwrap_or(self.enabled),
            path: o.path.clone().unwrap_or_else(|| self.path.clone()),
            interval: o.interval.unwrap_or(self.interval),
            timeout: o.timeout.unwrap_or(self.timeout),
            rise: o.rise.unwrap_or(self.rise),
            fall: o.fall.unwrap_or(self.fall),
        }
    }
}

/// Passive outlier ejection: failures seen on live traffic take a backend out for a while.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutlierDetection {
    /// Consecutive connect failures, timeouts or 5xx answers that eject; 0 turns ejection off.
    #[serde(default = "defaults::outlier_failures")]
    pub consecutive_failures: u32,
    /// Ejection time of a first ejection; each repeat multiplies it (1x, 2x, 3x, ...).
    #[serde(default = "defaults::outlier_base", with = "duration")]
    pub base_ejection: Duration,
    /// Cap on the ejection time.
    #[serde(default = "defaults::outlier_max", with = "duration")]
    pub max_ejection: Duration,
    /// Most of a pool that may be ejected at once, in percent (one backend always may be).
    #[serde(default = "defaults::outlier_max_percent")]
    pub max_ejected_percent: u32,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection {
            consecutive_failures: defaults::outlier_failures(),
            base_ejection: defaults::outlier_base(),
            max_ejection: defaults::outlier_max(),
            max_ejected_percent: defaults::outlier_max_percent(),
        }
    }
}
