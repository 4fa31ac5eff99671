//! Background loops beside the request path, each owning one concern: admission dispatch,
//! and per-backend health checks, model discovery and telemetry polls.
//!
//! Per-backend loops run as one task per backend, kept in step with the current snapshot:
//! reloads add, restart (when a backend's settings change) and stop them.

mod dispatch;
mod health_checks;
mod model_discovery;
mod telemetry_polls;

pub use dispatch::Dispatcher;
pub use health_checks::HealthChecks;
pub use model_discovery::ModelDiscovery;
pub use telemetry_polls::TelemetryPolling;

use crate::routing::{Backend, Registry, Snapshot};
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Turns true when the process shuts down.
pub type Stop = watch::Receiver<bool>;

/// A per-backend loop: what it needs to know about a backend, and how to start it.
pub trait BackendLoop: Send + Sync + 'static {
    /// The settings a running task was started with; a change restarts the task.
    type Spec: PartialEq + Send + Sync;
    /// The task's settings for `backend`, or `None` when it needs no task.
    fn spec(&self, snapshot: &Snapshot, backend: &Backend) -> Option<Self::Spec>;
    /// Starts the task on the current runtime; it ends when `shutdown` turns true (it is also
    /// aborted when its backend goes or its settings change).
    fn spawn(&self, backend: &Backend, spec: &Self::Spec, shutdown: Stop) -> JoinHandle<()>;
}

/// Background service running one `L` task per backend of the current snapshot.
pub struct PerBackend<L: BackendLoop> {
    registry: Arc<Registry>,
    looper: L,
    stop: watch::Sender<bool>,
}

impl<L: BackendLoop> PerBackend<L> {
    /// Runs `looper`'s tasks for the backends of `registry`.
    pub fn new(registry: Arc<Registry>, looper: L) -> Self {
        PerBackend {
            registry,
            looper,
            stop: watch::Sender::new(false),
        }
    }

    /// Starts, restarts and stops tasks so they match `snapshot`.
    fn sync(&self, snapshot: &Snapshot, running: &mut HashMap<String, (L::Spec, JoinHandle<()>)>) {
        let mut kept = HashMap::new();
        for backend in &snapshot.backends {
            let name = &backend.state.name;
            let Some(spec) = self.looper.spec(snapshot, backend) else {
                continue;
            };
            match running.remove(name) {
                Some((old, task)) if old == spec => {
                    kept.insert(name.clone(), (old, task));
                }
                previous => {
                    if let Some((_, task)) = previous {
                        task.abort();
                    }
                    let task = self.looper.spawn(backend, &spec, self.stop.subscribe());
                    kept.insert(name.clone(), (spec, task));
                }
            }
        }
        for (_, (_, task)) in running.drain() {
            task.abort();
        }
        *running = kept;
    }
}

#[async_trait]
impl<L: BackendLoop> BackgroundService for PerBackend<L> {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut changes = self.registry.subscribe();
        let mut running = HashMap::new();
        loop {
            self.sync(&self.registry.load(), &mut running);
            tokio::select! {
                _ = shutdown.changed() => break,
                changed = changes.changed() => if changed.is_err() { break },
            }
        }
        self.stop.send_replace(true);
        for (_, (_, task)) in running {
            task.abort();
        }
    }
}
