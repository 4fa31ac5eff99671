//! The admission dispatcher: when a slot is released, hand it to the next queued request.
//!
//! Every backend and class slot signals one shared `Notify` when released; this loop wakes on
//! it and runs each class queue's dispatch under the current snapshot. Releases are therefore
//! seen at once, without polling. Capacity that appears without a release (a backend turning
//! healthy, telemetry dropping below a guard, a reload) is signalled too, and the queue's own
//! slow re-check covers anything missed.

use crate::routing::Registry;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::sync::Arc;

/// Background service running admission dispatch.
pub struct Dispatcher {
    registry: Arc<Registry>,
}

impl Dispatcher {
    /// Dispatch for the queues of `registry`'s snapshots.
    pub fn new(registry: Arc<Registry>) -> Self {
        Dispatcher { registry }
    }
}

#[async_trait]
impl BackgroundService for Dispatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let capacity = Arc::clone(&self.registry.load().capacity);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                () = capacity.notify.notified() => self.registry.load().dispatch_all(),
            }
        }
    }
}
