//! Model discovery: each backend without a configured model list is asked `GET /v1/models` on
//! a cadence (vLLM, SGLang, TGI and llama.cpp all answer it), and its list replaced with the
//! answer, so a model loaded or unloaded there is routed accordingly (over TLS for an https
//! backend).

use super::{BackendLoop, Stop};
use crate::config::Upstream;
use crate::routing::{Backend, BackendState, ModelInfo, ModelList, ModelSource, Snapshot};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The discovery loop of every backend that has no `models` in config.
pub struct ModelDiscovery {
    client: reqwest::Client,
}

impl ModelDiscovery {
    /// Discovery sharing one HTTP client (no proxy from the environment).
    pub fn new() -> Result<Self, reqwest::Error> {
        Ok(ModelDiscovery {
            client: reqwest::Client::builder().no_proxy().build()?,
        })
    }
}

/// How often and how patiently a backend is asked, and where it listens.
#[derive(Debug, Clone, PartialEq)]
pub struct Cadence {
    interval: Duration,
    timeout: Duration,
    upstream: Upstream,
}

/// `GET /v1/models` as OpenAI-compatible servers answer it; other fields are ignored.
#[derive(Deserialize)]
struct ModelsPage {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
    #[serde(default)]
    owned_by: Option<String>,
    #[serde(default)]
    created: Option<u64>,
    #[serde(default)]
    max_model_len: Option<u64>,
}

/// Parses a `GET /v1/models` answer into a discovered list.
fn parse(body: &[u8]) -> Result<ModelList, serde_json::Error> {
    let page: ModelsPage = serde_json::from_slice(body)?;
    Ok(ModelList {
        source: ModelSource::Discovered,
        models: page
            .data
            .into_iter()
            .map(|m| ModelInfo {
                id: m.id,
                owned_by: m.owned_by.unwrap_or_default(),
                created: m.created.unwrap_or(0),
                max_model_len: m.max_model_len,
            })
            .collect(),
    })
}

/// One ask of the backend at its current address; the answer's list, or why there is none.
async fn discover_once(
    client: &reqwest::Client,
    state: &BackendState,
    cadence: &Cadence,
) -> Result<ModelList, String> {
    let addr = state.address.get().ok_or("its name does not resolve")?;
    let target = crate::tls::target(&cadence.upstream, addr, client)?;
    let url = format!("{}/v1/models", target.base);
    let resp = target
        .request(reqwest::Method::GET, &url)
        .timeout(cadence.timeout)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("GET {url} answered {}", resp.status()));
    }
    let body = resp.bytes().await.map_err(|e| format!("GET {url}: {e}"))?;
    parse(&body).map_err(|e| format!("GET {url}: not a model list: {e}"))
}

async fn discover_loop(
    client: reqwest::Client,
    state: Arc<BackendState>,
    cadence: Cadence,
    mut shutdown: Stop,
) {
    let mut failing = false;
    loop {
        match discover_once(&client, &state, &cadence).await {
            Ok(list) => {
                if state.models.get().as_deref() != Some(&list) {
                    let ids: Vec<&str> = list.models.iter().map(|m| m.id.as_str()).collect();
                    tracing::info!(backend = %state.name, models = ?ids, "backend serves");
                    state.models.set(Some(list));
                    state.outstanding.signal_capacity();
                }
                failing = false;
            }
            // The last list stands: a backend that does not answer is out by its health.
            Err(cause) if !failing => {
                tracing::debug!(backend = %state.name, %cause, "model discovery failed");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = tokio::time::sleep(cadence.interval) => {}
            () = crate::telemetry::stopped(&mut shutdown) => return,
        }
    }
}

impl BackendLoop for ModelDiscovery {
    type Spec = Cadence;

    fn spec(&self, snapshot: &Snapshot, backend: &Backend) -> Option<Cadence> {
        let models = &snapshot.config.models;
        let configured = snapshot
            .config
            .backends
            .iter()
            .any(|b| b.name == backend.state.name && b.models.is_some());
        (models.discover && !configured).then(|| Cadence {
            interval: models.interval,
            timeout: models.timeout,
            upstream: backend.upstream.clone(),
        })
    }

    fn spawn(&self, backend: &Backend, spec: &Cadence, shutdown: Stop) -> JoinHandle<()> {
        tokio::spawn(discover_loop(
            self.client.clone(),
            Arc::clone(&backend.state),
            spec.clone(),
            shutdown,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_and_minimal_model_lists() {
        let vllm = br#"{"object":"list","data":[{"id":"llama-3.1-8b","object":"model",
            "created":1733000000,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B","parent":null,
            "max_model_len":8192,"permission":[]}]}"#;
        let list = parse(vllm).unwrap();
        assert_eq!(list.source, ModelSource::Discovered);
        assert_eq!(
            list.models,
            vec![ModelInfo {
                id: "llama-3.1-8b".into(),
                owned_by: "vllm".into(),
                created: 1_733_000_000,
                max_model_len: Some(8192),
            }]
        );
        let bare = parse(br#"{"data":[{"id":"a"},{"id":"b"}]}"#).unwrap();
        assert_eq!(bare.models.len(), 2);
        assert!(parse(b"{\"models\":[]}").is_err());
    }
}
