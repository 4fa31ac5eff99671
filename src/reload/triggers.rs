//! What starts a reload in the background: the config file changing on disk, and `SIGHUP`.

use super::{Reloader, Trigger};
use async_trait::async_trait;
use notify::{RecursiveMode, Watcher};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// Background service that reloads on file change (when `watch`) and on `SIGHUP`.
pub struct ReloadService {
    reloader: Arc<Reloader>,
    watch: bool,
    debounce: Duration,
}

impl ReloadService {
    /// Reload triggers for `reloader`; `debounce` is the quiet time that ends a burst of events.
    pub fn new(reloader: Arc<Reloader>, watch: bool, debounce: Duration) -> Self {
        ReloadService {
            reloader,
            watch,
            debounce,
        }
    }

    /// Watches the config file's directory (a rename over the file replaces its inode, so the
    /// file itself cannot be watched); sends a tick for events that touch the file.
    fn watch_file(&self) -> Option<(notify::RecommendedWatcher, mpsc::Receiver<()>)> {
        let path = self.reloader.path();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => ".".into(),
        };
        let name: OsString = path.file_name()?.to_os_string();
        let (tx, rx) = mpsc::channel(16);
        let handler = move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            let touches_file = event.paths.iter().any(|p| {
                p.file_name().is_some_and(|n| {
                    // `..data` is how Kubernetes swaps a mounted ConfigMap.
                    n == name.as_os_str() || n.to_string_lossy().starts_with("..")
                })
            });
            if touches_file && !event.kind.is_access() {
                let _ = tx.try_send(());
            }
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the config file; reload with SIGHUP or POST /reload");
                return None;
            }
        };
        if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the config directory; reload with SIGHUP or POST /reload");
            return None;
        }
        Some((watcher, rx))
    }

    async fn run_reload(&self, trigger: Trigger) {
        let reloader = Arc::clone(&self.reloader);
        // Reading the file and resolving backend names may block: keep it off the event loop.
        let _ = tokio::task::spawn_blocking(move || reloader.reload(trigger)).await;
    }
}

#[async_trait]
impl BackgroundService for ReloadService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP");
                None
            }
        };
        let (_watcher, mut events) = match self.watch.then(|| self.watch_file()).flatten() {
            Some((w, rx)) => (Some(w), Some(rx)),
            None => (None, None),
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = async { hangup.as_mut()?.recv().await } => self.run_reload(Trigger::Signal).await,
                Some(()) = async { events.as_mut()?.recv().await } => {
                    // Let the burst of events one save makes settle, then reload once.
                    if let Some(rx) = events.as_mut() {
                        while let Ok(Some(())) = tokio::time::timeout(self.debounce, rx.recv()).await {}
                    }
                    self.run_reload(Trigger::File).await;
                }
            }
        }
    }
}
