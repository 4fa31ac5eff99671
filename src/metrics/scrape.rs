//! Scrape-time collectors: live state read from the snapshot, reload history and `/proc`, reset
//! and refilled on every scrape so series of removed backends and classes disappear.

use crate::health::{now_ms, CheckStatus};
use crate::hostinfo::{CpuRatios, ProcessStats};
use crate::registry::Snapshot;
use crate::reload::ReloadStatus;
use crate::telemetry::GpuReading;
use prometheus::{CounterVec, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Collectors filled at scrape time.
pub(super) struct Live {
    queue_depth: IntGaugeVec,
    class_outstanding: IntGaugeVec,
    service_seconds: GaugeVec,
    outstanding: IntGaugeVec,
    healthy: IntGaugeVec,
    eligible: IntGaugeVec,
    ejected: IntGaugeVec,
    ejections: IntCounterVec,
    attempts: IntCounterVec,
    gpu_util: GaugeVec,
    gpu_mem_used: GaugeVec,
    gpu_mem_total: GaugeVec,
    running: GaugeVec,
    waiting: GaugeVec,
    kv_cache: GaugeVec,
    telemetry_age: GaugeVec,
    telemetry_errors: IntCounterVec,
    reloads: IntCounterVec,
    generation: IntGaugeVec,
    config_info: IntGaugeVec,
    process_cpu: CounterVec,
    process_rss: GaugeVec,
    host_busy: GaugeVec,
    host_iowait: GaugeVec,
}

macro_rules! vec_of {
    ($ty:ty, $r:expr, $name:expr, $help:expr, [$($label:expr),*]) => {
        super::register($r, <$ty>::new(Opts::new($name, $help), &[$($label),*]).expect("valid metric"))
    };
}

impl Live {
    /// Creates and registers every scrape-time collector in `r`.
    pub(super) fn register(r: &Registry) -> Live {
        Live {
            queue_depth: vec_of!(IntGaugeVec, r, "gpulb_queue_depth", "Requests waiting in the class queue now.", ["class"]),
            class_outstanding: vec_of!(IntGaugeVec, r, "gpulb_class_outstanding", "Requests of the class in flight now.", ["class"]),
            service_seconds: vec_of!(GaugeVec, r, "gpulb_service_seconds", "Expected time a request of the class (of its mean response size) holds a slot on the backend, as measured for speed-aware placement.", ["class", "backend"]),
            outstanding: vec_of!(IntGaugeVec, r, "gpulb_backend_outstanding", "Requests this proxy has in flight on the backend.", ["backend"]),
            healthy: vec_of!(IntGaugeVec, r, "gpulb_backend_healthy", "1 when the backend's active checks pass (or checks are off), else 0.", ["backend"]),
            eligible: vec_of!(IntGaugeVec, r, "gpulb_backend_eligible", "1 when new requests may go to the backend (healthy and not ejected).", ["backend"]),
            ejected: vec_of!(IntGaugeVec, r, "gpulb_backend_ejected", "1 while the backend is out on a passive (outlier) ejection.", ["backend"]),
            ejections: vec_of!(IntCounterVec, r, "gpulb_backend_ejections_total", "Passive ejections of the backend for consecutive failures.", ["backend"]),
            attempts: vec_of!(IntCounterVec, r, "gpulb_backend_attempts_total", "Request attempts sent to the backend (retries count).", ["backend"]),
            gpu_util: vec_of!(GaugeVec, r, "gpulb_gpu_utilization_ratio", "GPU compute utilization as last read from telemetry, 0..1.", ["backend", "gpu"]),
            gpu_mem_used: vec_of!(GaugeVec, r, "gpulb_gpu_memory_used_bytes", "GPU framebuffer memory in use as last read from telemetry.", ["backend", "gpu"]),
            gpu_mem_total: vec_of!(GaugeVec, r, "gpulb_gpu_memory_total_bytes", "GPU framebuffer memory in all as last read from telemetry.", ["backend", "gpu"]),
            running: vec_of!(GaugeVec, r, "gpulb_backend_server_running", "Requests in the model server's running batch, as it reports.", ["backend"]),
            waiting: vec_of!(GaugeVec, r, "gpulb_backend_server_waiting", "Requests queued inside the model server, as it reports.", ["backend"]),
            kv_cache: vec_of!(GaugeVec, r, "gpulb_backend_kv_cache_usage_ratio", "The model server's KV-cache usage, 0..1.", ["backend"]),
            telemetry_age: vec_of!(GaugeVec, r, "gpulb_telemetry_age_seconds", "Age of the backend's last telemetry reading.", ["backend"]),
            telemetry_errors: vec_of!(IntCounterVec, r, "gpulb_telemetry_errors_total", "Telemetry scrapes of the backend that failed.", ["backend"]),
            reloads: vec_of!(IntCounterVec, r, "gpulb_config_reloads_total", "Config reloads by result (applied, rejected, unchanged).", ["result"]),
            generation: vec_of!(IntGaugeVec, r, "gpulb_config_generation", "Generation of the config in force.", []),
            config_info: vec_of!(IntGaugeVec, r, "gpulb_config_info", "Always 1; the hash label fingerprints the config file in force.", ["hash"]),
            process_cpu: vec_of!(CounterVec, r, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", []),
            process_rss: vec_of!(GaugeVec, r, "process_resident_memory_bytes", "Resident memory size in bytes.", []),
            host_busy: vec_of!(GaugeVec, r, "gpulb_host_cpu_busy_ratio", "Share of host CPU time neither idle nor in iowait over the last sampling interval.", []),
            host_iowait: vec_of!(GaugeVec, r, "gpulb_host_cpu_iowait_ratio", "Share of host CPU time idle waiting for I/O over the last sampling interval.", []),
        }
    }

    fn reset(&self) {
        for v in [
            &self.queue_depth,
            &self.class_outstanding,
            &self.outstanding,
            &self.healthy,
            &self.eligible,
            &self.ejected,
            &self.generation,
            &self.config_info,
        ] {
            v.reset();
        }
        for v in [
            &self.ejections,
            &self.attempts,
            &self.telemetry_errors,
            &self.reloads,
        ] {
            v.reset();
        }
        for v in [
            &self.service_seconds,
            &self.gpu_util,
            &self.gpu_mem_used,
            &self.gpu_mem_total,
            &self.running,
            &self.waiting,
            &self.kv_cache,
            &self.telemetry_age,
            &self.process_rss,
            &self.host_busy,
            &self.host_iowait,
        ] {
            v.reset();
        }
        self.process_cpu.reset();
    }

    /// Replaces every series with the state of `snapshot`, `reload`, the process and the host.
    pub(super) fn fill(
        &self,
        snapshot: &Snapshot,
        reload: Option<&ReloadStatus>,
        host: Option<CpuRatios>,
    ) {
        self.reset();
        let now = now_ms();
        let instant = Instant::now();
        for class in &snapshot.classes {
            let name = [class.name.as_str()];
            let depth = class.state.queue.depth();
            self.queue_depth.with_label_values(&name).set(depth as i64);
            let outstanding = class.state.outstanding.get();
            self.class_outstanding
                .with_label_values(&name)
                .set(i64::from(outstanding));
            for (backend, secs) in snapshot.service_seconds(class, instant) {
                self.service_seconds
                    .with_label_values(&[class.name.as_str(), backend])
                    .set(secs);
            }
        }
        for b in &snapshot.backends {
            let s = &b.state;
            let name = [s.name.as_str()];
            let healthy = matches!(
                s.health.status(),
                CheckStatus::Healthy | CheckStatus::Unchecked
            );
            let flag = |on: bool| i64::from(on);
            self.outstanding
                .with_label_values(&name)
                .set(i64::from(s.outstanding.get()));
            self.healthy.with_label_values(&name).set(flag(healthy));
            self.eligible
                .with_label_values(&name)
                .set(flag(s.health.eligible(now)));
            self.ejected
                .with_label_values(&name)
                .set(flag(s.health.is_ejected(now)));
            self.ejections
                .with_label_values(&name)
                .inc_by(s.health.ejections_total());
            self.attempts
                .with_label_values(&name)
                .inc_by(s.attempts_total.load(Ordering::Relaxed));
            self.telemetry_errors
                .with_label_values(&name)
                .inc_by(s.telemetry_errors.load(Ordering::Relaxed));
            let Some(t) = s.telemetry.load_full() else {
                continue;
            };
            let age = instant.saturating_duration_since(t.taken_at);
            self.telemetry_age
                .with_label_values(&name)
                .set(age.as_secs_f64());
            for (i, gpu) in t.reading.gpus.iter().enumerate() {
                let labels = [s.name.as_str(), &gpu_label(gpu, i)];
                let set = |v: &GaugeVec, x: Option<f64>| {
                    if let Some(x) = x {
                        v.with_label_values(&labels).set(x);
                    }
                };
                set(&self.gpu_util, gpu.utilization);
                set(&self.gpu_mem_used, gpu.memory_used_bytes.map(|m| m as f64));
                set(
                    &self.gpu_mem_total,
                    gpu.memory_total_bytes.map(|m| m as f64),
                );
            }
            if let Some(load) = &t.reading.server {
                let set = |v: &GaugeVec, x: Option<f64>| {
                    if let Some(x) = x {
                        v.with_label_values(&name).set(x);
                    }
                };
                set(&self.running, load.running);
                set(&self.waiting, load.waiting);
                set(&self.kv_cache, load.kv_cache_usage);
            }
        }
        self.generation
            .with_label_values(&[] as &[&str])
            .set(snapshot.generation as i64);
        let hash = reload.map_or("builtin", |r| r.hash.as_str());
        self.config_info.with_label_values(&[hash]).set(1);
        if let Some(r) = reload {
            for (result, n) in [
                ("applied", r.applied_total),
                ("rejected", r.rejected_total),
                ("unchanged", r.unchanged_total),
            ] {
                self.reloads.with_label_values(&[result]).inc_by(n);
            }
        }
        let none: &[&str] = &[];
        if let Some(p) = ProcessStats::read() {
            self.process_cpu
                .with_label_values(none)
                .inc_by(p.cpu.as_secs_f64());
            self.process_rss
                .with_label_values(none)
                .set(p.resident_bytes as f64);
        }
        if let Some(h) = host {
            self.host_busy.with_label_values(none).set(h.busy);
            self.host_iowait.with_label_values(none).set(h.iowait);
        }
    }
}

/// The `gpu` label of a reading: its index on the host, else its UUID, else its position.
pub fn gpu_label(gpu: &GpuReading, position: usize) -> String {
    match (gpu.index, &gpu.uuid) {
        (Some(i), _) => i.to_string(),
        (None, Some(uuid)) => uuid.clone(),
        (None, None) => position.to_string(),
    }
}
