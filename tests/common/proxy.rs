//! The real `gpulb serve` process on free loopback ports, and waits on its `/status`.

use super::{eventually, free_port_pair, Killed, START_WAIT, WAIT};
use serde_json::Value;
use std::fmt::Display;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

/// Environment variable the admin token is passed in by [`Proxy::start_with_token`].
const TOKEN_ENV: &str = "GPULB_TEST_ADMIN_TOKEN";

/// The real proxy binary, serving a config on free ports; killed when dropped.
pub struct Proxy {
    child: Killed,
    /// Proxy base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    /// Admin base URL.
    pub admin: String,
    /// The client the request helpers share (one connection pool per test).
    pub client: reqwest::Client,
    _dir: tempfile::TempDir,
    /// The config file it serves.
    pub config_path: PathBuf,
    /// The `listen`/`admin` lines every rewrite of the file keeps.
    header: String,
}

impl Proxy {
    /// Starts `gpulb serve` with `body` (a [`Config`](super::Config), or raw YAML without
    /// `listen`/`admin`), waits until every backend is eligible.
    pub async fn start(body: impl Display) -> Proxy {
        let proxy = Proxy::spawn_with(body, "", &[]).await;
        proxy.wait_eligible().await;
        proxy
    }

    /// Like [`Proxy::start`], with admin requests needing the bearer token `token`.
    pub async fn start_with_token(body: impl Display, token: &str) -> Proxy {
        let admin_extra = format!(", token_env: {TOKEN_ENV}");
        let proxy = Proxy::spawn_with(body, &admin_extra, &[(TOKEN_ENV, token)]).await;
        proxy.wait_eligible().await;
        proxy
    }

    /// Like [`Proxy::start`], with these variables in the process's environment.
    pub async fn start_with_env(body: impl Display, env: &[(&str, &str)]) -> Proxy {
        let proxy = Proxy::spawn_with(body, "", env).await;
        proxy.wait_eligible().await;
        proxy
    }

    /// Starts `gpulb serve` and waits only until it listens (backends may not be checked yet).
    pub async fn launch(body: impl Display) -> Proxy {
        Proxy::spawn_with(body, "", &[]).await
    }

    async fn spawn_with(body: impl Display, admin_extra: &str, env: &[(&str, &str)]) -> Proxy {
        let (port, admin_port) = free_port_pair();
        let dir = tempfile::tempdir().expect("tempdir");
        let config_path = dir.path().join("gpulb.yaml");
        let header = format!(
            "listen: 127.0.0.1:{port}\nadmin: {{listen: 127.0.0.1:{admin_port}{admin_extra}}}\n"
        );
        std::fs::write(&config_path, format!("{header}{body}")).expect("write config");
        let stdout = std::fs::File::create(dir.path().join("stdout.log")).expect("stdout file");
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr file");
        let child = Command::new(env!("CARGO_BIN_EXE_gpulb"))
            .args(["serve", "--config"])
            .arg(&config_path)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn gpulb");
        let mut proxy = Proxy {
            child: Killed(child),
            url: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            client: reqwest::Client::new(),
            _dir: dir,
            config_path,
            header,
        };
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let status_url = format!("{}/status", proxy.admin);
        let child = &mut proxy.child.0;
        eventually(START_WAIT, "gpulb to listen", || {
            // A gpulb that refused its config has exited: say so now, not after START_WAIT (its
            // stderr, which says why, is printed as the panic drops the proxy).
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!("gpulb exited before it listened ({status})");
            }
            let status_url = status_url.clone();
            async move {
                let up = tokio::net::TcpStream::connect(addr).await.is_ok();
                let status = reqwest::get(status_url).await.ok()?;
                (up && status.status().is_success()).then_some(())
            }
        })
        .await;
        proxy
    }

    /// What the process wrote to stdout so far: its access log.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("stdout.log")).unwrap_or_default()
    }

    /// What the process wrote to stderr so far: its diagnostics (`RUST_LOG=warn`).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// The access-log records written so far (JSON, the default format), one object each.
    pub fn access_records(&self) -> Vec<Value> {
        self.stdout()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The first `n` access-log records, once that many are written (a record is written after
    /// its answer has gone, so it can trail the answer a client already holds).
    pub async fn first_access_records(&self, n: usize) -> Vec<Value> {
        eventually(WAIT, &format!("{n} access-log records"), || async {
            let records = self.access_records();
            (records.len() >= n).then(|| records[..n].to_vec())
        })
        .await
    }

    /// Replaces the config file the way editors do: write a temp file, rename it over.
    pub fn rewrite_config(&self, body: impl Display) {
        let tmp = self.config_path.with_extension("yaml.tmp");
        std::fs::write(&tmp, format!("{}{body}", self.header)).expect("write temp config");
        std::fs::rename(&tmp, &self.config_path).expect("rename config");
    }

    /// Sends the process Unix signal `signal` (`libc::SIGTERM`, ...).
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.pid()).expect("pid");
        // SAFETY: kill(2) on the child this test started and still owns.
        assert_eq!(
            unsafe { libc::kill(pid, signal) },
            0,
            "kill({pid}, {signal})"
        );
    }

    /// Waits (bounded by [`WAIT`]) until the process has exited; its exit status.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let child = &mut self.child.0;
        eventually(WAIT, "gpulb to exit", || {
            let exited = child.try_wait().expect("try_wait");
            async move { exited }
        })
        .await
    }

    /// The proxy's process id.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// `POST /reload` on the admin listener, with `token` as bearer token if given.
    pub async fn post_reload(&self, token: Option<&str>) -> reqwest::Response {
        let req = self.client.post(format!("{}/reload", self.admin));
        let req = match token {
            Some(token) => req.bearer_auth(token),
            None => req,
        };
        req.send().await.expect("reload request")
    }

    /// `GET /metrics` text of the admin listener.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.admin))
            .await
            .expect("metrics request")
            .text()
            .await
            .expect("metrics text")
    }

    /// The value of `series` on `/metrics` (0 when absent).
    pub async fn metric(&self, series: &str) -> f64 {
        metric(&self.metrics().await, series)
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

    /// The config generation in force.
    pub async fn generation(&self) -> u64 {
        self.status().await["generation"]
            .as_u64()
            .expect("generation")
    }

    /// Outstanding count of backend `name`.
    pub async fn outstanding(&self, name: &str) -> u64 {
        backend_field(&self.status().await, name, "outstanding")
    }

    /// Waits until `/status` shows a model list on every backend; the status then.
    pub async fn wait_models_known(&self) -> Value {
        self.wait_status("every backend's models known", |s| {
            let backends = s["backends"].as_array()?;
            backends
                .iter()
                .all(|b| b["models"].is_object())
                .then(|| s.clone())
        })
        .await
    }

    /// Polls `/status` until `check` yields a value (bounded by [`WAIT`]).
    pub async fn wait_status<T>(&self, what: &str, check: impl Fn(&Value) -> Option<T>) -> T {
        eventually(WAIT, what, || async { check(&self.status().await) }).await
    }

    /// Waits until every backend may take traffic (its first health check passed).
    pub async fn wait_eligible(&self) {
        self.wait_status("every backend eligible", |s| {
            let all = s["backends"]
                .as_array()?
                .iter()
                .all(|b| b["eligible"] == true);
            all.then_some(())
        })
        .await;
    }

    /// Waits until every backend and class has nothing in flight.
    pub async fn wait_idle(&self) {
        self.wait_status("all counts back to zero", |s| {
            let busy = s["backends"]
                .as_array()?
                .iter()
                .chain(s["classes"].as_array()?)
                .any(|b| b["outstanding"] != 0);
            (!busy).then_some(())
        })
        .await;
    }

    /// Waits until backend `name` has exactly `n` requests in flight.
    pub async fn wait_outstanding(&self, name: &str, n: u64) {
        self.wait_count("backends", name, "outstanding", n).await;
    }

    /// Waits until the backends together have exactly `n` requests in flight.
    pub async fn wait_total_outstanding(&self, n: u64) {
        let what = format!("{n} in flight on all backends together");
        self.wait_status(&what, |s| {
            let busy: u64 = s["backends"]
                .as_array()?
                .iter()
                .filter_map(|b| b["outstanding"].as_u64())
                .sum();
            (busy == n).then_some(())
        })
        .await;
    }

    /// Waits until class `class` has exactly `n` requests in its queue.
    pub async fn wait_queued(&self, class: &str, n: u64) {
        self.wait_count("classes", class, "queue_depth", n).await;
    }

    /// Waits until `field` of the entry `name` of status list `list` is `n`.
    async fn wait_count(&self, list: &str, name: &str, field: &str, n: u64) {
        let what = format!("{field} of {name} to be {n}");
        self.wait_status(&what, |s| {
            (named_field(s, list, name, field) == n).then_some(())
        })
        .await;
    }

    /// Waits until config generation `n` is in force.
    pub async fn wait_generation(&self, n: u64) {
        let what = format!("generation {n}");
        self.wait_status(&what, |s| (s["generation"] == n).then_some(()))
            .await;
    }
}

/// The value of `series` (name and labels, as Prometheus writes them) in a `/metrics` page; 0
/// when absent.
pub fn metric(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|line| {
            line.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// A numeric field of backend `name` in a status document.
pub fn backend_field(status: &Value, name: &str, field: &str) -> u64 {
    named_field(status, "backends", name, field)
}

/// A numeric field of class `name` in a status document.
pub fn class_field(status: &Value, name: &str, field: &str) -> u64 {
    named_field(status, "classes", name, field)
}

fn named_field(status: &Value, list: &str, name: &str, field: &str) -> u64 {
    status[list]
        .as_array()
        .and_then(|items| items.iter().find(|b| b["name"] == name))
        .and_then(|b| b[field].as_u64())
        .unwrap_or_else(|| panic!("no {list} entry {name} with {field} in {status}"))
}

impl Drop for Proxy {
    /// A test that fails shows what gpulb wrote to stderr (the test harness captures it with
    /// the test's own output); a passing test prints nothing.
    fn drop(&mut self) {
        if std::thread::panicking() {
            let stderr = self.stderr();
            if !stderr.is_empty() {
                eprintln!("gpulb's stderr:\n{stderr}");
            }
        }
    }
}
