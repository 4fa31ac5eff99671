//! Runs each backend's telemetry poller, storing readings in its live state.

use super::{BackendLoop, Stop};
use crate::routing::{Backend, Snapshot};
use crate::telemetry::{poll, SourceConfig};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// The telemetry loop of every backend that lists sources.
pub struct TelemetryPolling;

impl BackendLoop for TelemetryPolling {
    /// The backend's URL and its sources.
    type Spec = (String, Vec<SourceConfig>);

    fn spec(&self, _snapshot: &Snapshot, backend: &Backend) -> Option<Self::Spec> {
        (!backend.telemetry.is_empty()).then(|| (backend.url.clone(), backend.telemetry.clone()))
    }

    fn spawn(&self, backend: &Backend, spec: &Self::Spec, shutdown: Stop) -> JoinHandle<()> {
        let (url, sources) = spec.clone();
        let sink = Arc::clone(&backend.state.telemetry);
        let errors = Arc::clone(&backend.state.telemetry_errors);
        tokio::spawn(poll(sources, url, sink, errors, shutdown))
    }
}
