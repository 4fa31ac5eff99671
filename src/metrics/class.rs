//! Per-class handles of the request-path metrics, and the tenant label cap.

use super::{now_s, status_label, LatencyWindow, Percentiles, MAX_TENANT_LEN};
use crate::fast_hash::{FastMap, FastSet};
use crate::request::Usage;
use prometheus::{Histogram, IntCounter, IntCounterVec};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Pre-resolved handles of one class: record through these to skip the label lookups.
pub struct ClassMetrics {
    pub(super) name: String,
    pub(super) requests: IntCounterVec,
    pub(super) duration: Histogram,
    pub(super) ttfb: Histogram,
    pub(super) queue_wait: Histogram,
    pub(super) shed: IntCounterVec,
    pub(super) model_requests: IntCounterVec,
    /// `model_requests` of a request that named no model.
    pub(super) no_model: IntCounter,
    /// `model_requests` resolved for each model this class answered that keeps its own label
    /// (so at most the label cap's worth), so a request skips both label lookups.
    pub(super) model_counters: RwLock<FastMap<String, IntCounter>>,
    /// Prompt tokens estimated, prompt tokens reported, completion tokens reported.
    pub(super) tokens: [IntCounter; 3],
    pub(super) tenants: Arc<TenantLabels>,
    pub(super) models: Arc<TenantLabels>,
    pub(super) window: LatencyWindow,
    pub(super) finished_total: AtomicU64,
    pub(super) shed_total: AtomicU64,
    pub(super) batch_size: Histogram,
    pub(super) batch_delay: Histogram,
    pub(super) batch_timer_late: Histogram,
    /// Requests answered as members of a batch, and requests of a batching class sent alone.
    pub(super) batching: [IntCounter; 2],
}

impl std::fmt::Debug for ClassMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassMetrics")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A class's batch totals: differences of two readings give the means over the time between.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchFigures {
    /// Batches sent upstream.
    pub sent: u64,
    /// Their input items, summed.
    pub items: f64,
    /// Batches assembled (closed with members).
    pub assembled: u64,
    /// Their assembly delays, summed, seconds.
    pub delay_s: f64,
}

impl BatchFigures {
    /// Mean items per batch sent, and mean assembly delay (seconds), since `before`; `None`
    /// where no batch came.
    pub fn means_since(&self, before: &BatchFigures) -> (Option<f64>, Option<f64>) {
        let mean = |sum: f64, n: u64| (n > 0).then(|| sum / n as f64);
        (
            mean(
                self.items - before.items,
                self.sent.saturating_sub(before.sent),
            ),
            mean(
                self.delay_s - before.delay_s,
                self.assembled.saturating_sub(before.assembled),
            ),
        )
    }
}

/// Folds tenants past the first `max` seen into `other`, bounding label cardinality.
pub(super) struct TenantLabels {
    pub(super) max: usize,
    pub(super) known: RwLock<FastSet<String>>,
}

impl TenantLabels {
    pub(super) fn label<'a>(&self, tenant: &'a str) -> &'a str {
        if tenant.is_empty() {
            return "none";
        }
        if tenant.len() > MAX_TENANT_LEN {
            return "other";
        }
        if self.known.read().is_ok_and(|k| k.contains(tenant)) {
            return tenant;
        }
        match self.known.write() {
            Ok(mut k) if k.contains(tenant) || k.len() < self.max => {
                k.insert(tenant.to_string());
                tenant
            }
            _ => "other",
        }
    }
}

impl ClassMetrics {
    /// Class name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A request was answered: once per request, shed and failed ones too (`backend` `None`
    /// when it never reached one); `ttfb` when a body byte was sent.
    pub fn request_finished(
        &self,
        backend: Option<&str>,
        status: u16,
        duration: Duration,
        ttfb: Option<Duration>,
    ) {
        let mut buf = [0; 3];
        let status = status_label(status, &mut buf);
        self.requests
            .with_label_values(&[self.name.as_str(), backend.unwrap_or("none"), status])
            .inc();
        self.duration.observe(duration.as_secs_f64());
        if let Some(t) = ttfb {
            self.ttfb.observe(t.as_secs_f64());
        }
        self.window.record(now_s(), duration, ttfb);
        self.finished_total.fetch_add(1, Ordering::Relaxed);
    }

    /// A request whose body was read asked for `model` (after aliases); `estimated` prompt
    /// tokens, and the backend's `usage` when it reported one.
    pub fn body_finished(&self, model: Option<&str>, estimated: u64, usage: Option<Usage>) {
        self.count_model_request(model);
        if let Some(usage) = usage {
            let [estimate, prompt, completion] = &self.tokens;
            estimate.inc_by(estimated);
            prompt.inc_by(usage.prompt_tokens);
            completion.inc_by(usage.completion_tokens);
        }
    }

    /// Counts a request for `model` in `model_requests`, through the handle resolved for it.
    fn count_model_request(&self, model: Option<&str>) {
        let Some(model) = model else {
            return self.no_model.inc();
        };
        if let Ok(counters) = self.model_counters.read() {
            if let Some(counter) = counters.get(model) {
                return counter.inc();
            }
        }
        let label = self.models.label(model);
        let counter = self
            .model_requests
            .with_label_values(&[self.name.as_str(), label]);
        counter.inc();
        // A model folded into `other` is not held: the map stays as small as the label set.
        if label == model {
            if let Ok(mut counters) = self.model_counters.write() {
                counters.entry(model.to_string()).or_insert(counter);
            }
        }
    }

    /// A request of `tenant` was refused by admission for `reason`.
    pub fn shed(&self, tenant: &str, reason: &str) {
        let tenant = self.tenants.label(tenant);
        self.shed
            .with_label_values(&[self.name.as_str(), tenant, reason])
            .inc();
        self.shed_total.fetch_add(1, Ordering::Relaxed);
    }

    /// A request waited `waited` in the queue before it was admitted.
    pub fn queue_wait(&self, waited: Duration) {
        self.queue_wait.observe(waited.as_secs_f64());
    }

    /// A batch stopped taking members `delay` after its first joined.
    pub fn batch_assembled(&self, delay: Duration) {
        self.batch_delay.observe(delay.as_secs_f64());
    }

    /// A batch's task woke `late` past the time its wait for company was to end.
    pub fn batch_timer_late(&self, late: Duration) {
        self.batch_timer_late.observe(late.as_secs_f64());
    }

    /// A batch of `items` input items went upstream as one call.
    pub fn batch_sent(&self, items: usize) {
        self.batch_size.observe(items as f64);
    }

    /// A request of a class that batches was answered from a batch (`batched`) or went to its
    /// backend alone.
    pub fn batching_request(&self, batched: bool) {
        self.batching[usize::from(!batched)].inc();
    }

    /// Batches sent and assembled so far, with their items and delays summed.
    pub fn batch_figures(&self) -> BatchFigures {
        BatchFigures {
            sent: self.batch_size.get_sample_count(),
            items: self.batch_size.get_sample_sum(),
            assembled: self.batch_delay.get_sample_count(),
            delay_s: self.batch_delay.get_sample_sum(),
        }
    }

    /// Requests answered from a batch, and requests of a batching class sent alone, so far.
    pub fn batching_totals(&self) -> (u64, u64) {
        (self.batching[0].get(), self.batching[1].get())
    }

    /// p50/p99 of (duration, time to first byte) over the last `span_s` seconds (at most 60).
    pub fn percentiles(&self, span_s: u64) -> (Percentiles, Percentiles) {
        self.window.percentiles(now_s(), span_s)
    }

    /// Requests of this class answered so far.
    pub fn finished_total(&self) -> u64 {
        self.finished_total.load(Ordering::Relaxed)
    }

    /// Requests of this class shed so far.
    pub fn shed_total(&self) -> u64 {
        self.shed_total.load(Ordering::Relaxed)
    }
}
