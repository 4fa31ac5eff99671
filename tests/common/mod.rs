//! Test harness: the real `gpulb` binary on free loopback ports, simulated workers, bounded waits.
#![allow(dead_code)]

use gpulb::tools::sim::{SimWorker, WorkerProfile};
use serde_json::Value;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (bound and released; pingora needs a distinct port per listener).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// Starts `n` simulated workers named w0.. with the profile `tune` shapes.
pub async fn start_workers(n: usize, tune: impl Fn(&mut WorkerProfile)) -> Vec<SimWorker> {
    let mut workers = Vec::new();
    for i in 0..n {
        let mut profile = WorkerProfile::new(format!("w{i}"));
        tune(&mut profile);
        workers.push(
            SimWorker::bind_loopback(profile)
                .await
                .expect("start worker"),
        );
    }
    workers
}

/// Polls `check` every 20 ms until it yields a value or `limit` passes.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The real proxy binary, serving a config on free ports; killed when dropped.
pub struct Proxy {
    child: Child,
    /// Proxy base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    /// Admin base URL.
    pub admin: String,
    _dir: tempfile::TempDir,
    /// The config file it serves.
    pub config_path: PathBuf,
    /// The `listen`/`admin` lines every rewrite of the file keeps.
    header: String,
}

impl Proxy {
    /// Starts `gpulb serve` with `body` (the config without `listen`/`admin`), waits until ready.
    pub async fn start(body: &str) -> Proxy {
        Proxy::start_with(body, "", &[]).await
    }

    /// Like [`Proxy::start`], with extra keys for the `admin` block and extra environment.
    pub async fn start_with(body: &str, admin_extra: &str, env: &[(&str, &str)]) -> Proxy {
        let proxy = Proxy::launch(body, admin_extra, env).await;
        proxy.wait_eligible().await;
        proxy
    }

    /// Waits until every backend may take traffic (its first health check passed).
    pub async fn wait_eligible(&self) {
        eventually(
            Duration::from_secs(15),
            "every backend eligible",
            || async {
                let status = self.status().await;
                let all = status["backends"]
                    .as_array()?
                    .iter()
                    .all(|b| b["eligible"] == true);
                all.then_some(())
            },
        )
        .await;
    }

    /// Starts `gpulb serve` and waits only until it listens (backends may not be checked yet).
    pub async fn launch(body: &str, admin_extra: &str, env: &[(&str, &str)]) -> Proxy {
        let (port, admin_port) = (free_port(), free_port());
        let dir = tempfile::tempdir().expect("tempdir");
        let config_path = dir.path().join("gpulb.yaml");
        let header = format!(
            "listen: 127.0.0.1:{port}\nadmin: {{listen: 127.0.0.1:{admin_port}{admin_extra}}}\n"
        );
        std::fs::write(&config_path, format!("{header}{body}")).expect("write config");
        let child = Command::new(env!("CARGO_BIN_EXE_gpulb"))
            .args(["serve", "--config"])
            .arg(&config_path)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn gpulb");
        let proxy = Proxy {
            child,
            url: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            _dir: dir,
            config_path,
            header,
        };
        let admin = proxy.admin.clone();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        eventually(Duration::from_secs(15), "gpulb to listen", || {
            let admin = admin.clone();
            async move {
                let up = tokio::net::TcpStream::connect(addr).await.is_ok();
                let status = reqwest::get(format!("{admin}/status")).await.ok()?;
                (up && status.status().is_success()).then_some(())
            }
        })
        .await;
        proxy
    }

    /// Replaces the config file the way editors do: write a temp file, rename it over.
    pub fn rewrite_config(&self, body: &str) {
        let tmp = self.config_path.with_extension("yaml.tmp");
        std::fs::write(&tmp, format!("{}{body}", self.header)).expect("write temp config");
        std::fs::rename(&tmp, &self.config_path).expect("rename config");
    }

    /// POSTs a completion request (see [`completion`]) through the proxy.
    pub async fn complete(
        &self,
        client: &reqwest::Client,
        max_tokens: u32,
        stream: bool,
    ) -> reqwest::Response {
        client
            .post(format!("{}/v1/completions", self.url))
            .body(completion(max_tokens, stream))
            .send()
            .await
            .expect("completion request")
    }

    /// The proxy's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The config generation in force.
    pub async fn generation(&self) -> u64 {
        self.status().await["generation"]
            .as_u64()
            .expect("generation")
    }

    /// `GET /status` of the admin listener.
    pub async fn status(&self) -> Value {
        reqwest::get(format!("{}/status", self.admin))
            .await
            .expect("status request")
            .json()
            .await
            .expect("status json")
    }

    /// Outstanding count of backend `name`.
    pub async fn outstanding(&self, name: &str) -> u64 {
        backend_field(&self.status().await, name, "outstanding")
    }

    /// Waits until every backend and class has nothing in flight.
    pub async fn wait_idle(&self) {
        eventually(
            Duration::from_secs(10),
            "all counts back to zero",
            || async {
                let status = self.status().await;
                let busy = status["backends"]
                    .as_array()?
                    .iter()
                    .chain(status["classes"].as_array()?)
                    .any(|b| b["outstanding"] != 0);
                (!busy).then_some(())
            },
        )
        .await;
    }
}

/// A numeric field of backend `name` in a status document.
pub fn backend_field(status: &Value, name: &str, field: &str) -> u64 {
    status["backends"]
        .as_array()
        .and_then(|bs| bs.iter().find(|b| b["name"] == name))
        .and_then(|b| b[field].as_u64())
        .unwrap_or_else(|| panic!("no backend {name} with {field} in {status}"))
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `backends:` YAML block for these workers (names w0..), with per-worker extra keys.
pub fn backends_yaml(workers: &[SimWorker], extra: impl Fn(usize) -> String) -> String {
    let mut yaml = String::from("backends:\n");
    for (i, w) in workers.iter().enumerate() {
        yaml.push_str(&format!(
            "  - {{name: {}, url: \"{}\"{}}}\n",
            w.name(),
            w.url(),
            extra(i)
        ));
    }
    yaml
}

/// A JSON completion request body.
pub fn completion(max_tokens: u32, stream: bool) -> String {
    format!(
        r#"{{"model":"sim","prompt":"hello world","max_tokens":{max_tokens},"stream":{stream}}}"#
    )
}

/// Which worker answered (the simulated worker's `x-sim-worker` header).
pub fn worker_of(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("x-sim-worker")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Like [`backends_yaml`], each worker with telemetry from its dcgm page and vLLM `/metrics`,
/// read every 100 ms, and fast health checks (100 ms, one failure marks it unhealthy).
pub fn telemetry_fleet_yaml(workers: &[SimWorker]) -> String {
    let urls: Vec<String> = workers.iter().map(SimWorker::url).collect();
    format!(
        "health_check: {{interval: 100ms, timeout: 200ms, fall: 1}}\n{}",
        backends_yaml(workers, |i| format!(
            ", telemetry: [{{kind: dcgm, url: \"{}/dcgm/metrics\", interval: 100ms}}, \
             {{kind: model_server, server: vllm, interval: 100ms}}]",
            urls[i]
        ))
    )
}
