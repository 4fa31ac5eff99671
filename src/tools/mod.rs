//! Tools beside the proxy: the simulated GPU worker (in-process, or served alone by
//! `gpulb sim`), the demo fleet, the NVML agent and the health-check probe.

pub mod agent;
pub mod demo;
pub mod probe;
pub mod sim;
pub mod sim_serve;

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
