//! Every Prometheus collector of gpulb, registered in one place (its own registry, not the
//! global one), with typed recording methods for the request path.
//!
//! Request-path figures (requests, latencies, sheds) are recorded here as they happen. Live state
//! that already sits in atomics (backends, health, queues, telemetry, reloads) is not copied
//! here: the admin exposition reads it from the fleet view (`view.rs`) at scrape time, so
//! nothing is counted twice and backends removed by a reload vanish from the next scrape.

mod class;
mod connections;

mod window;

pub use class::{BatchFigures, ClassMetrics};
pub use connections::{ClientTimeout, ConnectionMetrics};
pub use window::{LatencyWindow, Percentiles, WINDOW_SECS};

use crate::health::now_ms;
use crate::hostinfo::{CpuRatios, CpuSampler};
use class::TenantLabels;
use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Histogram buckets (seconds) for LLM latencies: milliseconds for a cached token, minutes for a
/// long generation.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Histogram buckets (input items) for the size of a batch.
pub const BATCH_SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// Histogram buckets (seconds) for a batch's assembly delay: `max_wait` is milliseconds.
pub const BATCH_DELAY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Longest tenant name used as a label value; longer ones fold into `other`.
const MAX_TENANT_LEN: usize = 64;

/// Host CPU figures older than this are refreshed by the scrape itself.
const HOST_STALE: Duration = Duration::from_secs(5);

/// The metrics of one process; share it as `Arc<Metrics>`.
pub struct Metrics {
    registry: prometheus::Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    ttfb: HistogramVec,
    queue_wait: HistogramVec,
    shed: IntCounterVec,
    model_requests: IntCounterVec,
    tokens: IntCounterVec,
    batch_size: HistogramVec,
    batch_delay: HistogramVec,
    batch_timer_late: HistogramVec,
    batching: IntCounterVec,
    auth_failures: IntCounter,
    connections: ConnectionMetrics,
    tenants: Arc<TenantLabels>,
    models: Arc<TenantLabels>,
    classes: RwLock<HashMap<String, Arc<ClassMetrics>>>,
    host: Mutex<HostCpu>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct HostCpu {
    sampler: CpuSampler,
    last: Option<(CpuRatios, Instant)>,
}

/// Registers `c` in `r`; names are constants, so a clash is a bug caught by the unit tests.
pub(crate) fn register<C: prometheus::core::Collector + Clone + 'static>(
    r: &prometheus::Registry,
    c: C,
) -> C {
    r.register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

fn histogram(r: &prometheus::Registry, name: &str, help: &str) -> HistogramVec {
    histogram_in(r, name, help, LATENCY_BUCKETS)
}

fn histogram_in(r: &prometheus::Registry, name: &str, help: &str, buckets: &[f64]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(
        r,
        HistogramVec::new(opts, &["class"]).expect("valid histogram"),
    )
}

fn counter(r: &prometheus::Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter"),
    )
}

/// The status code as a label value without allocating.
fn status_label(status: u16, buf: &mut [u8; 3]) -> &str {
    let s = status.clamp(100, 999);
    *buf = [
        b'0' + (s / 100) as u8,
        b'0' + (s / 10 % 10) as u8,
        b'0' + (s % 10) as u8,
    ];
    std::str::from_utf8(buf).unwrap_or("000")
}

/// Seconds on the monotonic clock that [`LatencyWindow`] is fed with.
pub fn now_s() -> u64 {
    now_ms() / 1000
}

impl Metrics {
    /// Every collector, registered; at most `max_tenants` tenant label values, and as many model
    /// label values (then `other`).
    pub fn new(max_tenants: usize) -> Metrics {
        let r = prometheus::Registry::new();
        let requests = counter(
            &r,
            "gpulb_requests_total",
            "Requests answered, by class, backend (none when shed or unrouted) and status code.",
            &["class", "backend", "status"],
        );
        let duration = histogram(
            &r,
            "gpulb_request_duration_seconds",
            "Time from request arrival to the last byte of the response, by class.",
        );
        let ttfb = histogram(
            &r,
            "gpulb_time_to_first_byte_seconds",
            "Time from request arrival to the first byte of the response body, by class.",
        );
        let queue_wait = histogram(
            &r,
            "gpulb_queue_wait_seconds",
            "Time a request waited in its class queue before a backend slot was free.",
        );
        let shed = counter(
            &r,
            "gpulb_shed_total",
            "Requests refused by admission, by class, tenant (capped, then other) and reason.",
            &["class", "tenant", "reason"],
        );
        let model_requests = counter(
            &r,
            "gpulb_model_requests_total",
            "Requests whose body gpulb read, by class and model (after aliases; capped, then other; none when the body named no model).",
            &["class", "model"],
        );
        let tokens = counter(
            &r,
            "gpulb_tokens_total",
            "Tokens of answered requests whose backend reported usage, by class and kind: prompt_estimated (gpulb's estimate from the body), prompt_reported and completion_reported (the backend's usage).",
            &["class", "kind"],
        );
        let batch_size = histogram_in(
            &r,
            "gpulb_batch_size",
            "Input items of each batch sent upstream as one call, by class.",
            BATCH_SIZE_BUCKETS,
        );
        let batch_delay = histogram_in(
            &r,
            "gpulb_batch_assembly_delay_seconds",
            "Time from a batch's first member joining to the end of its wait for company (full, a backend slot granted, or max_wait), by class.",
            BATCH_DELAY_BUCKETS,
        );
        let batch_timer_late = histogram_in(
            &r,
            "gpulb_batch_timer_lateness_seconds",
            "How late a batch's wait for company ended past the time set for it (the batch clock's alarm, set early by the lateness lately seen, or a slot granted after that time), by class.",
            BATCH_DELAY_BUCKETS,
        );
        let batching = counter(
            &r,
            "gpulb_batching_requests_total",
            "Requests of classes that batch, by class and mode: batched (answered from a batch) or unbatched (sent alone: a backend slot was free and no batch forming, streaming, another path, too large, or not mergeable).",
            &["class", "mode"],
        );
        let auth_failures = register(
            &r,
            IntCounter::new(
                "gpulb_admin_auth_failures_total",
                "Admin requests refused for a missing or wrong bearer token.",
            )
            .expect("valid counter"),
        );
        let connections = ConnectionMetrics::new(&r);
        Metrics {
            registry: r,
            connections,
            requests,
            duration,
            ttfb,
            queue_wait,
            shed,
            model_requests,
            tokens,
            batch_size,
            batch_delay,
            batch_timer_late,
            batching,
            auth_failures,
            tenants: Arc::new(TenantLabels {
                max: max_tenants,
                known: RwLock::default(),
            }),
            models: Arc::new(TenantLabels {
                max: max_tenants,
                known: RwLock::default(),
            }),
            classes: RwLock::default(),
            host: Mutex::default(),
        }
    }

    /// The handles of class `name`, created on first use; cheap to hold per request.
    pub fn class(&self, name: &str) -> Arc<ClassMetrics> {
        if let Some(c) = self.classes.read().ok().and_then(|m| m.get(name).cloned()) {
            return c;
        }
        let Ok(mut classes) = self.classes.write() else {
            return Arc::new(self.new_class(name));
        };
        Arc::clone(
            classes
                .entry(name.to_string())
                .or_insert_with(|| Arc::new(self.new_class(name))),
        )
    }

    fn new_class(&self, name: &str) -> ClassMetrics {
        ClassMetrics {
            name: name.to_string(),
            requests: self.requests.clone(),
            duration: self.duration.with_label_values(&[name]),
            ttfb: self.ttfb.with_label_values(&[name]),
            queue_wait: self.queue_wait.with_label_values(&[name]),
            shed: self.shed.clone(),
            model_requests: self.model_requests.clone(),
            no_model: self.model_requests.with_label_values(&[name, "none"]),
            model_counters: RwLock::default(),
            tokens: ["prompt_estimated", "prompt_reported", "completion_reported"]
                .map(|kind| self.tokens.with_label_values(&[name, kind])),
            tenants: Arc::clone(&self.tenants),
            models: Arc::clone(&self.models),
            window: LatencyWindow::default(),
            finished_total: AtomicU64::new(0),
            shed_total: AtomicU64::new(0),
            batch_size: self.batch_size.with_label_values(&[name]),
            batch_delay: self.batch_delay.with_label_values(&[name]),
            batch_timer_late: self.batch_timer_late.with_label_values(&[name]),
            batching: ["batched", "unbatched"]
                .map(|mode| self.batching.with_label_values(&[name, mode])),
        }
    }

    /// The client connection collectors.
    pub fn connections(&self) -> &ConnectionMetrics {
        &self.connections
    }

    /// An admin request was refused for a missing or wrong token.
    pub fn auth_failure(&self) {
        self.auth_failures.inc();
    }

    /// Admin requests refused so far for a missing or wrong token.
    pub fn auth_failures_total(&self) -> u64 {
        self.auth_failures.get()
    }

    /// Reads the host CPU counters; the use since the previous call (`None` on the first).
    pub fn sample_host_cpu(&self) -> Option<CpuRatios> {
        let mut host = self.host.lock().ok()?;
        let ratios = host.sampler.sample();
        if let Some(r) = ratios {
            host.last = Some((r, Instant::now()));
        }
        ratios
    }

    /// The last host CPU figures, sampling now when they are missing or stale.
    pub fn host_cpu(&self) -> Option<CpuRatios> {
        let fresh = self
            .host
            .lock()
            .ok()
            .and_then(|h| h.last)
            .and_then(|(r, at)| (at.elapsed() < HOST_STALE).then_some(r));
        fresh.or_else(|| self.sample_host_cpu())
    }

    /// The request-path collectors' current values, for the exposition.
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_become_three_digit_labels() {
        let mut buf = [0; 3];
        assert_eq!(status_label(200, &mut buf), "200");
        assert_eq!(status_label(503, &mut buf), "503");
        assert_eq!(status_label(7, &mut buf), "100");
        assert_eq!(status_label(1234, &mut buf), "999");
    }

    /// `gpulb_model_requests_total` by model label, for class `c`.
    fn model_counts(metrics: &Metrics) -> Vec<(String, u64)> {
        let families = metrics.gather();
        let family = families
            .iter()
            .find(|f| f.name() == "gpulb_model_requests_total")
            .expect("the model counter is registered");
        let mut counts: Vec<(String, u64)> = family
            .get_metric()
            .iter()
            .map(|m| {
                let model = m.get_label().iter().find(|l| l.name() == "model");
                let model = model.expect("a model label").value().to_string();
                (model, m.get_counter().get_value() as u64)
            })
            .collect();
        counts.sort();
        counts
    }

    #[test]
    fn model_requests_count_through_held_handles_and_fold_past_the_cap() {
        let metrics = Metrics::new(2);
        let class = metrics.class("c");
        for model in ["a", "b", "a", "c", "d", "c", "a"] {
            class.body_finished(Some(model), 1, None);
        }
        class.body_finished(None, 1, None);
        let expected = [("a", 3), ("b", 1), ("none", 1), ("other", 3)];
        let expected: Vec<(String, u64)> =
            expected.iter().map(|&(m, n)| (m.to_string(), n)).collect();
        assert_eq!(model_counts(&metrics), expected);
        // Only the models with their own label are held.
        let held = class.model_counters.read().unwrap();
        let mut held: Vec<&String> = held.keys().collect();
        held.sort();
        assert_eq!(held, ["a", "b"]);
    }
}
