//! `GET /metrics`: the request-path collectors of [`Metrics`] plus gauges and counters of live
//! state, refilled from a [`FleetView`] on every scrape so series of removed backends and classes
//! disappear.

use crate::hostinfo::{CpuRatios, ProcessStats};
use crate::metrics::{register, Metrics};
use crate::reload::ReloadStatus;
use crate::view::FleetView;
use prometheus::{CounterVec, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::sync::Mutex;

/// Declares the scrape-time collectors once: the struct, their registration and their reset.
macro_rules! live_collectors {
    ($( $field:ident: $ty:ty = $name:literal, $help:literal, [$($label:literal),*]; )*) => {
        /// Collectors filled at scrape time.
        struct Live {
            $( $field: $ty, )*
        }

        impl Live {
            fn register(r: &Registry) -> Live {
                Live {
                    $( $field: register(r, <$ty>::new(Opts::new($name, $help), &[$($label),*]).expect("valid metric")), )*
                }
            }

            fn reset(&self) {
                $( self.$field.reset(); )*
            }
        }
    };
}

live_collectors! {
    queue_depth: IntGaugeVec = "gpulb_queue_depth", "Requests waiting in the class queue now.", ["class"];
    class_outstanding: IntGaugeVec = "gpulb_class_outstanding", "Requests of the class in flight now.", ["class"];
    service_seconds: GaugeVec = "gpulb_service_seconds", "Expected time a request of the class (of its mean response size) holds a slot on the backend, as measured for speed-aware placement.", ["class", "backend"];
    outstanding: IntGaugeVec = "gpulb_backend_outstanding", "Requests this proxy has in flight on the backend.", ["backend"];
    others_outstanding: GaugeVec = "gpulb_backend_others_outstanding", "Requests on the backend that are not this proxy's (other replicas, direct clients), estimated from its model server's running + waiting; absent without a recent reading.", ["backend"];
    outstanding_tokens: IntGaugeVec = "gpulb_backend_outstanding_tokens", "Estimated tokens (prompt + max_tokens) of the requests this proxy has in flight on the backend, where their bodies were read.", ["backend"];
    kv_capacity: GaugeVec = "gpulb_backend_kv_cache_capacity_tokens", "The model server's KV-cache capacity in tokens, as it states it (vLLM cache_config_info).", ["backend"];
    healthy: IntGaugeVec = "gpulb_backend_healthy", "1 when the backend's active checks pass (or checks are off), else 0.", ["backend"];
    eligible: IntGaugeVec = "gpulb_backend_eligible", "1 when new requests may go to the backend (healthy, not ejected, its name resolved).", ["backend"];
    ejected: IntGaugeVec = "gpulb_backend_ejected", "1 while the backend is out on a passive (outlier) ejection.", ["backend"];
    unresolved: IntGaugeVec = "gpulb_backend_unresolved", "1 while the backend's name resolves to no address (it gets no traffic).", ["backend"];
    ejections: IntCounterVec = "gpulb_backend_ejections_total", "Passive ejections of the backend for consecutive failures.", ["backend"];
    attempts: IntCounterVec = "gpulb_backend_attempts_total", "Request attempts sent to the backend (retries count).", ["backend"];
    refusals_retried: IntCounterVec = "gpulb_backend_refusals_retried_total", "Attempts the backend refused with a retry_statuses status (TGI's 429 when overloaded) that went to another backend instead.", ["backend"];
    gpu_util: GaugeVec = "gpulb_gpu_utilization_ratio", "GPU compute utilization as last read from telemetry, 0..1.", ["backend", "gpu"];
    gpu_mem_used: GaugeVec = "gpulb_gpu_memory_used_bytes", "GPU framebuffer memory in use as last read from telemetry.", ["backend", "gpu"];
    gpu_mem_total: GaugeVec = "gpulb_gpu_memory_total_bytes", "GPU framebuffer memory in all as last read from telemetry.", ["backend", "gpu"];
    running: GaugeVec = "gpulb_backend_server_running", "Requests in the model server's running batch, as it reports.", ["backend"];
    waiting: GaugeVec = "gpulb_backend_server_waiting", "Requests queued inside the model server, as it reports.", ["backend"];
    kv_cache: GaugeVec = "gpulb_backend_kv_cache_usage_ratio", "The model server's KV-cache usage, 0..1.", ["backend"];
    prefix_hits: GaugeVec = "gpulb_backend_prefix_cache_hit_ratio", "Share of prompt tokens the model server found in its prefix cache, 0..1 (vLLM: since it started; SGLang: its cache_hit_rate).", ["backend"];
    body_held: IntGaugeVec = "gpulb_request_body_held_bytes", "Request body bytes held in memory now (read before routing, kept until the request ends), against request_body.max_held_bytes.", [];
    prefix_entries: IntGaugeVec = "gpulb_prefix_index_entries", "Prompt prefix blocks the prefix_affinity index remembers now (each about 60 bytes).", [];
    stored_responses: IntGaugeVec = "gpulb_stored_responses_tracked", "Stored responses (Responses API) whose backend gpulb remembers now, to send the requests naming them there.", [];
    telemetry_age: GaugeVec = "gpulb_telemetry_age_seconds", "Age of the backend's last telemetry reading.", ["backend"];
    telemetry_errors: IntCounterVec = "gpulb_telemetry_errors_total", "Telemetry scrapes of the backend that failed.", ["backend"];
    discovered: IntGaugeVec = "gpulb_discovery_backends", "Backends the pool's DNS discovery has in force (its last good set).", ["pool"];
    discovery_up: IntGaugeVec = "gpulb_discovery_up", "1 when the pool's last DNS lookup succeeded, 0 while the last good set is kept after a failure.", ["pool"];
    discovery_errors: IntCounterVec = "gpulb_discovery_errors_total", "DNS lookups of the pool that failed (or found a set that could not be added).", ["pool"];
    reloads: IntCounterVec = "gpulb_config_reloads_total", "Config reloads by result (applied, rejected, unchanged, abandoned).", ["result"];
    generation: IntGaugeVec = "gpulb_config_generation", "Generation of the config in force.", [];
    config_info: IntGaugeVec = "gpulb_config_info", "Always 1; the hash label fingerprints the config file in force.", ["hash"];
    process_cpu: CounterVec = "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", [];
    process_rss: GaugeVec = "process_resident_memory_bytes", "Resident memory size in bytes.", [];
    host_busy: GaugeVec = "gpulb_host_cpu_busy_ratio", "Share of host CPU time neither idle nor in iowait over the last sampling interval.", [];
    host_iowait: GaugeVec = "gpulb_host_cpu_iowait_ratio", "Share of host CPU time idle waiting for I/O over the last sampling interval.", [];
}

/// Sets a gauge series when the value is known.
fn set_known(gauge: &GaugeVec, labels: &[&str], value: Option<f64>) {
    if let Some(v) = value {
        gauge.with_label_values(labels).set(v);
    }
}

impl Live {
    /// Replaces every series with the state of `view`, `reload`, the process and the host.
    fn fill(&self, view: &FleetView, reload: Option<&ReloadStatus>, host: Option<CpuRatios>) {
        self.reset();
        for class in &view.classes {
            let name = [class.name.as_str()];
            self.queue_depth
                .with_label_values(&name)
                .set(class.queue_depth as i64);
            self.class_outstanding
                .with_label_values(&name)
                .set(i64::from(class.outstanding));
            for (backend, secs) in &class.service_seconds {
                self.service_seconds
                    .with_label_values(&[class.name.as_str(), backend])
                    .set(*secs);
            }
        }
        for b in &view.backends {
            let name = [b.name.as_str()];
            let flag = |on: bool| i64::from(on);
            self.outstanding
                .with_label_values(&name)
                .set(i64::from(b.outstanding));
            self.outstanding_tokens
                .with_label_values(&name)
                .set(i64::try_from(b.outstanding_tokens).unwrap_or(i64::MAX));
            set_known(
                &self.others_outstanding,
                &name,
                b.others_outstanding.map(f64::from),
            );
            self.healthy.with_label_values(&name).set(flag(b.healthy()));
            self.eligible.with_label_values(&name).set(flag(b.eligible));
            self.ejected.with_label_values(&name).set(flag(b.ejected));
            self.unresolved
                .with_label_values(&name)
                .set(flag(b.unresolved.is_some()));
            self.ejections
                .with_label_values(&name)
                .inc_by(b.ejections_total);
            self.attempts
                .with_label_values(&name)
                .inc_by(b.attempts_total);
            self.refusals_retried
                .with_label_values(&name)
                .inc_by(b.refusals_retried_total);
            let t = &b.telemetry;
            self.telemetry_errors
                .with_label_values(&name)
                .inc_by(t.errors_total);
            set_known(&self.telemetry_age, &name, t.age_seconds);
            for g in &t.gpus {
                let labels = [b.name.as_str(), g.gpu.as_str()];
                let r = &g.reading;
                set_known(&self.gpu_util, &labels, r.utilization);
                set_known(
                    &self.gpu_mem_used,
                    &labels,
                    r.memory_used_bytes.map(|m| m as f64),
                );
                set_known(
                    &self.gpu_mem_total,
                    &labels,
                    r.memory_total_bytes.map(|m| m as f64),
                );
            }
            if let Some(load) = &t.server {
                set_known(&self.running, &name, load.running);
                set_known(&self.waiting, &name, load.waiting);
                set_known(&self.kv_cache, &name, load.kv_cache_usage);
                set_known(&self.kv_capacity, &name, load.kv_capacity_tokens);
                set_known(&self.prefix_hits, &name, load.prefix_cache_hit_ratio);
            }
        }
        let none: &[&str] = &[];
        self.prefix_entries
            .with_label_values(none)
            .set(i64::try_from(view.prefix_index.entries).unwrap_or(i64::MAX));
        self.stored_responses
            .with_label_values(none)
            .set(i64::try_from(view.stored_responses).unwrap_or(i64::MAX));
        self.generation
            .with_label_values(none)
            .set(view.generation as i64);
        let held = crate::proxy::body_budget::held_now();
        self.body_held
            .with_label_values(none)
            .set(i64::try_from(held).unwrap_or(i64::MAX));
        let hash = reload.map_or("builtin", |r| r.hash.as_str());
        self.config_info.with_label_values(&[hash]).set(1);
        if let Some(r) = reload {
            for (result, n) in [
                ("applied", r.applied_total),
                ("rejected", r.rejected_total),
                ("unchanged", r.unchanged_total),
                ("abandoned", r.abandoned_total),
            ] {
                self.reloads.with_label_values(&[result]).inc_by(n);
            }
        }
        for group in &view.discovery {
            let pool: &[&str] = &[&group.pool];
            let count = i64::try_from(group.addresses.len()).unwrap_or(i64::MAX);
            self.discovered.with_label_values(pool).set(count);
            let up = i64::from(group.last_error.is_none());
            self.discovery_up.with_label_values(pool).set(up);
            self.discovery_errors
                .with_label_values(pool)
                .inc_by(group.errors_total);
        }
        if let Some(p) = ProcessStats::read() {
            self.process_cpu
                .with_label_values(none)
                .inc_by(p.cpu.as_secs_f64());
            set_known(&self.process_rss, none, Some(p.resident_bytes as f64));
        }
        if let Some(h) = host {
            set_known(&self.host_busy, none, Some(h.busy));
            set_known(&self.host_iowait, none, Some(h.iowait));
        }
    }
}

/// The Prometheus exposition: live-state collectors in a registry of their own, gathered with
/// the request-path ones.
pub struct Exposition {
    registry: Registry,
    live: Mutex<Live>,
}

impl Default for Exposition {
    fn default() -> Self {
        let registry = Registry::new();
        let live = Mutex::new(Live::register(&registry));
        Exposition { registry, live }
    }
}

impl Exposition {
    /// The text exposition (format 0.0.4) of `metrics` and of the live state in `view`.
    pub fn render(
        &self,
        metrics: &Metrics,
        view: &FleetView,
        reload: Option<&ReloadStatus>,
    ) -> String {
        let host = metrics.host_cpu();
        let mut families = metrics.gather();
        match self.live.lock() {
            Ok(live) => {
                live.fill(view, reload, host);
                // Gathered under the lock so two scrapes never see each other's half-filled state.
                families.extend(self.registry.gather());
            }
            Err(_) => families.extend(self.registry.gather()),
        }
        families.sort_by(|a, b| a.name().cmp(b.name()));
        prometheus::TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_default()
    }
}

#[cfg(test)]
#[path = "exposition_tests.rs"]
mod tests;
