//! The `GET /status` document: config generation, backends with live counters and telemetry,
//! classes with queues and recent latency percentiles.

use crate::config::Placement;
use crate::health::{now_ms, CheckStatus};
use crate::metrics::{gpu_label, Metrics, Percentiles};
use crate::registry::{Backend, Snapshot};
use crate::reload::ReloadStatus;
use crate::telemetry::ServerLoad;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Span of the latency percentiles in `/status`, seconds.
pub const LATENCY_SPAN_S: u64 = 60;

/// `GET /status` body.
#[derive(Debug, Serialize)]
pub struct Status {
    /// Generation of the config in force.
    pub generation: u64,
    /// Reload history (with the last error, if any), when serving from a config file.
    pub reload: Option<ReloadStatus>,
    /// Every backend with its live counters.
    pub backends: Vec<BackendStatus>,
    /// Every class with its live counters.
    pub classes: Vec<ClassStatus>,
}

/// One backend in [`Status`].
#[derive(Debug, Serialize)]
pub struct BackendStatus {
    /// Backend name.
    pub name: String,
    /// Backend URL.
    pub url: String,
    /// Relative capacity.
    pub weight: u32,
    /// In-flight cap.
    pub max_outstanding: u32,
    /// Requests in flight now.
    pub outstanding: u32,
    /// Attempts ever sent.
    pub attempts_total: u64,
    /// Active check status.
    pub health: CheckStatus,
    /// Out on a passive ejection now.
    pub ejected: bool,
    /// Times ejected so far.
    pub ejections_total: u64,
    /// Consecutive failed attempts on live traffic.
    pub consecutive_failures: u32,
    /// Whether new requests may go to it now.
    pub eligible: bool,
    /// Its last telemetry reading.
    pub telemetry: TelemetryStatus,
}

/// A backend's telemetry in [`BackendStatus`].
#[derive(Debug, Serialize)]
pub struct TelemetryStatus {
    /// Age of the last reading, seconds; `None` before any.
    pub age_seconds: Option<f64>,
    /// Whether the last reading is older than `telemetry.stale_after`; `None` before any.
    pub stale: Option<bool>,
    /// Scrapes that failed so far.
    pub errors_total: u64,
    /// The GPUs read.
    pub gpus: Vec<GpuStatus>,
    /// The model server's own load figures.
    pub server: Option<ServerLoadStatus>,
}

/// One GPU in [`TelemetryStatus`].
#[derive(Debug, Serialize)]
pub struct GpuStatus {
    /// Label used in metrics: index on the host, else UUID, else position.
    pub gpu: String,
    /// `GPU-…` UUID.
    pub uuid: Option<String>,
    /// Compute utilization, 0..1.
    pub utilization: Option<f64>,
    /// Memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Memory in all, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Core temperature, °C.
    pub temperature_celsius: Option<f64>,
    /// Power draw, W.
    pub power_watts: Option<f64>,
}

/// The model server's load in [`TelemetryStatus`].
#[derive(Debug, Serialize)]
pub struct ServerLoadStatus {
    /// Requests in its running batch.
    pub running: Option<f64>,
    /// Requests queued inside it.
    pub waiting: Option<f64>,
    /// KV-cache usage, 0..1.
    pub kv_cache_usage: Option<f64>,
}

impl From<&ServerLoad> for ServerLoadStatus {
    fn from(l: &ServerLoad) -> Self {
        ServerLoadStatus {
            running: l.running,
            waiting: l.waiting,
            kv_cache_usage: l.kv_cache_usage,
        }
    }
}

/// One class in [`Status`].
#[derive(Debug, Serialize)]
pub struct ClassStatus {
    /// Class name.
    pub name: String,
    /// Its pool.
    pub pool: String,
    /// Requests in flight now.
    pub outstanding: u32,
    /// Requests waiting in its queue now.
    pub queue_depth: usize,
    /// Requests waiting now, per tenant with any.
    pub queue_by_tenant: BTreeMap<String, usize>,
    /// Requests answered so far.
    pub requests_total: u64,
    /// Requests shed so far.
    pub shed_total: u64,
    /// Latency percentiles over the last [`LATENCY_SPAN_S`] seconds.
    pub latency: LatencyStatus,
    /// How it places requests (`least_loaded`, `speed_weighted`, `earliest_finish`).
    pub placement: Placement,
    /// Expected service time (slot to last byte) of a request of its mean size per backend
    /// of its pool, seconds, as measured; backends without a usable estimate are left out.
    pub service_seconds: BTreeMap<String, f64>,
}

/// Recent latency of a class in [`ClassStatus`], seconds.
#[derive(Debug, Serialize)]
pub struct LatencyStatus {
    /// Span covered, seconds.
    pub window_seconds: u64,
    /// Time to first byte.
    pub ttfb: Percentiles,
    /// Whole request.
    pub duration: Percentiles,
}

fn telemetry_of(b: &Backend, now: Instant, stale_after: Duration) -> TelemetryStatus {
    let t = b.state.telemetry.load_full();
    let age = t
        .as_ref()
        .map(|t| now.saturating_duration_since(t.taken_at));
    TelemetryStatus {
        age_seconds: age.map(|a| a.as_secs_f64()),
        stale: age.map(|a| a > stale_after),
        errors_total: b.state.telemetry_errors.load(Ordering::Relaxed),
        gpus: t
            .as_ref()
            .map(|t| {
                t.reading
                    .gpus
                    .iter()
                    .enumerate()
                    .map(|(i, g)| GpuStatus {
                        gpu: gpu_label(g, i),
                        uuid: g.uuid.clone(),
                        utilization: g.utilization,
                        memory_used_bytes: g.memory_used_bytes,
                        memory_total_bytes: g.memory_total_bytes,
                        temperature_celsius: g.temperature_celsius,
                        power_watts: g.power_watts,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        server: t
            .as_ref()
            .and_then(|t| t.reading.server.as_ref())
            .map(Into::into),
    }
}

impl Status {
    /// The status of one snapshot's live state, with class latencies from `metrics`.
    pub fn of(snapshot: &Snapshot, reload: Option<ReloadStatus>, metrics: &Metrics) -> Status {
        let now = now_ms();
        let instant = Instant::now();
        let stale_after = snapshot.config.telemetry.stale_after;
        Status {
            generation: snapshot.generation,
            reload,
            backends: snapshot
                .backends
                .iter()
                .map(|b| BackendStatus {
                    name: b.state.name.clone(),
                    url: b.url.clone(),
                    weight: b.weight,
                    max_outstanding: b.max_outstanding,
                    outstanding: b.state.outstanding.get(),
                    attempts_total: b.state.attempts_total.load(Ordering::Relaxed),
                    health: b.state.health.status(),
                    ejected: b.state.health.is_ejected(now),
                    ejections_total: b.state.health.ejections_total(),
                    consecutive_failures: b.state.health.consecutive_failures(),
                    eligible: b.state.health.eligible(now),
                    telemetry: telemetry_of(b, instant, stale_after),
                })
                .collect(),
            classes: snapshot
                .classes
                .iter()
                .map(|c| {
                    let m = metrics.class(&c.name);
                    let (duration, ttfb) = m.percentiles(LATENCY_SPAN_S);
                    ClassStatus {
                        name: c.name.clone(),
                        pool: snapshot.pools[c.pool].name.clone(),
                        outstanding: c.state.outstanding.get(),
                        queue_depth: c.state.queue.depth(),
                        queue_by_tenant: c.state.queue.depth_by_tenant().into_iter().collect(),
                        requests_total: m.finished_total(),
                        shed_total: m.shed_total(),
                        latency: LatencyStatus {
                            window_seconds: LATENCY_SPAN_S,
                            ttfb,
                            duration,
                        },
                        placement: c.placement,
                        service_seconds: snapshot
                            .service_seconds(c, instant)
                            .into_iter()
                            .map(|(name, secs)| (name.to_string(), secs))
                            .collect(),
                    }
                })
                .collect(),
        }
    }
}
