//! `FleetView`: one typed, read-only view of live state, built once per read. `/status` serializes
//! it, `/history` samples it and `/metrics` fills its gauges from it, so a health label or a
//! telemetry staleness is computed in one place.

use crate::config::{PlacementKind, TelemetrySettings};
use crate::health::{now_ms, CheckStatus};
use crate::metrics::{ClassMetrics, Metrics, Percentiles};
use crate::routing::prefix::ENTRY_BYTES;
use crate::routing::{Backend, Class, ModelList, Snapshot};
use crate::telemetry::{GpuReading, ServerLoad};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Span of the latency percentiles in `/status` and `/metrics`, seconds: a minute, steady.
pub const STATUS_LATENCY_SPAN_S: u64 = 60;
/// Span of the latency percentiles in each dashboard sample, seconds: short, so charts react.
pub const CHART_LATENCY_SPAN_S: u64 = 10;

/// The fleet as one read saw it.
#[derive(Debug, Serialize)]
pub struct FleetView {
    /// Generation of the config in force.
    pub generation: u64,
    /// Every backend, in config order.
    pub backends: Vec<BackendView>,
    /// Every class, in match order.
    pub classes: Vec<ClassView>,
    /// The prompt prefix index of `prefix_affinity` placement.
    pub prefix_index: PrefixIndexView,
    /// Stored responses (Responses API) whose backend is remembered now.
    pub stored_responses: usize,
    /// Each pool's DNS discovery (filled by whoever holds the registry; empty when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub discovery: Vec<crate::discovery::GroupStatus>,
}

/// The size of the prefix index in a [`FleetView`].
#[derive(Debug, Serialize)]
pub struct PrefixIndexView {
    /// Block entries held now.
    pub entries: usize,
    /// Most entries held.
    pub capacity: usize,
    /// Memory the entries take, about.
    pub approx_bytes: usize,
}

/// One backend in a [`FleetView`].
#[derive(Debug, Serialize)]
pub struct BackendView {
    /// Backend name.
    pub name: String,
    /// Backend URL.
    pub url: String,
    /// Whether gpulb sends it an API key of its own (`auth`); the key itself is never shown.
    pub auth: bool,
    /// Relative capacity.
    pub weight: u32,
    /// In-flight cap.
    pub max_outstanding: u32,
    /// Requests this proxy has in flight on it now.
    pub outstanding: u32,
    /// Estimated tokens (prompt + max_tokens) of those requests, where their bodies were read.
    pub outstanding_tokens: u64,
    /// Requests on it that are not this proxy's (other replicas, direct clients), estimated
    /// from the model server's counts; `None` when there is no recent enough reading (or
    /// `telemetry.count_others` is off). Admission counts them against `max_outstanding`.
    pub others_outstanding: Option<u32>,
    /// Attempts ever sent.
    pub attempts_total: u64,
    /// Attempts it refused (`retry_statuses`) that were sent to another backend instead.
    pub refusals_retried_total: u64,
    /// Passed over now, while another backend has room, for a recent refusal (`retry_statuses`).
    pub refusing: bool,
    /// Active check status.
    pub health: CheckStatus,
    /// Why its address is unknown, when its name did not resolve (it gets no traffic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unresolved: Option<String>,
    /// Out on a passive ejection now.
    pub ejected: bool,
    /// Times ejected so far.
    pub ejections_total: u64,
    /// Consecutive failed attempts on live traffic.
    pub consecutive_failures: u32,
    /// Whether new requests may go to it now.
    pub eligible: bool,
    /// The models it serves and where that list came from; `None` while unknown (it may get
    /// any model).
    pub models: Option<ModelList>,
    /// Its last telemetry reading.
    pub telemetry: TelemetryView,
}

impl BackendView {
    /// `healthy`, `unhealthy`, `unknown`, `unchecked` or `ejected`: the dashboard's label.
    pub fn state_label(&self) -> &'static str {
        if self.ejected {
            return "ejected";
        }
        match self.health {
            CheckStatus::Healthy => "healthy",
            CheckStatus::Unhealthy => "unhealthy",
            CheckStatus::Unknown => "unknown",
            CheckStatus::Unchecked => "unchecked",
        }
    }

    /// Whether its active checks pass (or are off).
    pub fn healthy(&self) -> bool {
        matches!(self.health, CheckStatus::Healthy | CheckStatus::Unchecked)
    }
}

/// A backend's telemetry in [`BackendView`].
#[derive(Debug, Serialize)]
pub struct TelemetryView {
    /// Age of the last reading, seconds; `None` before any.
    pub age_seconds: Option<f64>,
    /// Whether the last reading is older than `telemetry.stale_after`; `None` before any.
    pub stale: Option<bool>,
    /// Scrapes that failed so far.
    pub errors_total: u64,
    /// The GPUs read.
    pub gpus: Vec<GpuView>,
    /// The model server's own load figures.
    pub server: Option<ServerLoad>,
}

/// One GPU in [`TelemetryView`].
#[derive(Debug, Serialize)]
pub struct GpuView {
    /// Label used in metrics: index on the host, else UUID, else position.
    pub gpu: String,
    /// What was read.
    #[serde(flatten)]
    pub reading: GpuReading,
}

/// One class in a [`FleetView`].
#[derive(Debug, Serialize)]
pub struct ClassView {
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
    /// Requests waiting now, per model with any (`*`: naming none).
    pub queue_by_model: BTreeMap<String, usize>,
    /// Requests answered so far.
    pub requests_total: u64,
    /// Requests shed so far.
    pub shed_total: u64,
    /// Latency percentiles over the view's span.
    pub latency: LatencyView,
    /// How it places requests.
    pub placement: PlacementKind,
    /// Expected service time (slot to last byte) of a request of its mean size per backend
    /// of its pool, seconds, as measured; backends without a usable estimate are left out.
    pub service_seconds: BTreeMap<String, f64>,
    /// Its batching settings and state, when it batches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batching: Option<BatchingView>,
}

/// A batching class's settings and batches in [`ClassView`].
#[derive(Debug, Serialize)]
pub struct BatchingView {
    /// Most items in one batch.
    pub max_batch: usize,
    /// Longest a batch waits for members, milliseconds.
    pub max_wait_ms: f64,
    /// Most estimated tokens in one batch, when limited.
    pub max_batch_tokens: Option<u64>,
    /// Batches taking members now.
    pub open_batches: usize,
    /// Requests waiting in them.
    pub waiting: usize,
    /// Requests answered from a batch so far.
    pub batched_total: u64,
    /// Requests of the class sent alone so far.
    pub unbatched_total: u64,
}

/// Recent latency of a class in [`ClassView`], seconds.
#[derive(Debug, Serialize)]
pub struct LatencyView {
    /// Span covered, seconds.
    pub window_seconds: u64,
    /// Time to first byte.
    pub ttfb: Percentiles,
    /// Whole request.
    pub duration: Percentiles,
}

impl FleetView {
    /// Reads `snapshot`'s live state now, with class latencies over the last `latency_span_s`
    /// seconds from `metrics`.
    pub fn read(snapshot: &Snapshot, metrics: &Metrics, latency_span_s: u64) -> FleetView {
        let (now_ms, now) = (now_ms(), Instant::now());
        let settings = &snapshot.config.telemetry;
        FleetView {
            generation: snapshot.generation,
            backends: snapshot
                .backends
                .iter()
                .map(|b| backend_view(b, now_ms, now, settings))
                .collect(),
            classes: snapshot
                .classes
                .iter()
                .map(|c| class_view(snapshot, c, metrics, latency_span_s, now))
                .collect(),
            prefix_index: PrefixIndexView {
                entries: snapshot.prefixes.len(),
                capacity: snapshot.prefixes.capacity(),
                approx_bytes: snapshot.prefixes.len() * ENTRY_BYTES,
            },
            stored_responses: snapshot.responses.len(),
            discovery: Vec::new(),
        }
    }
}

fn backend_view(
    b: &Backend,
    now_ms: u64,
    now: Instant,
    settings: &TelemetrySettings,
) -> BackendView {
    let health = &b.state.health;
    let telemetry = b.state.telemetry.load();
    BackendView {
        name: b.state.name.clone(),
        url: b.url.clone(),
        auth: b.upstream.auth.is_some(),
        weight: b.weight,
        max_outstanding: b.max_outstanding,
        outstanding: b.state.outstanding.get(),
        outstanding_tokens: b.state.outstanding_tokens.load(Ordering::Relaxed),
        others_outstanding: telemetry
            .as_deref()
            .filter(|_| settings.count_others)
            .and_then(|t| t.others_in_flight(settings.others_max_age, now)),
        attempts_total: b.state.attempts_total.load(Ordering::Relaxed),
        refusals_retried_total: b.state.refusals_retried_total.load(Ordering::Relaxed),
        refusing: b.state.refusing(now_ms),
        health: health.status(),
        unresolved: b.state.address.unresolved(),
        ejected: health.is_ejected(now_ms),
        ejections_total: health.ejections_total(),
        consecutive_failures: health.consecutive_failures(),
        eligible: b.state.eligible(now_ms),
        models: b.state.models.get().map(|l| (*l).clone()),
        telemetry: telemetry_view(b, now, settings.stale_after),
    }
}

fn telemetry_view(b: &Backend, now: Instant, stale_after: Duration) -> TelemetryView {
    let last = b.state.telemetry.load_full();
    let age = last
        .as_ref()
        .map(|t| now.saturating_duration_since(t.taken_at));
    TelemetryView {
        age_seconds: age.map(|a| a.as_secs_f64()),
        stale: age.map(|a| a > stale_after),
        errors_total: b.state.telemetry_errors.load(Ordering::Relaxed),
        gpus: last
            .as_ref()
            .map(|t| {
                let gpus = t.reading.gpus.iter().enumerate();
                gpus.map(|(i, g)| GpuView {
                    gpu: g.label(i),
                    reading: g.clone(),
                })
                .collect()
            })
            .unwrap_or_default(),
        server: last.as_ref().and_then(|t| t.reading.server.clone()),
    }
}

fn class_view(
    snapshot: &Snapshot,
    c: &Class,
    metrics: &Metrics,
    latency_span_s: u64,
    now: Instant,
) -> ClassView {
    let m = metrics.class(&c.name);
    let (duration, ttfb) = m.percentiles(latency_span_s);
    ClassView {
        name: c.name.clone(),
        pool: snapshot.pools[c.pool].name.clone(),
        outstanding: c.state.outstanding.get(),
        queue_depth: c.state.queues.depth(),
        queue_by_tenant: c.state.queues.depth_by_tenant(),
        queue_by_model: c.state.queues.depth_by_model(),
        requests_total: m.finished_total(),
        shed_total: m.shed_total(),
        latency: LatencyView {
            window_seconds: latency_span_s,
            ttfb,
            duration,
        },
        placement: c.placement.kind(),
        service_seconds: snapshot
            .service_seconds(c, now)
            .into_iter()
            .map(|(name, secs)| (name.to_string(), secs))
            .collect(),
        batching: batching_view(snapshot, c, &m),
    }
}

fn batching_view(snapshot: &Snapshot, c: &Class, m: &ClassMetrics) -> Option<BatchingView> {
    let config = snapshot.config.classes.iter().find(|k| k.name == c.name)?;
    let settings = config.batching?;
    let (batched_total, unbatched_total) = m.batching_totals();
    Some(BatchingView {
        max_batch: settings.max_batch,
        max_wait_ms: settings.max_wait.as_secs_f64() * 1000.0,
        max_batch_tokens: settings.max_batch_tokens,
        open_batches: c.state.batches.open_count(),
        waiting: c.state.batches.waiting(),
        batched_total,
        unbatched_total,
    })
}
