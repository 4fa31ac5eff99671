//! Simulated OpenAI-compatible GPU inference worker (continuous batching) for demos, tests and benchmarks.

mod body;
mod completions;
mod dcgm;
#[cfg(test)]
mod embedding_tests;
mod embeddings;
mod engine;
#[cfg(test)]
mod fault_tests;
mod http;
mod metrics;
#[cfg(test)]
mod model_tests;
mod models;
mod openai;
mod prefix;
mod responses;
#[cfg(test)]
mod tests;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::http::header::HeaderValue;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};

pub use self::embeddings::{EmbeddingProfile, REJECT_MARKER};

use self::embeddings::Embedder;
use self::engine::{Engine, EngineConfig};
use self::http::{Mode, Shared};
use self::models::ServedModels;

/// How long a graceful shutdown lets open connections finish before dropping them.
const GRACE: Duration = Duration::from_secs(1);

/// Timing and capacity model of one simulated GPU worker.
#[derive(Clone, Debug)]
pub struct WorkerProfile {
    /// Worker name: sent in the `x-sim-worker` header and as the metrics `model_name` label.
    pub name: String,
    /// Time of one decode step with one running sequence.
    pub decode_step: Duration,
    /// Added to the step time for each extra running sequence.
    pub step_per_running: Duration,
    /// Prefill cost per prompt token not found in the prefix cache, paid in the step where a
    /// sequence joins.
    pub prefill_per_token: Duration,
    /// At most this many sequences run at once.
    pub max_running: usize,
    /// Sum over running sequences of (prompt + max_tokens) must fit in this budget.
    pub kv_budget_tokens: usize,
    /// Tokens generated when a request has no `max_tokens`.
    pub default_max_tokens: u32,
    /// Index of the simulated GPU in `/dcgm/metrics` (the `gpu` label).
    pub gpu_index: u32,
    /// UUID of the simulated GPU; `None` derives a stable one from the name.
    pub gpu_uuid: Option<String>,
    /// Model ids listed by `/v1/models`, in order; a request naming no model gets the first.
    pub models: Vec<String>,
    /// Answer a request naming a model not in `models` with 404, as vLLM does. Off by default,
    /// so clients that send any model name are served under it.
    pub strict_models: bool,
    /// Automatic prefix caching like vLLM's: finished prompts' 16-token blocks stay cached in
    /// the free KV budget (LRU), and a prompt's cached leading blocks skip prefill. On by default.
    pub prefix_caching: bool,
    /// Cost and capacity of `POST /v1/embeddings`.
    pub embedding: EmbeddingProfile,
    /// Like vLLM's `--api-key`: every `/v1/` request must carry `Authorization: Bearer <key>`,
    /// else 401; `/health` and `/metrics` stay open.
    pub api_key: Option<String>,
}

impl WorkerProfile {
    /// A profile with the given name and default timings.
    pub fn new(name: impl Into<String>) -> Self {
        WorkerProfile {
            name: name.into(),
            decode_step: Duration::from_millis(10),
            step_per_running: Duration::from_micros(500),
            prefill_per_token: Duration::from_micros(50),
            max_running: 16,
            kv_budget_tokens: 32768,
            default_max_tokens: 16,
            gpu_index: 0,
            gpu_uuid: None,
            models: vec![openai::DEFAULT_MODEL.to_string()],
            strict_models: false,
            prefix_caching: true,
            embedding: EmbeddingProfile::default(),
            api_key: None,
        }
    }

    /// Serves exactly these models, in order, and answers 404 to any other (`strict_models`).
    pub fn serving(mut self, models: &[&str]) -> Self {
        self.models = models.iter().map(|m| m.to_string()).collect();
        self.strict_models = true;
        self
    }
}

impl Default for WorkerProfile {
    fn default() -> Self {
        WorkerProfile::new("sim")
    }
}

/// Failure mode injected into a worker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Healthy.
    None,
    /// Accept requests, never answer (until shutdown/kill).
    Hang,
    /// Answer every request with 500 and a JSON error body.
    ServerError,
    /// Answer every `/v1/` request with 429, as TGI does past `--max-concurrent-requests`
    /// (health and metrics still answer).
    Overloaded,
    /// Multiply all step/prefill times (and `/sleep`) by this factor.
    Slow(f64),
    /// Streaming responses abort the connection after this many tokens.
    DieMidStream {
        /// Tokens sent before the connection is dropped.
        after_tokens: u32,
    },
}

/// Counters and gauges of a worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Requests received (all routes except `/health`, `/metrics` and `/dcgm/metrics`).
    pub received_total: u64,
    /// Responses whose body completed (same routes as `received_total`).
    pub served_total: u64,
    /// Sequences currently running in the engine.
    pub running: usize,
    /// Sequences waiting for admission.
    pub waiting: usize,
    /// Requests to `/health`, `/metrics` and `/dcgm/metrics` (kept apart so probes do not skew load counts).
    pub control_total: u64,
    /// Prompt tokens looked up in the prefix cache (`vllm:prefix_cache_queries_total`).
    pub prefix_cache_queries_total: u64,
    /// Prompt tokens found in the prefix cache, whose prefill was skipped (`vllm:prefix_cache_hits_total`).
    pub prefix_cache_hits_total: u64,
    /// `/v1/embeddings` calls answered 200.
    pub embedding_calls_total: u64,
    /// Input items embedded by those calls.
    pub embedding_items_total: u64,
}

/// A running simulated worker; dropping it stops all of its tasks.
pub struct SimWorker {
    addr: SocketAddr,
    shared: Arc<Shared>,
    ctl: watch::Sender<Mode>,
    done: watch::Receiver<bool>,
    accept_task: AbortHandle,
    engine_task: AbortHandle,
}

impl SimWorker {
    /// Starts serving on an already-bound listener, spawning tasks on the current tokio runtime.
    pub fn start(listener: TcpListener, profile: WorkerProfile) -> std::io::Result<SimWorker> {
        tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
        let addr = listener.local_addr()?;
        let (engine, engine_task) = Engine::spawn(EngineConfig {
            decode_step: profile.decode_step,
            step_per_running: profile.step_per_running,
            prefill_per_token: profile.prefill_per_token,
            max_running: profile.max_running.max(1),
            kv_budget_tokens: profile.kv_budget_tokens,
            prefix_caching: profile.prefix_caching,
        });
        let (ctl, ctl_rx) = watch::channel(Mode::Running);
        let (done_tx, done) = watch::channel(false);
        let header =
            HeaderValue::from_str(&profile.name).unwrap_or(HeaderValue::from_static("sim"));
        let gpu_uuid = profile
            .gpu_uuid
            .clone()
            .unwrap_or_else(|| dcgm::uuid_for(&profile.name));
        let gpu = dcgm::SimGpu::new(profile.gpu_index, gpu_uuid, profile.max_running);
        let shared = Arc::new(Shared {
            name: profile.name,
            header,
            engine,
            default_max_tokens: profile.default_max_tokens.max(1),
            fault: Mutex::new(Fault::None),
            received: AtomicU64::new(0),
            served: Arc::new(AtomicU64::new(0)),
            control: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            ctl: ctl_rx.clone(),
            gpu,
            embedder: Embedder::new(profile.embedding),
            responses: Default::default(),
            api_key: profile
                .api_key
                .map(|key| format!("Bearer {key}").into_bytes()),
            models: ServedModels::new(
                profile.models,
                profile.strict_models,
                openai::now_s(),
                profile.kv_budget_tokens,
            ),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone(), ctl_rx, done_tx));
        Ok(SimWorker {
            addr,
            shared,
            ctl,
            done,
            accept_task: accept.abort_handle(),
            engine_task: engine_task.abort_handle(),
        })
    }

    /// Convenience: bind 127.0.0.1:0 and start.
    pub async fn bind_loopback(profile: WorkerProfile) -> std::io::Result<SimWorker> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        SimWorker::start(listener, profile)
    }

    /// Address the worker listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Worker name from its profile.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Injects a failure mode (applies to requests arriving from now on).
    pub fn set_fault(&self, fault: Fault) {
        match self.shared.fault.lock() {
            Ok(mut f) => *f = fault,
            Err(p) => *p.into_inner() = fault,
        }
        let slow = if let Fault::Slow(f) = fault { f } else { 1.0 };
        self.shared.engine.state().set_slow_factor(slow);
    }

    /// Forces the simulated GPU's used-memory fraction (0..=1) in `/dcgm/metrics`;
    /// `None` returns to the model (weights + KV-cache use).
    pub fn set_gpu_memory_override(&self, fraction: Option<f64>) {
        self.shared.gpu.set_memory_override(fraction);
    }

    /// Replaces the served models (applies to requests arriving from now on, `/v1/models` included).
    pub fn set_models(&self, models: Vec<String>) {
        self.shared.models.set(models);
    }

    /// Models served now, in `/v1/models` order.
    pub fn models(&self) -> Vec<String> {
        self.shared.models.current().to_vec()
    }

    /// UUID of the simulated GPU, as `/dcgm/metrics` reports it.
    pub fn gpu_uuid(&self) -> &str {
        &self.shared.gpu.uuid
    }

    /// Current failure mode.
    pub fn fault(&self) -> Fault {
        self.shared.fault()
    }

    /// Snapshot of counters and engine gauges.
    pub fn stats(&self) -> SimStats {
        let st = self.shared.engine.state();
        SimStats {
            received_total: self.shared.received.load(Ordering::Relaxed),
            served_total: self.shared.served.load(Ordering::Relaxed),
            running: st.running.load(Ordering::Relaxed),
            waiting: st.waiting.load(Ordering::Relaxed),
            control_total: self.shared.control.load(Ordering::Relaxed),
            prefix_cache_queries_total: st.prefix_queries_total.load(Ordering::Relaxed),
            prefix_cache_hits_total: st.prefix_hits_total.load(Ordering::Relaxed),
            embedding_calls_total: self.shared.embedder.calls.load(Ordering::Relaxed),
            embedding_items_total: self.shared.embedder.items.load(Ordering::Relaxed),
        }
    }

    /// "Die": stop accepting and drop every open connection at once (clients see resets / EOF).
    ///
    /// Takes effect as soon as the runtime runs the worker's accept task; use
    /// [`SimWorker::kill_and_wait`] to be sure the port is closed.
    pub fn kill(&self) {
        self.ctl.send_replace(Mode::Kill);
    }

    /// Like [`SimWorker::kill`], then waits (at most 2 s) until the listener and all connections are gone.
    pub async fn kill_and_wait(&self) {
        self.kill();
        self.wait_done(Duration::from_secs(2)).await;
    }

    /// Graceful: stop accepting, let connections finish (bounded), end all tasks.
    pub async fn shutdown(self) {
        self.ctl.send_replace(Mode::Graceful);
        self.wait_done(GRACE + Duration::from_secs(1)).await;
        // Drop aborts whatever is left, including the engine.
    }

    async fn wait_done(&self, limit: Duration) {
        let mut done = self.done.clone();
        let _ = tokio::time::timeout(limit, done.wait_for(|d| *d)).await;
    }
}

impl Drop for SimWorker {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.engine_task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut ctl: watch::Receiver<Mode>,
    done: watch::Sender<bool>,
) {
    let mut conns = JoinSet::new();
    let mode = loop {
        tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    conns.spawn(serve_conn(stream, shared.clone(), ctl.clone()));
                }
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::debug!(error = %e, "sim worker accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            changed = ctl.changed() => {
                let mode = if changed.is_err() { Mode::Kill } else { *ctl.borrow_and_update() };
                if mode != Mode::Running {
                    break mode;
                }
            }
        }
    };
    drop(listener);
    if mode == Mode::Graceful {
        let _ =
            tokio::time::timeout(GRACE, async { while conns.join_next().await.is_some() {} }).await;
    }
    conns.shutdown().await;
    let _ = done.send(true);
}

async fn serve_conn(stream: TcpStream, shared: Arc<Shared>, mut ctl: watch::Receiver<Mode>) {
    let svc = service_fn(move |req| http::handle(shared.clone(), req));
    let conn = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), svc);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = ctl.wait_for(|m| *m != Mode::Running) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}
