//! Listeners that stop accepting when gpulb says so, ahead of pingora's own stop.
//!
//! pingora closes its listening sockets only when the whole server stops, after the shutdown
//! watch returns. gpulb's drain needs the proxy's listener closed at the end of `drain_delay`
//! while requests in flight still run (and, on an upgrade, once the sockets are handed over).
//! [`StopAccepting`] wraps a pingora service and gives it a shutdown watch that turns true at
//! whichever comes first: gpulb's own switch or pingora's stop. pingora's accept loop then ends
//! and drops the listening socket (new connections are refused), connections waiting for a
//! request are closed after their last call (`connections::LAST_CALL`), and connections with a
//! request in flight close after its response.

use async_trait::async_trait;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::Service;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// The switch that tells wrapped listeners to stop accepting, and what pingora lent them.
pub struct AcceptSwitch {
    stop: watch::Sender<bool>,
    listen_fds: Mutex<Option<ListenFds>>,
}

impl std::fmt::Debug for AcceptSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcceptSwitch")
            .field("stopped", &self.stopped())
            .finish_non_exhaustive()
    }
}

impl Default for AcceptSwitch {
    fn default() -> Self {
        AcceptSwitch {
            stop: watch::channel(false).0,
            listen_fds: Mutex::new(None),
        }
    }
}

impl AcceptSwitch {
    /// Stops every listener wrapped with this switch (idempotent).
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Whether [`AcceptSwitch::stop`] was called.
    pub fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// pingora's table of listening sockets, once a wrapped service has started.
    pub fn listen_fds(&self) -> Option<ListenFds> {
        self.listen_fds.lock().ok()?.clone()
    }

    fn keep_listen_fds(&self, fds: &ListenFds) {
        if let Ok(mut slot) = self.listen_fds.lock() {
            slot.get_or_insert_with(|| Arc::clone(fds));
        }
    }
}

/// A pingora service whose listeners stop accepting when its [`AcceptSwitch`] is thrown.
pub struct StopAccepting<S> {
    inner: S,
    switch: Arc<AcceptSwitch>,
}

impl<S> StopAccepting<S> {
    /// Wraps `inner` so that `switch` can stop its listeners.
    pub fn new(inner: S, switch: Arc<AcceptSwitch>) -> Self {
        StopAccepting { inner, switch }
    }
}

/// A watch that turns true when either `ours` or pingora's `theirs` does.
fn either_stop(mut ours: watch::Receiver<bool>, mut theirs: ShutdownWatch) -> ShutdownWatch {
    let (tx, rx) = watch::channel(*ours.borrow() || *theirs.borrow());
    tokio::spawn(async move {
        tokio::select! {
            _ = ours.wait_for(|stop| *stop) => {}
            _ = theirs.wait_for(|stop| *stop) => {}
        }
        tx.send_replace(true);
    });
    rx
}

#[async_trait]
impl<S: Service> Service for StopAccepting<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        if let Some(fds) = &fds {
            self.switch.keep_listen_fds(fds);
        }
        let stop = either_stop(self.switch.stop.subscribe(), shutdown);
        self.inner.start_service(fds, stop, listeners_per_fd).await;
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.inner.listen_addresses()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn either_side_stops_the_listeners() {
        let switch = AcceptSwitch::default();
        let (pingora, theirs) = watch::channel(false);
        let mut stop = either_stop(switch.stop.subscribe(), theirs.clone());
        assert!(!*stop.borrow());
        switch.stop();
        stop.wait_for(|s| *s).await.unwrap();
        assert!(switch.stopped());

        let fresh = AcceptSwitch::default();
        let mut stop = either_stop(fresh.stop.subscribe(), theirs);
        pingora.send_replace(true);
        stop.wait_for(|s| *s).await.unwrap();
        assert!(!fresh.stopped());
    }
}
