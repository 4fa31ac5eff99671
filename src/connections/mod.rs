//! Client connections below HTTP: the `limits.max_connections` cap (a connection over it is
//! closed at once, logged and counted, instead of the process running out of file
//! descriptors), the per-connection deadlines of [`stream`], and the HTTP/1 keep-alive loop,
//! so that an idle connection waits here holding its socket and little else.

mod stream;

pub use stream::{mark_active, mark_idle, ClientLimits, GuardedStream};

use crate::metrics::Metrics;
use crate::routing::Registry;
use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::{Stream, ALPN};
use pingora::server::ShutdownWatch;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Once the service stops, how long an HTTP/1 connection still waits for a request it has not
/// sent yet (its first, or its next on keep-alive): a client that sent one as the stop came is
/// answered (its connection closed after the response) instead of finding it cut, which HTTP/1
/// cannot tell from a dropped request. Connections still silent then are closed.
pub const LAST_CALL: Duration = Duration::from_millis(500);

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
    /// When the service stopped (pingora's `cleanup`), the waiting connections woken then: each
    /// gets until [`LAST_CALL`] after it for its request, and closes if none comes.
    stopped_at: OnceLock<Instant>,
    stop: Notify,
    /// HTTP/1 connections open in gpulb's keep-alive loop, which the drain waits for.
    open_http1: Arc<AtomicUsize>,
}

/// One HTTP/1 connection in gpulb's keep-alive loop, counted for as long as it lives.
struct Http1Open(Arc<AtomicUsize>);

impl Http1Open {
    fn new(open: &Arc<AtomicUsize>) -> Http1Open {
        open.fetch_add(1, Ordering::AcqRel);
        Http1Open(Arc::clone(open))
    }
}

impl Drop for Http1Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<A> GuardedApp<A> {
    /// Guards `inner` with the limits of `registry`'s current config; `open_http1` counts the
    /// HTTP/1 connections open (the drain waits for them, see [`LAST_CALL`]).
    pub fn new(
        inner: A,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        open_http1: Arc<AtomicUsize>,
    ) -> GuardedApp<A> {
        GuardedApp {
            inner: Arc::new(inner),
            registry,
            metrics,
            automatic_cap: automatic_max_connections(),
            open: Arc::default(),
            last_refusal_log: AtomicU64::new(u64::MAX),
            stopped_at: OnceLock::new(),
            stop: Notify::new(),
            open_http1,
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

impl<A: HttpServerApp + Send + Sync + 'static> GuardedApp<A> {
    /// Whether pingora would serve `stream` as HTTP/1 (not h2c, HTTP/2 by ALPN or custom).
    fn is_http1(&self, stream: &Stream) -> bool {
        let options = self.inner.server_options();
        let h2c = options.is_some_and(|o| o.h2c) && stream.get_ssl_digest().is_none();
        let custom = options.is_some_and(|o| o.force_custom);
        !h2c && !custom && matches!(stream.selected_alpn_proto(), None | Some(ALPN::H1))
    }

    /// A session for the next request on an HTTP/1 connection, its header names' case kept
    /// or not as the current config says (`preserve_header_case`). A client that sends its
    /// next request before this one's answer (HTTP/1.1 pipelining) gets the answers in order,
    /// as nginx and HAProxy give them, instead of a close after the first (pingora's default;
    /// RFC 9112 section 9.3.2 allows either).
    fn new_http1_session(&self, stream: Stream) -> ServerSession {
        let mut session = ServerSession::new_http1(stream);
        session.set_keep_header_case(self.registry.load().config.preserve_header_case);
        session.set_pipelining_enabled(true);
        session
    }

    /// The requests of an HTTP/1 connection, as pingora's own loop serves them (pingora-core
    /// `apps/mod.rs`), except that before each request the connection waits here: pingora's
    /// per-request state (the session, its header buffer and the proxy's request future) is
    /// allocated when the request's first bytes arrive, not held while idle, and a stop leaves
    /// a request already sent its [`LAST_CALL`] (pingora would drop a connection whose request
    /// it had not read yet).
    async fn serve_http1(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) {
        let Some(stream) = self.wait_for_request(stream).await else {
            return;
        };
        let mut session = self.new_http1_session(stream);
        session.set_keepalive(if *shutdown.borrow() { None } else { Some(60) });
        session.set_keepalive_reuses_remaining(
            self.inner
                .server_options()
                .and_then(|o| o.keepalive_request_limit),
        );
        loop {
            let Some(reused) = self.inner.process_new_http(session, shutdown).await else {
                return;
            };
            let (stream, settings) = reused.consume();
            // A client that pipelined its next request has sent it already, and pingora holds
            // its first bytes: the socket may say nothing more, so there is nothing to wait for.
            let pipelined = settings.as_ref().is_some_and(|s| s.has_pipelined_prefix());
            let stream = if pipelined {
                stream
            } else {
                let Some(stream) = self.wait_for_request(stream).await else {
                    return;
                };
                stream
            };
            session = self.new_http1_session(stream);
            if let Some(settings) = settings {
                settings.apply_to_session(&mut session);
            }
        }
    }

    /// Waits for a request's first bytes under the connection's deadlines; `None` when the
    /// service stopped and [`LAST_CALL`] passed first (the connection is then closed).
    async fn wait_for_request(&self, stream: Stream) -> Option<Stream> {
        if !stream.as_any().is::<GuardedStream>() {
            return Some(stream); // not ours: pingora waits, as before
        }
        let Ok(mut guarded) = stream.into_any().downcast::<GuardedStream>() else {
            return None;
        };
        let stopped = self.stop.notified();
        if self.stopped_at.get().is_none() {
            tokio::select! {
                biased;
                () = guarded.wait_readable() => return Some(guarded as Stream),
                () = stopped => {}
            }
        }
        let last_call = *self.stopped_at.get()? + LAST_CALL;
        let request = tokio::time::timeout_at(last_call, guarded.wait_readable()).await;
        request.ok().map(|()| guarded as Stream)
    }
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for GuardedApp<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let snapshot = self.registry.load();
        let config = &snapshot.config;
        let cap = config.limits.max_connections.unwrap_or(self.automatic_cap);
        let permit = self.admit(cap)?;
        let limits = ClientLimits {
            header: config.timeouts.client_header,
            idle: config.timeouts.client_idle,
            max_header_bytes: config.limits.max_header_bytes,
        };
        drop(snapshot);
        let metrics = self.metrics.connections().clone();
        let http1 = self.is_http1(&stream);
        let stream = Box::new(GuardedStream::new(stream, limits, metrics)) as Stream;
        if http1 {
            // A task of its own, and pingora's ends here: pingora's task is sized for its TLS
            // handshake and accept path (~9 KiB), held for the connection's whole life.
            let app = Arc::clone(self);
            let shutdown = shutdown.clone();
            // Counted before the task runs, so the drain cannot miss a connection just accepted.
            let open_http1 = Http1Open::new(&self.open_http1);
            tokio::spawn(async move {
                let _counted = (permit, open_http1);
                app.serve_http1(stream, &shutdown).await;
            });
            return None;
        }
        let _permit = permit;
        let mut next = Some(stream);
        while let Some(stream) = next {
            next = self.inner.process_new(stream, shutdown).await;
        }
        None
    }

    async fn cleanup(&self) {
        self.stopped_at.get_or_init(Instant::now);
        self.stop.notify_waiters();
        self.inner.cleanup().await
    }
}
