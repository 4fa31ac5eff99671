//! Test harness: the real `gpulb` binary on free loopback ports, simulated workers, bounded waits.
#![allow(dead_code)]

use gpulb::sim::{SimWorker, WorkerProfile};
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
}

impl Proxy {
    /// Starts `gpulb serve` with `body` (the config without `listen`/`admin`), waits until ready.
    pub async fn start(body: &str) -> Proxy {
        let (port, admin_port) = (free_port(), free_port());
        let dir = tempfile::tempdir().expect("tempdir");
        let config_path = dir.path().join("gpulb.yaml");
        let yaml =
            format!("listen: 127.0.0.1:{port}\nadmin: {{listen: 127.0.0.1:{admin_port}}}\n{body}");
        std::fs::write(&config_path, yaml).expect("write config");
        let child = Command::new(env!("CARGO_BIN_EXE_gpulb"))
            .args(["serve", "--config"])
            .arg(&config_path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn gpulb");
        let proxy = Proxy {
            child,
            url: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            _dir: dir,
            config_path,
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
