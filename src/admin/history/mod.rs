//! The dashboard's recent history: a sampler that every second records GPU, backend, class and
//! host figures into a bounded ring (the last ten minutes), served as JSON by `GET /history`.

use crate::hostinfo::CpuRatios;
use crate::metrics::{BatchFigures, Metrics, Percentiles};
use crate::routing::{Registry, Snapshot};
use crate::telemetry::ServerLoad;
use crate::view::{BackendView, FleetView, CHART_LATENCY_SPAN_S};
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Time between samples.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept: ten minutes at one a second.
pub const CAPACITY: usize = 600;
/// One second of the fleet, as the dashboard draws it.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Increases by one per sample; `GET /history?since=SEQ` returns the later ones.
    pub seq: u64,
    /// Wall-clock time, Unix seconds.
    pub t: f64,
    /// Config generation in force.
    pub generation: u64,
    /// Every backend of the snapshot.
    pub backends: Vec<BackendPoint>,
    /// Every GPU with telemetry.
    pub gpus: Vec<GpuPoint>,
    /// Every class of the snapshot.
    pub classes: Vec<ClassPoint>,
    /// Host CPU use over the last interval (Linux only).
    pub host: Option<CpuRatios>,
}

/// A backend in a [`Sample`].
#[derive(Debug, Clone, Serialize)]
pub struct BackendPoint {
    /// Backend name.
    pub name: String,
    /// Requests this proxy has in flight on it.
    pub outstanding: u32,
    /// Its in-flight cap.
    pub max_outstanding: u32,
    /// `healthy`, `unhealthy`, `unknown`, `unchecked` or `ejected`.
    pub state: &'static str,
    /// Whether new requests may go to it.
    pub eligible: bool,
    /// The model server's own load figures, as it reports them.
    pub server: Option<ServerLoad>,
    /// The models it serves, when known.
    pub models: Vec<String>,
    /// Age of its telemetry, seconds; `None` when it has none.
    pub telemetry_age_s: Option<f64>,
    /// Whether that telemetry is older than `telemetry.stale_after`; `None` when it has none.
    pub telemetry_stale: Option<bool>,
}

/// A GPU in a [`Sample`].
#[derive(Debug, Clone, Serialize)]
pub struct GpuPoint {
    /// Backend it serves.
    pub backend: String,
    /// Index (or UUID) on its host.
    pub gpu: String,
    /// Compute utilization, 0..1.
    pub utilization: Option<f64>,
    /// Memory in use, 0..1 of its total.
    pub memory_ratio: Option<f64>,
    /// Memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// The reading is older than `telemetry.stale_after` (the backend may be gone).
    pub stale: bool,
}

/// A class in a [`Sample`].
#[derive(Debug, Clone, Serialize)]
pub struct ClassPoint {
    /// Class name.
    pub name: String,
    /// Requests waiting in its queue.
    pub queue_depth: usize,
    /// Requests of the class in flight.
    pub outstanding: u32,
    /// Request duration over the last [`CHART_LATENCY_SPAN_S`] seconds.
    pub duration: Percentiles,
    /// Time to first byte over the last [`CHART_LATENCY_SPAN_S`] seconds.
    pub ttfb: Percentiles,
    /// Requests answered per second over the last interval.
    pub requests_per_s: f64,
    /// Requests shed per second over the last interval.
    pub sheds_per_s: f64,
    /// Whether the class batches (has `batching`).
    pub batching: bool,
    /// Mean input items per batch sent over the last interval; `None` when none was sent.
    pub batch_size: Option<f64>,
    /// Mean batch assembly delay over the last interval, seconds; `None` when none closed.
    pub batch_delay_s: Option<f64>,
}

/// A backend of the view as the dashboard draws it.
fn backend_point(b: &BackendView) -> BackendPoint {
    BackendPoint {
        name: b.name.clone(),
        outstanding: b.outstanding,
        max_outstanding: b.max_outstanding,
        state: b.state_label(),
        eligible: b.eligible,
        server: b.telemetry.server.clone(),
        models: b
            .models
            .iter()
            .flat_map(|l| l.models.iter().map(|m| m.id.clone()))
            .collect(),
        telemetry_age_s: b.telemetry.age_seconds,
        telemetry_stale: b.telemetry.stale,
    }
}

/// The GPUs of a backend of the view as the dashboard draws them.
fn gpu_points(b: &BackendView) -> impl Iterator<Item = GpuPoint> + '_ {
    b.telemetry.gpus.iter().map(|g| GpuPoint {
        backend: b.name.clone(),
        gpu: g.gpu.clone(),
        utilization: g.reading.utilization,
        memory_ratio: g.reading.memory_fraction(),
        memory_used_bytes: g.reading.memory_used_bytes,
        stale: b.telemetry.stale.unwrap_or(false),
    })
}

/// The last [`CAPACITY`] samples.
#[derive(Default)]
pub struct History {
    ring: Mutex<Ring>,
}

#[derive(Default)]
struct Ring {
    samples: VecDeque<Arc<Sample>>,
    next_seq: u64,
    /// Per class: (answered, shed) totals at the previous sample, and when.
    previous: HashMap<String, (u64, u64, Instant)>,
    /// Per class: its batch totals at the previous sample.
    previous_batches: HashMap<String, BatchFigures>,
}

/// `GET /history` body.
#[derive(Debug, Serialize)]
pub struct Page {
    /// Seconds between samples.
    pub interval_s: f64,
    /// Most samples kept.
    pub capacity: usize,
    /// `seq` of the newest sample (0 before any); lower than a client's `since` after a restart.
    pub latest: u64,
    /// The samples after the `since` asked for, oldest first.
    #[serde(serialize_with = "shared_samples")]
    pub samples: Vec<Arc<Sample>>,
}

fn shared_samples<S: serde::Serializer>(v: &[Arc<Sample>], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|a| &**a))
}

impl History {
    /// Records one sample of `snapshot`, `metrics` and the host figures `host`.
    pub fn record(&self, snapshot: &Snapshot, metrics: &Metrics, host: Option<CpuRatios>) {
        let Ok(mut ring) = self.ring.lock() else {
            return;
        };
        let instant = Instant::now();
        let view = FleetView::read(snapshot, metrics, CHART_LATENCY_SPAN_S);
        let backends = view.backends.iter().map(backend_point).collect();
        let gpus = view.backends.iter().flat_map(gpu_points).collect();
        let mut classes = Vec::with_capacity(view.classes.len());
        let mut previous = HashMap::new();
        let mut previous_batches = HashMap::new();
        for c in &view.classes {
            let batches = metrics.class(&c.name).batch_figures();
            let before = ring.previous_batches.get(&c.name).copied();
            let (batch_size, batch_delay_s) = batches.means_since(&before.unwrap_or(batches));
            previous_batches.insert(c.name.clone(), batches);
            let (done, shed) = (c.requests_total, c.shed_total);
            let rate = |now: u64, before: u64, at: Instant| {
                let secs = instant.saturating_duration_since(at).as_secs_f64();
                if secs > 0.0 {
                    now.saturating_sub(before) as f64 / secs
                } else {
                    0.0
                }
            };
            let (requests_per_s, sheds_per_s) = match ring.previous.get(&c.name) {
                Some(&(d, s, at)) => (rate(done, d, at), rate(shed, s, at)),
                None => (0.0, 0.0),
            };
            previous.insert(c.name.clone(), (done, shed, instant));
            classes.push(ClassPoint {
                name: c.name.clone(),
                queue_depth: c.queue_depth,
                outstanding: c.outstanding,
                duration: c.latency.duration,
                ttfb: c.latency.ttfb,
                requests_per_s,
                sheds_per_s,
                batching: c.batching.is_some(),
                batch_size,
                batch_delay_s,
            });
        }
        ring.previous = previous;
        ring.previous_batches = previous_batches;
        ring.next_seq += 1;
        let sample = Sample {
            seq: ring.next_seq,
            t: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            generation: view.generation,
            backends,
            gpus,
            classes,
            host,
        };
        if ring.samples.len() >= CAPACITY {
            ring.samples.pop_front();
        }
        ring.samples.push_back(Arc::new(sample));
    }

    /// The samples with `seq` above `since`, oldest first.
    pub fn since(&self, since: u64) -> Page {
        let (samples, latest) = self
            .ring
            .lock()
            .map(|r| {
                let samples = r.samples.iter().filter(|s| s.seq > since).cloned();
                (samples.collect(), r.next_seq)
            })
            .unwrap_or_default();
        Page {
            interval_s: INTERVAL.as_secs_f64(),
            capacity: CAPACITY,
            latest,
            samples,
        }
    }
}

/// The background loop that feeds a [`History`] once per [`INTERVAL`] until shutdown.
pub struct HistorySampler {
    history: Arc<History>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
}

impl HistorySampler {
    /// A sampler of `registry`'s live snapshot and `metrics` into `history`.
    pub fn new(history: Arc<History>, registry: Arc<Registry>, metrics: Arc<Metrics>) -> Self {
        HistorySampler {
            history,
            registry,
            metrics,
        }
    }

    /// Samples until `shutdown` turns true (or its sender goes away).
    pub async fn run(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let host = self.metrics.sample_host_cpu();
                    self.history.record(&self.registry.load(), &self.metrics, host);
                }
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
            }
        }
    }
}

#[async_trait]
impl BackgroundService for HistorySampler {
    async fn start(&self, shutdown: ShutdownWatch) {
        self.run(shutdown).await;
    }
}

#[cfg(test)]
mod tests;
