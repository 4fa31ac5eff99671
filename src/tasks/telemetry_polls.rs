//! Runs each backend's telemetry poller, storing readings in its live state.

use super::{BackendLoop, Stop};
use crate::routing::{Backend, InflightCounter, Snapshot};
use crate::telemetry::{poll, PollTarget, SourceConfig};
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
        let target = Arc::new(Outstanding(Arc::clone(&backend.state.outstanding)));
        tokio::spawn(poll(sources, url, sink, errors, target, shutdown))
    }
}

/// A backend's in-flight counter, as its telemetry loop sees it.
struct Outstanding(Arc<InflightCounter>);

impl PollTarget for Outstanding {
    fn own_in_flight(&self) -> u32 {
        self.0.get()
    }

    /// Queued requests are looked at again: other replicas' load may have fallen.
    fn stored(&self) {
        self.0.signal_capacity();
    }
}
