//! Hostile clients beside the trace (`--abuse`): slowloris connections that drip a header line
//! every `--drip-ms` and never finish it (reconnecting when cut, as an attacker would), idle
//! keep-alive connections left open after one request, and uploads that announce 100 kB and
//! stall after 1 kB (sent again when answered). They start before the trace and run through
//! it; [`Abuse::finish`] says how many of them the target still held at the end.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How much abuse to send.
#[derive(Clone, Copy, Debug)]
pub struct AbuseSpec {
    /// Slowloris connections kept up.
    pub slowloris: usize,
    /// Idle keep-alive connections opened.
    pub idle: usize,
    /// Stalled uploads kept up.
    pub stalled: usize,
    /// Time between two header lines of a slowloris connection.
    pub drip: Duration,
}

/// What the abuse saw, counted by its tasks.
#[derive(Default)]
struct Counters {
    slowloris_open: AtomicI64,
    slowloris_cut: AtomicU64,
    idle_open: AtomicI64,
    idle_refused: AtomicU64,
    stalled_open: AtomicI64,
    stalled_answers: Mutex<BTreeMap<String, u64>>,
}

/// The abuse against one target, running on a runtime (and thread) of its own, so its
/// thousands of sockets do not slow the harness client that times the trace.
pub struct Abuse {
    runtime: Runtime,
    stop: watch::Sender<bool>,
    counters: Arc<Counters>,
    tasks: Vec<JoinHandle<()>>,
}

/// What the abuse found at the end of the trace.
#[derive(Clone, Debug, Default)]
pub struct AbuseReport {
    /// Slowloris connections open at the end, of `spec.slowloris`.
    pub slowloris_open: i64,
    /// Slowloris connections the target cut during the run.
    pub slowloris_cut: u64,
    /// Idle connections still open at the end.
    pub idle_open: i64,
    /// Idle connections refused or failed before their first answer.
    pub idle_refused: u64,
    /// Stalled uploads open at the end.
    pub stalled_open: i64,
    /// What stalled uploads were answered: status (or `closed`) -> count.
    pub stalled_answers: BTreeMap<String, u64>,
}

/// The idle connections' one request: gpulb answers it itself (no backend time is measured,
/// which would teach speed-aware placement before the trace); peers forward it.
const GET_MODELS: &[u8] = b"GET /v1/models HTTP/1.1\r\nhost: bench\r\n\r\n";

/// Waits until `stop` turns true.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Waits until the peer closes `socket` (or it fails); what arrived meanwhile is dropped.
async fn closed(socket: &mut TcpStream) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = socket.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

/// The status code of the first response in `socket`, or `closed`.
async fn status_of(socket: &mut TcpStream) -> String {
    let mut buf = [0u8; 256];
    match socket.read(&mut buf).await {
        Ok(n) if n >= 12 && buf.starts_with(b"HTTP/1.") => {
            String::from_utf8_lossy(&buf[9..12]).into_owned()
        }
        _ => "closed".to_string(),
    }
}

/// A gauge held up while a connection lives.
struct Held<'a>(&'a AtomicI64);

impl<'a> Held<'a> {
    fn new(gauge: &'a AtomicI64) -> Held<'a> {
        gauge.fetch_add(1, Ordering::Relaxed);
        Held(gauge)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn slowloris(
    to: SocketAddr,
    drip: Duration,
    c: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        if let Ok(mut socket) = TcpStream::connect(to).await {
            let _held = Held::new(&c.slowloris_open);
            let _ = socket
                .write_all(b"GET /health HTTP/1.1\r\nhost: bench\r\n")
                .await;
            let cut = async {
                loop {
                    tokio::select! {
                        () = closed(&mut socket) => return,
                        () = tokio::time::sleep(drip) => {}
                    }
                    if socket.write_all(b"x-slow: 1\r\n").await.is_err() {
                        return;
                    }
                }
            };
            tokio::select! {
                () = cut => { c.slowloris_cut.fetch_add(1, Ordering::Relaxed); }
                () = stopped(&mut stop) => return,
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn idle(to: SocketAddr, c: Arc<Counters>, mut stop: watch::Receiver<bool>) {
    let Ok(mut socket) = TcpStream::connect(to).await else {
        c.idle_refused.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if socket.write_all(GET_MODELS).await.is_err() || status_of(&mut socket).await != "200" {
        c.idle_refused.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let _held = Held::new(&c.idle_open);
    tokio::select! {
        () = closed(&mut socket) => {}
        () = stopped(&mut stop) => {}
    }
}

async fn stalled(to: SocketAddr, c: Arc<Counters>, mut stop: watch::Receiver<bool>) {
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n";
    let start = format!(
        "{head}{{\"model\":\"sim-model\",\"messages\":[{{\"role\":\"user\",\"content\":\"{}",
        "a".repeat(1000)
    );
    while !*stop.borrow() {
        if let Ok(mut socket) = TcpStream::connect(to).await {
            let _held = Held::new(&c.stalled_open);
            let _ = socket.write_all(start.as_bytes()).await;
            tokio::select! {
                status = status_of(&mut socket) => {
                    let mut answers = c.stalled_answers.lock().unwrap_or_else(|p| p.into_inner());
                    *answers.entry(status).or_default() += 1;
                }
                () = stopped(&mut stop) => return,
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Abuse {
    /// Starts the abuse against the proxy at `to` on its own one-thread runtime; the
    /// connections open over about a second. Call it outside any runtime.
    pub fn start(to: SocketAddr, spec: AbuseSpec) -> Result<Abuse, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-abuse")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the abuse runtime: {e}"))?;
        let (stop, watch) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let mut tasks = Vec::new();
        let total = spec.slowloris + spec.idle + spec.stalled;
        for i in 0..total {
            let (c, w) = (Arc::clone(&counters), watch.clone());
            // Spread the connects over a second so the accept queue is not the test.
            let delay = Duration::from_micros(1_000_000 * i as u64 / total.max(1) as u64);
            tasks.push(runtime.spawn(async move {
                tokio::time::sleep(delay).await;
                if i < spec.slowloris {
                    slowloris(to, spec.drip, c, w).await
                } else if i < spec.slowloris + spec.idle {
                    idle(to, c, w).await
                } else {
                    stalled(to, c, w).await
                }
            }));
        }
        Ok(Abuse {
            runtime,
            stop,
            counters,
            tasks,
        })
    }

    /// The abuse's figures now, then every connection closed (bounded). Call it outside any
    /// runtime.
    pub fn finish(self) -> AbuseReport {
        let c = &self.counters;
        let report = AbuseReport {
            slowloris_open: c.slowloris_open.load(Ordering::Relaxed),
            slowloris_cut: c.slowloris_cut.load(Ordering::Relaxed),
            idle_open: c.idle_open.load(Ordering::Relaxed),
            idle_refused: c.idle_refused.load(Ordering::Relaxed),
            stalled_open: c.stalled_open.load(Ordering::Relaxed),
            stalled_answers: c
                .stalled_answers
                .lock()
                .map(|a| a.clone())
                .unwrap_or_default(),
        };
        let _ = self.stop.send(true);
        let all = futures_util::future::join_all(self.tasks);
        let _ = self
            .runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), all).await });
        self.runtime.shutdown_timeout(Duration::from_secs(1));
        report
    }
}
