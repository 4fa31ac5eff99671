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
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            stale_after: defaults::stale_after(),
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

    /// Whether a reading breaks a limit; `None` figures (unknown) break nothing.
    pub fn excludes(&self, reading: &crate::telemetry::Reading) -> bool {
        let over = |value: Option<f64>, limit: Option<f64>| matches!((value, limit), (Some(v), Some(l)) if v > l);
        let server = reading.server.as_ref();
        over(reading.max_memory_fraction(), self.max_gpu_memory)
            || over(server.and_then(|s| s.kv_cache_usage), self.max_kv_cache)
            || over(server.and_then(|s| s.waiting), self.max_server_queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{GpuReading, Reading, ServerLoad};

    fn reading(mem_used: u64, kv: f64, waiting: f64) -> Reading {
        Reading {
            gpus: vec![GpuReading {
                memory_used_bytes: Some(mem_used),
                memory_total_bytes: Some(100),
                ..Default::default()
            }],
            server: Some(ServerLoad {
                running: Some(1.0),
                waiting: Some(waiting),
                kv_cache_usage: Some(kv),
            }),
        }
    }

    #[test]
    fn each_limit_excludes_only_above_it() {
        let g = Guards {
            max_gpu_memory: Some(0.95),
            max_kv_cache: Some(0.9),
            max_server_queue: Some(4.0),
        };
        assert!(!g.excludes(&reading(95, 0.9, 4.0)));
        assert!(g.excludes(&reading(96, 0.1, 0.0)));
        assert!(g.excludes(&reading(10, 0.91, 0.0)));
        assert!(g.excludes(&reading(10, 0.1, 5.0)));
    }

    #[test]
    fn unknown_figures_and_no_limits_exclude_nothing() {
        assert!(!Guards::default().excludes(&reading(100, 1.0, 99.0)));
        let g = Guards {
            max_gpu_memory: Some(0.5),
            max_kv_cache: Some(0.5),
            max_server_queue: Some(0.0),
        };
        assert!(!g.excludes(&Reading::default()));
    }
}
