//! Client connections below HTTP: the `limits.max_connections` cap (a connection over it is
//! closed at once, logged and counted, instead of the process running out of file
//! descriptors) and the per-connection deadlines of [`stream`].

mod stream;

pub use stream::{mark_active, mark_idle, ClientLimits, GuardedStream};

use crate::metrics::Metrics;
use crate::routing::Registry;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// File descriptors kept back from the automatic connection cap: listeners, logs, health checks.
const FD_RESERVE: usize = 128;

/// The connection cap when `limits.max_connections` is absent: half of what the open-file
/// limit leaves after a reserve (each proxied request holds a backend connection too).
pub fn automatic_max_connections() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given and nothing else.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
    } else {
        1024
    };
    (soft.saturating_sub(FD_RESERVE) / 2).max(1)
}

/// One open client connection, counted for as long as it lives.
struct Permit {
    open: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        self.metrics.connections().open_changed(-1);
    }
}

/// Wraps the proxy's pingora application with the connection cap and deadlines; the limits
/// in force are read from the routing snapshot at each accept, so a reload changes them for
/// new connections.
pub struct GuardedApp<A> {
    inner: Arc<A>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    automatic_cap: usize,
    open: Arc<AtomicUsize>,
    /// Seconds (monotonic) of the last "refused" log line, so a flood logs once a second.
    last_refusal_log: AtomicU64,
}

impl<A> GuardedApp<A> {
    /// Guards `inner` with the limits of `registry`'s current config.
    pub fn new(inner: A, registry: Arc<Registry>, metrics: Arc<Metrics>) -> GuardedApp<A> {
        GuardedApp {
            inner: Arc::new(inner),
            registry,
            metrics,
            automatic_cap: automatic_max_connections(),
            open: Arc::default(),
            last_refusal_log: AtomicU64::new(u64::MAX),
        }
    }

    /// Counts a connection in, or `None` when `cap` are open already.
    fn admit(&self, cap: usize) -> Option<Permit> {
        let admitted = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            self.refuse(cap);
            return None;
        }
        self.metrics.connections().open_changed(1);
        Some(Permit {
            open: Arc::clone(&self.open),
            metrics: Arc::clone(&self.metrics),
        })
    }

    fn refuse(&self, cap: usize) {
        let connections = self.metrics.connections();
        connections.refused();
        let now = crate::metrics::now_s();
        if self.last_refusal_log.swap(now, Ordering::AcqRel) != now {
            tracing::warn!(
                max_connections = cap,
                refused_total = connections.refused_total(),
                "client connection refused: limits.max_connections are open"
            );
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for GuardedApp<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let snapshot = self.registry.load();
        let config = &snapshot.config;
        let cap = config.limits.max_connections.unwrap_or(self.automatic_cap);
        let _permit = self.admit(cap)?;
        let limits = ClientLimits {
            header: config.timeouts.client_header,
            idle: config.timeouts.client_idle,
            max_header_bytes: config.limits.max_header_bytes,
        };
        let metrics = self.metrics.connections().clone();
        let mut next = Some(Box::new(GuardedStream::new(stream, limits, metrics)) as Stream);
        while let Some(stream) = next {
            next = self.inner.process_new(stream, shutdown).await;
        }
        None
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}
