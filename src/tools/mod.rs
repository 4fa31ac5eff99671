//! Tools beside the proxy: the simulated GPU worker (in-process, or served alone by
//! `gpulb sim`), the demo fleet, the NVML agent and the health-check probe.

pub mod agent;
pub mod demo;
pub mod probe;
pub mod sim;
pub mod sim_serve;

/// Why a tool's server (`gpulb sim`, `gpulb agent`) could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The async runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

/// Waits for SIGTERM or Ctrl-C (SIGINT).
pub(crate) async fn until_stopped() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
