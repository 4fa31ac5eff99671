//! Runs each backend's telemetry poller, storing readings in its live state.

use super::{BackendLoop, Stop};
use crate::routing::{Backend, BackendState, Registry, Snapshot};
use crate::telemetry::{poll, OwnServer, PollTarget, SourceConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// The telemetry loop of every backend that lists sources.
pub struct TelemetryPolling {
    registry: Arc<Registry>,
}

impl TelemetryPolling {
    /// Loops for the backends of `registry`, whose queues and settings they consult.
    pub fn new(registry: Arc<Registry>) -> Self {
        TelemetryPolling { registry }
    }
}

impl BackendLoop for TelemetryPolling {
    /// The backend's URL and its sources (its URL's `tls` and `auth` settings among them).
    type Spec = (
        String,
        Vec<SourceConfig>,
        Option<crate::config::UpstreamTls>,
        Option<crate::config::Credential>,
    );

    fn spec(&self, _snapshot: &Snapshot, backend: &Backend) -> Option<Self::Spec> {
        (!backend.telemetry.is_empty()).then(|| {
            (
                backend.url.clone(),
                backend.telemetry.clone(),
                backend.upstream.tls.clone(),
                backend.upstream.auth.clone(),
            )
        })
    }

    fn spawn(&self, backend: &Backend, spec: &Self::Spec, shutdown: Stop) -> JoinHandle<()> {
        let (url, sources, _, auth) = spec.clone();
        let own = OwnServer { url, auth };
        // An https backend's pages are read trusting what its `tls` keys say.
        let client = backend.upstream.tls.as_ref().and_then(|tls| {
            crate::tls::client_for(tls, None)
                .inspect_err(|error| {
                    tracing::warn!(backend = %backend.state.name, %error, "telemetry uses the system's roots");
                })
                .ok()
        });
        let sink = Arc::clone(&backend.state.telemetry);
        let errors = Arc::clone(&backend.state.telemetry_errors);
        let target = Arc::new(Polled {
            registry: Arc::clone(&self.registry),
            state: Arc::clone(&backend.state),
        });
        tokio::spawn(poll(sources, own, client, sink, errors, target, shutdown))
    }
}

/// A backend as its telemetry loop sees it: its live state, and the queues that wait on it.
struct Polled {
    registry: Arc<Registry>,
    state: Arc<BackendState>,
}

impl PollTarget for Polled {
    fn own_in_flight(&self) -> u32 {
        self.state.outstanding.get()
    }

    /// Queued requests are looked at again: other replicas' load may have fallen.
    fn stored(&self) {
        self.state.outstanding.signal_capacity();
    }

    /// `telemetry.waiting_interval` while requests wait in a queue and the last reading showed
    /// other replicas' requests on this backend: the room they free is seen that much sooner.
    fn hurry(&self) -> Option<Duration> {
        let snapshot = self.registry.load();
        let settings = &snapshot.config.telemetry;
        let every = settings
            .waiting_interval
            .filter(|_| settings.count_others)?;
        let others = self
            .state
            .telemetry
            .load()
            .as_deref()
            .and_then(|t| t.others_in_flight(settings.others_max_age, Instant::now()));
        let waiting = || snapshot.classes.iter().any(|c| c.state.queues.depth() > 0);
        (others.unwrap_or(0) > 0 && waiting()).then_some(every)
    }

    fn hurry_check(&self) -> Option<Duration> {
        let snapshot = self.registry.load();
        let settings = &snapshot.config.telemetry;
        settings.waiting_interval.filter(|_| settings.count_others)
    }
}
