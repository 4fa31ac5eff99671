//! `gpulb sim`: one simulated GPU worker on a given address, until SIGTERM or Ctrl-C, so a
//! container image (or a shell) can play a fleet.

use crate::tools::sim::{SimWorker, WorkerProfile};
use std::net::SocketAddr;
use std::time::Duration;

/// What `gpulb sim` serves.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Listen address.
    pub listen: SocketAddr,
    /// The worker's name (`x-sim-worker` header, metrics label, GPU UUID seed).
    pub name: String,
    /// Models served; empty keeps the simulator's default model and accepts any name.
    pub models: Vec<String>,
    /// One decode step with one running sequence.
    pub decode_step: Duration,
    /// Most sequences running at once.
    pub max_running: usize,
    /// KV-cache budget in tokens.
    pub kv_budget_tokens: usize,
    /// The GPU index in `/dcgm/metrics`.
    pub gpu_index: u32,
}

pub use super::ServeError as SimError;

impl SimOptions {
    fn profile(&self) -> WorkerProfile {
        let mut profile = WorkerProfile::new(self.name.clone());
        if !self.models.is_empty() {
            let models: Vec<&str> = self.models.iter().map(String::as_str).collect();
            profile = profile.serving(&models);
        }
        profile.decode_step = self.decode_step;
        profile.max_running = self.max_running;
        profile.kv_budget_tokens = self.kv_budget_tokens;
        profile.gpu_index = self.gpu_index;
        profile
    }
}

/// Serves one simulated worker until SIGTERM or Ctrl-C, then stops gracefully.
pub fn run(options: SimOptions) -> Result<(), SimError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(SimError::Runtime)?;
    runtime.block_on(async {
        let bind = |source| SimError::Bind {
            addr: options.listen,
            source,
        };
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(bind)?;
        let worker = SimWorker::start(listener, options.profile()).map_err(bind)?;
        tracing::info!(
            listen = %worker.addr(),
            name = %options.name,
            "gpulb sim serving /v1/*, /health, /metrics (vLLM-style) and /dcgm/metrics"
        );
        super::until_stopped().await;
        worker.shutdown().await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_shape_the_profile() {
        let options = SimOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            name: "gpu7".into(),
            models: vec!["m1".into(), "m2".into()],
            decode_step: Duration::from_millis(25),
            max_running: 8,
            kv_budget_tokens: 1000,
            gpu_index: 3,
        };
        let profile = options.profile();
        assert_eq!(profile.name, "gpu7");
        assert_eq!(profile.models, ["m1", "m2"]);
        assert!(profile.strict_models);
        assert_eq!(profile.decode_step, Duration::from_millis(25));
        assert_eq!((profile.max_running, profile.kv_budget_tokens), (8, 1000));
        assert_eq!(profile.gpu_index, 3);
        let open = SimOptions {
            models: vec![],
            ..options
        };
        assert!(!open.profile().strict_models);
    }
}
