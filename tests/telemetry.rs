//! Telemetry over HTTP: the poller against simulated workers, failures, and `gpulb agent`.

mod common;

use common::{eventually, free_port, Killed, STOP, WAIT};
use std::io::Read;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use gpulb::telemetry::nvml::DeviceReading;
use gpulb::telemetry::{
    poll, scrape, GpuReading, GpuSelector, OwnServer, PollTarget, ServerKind, SourceConfig,
    SourceKind, Telemetry, TelemetryError,
};
use gpulb::tools::agent::{self, GpuSource};
use gpulb::tools::sim::{SimWorker, WorkerProfile};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

fn source(kind: SourceKind) -> SourceConfig {
    SourceConfig {
        kind,
        interval: Duration::from_millis(20),
        timeout: Duration::from_millis(500),
    }
}

/// The proxy side a poller reads for: a settable in-flight count, and how often it was told
/// of a stored reading.
#[derive(Default)]
struct Proxied {
    in_flight: AtomicU32,
    stored: AtomicU64,
    /// Whether to ask for 20 ms reads.
    hurried: AtomicBool,
}

impl PollTarget for Proxied {
    fn own_in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }
    fn stored(&self) {
        self.stored.fetch_add(1, Ordering::Relaxed);
    }
    fn hurry(&self) -> Option<Duration> {
        self.hurried
            .load(Ordering::Relaxed)
            .then_some(Duration::from_millis(20))
    }
    fn hurry_check(&self) -> Option<Duration> {
        Some(Duration::from_millis(20))
    }
}

/// A running poller and what it writes to.
struct Poller {
    sink: Arc<ArcSwapOption<Telemetry>>,
    errors: Arc<AtomicU64>,
    proxied: Arc<Proxied>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn start_poll(sources: Vec<SourceConfig>, backend_url: String) -> Poller {
    let sink = Arc::new(ArcSwapOption::empty());
    let errors = Arc::new(AtomicU64::new(0));
    let proxied = Arc::new(Proxied::default());
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(poll(
        sources,
        OwnServer::at(&backend_url),
        None,
        sink.clone(),
        errors.clone(),
        proxied.clone(),
        stopped,
    ));
    Poller {
        sink,
        errors,
        proxied,
        stop,
        task,
    }
}

impl Poller {
    /// Waits (bounded) until the published telemetry satisfies `check`.
    async fn until(&self, what: &str, check: impl Fn(&Telemetry) -> bool) -> Arc<Telemetry> {
        eventually(WAIT, what, || {
            let published = self.sink.load_full().filter(|t| check(t));
            async move { published }
        })
        .await
    }

    /// Waits (bounded) until at least `n` scrapes have failed.
    async fn until_errors(&self, n: u64) {
        eventually(WAIT, &format!("{n} scrape errors counted"), || {
            let counted = self.errors.load(Ordering::Relaxed) >= n;
            async move { counted.then_some(()) }
        })
        .await;
    }

    /// Stops the loop and checks it ends promptly.
    async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(STOP, self.task)
            .await
            .expect("poll loop ends on shutdown")
            .expect("poll loop did not panic");
    }
}

/// A poller of `worker`'s vLLM `/metrics`, and its first reading.
async fn poll_vllm(worker: &SimWorker) -> (Poller, Arc<Telemetry>) {
    let sources = vec![source(SourceKind::ModelServer {
        server: ServerKind::Vllm,
        url: None,
    })];
    let poller = start_poll(sources, worker.url());
    let first = poller.until("a reading", |_| true).await;
    (poller, first)
}

fn gpu_memory(t: &Telemetry) -> Option<f64> {
    t.reading.max_memory_fraction()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_server_and_dcgm_sources_merge_and_follow_the_worker() {
    let worker = SimWorker::bind_loopback(WorkerProfile::new("w0"))
        .await
        .expect("worker");
    let sources = vec![
        source(SourceKind::ModelServer {
            server: ServerKind::Vllm,
            url: None,
        }),
        source(SourceKind::Dcgm {
            url: format!("{}/dcgm/metrics", worker.url()),
            gpus: vec![GpuSelector::Uuid(worker.gpu_uuid().to_string())],
        }),
    ];
    let poller = start_poll(sources, format!("{}/", worker.url()));
    let t = poller
        .until("both sources", |t| {
            t.reading.server.is_some() && !t.reading.gpus.is_empty()
        })
        .await;
    let server = t.reading.server.clone().expect("server load");
    assert_eq!(server.running, Some(0.0));
    assert_eq!(server.waiting, Some(0.0));
    assert_eq!(server.kv_cache_usage, Some(0.0));
    assert_eq!(t.reading.gpus.len(), 1);
    let gpu = &t.reading.gpus[0];
    assert_eq!(gpu.index, Some(0));
    assert_eq!(gpu.uuid.as_deref(), Some(worker.gpu_uuid()));
    assert_eq!(gpu.utilization, Some(0.0));
    assert_eq!(gpu.memory_total_bytes, Some(80 << 30));
    let idle = gpu_memory(&t).expect("memory known");
    assert!(
        (idle - 0.45).abs() < 1e-3,
        "idle GPU holds only the weights: {idle}"
    );

    worker.set_gpu_memory_override(Some(0.97));
    poller
        .until("memory override", |t| {
            gpu_memory(t).is_some_and(|f| f > 0.96)
        })
        .await;
    worker.set_gpu_memory_override(None);
    poller
        .until("override lifted", |t| {
            gpu_memory(t).is_some_and(|f| f < 0.5)
        })
        .await;
    assert_eq!(poller.errors.load(Ordering::Relaxed), 0);
    assert_eq!(worker.stats().received_total, 0, "telemetry is not load");
    assert!(worker.stats().control_total > 0);
    poller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_keeps_the_last_reading_ageing_and_counts_errors() {
    let worker = SimWorker::bind_loopback(WorkerProfile::new("w1"))
        .await
        .expect("worker");
    let (poller, first) = poll_vllm(&worker).await;
    worker.kill_and_wait().await;
    poller.until_errors(3).await;
    let kept = poller.sink.load_full().expect("last reading kept");
    assert_eq!(kept.reading, first.reading);
    let age = kept.taken_at.elapsed();
    // Time passing is the point: the kept reading ages (past the 50 ms freshness checked
    // below) while further reads fail.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let later = poller.sink.load_full().expect("still kept");
    assert_eq!(
        later.taken_at, kept.taken_at,
        "a failed read does not refresh the stamp"
    );
    assert!(later.taken_at.elapsed() > age);
    assert!(!gpulb::telemetry::is_fresh(
        &later,
        Duration::from_millis(50),
        Instant::now()
    ));
    poller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_server_reading_carries_what_this_proxy_had_in_flight_and_is_announced() {
    let worker = SimWorker::bind_loopback(WorkerProfile::new("w4"))
        .await
        .expect("worker");
    let (poller, first) = poll_vllm(&worker).await;
    let sample = first.server_sample.expect("a server reading has a sample");
    assert_eq!(sample.own_in_flight, 0);
    assert!(poller.proxied.stored.load(Ordering::Relaxed) >= 1);
    // Say this proxy has 3 in flight: the idle server then has nobody else's.
    poller.proxied.in_flight.store(3, Ordering::Relaxed);
    let later = poller
        .until("a reading taken with 3 of ours in flight", |t| {
            t.server_sample.is_some_and(|s| s.own_in_flight == 3)
        })
        .await;
    let now = Instant::now();
    assert_eq!(later.others_in_flight(WAIT, now), Some(0));
    poller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hurried_poller_reads_the_model_server_faster_than_its_interval() {
    let worker = SimWorker::bind_loopback(WorkerProfile::new("w5"))
        .await
        .expect("worker");
    let slow = SourceConfig {
        interval: Duration::from_secs(60),
        ..source(SourceKind::ModelServer {
            server: ServerKind::Vllm,
            url: None,
        })
    };
    let poller = start_poll(vec![slow], worker.url());
    poller.until("the first reading", |_| true).await;
    let first = poller.proxied.stored.load(Ordering::Relaxed);
    // Not hurried: the next read is a minute away.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(poller.proxied.stored.load(Ordering::Relaxed), first);
    // Hurried: every 20 ms.
    poller.proxied.hurried.store(true, Ordering::Relaxed);
    eventually(WAIT, "five hurried readings", || {
        let n = poller.proxied.stored.load(Ordering::Relaxed);
        async move { (n >= first + 5).then_some(()) }
    })
    .await;
    poller.stop().await;
}

#[tokio::test]
async fn poll_ends_when_its_shutdown_sender_is_dropped() {
    let worker = SimWorker::bind_loopback(WorkerProfile::new("w3"))
        .await
        .expect("worker");
    let (poller, _) = poll_vllm(&worker).await;
    drop(poller.stop);
    tokio::time::timeout(STOP, poller.task)
        .await
        .expect("poll loop ends")
        .expect("no panic");
}

#[tokio::test]
async fn scrape_errors_name_their_cause() {
    let worker = SimWorker::bind_loopback(WorkerProfile::new("w2"))
        .await
        .expect("worker");
    // Wrong path: HTTP status.
    let s = source(SourceKind::Dcgm {
        url: format!("{}/nope", worker.url()),
        gpus: vec![],
    });
    assert_eq!(
        scrape(&s, &OwnServer::at(""), None).await,
        Err(TelemetryError::Status {
            url: format!("{}/nope", worker.url()),
            status: 404
        })
    );
    // A GPU that is not there.
    let s = source(SourceKind::Dcgm {
        url: format!("{}/dcgm/metrics", worker.url()),
        gpus: vec![GpuSelector::Index(3)],
    });
    assert_eq!(
        scrape(&s, &OwnServer::at(""), None).await,
        Err(TelemetryError::GpuNotFound("3".into()))
    );
    // The wrong server kind: no series, not zeros.
    let s = source(SourceKind::ModelServer {
        server: ServerKind::Tgi,
        url: None,
    });
    let e = scrape(&s, &OwnServer::at(&worker.url()), None).await;
    assert!(matches!(e, Err(TelemetryError::NoSeries { .. })), "{e:?}");
    // A peer that accepts and never answers: the timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/metrics", silent.local_addr().expect("addr"));
    let s = SourceConfig {
        timeout: Duration::from_millis(100),
        ..source(SourceKind::Dcgm {
            url: url.clone(),
            gpus: vec![],
        })
    };
    let started = Instant::now();
    let e = scrape(&s, &OwnServer::at(""), None).await;
    assert!(matches!(e, Err(TelemetryError::Timeout { .. })), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // Nothing listening: an HTTP error.
    drop(silent);
    let e = scrape(&s, &OwnServer::at(""), None).await;
    assert!(
        matches!(
            e,
            Err(TelemetryError::Http { .. } | TelemetryError::Timeout { .. })
        ),
        "{e:?}"
    );
}

fn fake_gpu(index: u32, util: f64, used_mib: u64) -> DeviceReading {
    DeviceReading {
        reading: GpuReading {
            index: Some(index),
            uuid: Some(format!("GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd")),
            utilization: Some(util),
            memory_used_bytes: Some(used_mib << 20),
            memory_total_bytes: Some(81_559 << 20),
            temperature_celsius: Some(40.0 + f64::from(index)),
            power_watts: Some(123.456),
        },
        model_name: Some("NVIDIA H100 80GB HBM3".into()),
        pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + index)),
    }
}

async fn start_agent(
    source: Arc<dyn GpuSource>,
) -> (SocketAddr, watch::Sender<bool>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(agent::serve(listener, source, stopped));
    (addr, stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_page_reads_back_through_the_dcgm_source() {
    let gpus = vec![fake_gpu(0, 0.42, 1000), fake_gpu(1, 0.9, 70_000)];
    let served = gpus.clone();
    let (addr, stop, task) = start_agent(Arc::new(move || Ok(served.clone()))).await;
    let s = source(SourceKind::Dcgm {
        url: format!("http://{addr}/metrics"),
        gpus: vec![
            GpuSelector::Uuid("GPU-00000001-aaaa-bbbb-cccc-dddddddddddd".into()),
            GpuSelector::Index(0),
        ],
    });
    let reading = scrape(&s, &OwnServer::at(""), None)
        .await
        .expect("agent page parses as dcgm");
    let expected: Vec<GpuReading> = [&gpus[1], &gpus[0]]
        .iter()
        .map(|d| d.reading.clone())
        .collect();
    assert_eq!(reading.gpus, expected);
    let _ = stop.send(true);
    tokio::time::timeout(STOP, task)
        .await
        .expect("agent stops")
        .expect("no panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_without_gpus_answers_503_with_the_reason_and_no_values() {
    let source = || -> Result<Vec<DeviceReading>, TelemetryError> {
        Err(TelemetryError::NvmlUnavailable(
            "libnvidia-ml.so.1: cannot open".into(),
        ))
    };
    let (addr, stop, _task) = start_agent(Arc::new(source)).await;
    let resp = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("answers");
    assert_eq!(resp.status(), 503);
    let body = resp.text().await.expect("body");
    assert_eq!(
        body,
        "# gpulb agent: NVML unavailable: libnvidia-ml.so.1: cannot open\n"
    );
    let s = source_dcgm(addr);
    assert_eq!(
        scrape(&s, &OwnServer::at(""), None).await,
        Err(TelemetryError::Status {
            url: format!("http://{addr}/metrics"),
            status: 503
        })
    );
    let health = reqwest::get(format!("http://{addr}/health"))
        .await
        .expect("answers");
    assert_eq!(health.status(), 200);
    let _ = stop.send(true);
}

fn source_dcgm(addr: SocketAddr) -> SourceConfig {
    source(SourceKind::Dcgm {
        url: format!("http://{addr}/metrics"),
        gpus: vec![],
    })
}

#[test]
fn agent_refuses_a_taken_port_clearly() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let e = agent::run(agent::AgentOptions {
        listen: addr,
        gpus: vec![],
    })
    .expect_err("port is taken");
    assert!(
        e.to_string()
            .starts_with(&format!("cannot listen on {addr}:")),
        "{e}"
    );
}

/// The real binary on a host without a GPU driver: 503 with the reason, logged once.
#[test]
fn agent_binary_reports_missing_nvml_once() {
    if gpulb::telemetry::nvml::handle().is_ok() {
        return; // a GPU host: the fake-source tests above cover the format
    }
    let port = free_port();
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_gpulb"))
            .args([
                "agent",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--gpus",
                "0,GPU-x",
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpulb agent"),
    );
    let url = format!("http://127.0.0.1:{port}/metrics");
    let get = || async {
        let resp = reqwest::get(&url).await.ok()?;
        Some((
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        ))
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let bodies: Vec<(u16, String)> = rt.block_on(async {
        let first = eventually(WAIT, "the agent to answer", get).await;
        let second = eventually(WAIT, "the agent to answer again", get).await;
        vec![first, second]
    });
    child.stop();
    let mut log = String::new();
    if let Some(mut out) = child.0.stdout.take() {
        let _ = out.read_to_string(&mut log);
    }
    if let Some(mut err) = child.0.stderr.take() {
        let _ = err.read_to_string(&mut log);
    }
    for (status, body) in bodies {
        assert_eq!(status, 503);
        assert!(
            body.starts_with("# gpulb agent: NVML unavailable: "),
            "{body}"
        );
        assert_eq!(body.lines().count(), 1, "no values: {body}");
    }
    assert_eq!(
        log.matches("NVML unavailable").count(),
        1,
        "one log line:\n{log}"
    );
}

#[test]
fn agent_command_line() {
    use clap::Parser;
    use gpulb::cli::{Cli, Command as Cmd};
    let cli = Cli::try_parse_from(["gpulb", "agent", "--gpus", "0,GPU-x"]).expect("parses");
    match cli.command {
        Cmd::Agent { listen, gpus } => {
            assert_eq!(
                listen,
                "127.0.0.1:9400".parse::<SocketAddr>().expect("addr")
            );
            assert_eq!(
                gpus,
                [GpuSelector::Index(0), GpuSelector::Uuid("GPU-x".into())]
            );
        }
        other => panic!("parsed as {other:?}"),
    }
    let e = Cli::try_parse_from(["gpulb", "agent", "--gpus=1,-1"]).expect_err("negative index");
    assert!(e.to_string().contains("negative"), "{e}");
}

/// Serves `page` at any path to requests carrying `Authorization: <want>`, 401 to others, on
/// loopback, for as long as the returned task runs; its address.
async fn guarded_page(page: String, want: &'static str) -> (SocketAddr, JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let allowed = head.contains(&format!(
                "\r\nauthorization: {}\r\n",
                want.to_ascii_lowercase()
            ));
            let (status, body) = if allowed {
                ("200 OK", page.as_str())
            } else {
                ("401 Unauthorized", "")
            };
            let answer = format!(
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(answer.as_bytes()).await;
        }
    });
    (addr, task)
}

#[tokio::test]
async fn the_backends_key_goes_to_its_own_metrics_page_only() {
    let worker = SimWorker::bind_loopback(WorkerProfile::new("w9"))
        .await
        .expect("worker");
    let page = reqwest::get(format!("{}/metrics", worker.url()))
        .await
        .expect("sim metrics")
        .text()
        .await
        .expect("text");
    let (addr, server) = guarded_page(page, "Bearer sk-metrics").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("key");
    std::fs::write(&key, "sk-metrics").expect("key file");
    let auth = gpulb::config::BackendAuth {
        token_env: None,
        token_file: Some(key),
    };
    let own = OwnServer {
        url: format!("http://{addr}"),
        auth: Some(auth.credential().expect("credential")),
    };
    // The backend's own server page (no url of its own): read with the key.
    let model_server = source(SourceKind::ModelServer {
        server: ServerKind::Vllm,
        url: None,
    });
    let read = scrape(&model_server, &own, None).await;
    assert!(read.is_ok(), "{read:?}");
    // Without it, refused: the key is what opened it.
    let bare = scrape(&model_server, &OwnServer::at(&own.url), None).await;
    assert!(
        matches!(bare, Err(TelemetryError::Status { status: 401, .. })),
        "{bare:?}"
    );
    // A source at a URL of its own (here the same page) never gets the key.
    let elsewhere = source(SourceKind::ModelServer {
        server: ServerKind::Vllm,
        url: Some(format!("http://{addr}/metrics")),
    });
    let other = scrape(&elsewhere, &own, None).await;
    assert!(
        matches!(other, Err(TelemetryError::Status { status: 401, .. })),
        "{other:?}"
    );
    server.abort();
}
