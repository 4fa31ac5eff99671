//! Telemetry trust and the guards that keep loaded GPUs out of rotation.

use super::{defaults, duration};
use serde::Deserialize;
use std::time::Duration;

/// How telemetry readings are trusted.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// A reading older than this is unknown: it neither excludes nor favours a backend.
    #[serde(default = "defaults::stale_after", with = "duration")]
    pub stale_after: Duration,
    /// Whether admission counts the requests a backend's model server reports beyond this
    /// proxy's own (other gpulb replicas, clients that bypass it) against the backend's
    /// `max_outstanding` and each class's `backend_share` of it.
    #[serde(default = "defaults::count_others")]
    pub count_others: bool,
    /// The oldest server reading that estimate is made from; older, only this proxy's own
    /// requests count.
    #[serde(default = "defaults::others_max_age", with = "duration")]
    pub others_max_age: Duration,
    /// While requests wait in a queue and other replicas' requests hold part of a backend, its
    /// model server is read this often instead of its source's interval (the room they free
    /// is seen sooner); `None` (`off`): never faster.
    #[serde(default = "defaults::waiting_interval", with = "duration::or_off")]
    pub waiting_interval: Option<Duration>,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            stale_after: defaults::stale_after(),
            count_others: defaults::count_others(),
            others_max_age: defaults::others_max_age(),
            waiting_interval: defaults::waiting_interval(),
        }
    }
}

/// Limits on a backend's telemetry beyond which it gets no new requests; absent = no limit.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Guards {
    /// Highest used share of GPU memory (0..=1) on the backend's most loaded GPU.
    #[serde(default)]
    pub max_gpu_memory: Option<f64>,
    /// Highest KV-cache usage (0..=1) the model server reports.
    #[serde(default)]
    pub max_kv_cache: Option<f64>,
    /// Most requests waiting in the model server's own queue.
    #[serde(default)]
    pub max_server_queue: Option<f64>,
}

impl Guards {
    /// Each configured limit with its field name, for validation.
    pub fn limits(&self) -> [(&'static str, Option<f64>, f64); 3] {
        [
            ("max_gpu_memory", self.max_gpu_memory, 1.0),
            ("max_kv_cache", self.max_kv_cache, 1.0),
            ("max_server_queue", self.max_server_queue, f64::INFINITY),
        ]
    }
}
