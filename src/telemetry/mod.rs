//! GPU and model-server telemetry: typed readings, the sources that produce them, and the poller.
//!
//! Each source (NVML, a dcgm-exporter endpoint, a model server's `/metrics`) yields a
//! [`Reading`]; a backend's sources are merged into one and published as [`Telemetry`].
//! Values a source does not expose stay `None`: nothing here invents numbers.

pub mod dcgm;
pub mod model_server;
pub mod nvml;
mod poll;
pub mod prom_text;

use crate::config::Guards;
pub use crate::config::{GpuSelector, SourceConfig, SourceKind};
pub use dcgm::parse_dcgm;
pub use model_server::{parse_server_load, ServerKind};
pub(crate) use poll::stopped;
pub use poll::{poll, scrape, OwnServer, PollTarget, MAX_BODY};

use std::time::{Duration, Instant};

/// One GPU as last read.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GpuReading {
    /// NVML / dcgm index of the GPU on its host.
    pub index: Option<u32>,
    /// `GPU-…` UUID.
    pub uuid: Option<String>,
    /// Compute utilization, 0..=1.
    pub utilization: Option<f64>,
    /// Framebuffer memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Framebuffer memory in all, bytes.
    pub memory_total_bytes: Option<u64>,
    /// GPU core temperature, °C.
    pub temperature_celsius: Option<f64>,
    /// Power draw, W.
    pub power_watts: Option<f64>,
}

impl GpuReading {
    /// The `gpu` label of this reading, the `position`th of its backend: its index on the
    /// host, else its UUID, else its position.
    pub fn label(&self, position: usize) -> String {
        match (self.index, &self.uuid) {
            (Some(i), _) => i.to_string(),
            (None, Some(uuid)) => uuid.clone(),
            (None, None) => position.to_string(),
        }
    }

    /// Used share of the GPU's memory, 0..=1, when both figures are known.
    pub fn memory_fraction(&self) -> Option<f64> {
        let used = self.memory_used_bytes?;
        let total = self.memory_total_bytes?;
        (total > 0).then(|| (used as f64 / total as f64).clamp(0.0, 1.0))
    }

    /// Whether two readings describe the same GPU (same UUID, or same index when a UUID is missing).
    fn same_gpu(&self, other: &GpuReading) -> bool {
        match (&self.uuid, &other.uuid) {
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            _ => self.index.is_some() && self.index == other.index,
        }
    }

    /// Fills the fields this reading lacks from `other`.
    fn fill_from(&mut self, other: &GpuReading) {
        fn fill<T: Clone>(mine: &mut Option<T>, theirs: &Option<T>) {
            if mine.is_none() {
                mine.clone_from(theirs);
            }
        }
        fill(&mut self.index, &other.index);
        fill(&mut self.uuid, &other.uuid);
        fill(&mut self.utilization, &other.utilization);
        fill(&mut self.memory_used_bytes, &other.memory_used_bytes);
        fill(&mut self.memory_total_bytes, &other.memory_total_bytes);
        fill(&mut self.temperature_celsius, &other.temperature_celsius);
        fill(&mut self.power_watts, &other.power_watts);
    }
}

/// The model server's own view of its load.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ServerLoad {
    /// Requests in the running batch.
    pub running: Option<f64>,
    /// Requests queued inside the server, not yet running.
    pub waiting: Option<f64>,
    /// KV-cache usage, 0..=1.
    pub kv_cache_usage: Option<f64>,
    /// KV-cache capacity in tokens (vLLM: `num_gpu_blocks` x `block_size` of
    /// `vllm:cache_config_info`), when the server says.
    pub kv_capacity_tokens: Option<f64>,
    /// Share of prompt tokens found in its prefix cache, 0..=1 (vLLM: hits / queries since it
    /// started; SGLang: its `cache_hit_rate`).
    pub prefix_cache_hit_ratio: Option<f64>,
}

/// What one scrape of one source gave (or several sources, merged).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// The GPUs read (a tensor-parallel backend has several).
    pub gpus: Vec<GpuReading>,
    /// The model server's load figures, when a model-server source was read.
    pub server: Option<ServerLoad>,
}

impl Reading {
    /// Merges `other` into `self`: the same GPU seen twice becomes one (earlier sources win
    /// on conflicting values, later ones fill gaps); server figures likewise.
    pub fn merge(&mut self, other: &Reading) {
        for gpu in &other.gpus {
            match self.gpus.iter_mut().find(|g| g.same_gpu(gpu)) {
                Some(mine) => mine.fill_from(gpu),
                None => self.gpus.push(gpu.clone()),
            }
        }
        match (&mut self.server, &other.server) {
            (Some(mine), Some(theirs)) => {
                mine.running = mine.running.or(theirs.running);
                mine.waiting = mine.waiting.or(theirs.waiting);
                mine.kv_cache_usage = mine.kv_cache_usage.or(theirs.kv_cache_usage);
                mine.kv_capacity_tokens = mine.kv_capacity_tokens.or(theirs.kv_capacity_tokens);
                mine.prefix_cache_hit_ratio = mine
                    .prefix_cache_hit_ratio
                    .or(theirs.prefix_cache_hit_ratio);
            }
            (None, Some(theirs)) => self.server = Some(theirs.clone()),
            _ => {}
        }
    }

    /// Whether this reading breaks a limit of `guards`; `None` figures (unknown) break nothing.
    pub fn breaks(&self, guards: &Guards) -> bool {
        let over = |value: Option<f64>, limit: Option<f64>| matches!((value, limit), (Some(v), Some(l)) if v > l);
        let server = self.server.as_ref();
        over(self.max_memory_fraction(), guards.max_gpu_memory)
            || over(server.and_then(|s| s.kv_cache_usage), guards.max_kv_cache)
            || over(server.and_then(|s| s.waiting), guards.max_server_queue)
    }

    /// Highest memory fraction over the GPUs whose memory is known.
    pub fn max_memory_fraction(&self) -> Option<f64> {
        self.gpus
            .iter()
            .filter_map(GpuReading::memory_fraction)
            .reduce(f64::max)
    }
}

/// A backend's merged reading and when it was taken (the oldest part of it, when merged).
#[derive(Debug, Clone, PartialEq)]
pub struct Telemetry {
    /// The merged reading.
    pub reading: Reading,
    /// When it was read; its age tells the consumer whether to trust it.
    pub taken_at: Instant,
    /// When the server-load part was read, and what this proxy itself had in flight on the
    /// backend then; `None` without a server-load reading.
    pub server_sample: Option<ServerSample>,
}

/// When a model server's load was read, with this proxy's own share of it at that moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerSample {
    /// When the server answered.
    pub taken_at: Instant,
    /// Requests this proxy had in flight on the backend as the answer arrived.
    pub own_in_flight: u32,
    /// Everyone else's share of the backend's load over recent readings (0 to 1): moved an
    /// eighth of the way toward each reading's share, left alone by readings of an idle
    /// backend, so it remembers other replicas through a quiet moment.
    pub others_share: f64,
}

impl Telemetry {
    /// Requests on the backend that are not this proxy's — other gpulb replicas, clients that
    /// bypass it — estimated as the server's running + waiting minus what this proxy had in
    /// flight when it was read; `None` when that reading is older than `max_age` at `now` or
    /// the server reports neither count.
    pub fn others_in_flight(&self, max_age: Duration, now: Instant) -> Option<u32> {
        self.others_at_read(max_age, now).map(|o| o.others)
    }

    /// [`Telemetry::others_in_flight`], with this proxy's own count at that reading.
    pub fn others_at_read(&self, max_age: Duration, now: Instant) -> Option<OthersAtRead> {
        let sample = self.server_sample?;
        if now.saturating_duration_since(sample.taken_at) > max_age {
            return None;
        }
        let server = self.reading.server.as_ref()?;
        if server.running.is_none() && server.waiting.is_none() {
            return None;
        }
        let reported = server.running.unwrap_or(0.0) + server.waiting.unwrap_or(0.0);
        let others = reported.round() - f64::from(sample.own_in_flight);
        Some(OthersAtRead {
            others: others.clamp(0.0, f64::from(u32::MAX / 2)) as u32,
            own: sample.own_in_flight,
            others_share: sample.others_share,
        })
    }
}

/// Who held a backend when its server was last read: everyone else, and this proxy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OthersAtRead {
    /// Requests that were not this proxy's.
    pub others: u32,
    /// This proxy's own requests in flight then.
    pub own: u32,
    /// Everyone else's share of the backend's load over recent readings
    /// ([`ServerSample::others_share`]).
    pub others_share: f64,
}

/// Whether `t` is at most `max_age` old at `now`.
pub fn is_fresh(t: &Telemetry, max_age: Duration, now: Instant) -> bool {
    now.saturating_duration_since(t.taken_at) <= max_age
}

/// Why a source gave no reading.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TelemetryError {
    /// The HTTP request failed before a status came back (connect refused, reset...).
    #[error("GET {url}: {message}")]
    Http {
        /// The URL scraped.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The endpoint answered with a non-success status.
    #[error("GET {url}: HTTP {status}")]
    Status {
        /// The URL scraped.
        url: String,
        /// The status code.
        status: u16,
    },
    /// No complete answer within the source's timeout.
    #[error("GET {url}: no answer within {}", crate::config::duration::format(*.timeout))]
    Timeout {
        /// The URL scraped.
        url: String,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// The answer was larger than a metrics page may be.
    #[error("GET {url}: body larger than {limit} bytes")]
    TooLarge {
        /// The URL scraped.
        url: String,
        /// The limit, bytes.
        limit: usize,
    },
    /// The text is not Prometheus exposition format.
    #[error("{0}")]
    Parse(#[from] prom_text::ParseError),
    /// The scrape parsed but holds none of the series this source reads.
    #[error("no {what} series in the scrape")]
    NoSeries {
        /// What was looked for, e.g. `vllm` or `DCGM_FI_DEV_*`.
        what: String,
    },
    /// A configured GPU is not in the scrape or not on this host.
    #[error("GPU {0} not found")]
    GpuNotFound(String),
    /// NVML cannot be used on this host (no library, no driver, no permission).
    #[error("NVML unavailable: {0}")]
    NvmlUnavailable(String),
    /// NVML is loaded but a call failed.
    #[error("NVML: {0}")]
    Nvml(String),
}

#[cfg(test)]
mod guard_tests;
#[cfg(test)]
mod tests;
