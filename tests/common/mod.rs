//! Test support: the real `gpulb` binary on free loopback ports ([`Proxy`]), simulated workers,
//! typed configs ([`Config`]), request helpers ([`Req`], [`Answer`]) and the one set of bounded
//! waits every test uses.
// Each test file uses only part of this module.
#![allow(dead_code, unused_imports)]

mod config;
mod proxy;
mod raw;
mod recording;
mod requests;
mod tls;

pub use config::{Backend, Class, Config, Pool};
pub use proxy::{backend_field, class_field, metric, Proxy};
pub use raw::{canned_backend, json_post, message_len, Raw, RawAnswer};
pub use recording::{recording_backend, Received, ReceivedLog};
pub use requests::{completion, served_by, worker_of, Answer, Req};
pub use tls::{https_client, tls_connect, Issued, TestCa, TlsFront};

use gpulb::tools::sim::{SimWorker, WorkerProfile};
use std::future::Future;
use std::net::TcpListener;
use std::process::Child;
use std::time::{Duration, Instant};

/// Longest a test waits for a state it expects soon: a count reaching a value, a health or
/// reload change, a telemetry reading, the proxy listening. Spent only when something is wrong.
pub const WAIT: Duration = Duration::from_secs(15);
/// How long a started gpulb may take to listen: longer than [`WAIT`], since a first launch on a
/// loaded 2-core machine (the suite runs many tests at once) has been seen to pass 15 s.
pub const START_WAIT: Duration = Duration::from_secs(45);
/// Longest a background loop (poller, agent) may take to end once told to stop.
pub const STOP: Duration = Duration::from_secs(2);
/// Longest one headless-browser page dump may take, browser start included.
pub const PAGE_DUMP: Duration = Duration::from_secs(60);
/// How often [`eventually`] looks again.
pub const POLL: Duration = Duration::from_millis(20);

/// A free loopback port (bound and released; pingora needs a distinct port per listener).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// Two distinct free loopback ports, for a process's proxy and admin listeners: both are held
/// while the second is picked (two [`free_port`] calls may hand back the same port).
pub fn free_port_pair() -> (u16, u16) {
    let bind = || TcpListener::bind("127.0.0.1:0").expect("no free loopback port");
    let (first, second) = (bind(), bind());
    let port = |l: &TcpListener| l.local_addr().expect("bound port").port();
    (port(&first), port(&second))
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

/// `n` default workers and a proxy serving all of them (no pools or classes), ready.
pub async fn start_fleet(n: usize) -> (Vec<SimWorker>, Proxy) {
    let workers = start_workers(n, |_| {}).await;
    let proxy = Proxy::start(Config::fleet(&workers)).await;
    (workers, proxy)
}

/// Polls `check` every [`POLL`] until it yields a value or `limit` passes.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_or(limit, what, || {
        let attempt = check();
        async move { attempt.await.ok_or_else(String::new) }
    })
    .await
}

/// [`eventually`] for a check that says what it saw when it is not there yet: on timeout the
/// last of those reports is in the failure message.
pub async fn eventually_or<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        let seen = match check().await {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}{}{seen}",
            if seen.is_empty() { "" } else { "; last seen: " }
        );
        tokio::time::sleep(POLL).await;
    }
}

/// A child process that is killed and reaped when dropped, even when the test panics.
pub struct Killed(pub Child);

impl Killed {
    /// Kills and reaps it now; its piped output can still be read from `self.0`.
    pub fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `gpulb check` on `yaml`: whether it passed, its stdout and its stderr.
pub fn gpulb_check(yaml: &str) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpulb"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}
