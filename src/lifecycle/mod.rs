//! The process's lifecycle as the outside sees it, and the drain that orders a graceful stop.
//!
//! On SIGTERM gpulb drains in the order Kubernetes needs: readiness turns false at once while
//! traffic is still served for `drain_delay` (so endpoints are withdrawn); then the proxy's
//! listener stops accepting (new connections are refused; a new request on a connection
//! already open gets a 503) and in-flight and queued requests get `shutdown_timeout` to finish;
//! queued requests still waiting then get a clean 503; only then is pingora told to stop, so no
//! stream is cut. SIGINT stops at once, also during a drain.
//!
//! On SIGQUIT gpulb hands its listening sockets to a new process started with `--upgrade`
//! (pingora's socket hand-over, [`handover`]), stops accepting on them, and exits once what it
//! has in flight is done (within `shutdown_timeout`); if the hand-over fails it keeps serving.

pub mod handover;
mod listeners;

pub use handover::Handover;
pub use listeners::{AcceptSwitch, StopAccepting};

use crate::admission::ShedReason;
use crate::routing::Registry;
use async_trait::async_trait;
use futures_util::FutureExt;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often the drain looks at what is still in flight.
const DRAIN_POLL: Duration = Duration::from_millis(50);
/// How long the old process keeps accepting after a hand-over, closing each connection after
/// its response, before it stops accepting (and closes the idle ones after their last call).
const HANDOVER_LINGER: Duration = Duration::from_secs(1);

/// Where the process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Serving; ready for traffic.
    Serving = 0,
    /// Told to stop: not ready, still serving every request.
    Draining = 1,
    /// Finishing what is in flight; the proxy's listener is closed and a new request on a
    /// connection still open is refused.
    Closing = 2,
}

/// The lifecycle phase, shared by the proxy, the admin probes and the drain, and the switches
/// that close the listeners: the proxy's when the phase reaches [`Phase::Closing`], both once
/// the sockets are handed over to a new process.
#[derive(Debug, Default)]
pub struct Lifecycle {
    phase: AtomicU8,
    proxy_listener: Arc<AcceptSwitch>,
    admin_listener: Arc<AcceptSwitch>,
    open_http1: Arc<AtomicUsize>,
}

impl Lifecycle {
    /// The phase now.
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Serving,
            1 => Phase::Draining,
            _ => Phase::Closing,
        }
    }

    /// The switch that stops the proxy's listener.
    pub fn proxy_listener(&self) -> Arc<AcceptSwitch> {
        Arc::clone(&self.proxy_listener)
    }

    /// The switch that stops the admin listener.
    pub fn admin_listener(&self) -> Arc<AcceptSwitch> {
        Arc::clone(&self.admin_listener)
    }

    /// The count of HTTP/1 client connections open, kept by the proxy's connection loop; the
    /// drain waits for it to reach zero (each closes after its response or its last call).
    pub fn open_http1(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.open_http1)
    }

    fn enter(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
        if phase == Phase::Closing {
            self.proxy_listener.stop();
        }
    }
}

/// A shutdown watch that drains before passing a graceful stop on to pingora.
pub struct Drain {
    inner: Box<dyn ShutdownSignalWatch + Send + Sync>,
    lifecycle: Arc<Lifecycle>,
    registry: Arc<Registry>,
    drain_delay: Duration,
    shutdown_timeout: Duration,
    handover: Handover,
}

impl Drain {
    /// Drains `registry`'s traffic on `inner`'s graceful stop, keeping `lifecycle` current.
    pub fn new(
        inner: Box<dyn ShutdownSignalWatch + Send + Sync>,
        lifecycle: Arc<Lifecycle>,
        registry: Arc<Registry>,
        drain_delay: Duration,
        shutdown_timeout: Duration,
    ) -> Self {
        Drain {
            inner,
            lifecycle,
            registry,
            drain_delay,
            shutdown_timeout,
            handover: Handover::default(),
        }
    }

    /// Hands the listening sockets over through `handover`'s socket on SIGQUIT.
    pub fn with_handover(mut self, handover: Handover) -> Self {
        self.handover = handover;
        self
    }

    /// Requests in flight or queued, over every class.
    fn in_flight(&self) -> usize {
        let snapshot = self.registry.load();
        let classes = snapshot.classes.iter();
        classes
            .map(|c| c.state.outstanding.get() as usize + c.state.queues.depth())
            .sum()
    }

    /// The drain itself: delay, then close and wait for what is in flight.
    async fn drain(&self) {
        self.lifecycle.enter(Phase::Draining);
        tracing::info!(delay = ?self.drain_delay, "SIGTERM: not ready any more; draining");
        tokio::time::sleep(self.drain_delay).await;
        self.lifecycle.enter(Phase::Closing);
        self.finish_in_flight().await;
    }

    /// After the sockets went to the new process: leave the probes to it, close each proxy
    /// connection after its next response for [`HANDOVER_LINGER`] (so busy keep-alive clients
    /// move over without racing an idle close), then stop accepting and finish what is in flight.
    async fn after_handover(&self) {
        self.lifecycle.admin_listener.stop();
        self.lifecycle.enter(Phase::Draining);
        tracing::info!("listening sockets handed over; moving clients to the new process");
        tokio::time::sleep(HANDOVER_LINGER).await;
        self.lifecycle.proxy_listener.stop();
        self.finish_in_flight().await;
    }

    /// Waits up to `shutdown_timeout` for what is in flight or queued and for the HTTP/1 client
    /// connections to close (a request sent as the listener closed is still answered), then
    /// refuses the queued.
    async fn finish_in_flight(&self) {
        let deadline = Instant::now() + self.shutdown_timeout;
        let open = &self.lifecycle.open_http1;
        let mut left = self.in_flight();
        while (left > 0 || open.load(Ordering::Acquire) > 0) && Instant::now() < deadline {
            tokio::time::sleep(DRAIN_POLL).await;
            left = self.in_flight();
        }
        if left > 0 {
            tracing::warn!(left, timeout = ?self.shutdown_timeout, "requests still in flight at shutdown_timeout");
            let snapshot = self.registry.load();
            for class in &snapshot.classes {
                for (_, queue) in class.state.queues.waiting() {
                    queue.shed_all(&class.policy, ShedReason::ShuttingDown);
                }
            }
            // Let the refused ones write their 503.
            tokio::time::sleep(DRAIN_POLL * 4).await;
        } else {
            match open.load(Ordering::Acquire) {
                0 => tracing::info!("drained: nothing in flight"),
                connections => {
                    tracing::warn!(connections, timeout = ?self.shutdown_timeout, "client connections still open at shutdown_timeout (a response still being written); closing them")
                }
            }
        }
    }
}

#[async_trait]
impl ShutdownSignalWatch for Drain {
    async fn recv(&self) -> ShutdownSignal {
        loop {
            let finish = match self.inner.recv().await {
                ShutdownSignal::GracefulTerminate => self.drain().boxed(),
                ShutdownSignal::GracefulUpgrade => {
                    let fds = self.lifecycle.proxy_listener.listen_fds();
                    match self.handover.send(fds).await {
                        Ok(()) => self.after_handover().boxed(),
                        Err(e) => {
                            tracing::error!(error = %e, "SIGQUIT: cannot hand the listening sockets over; still serving");
                            continue;
                        }
                    }
                }
                ShutdownSignal::FastShutdown => return ShutdownSignal::FastShutdown,
            };
            // pingora then stops: the listeners are closed already, nothing is in flight.
            return tokio::select! {
                () = finish => ShutdownSignal::GracefulTerminate,
                // A second signal meanwhile (SIGINT: stop now) wins.
                again = self.inner.recv() => again,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::sync::Mutex;

    /// A watch that answers the signals it was given, one per call, then waits forever.
    struct Scripted(Mutex<Vec<ShutdownSignal>>);

    #[async_trait]
    impl ShutdownSignalWatch for Scripted {
        async fn recv(&self) -> ShutdownSignal {
            let next = self.0.lock().unwrap().pop();
            match next {
                Some(signal) => signal,
                None => std::future::pending().await,
            }
        }
    }

    fn drain(signals: Vec<ShutdownSignal>, registry: &Arc<Registry>) -> (Drain, Arc<Lifecycle>) {
        let lifecycle = Arc::new(Lifecycle::default());
        let drain = Drain::new(
            Box::new(Scripted(Mutex::new(signals))),
            Arc::clone(&lifecycle),
            Arc::clone(registry),
            Duration::from_millis(200),
            Duration::from_secs(5),
        );
        (drain, lifecycle)
    }

    fn registry() -> Arc<Registry> {
        let yaml =
            "health_check: {enabled: false}\nbackends:\n  - {name: a, url: 'http://127.0.0.1:9'}\n";
        Arc::new(Registry::new(Config::from_yaml(yaml).unwrap()))
    }

    #[tokio::test(start_paused = true)]
    async fn sigterm_waits_for_the_delay_and_for_what_is_in_flight() {
        let registry = registry();
        let (drain, lifecycle) = drain(vec![ShutdownSignal::GracefulTerminate], &registry);
        let grant = registry
            .load()
            .grant(0, &Default::default())
            .expect("a slot");
        let started = Instant::now();
        let stop = tokio::spawn(async move { drain.recv().await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(lifecycle.phase(), Phase::Draining);
        assert!(!lifecycle.proxy_listener().stopped());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(lifecycle.phase(), Phase::Closing);
        assert!(lifecycle.proxy_listener().stopped());
        assert!(!stop.is_finished(), "a request is still in flight");
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(grant);
        let signal = stop.await.unwrap();
        assert!(matches!(signal, ShutdownSignal::GracefulTerminate));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(1300) && took < Duration::from_millis(1500),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sigint_during_a_drain_stops_at_once_and_other_signals_pass() {
        let registry = registry();
        let _grant = registry.load().grant(0, &Default::default());
        // Popped from the end: first SIGTERM, then SIGINT.
        let signals = vec![
            ShutdownSignal::FastShutdown,
            ShutdownSignal::GracefulTerminate,
        ];
        let (drain, _) = drain(signals, &registry);
        assert!(matches!(drain.recv().await, ShutdownSignal::FastShutdown));
    }

    #[tokio::test(start_paused = true)]
    async fn an_upgrade_that_cannot_hand_over_keeps_serving() {
        let registry = registry();
        // No listener has started, so there is nothing to hand over; then SIGINT.
        let signals = vec![
            ShutdownSignal::FastShutdown,
            ShutdownSignal::GracefulUpgrade,
        ];
        let (upgrade, lifecycle) = drain(signals, &registry);
        assert!(matches!(upgrade.recv().await, ShutdownSignal::FastShutdown));
        assert_eq!(lifecycle.phase(), Phase::Serving);
        assert!(!lifecycle.proxy_listener().stopped());
        assert!(!lifecycle.admin_listener().stopped());
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_timeout_queued_requests_are_refused_and_the_stop_goes_on() {
        let registry = registry();
        let lifecycle = Arc::new(Lifecycle::default());
        let drain = Drain::new(
            Box::new(Scripted(Mutex::new(vec![
                ShutdownSignal::GracefulTerminate,
            ]))),
            Arc::clone(&lifecycle),
            Arc::clone(&registry),
            Duration::ZERO,
            Duration::from_secs(2),
        );
        let _held = registry.load().grant(0, &Default::default());
        let started = Instant::now();
        assert!(matches!(
            drain.recv().await,
            ShutdownSignal::GracefulTerminate
        ));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(3),
            "{took:?}"
        );
    }
}
