//! Routing-quality benchmark: gpulb against round-robin and least-connections peers (nginx and
//! HAProxy from the distribution) in front of the same uneven simulated GPU fleet, each sent the
//! identical open-loop trace of streaming interactive and long bulk requests.
//!
//! ```text
//! cargo build --release --bin gpulb --examples
//! target/release/examples/bench_routing                 # defaults: seed 1, 30 s trace, 5 targets
//! target/release/examples/bench_routing --seed 2 --targets gpulb,haproxy-lc
//! target/release/examples/bench_routing --help          # every knob
//! ```
//! or `examples/bench_routing.sh` (build + run over several seeds).
//!
//! What it does, in one process:
//! 1. starts `--workers` simulated GPU workers (`gpulb::tools::sim`) on loopback, uneven like the demo
//!    fleet (`gpulb::tools::demo::demo_profile`: gpu1 half speed, gpu2 half the KV budget), with
//!    timings slowed down (`--decode-ms` ...) so the fleet, not this harness, is the bottleneck;
//! 2. generates the trace from `--seed`: Poisson arrivals of interactive (streaming chat,
//!    `x-priority: interactive`, three tenants 6:3:1) and bulk (long non-streaming completions)
//!    requests, both rates multiplied by `--burst-factor` inside burst windows;
//! 3. for each target in turn: writes its config into the run directory, starts it as a child
//!    process (own process group, killed by a guard on every exit path), waits until it answers
//!    and the fleet is idle, replays the trace open loop (one task per request, launched at its
//!    scheduled time whatever earlier requests are doing), then stops it;
//! 4. prints markdown tables (per target and class: TTFT and end-to-end p50/p99, completed/s,
//!    tokens/s, errors, sheds; routing and harness diagnostics) and writes them, the configs,
//!    per-request CSVs and gpulb's sampled `/status` into the run directory.
//!
//! Definitions. Times are measured from each request's *scheduled* send time. TTFT: streaming,
//! the first SSE `data:` event carrying a token; non-streaming, the response headers (the sim
//! answers after generating every token, so bulk TTFT is about its end-to-end time). E2E: the
//! last body byte. ok: HTTP 200 with every requested token; shed: 429 or 503; error: anything
//! else (other status, transport error, short answer, client timeout, unfinished at the drain
//! limit). Percentiles (nearest rank) are over ok requests only. completed/s and tokens/s: ok
//! requests and their tokens divided by the class's span, trace start to its last completion.

mod client;
mod pooled;
mod procs;
mod report;
mod targets;
mod trace;

use clap::Parser;
use gpulb::tools::sim::{SimWorker, WorkerProfile};
use procs::{ChildGuard, SelfCpu};
use report::TargetRun;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use targets::{GpulbKnobs, Target};
use tokio::time::Instant;
use trace::{Class, Req, TraceSpec};

#[derive(Parser, Debug, Clone)]
#[command(
    about = "Routing-quality benchmark: gpulb vs nginx/HAProxy on a simulated uneven GPU fleet"
)]
struct Args {
    /// Seed of the trace (arrivals, tenants, sizes).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Length of the arrival window, seconds (the run then drains).
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Base arrival rate of interactive requests, per second.
    #[arg(long, default_value_t = 6.0)]
    interactive_rps: f64,
    /// Base arrival rate of bulk requests, per second.
    #[arg(long, default_value_t = 0.9)]
    bulk_rps: f64,
    /// Both rates are multiplied by this inside a burst window (unless set per class below).
    #[arg(long, default_value_t = 3.0)]
    burst_factor: f64,
    /// Interactive rate multiplier inside a burst window (default: --burst-factor).
    #[arg(long)]
    interactive_burst: Option<f64>,
    /// Bulk rate multiplier inside a burst window (default: --burst-factor).
    #[arg(long)]
    bulk_burst: Option<f64>,
    /// Start of the first burst window, seconds.
    #[arg(long, default_value_t = 5.0)]
    burst_start: f64,
    /// A burst window starts every this many seconds.
    #[arg(long, default_value_t = 15.0)]
    burst_every: f64,
    /// Length of each burst window, seconds (0: no bursts).
    #[arg(long, default_value_t = 4.0)]
    burst_len: f64,
    /// Interactive max_tokens range, `LO-HI`.
    #[arg(long, default_value = "16-64", value_parser = range_u32)]
    interactive_tokens: (u32, u32),
    /// Interactive prompt length range in characters (4 characters = 1 sim token).
    #[arg(long, default_value = "200-1200", value_parser = range_usize)]
    interactive_prompt: (usize, usize),
    /// Bulk max_tokens range.
    #[arg(long, default_value = "128-384", value_parser = range_u32)]
    bulk_tokens: (u32, u32),
    /// Bulk prompt length range in characters.
    #[arg(long, default_value = "2000-6000", value_parser = range_usize)]
    bulk_prompt: (usize, usize),

    /// Simulated workers (uneven as in `gpulb demo`: every 4th+1 half speed, 4th+2 half KV).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Decode step with one running sequence, ms (x2 on the half-speed worker).
    #[arg(long, default_value_t = 20.0)]
    decode_ms: f64,
    /// Added to the step per extra running sequence, µs.
    #[arg(long, default_value_t = 1000.0)]
    step_per_running_us: f64,
    /// Prefill cost per prompt token, µs (x2 on the half-speed worker).
    #[arg(long, default_value_t = 20.0)]
    prefill_us: f64,
    /// Sequences a worker runs at once.
    #[arg(long, default_value_t = 8)]
    max_running: usize,
    /// KV budget per worker in tokens (prompt + max_tokens of running sequences; half on gpu2).
    #[arg(long, default_value_t = 16384)]
    kv_tokens: usize,

    /// Targets, in run order: gpulb, nginx-rr, nginx-lc, haproxy-rr, haproxy-lc, haproxy-prio.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "gpulb,nginx-rr,nginx-lc,haproxy-rr,haproxy-lc"
    )]
    targets: Vec<String>,
    /// Per-worker weights, comma-separated, given to every target alike (gpulb `weight`, nginx
    /// `weight=`, HAProxy `weight`); default: none (all equal).
    #[arg(long, value_delimiter = ',')]
    weights: Vec<u32>,
    /// Worker threads of every proxy (gpulb threads = nginx worker_processes = HAProxy nbthread).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Tokio worker threads of the harness client (the fleet gets its own runtime, 1 thread).
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// The gpulb binary (default: next to this example, target/release/gpulb).
    #[arg(long)]
    gpulb_bin: Option<PathBuf>,
    /// gpulb backends' max_outstanding (default: --max-running).
    #[arg(long)]
    gpulb_max_outstanding: Option<usize>,
    /// gpulb bulk class backend_share.
    #[arg(long, default_value_t = 0.75)]
    bulk_share: f64,
    /// gpulb bulk class placement (least_loaded, speed_weighted, earliest_finish).
    #[arg(long, default_value = "earliest_finish")]
    bulk_placement: String,
    /// gpulb interactive class placement (least_loaded, speed_weighted, earliest_finish).
    #[arg(long, default_value = "speed_weighted")]
    interactive_placement: String,
    /// gpulb interactive queue max_wait.
    #[arg(long, default_value = "10s")]
    interactive_max_wait: String,
    /// gpulb bulk queue max_wait.
    #[arg(long, default_value = "120s")]
    bulk_max_wait: String,
    /// gpulb model-server telemetry interval.
    #[arg(long, default_value = "200ms")]
    telemetry_interval: String,
    /// gpulb pool guard max_server_queue (negative: no guard). Off by default: a request counts
    /// as waiting in the worker until its next step boundary, so 0 trips on healthy workers.
    #[arg(long, default_value_t = -1.0, allow_hyphen_values = true)]
    max_server_queue: f64,
    /// gpulb interactive class guard max_server_queue (negative: none).
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true)]
    interactive_guard_queue: f64,
    /// gpulb interactive class guard max_kv_cache, beside max_server_queue (negative: none).
    #[arg(long, default_value_t = 0.9, allow_hyphen_values = true)]
    interactive_guard_kv: f64,
    /// gpulb bulk class guard max_kv_cache (negative: none).
    #[arg(long, default_value_t = 0.75, allow_hyphen_values = true)]
    bulk_guard_kv: f64,
    /// Turn gpulb's access log on (written to DIR/seed-N/gpulb.log; off by default for parity).
    #[arg(long)]
    gpulb_access_log: bool,
    /// Use this gpulb config instead of the generated one; {LISTEN} {ADMIN} {THREADS} {URL0}..
    /// are replaced.
    #[arg(long)]
    gpulb_config: Option<PathBuf>,
    /// haproxy-prio: maxconn per server (default: --max-running).
    #[arg(long)]
    prio_maxconn: Option<usize>,

    /// Most requests the harness keeps in flight (protects the machine; hits are reported).
    #[arg(long, default_value_t = 4000)]
    max_inflight: usize,
    /// Client timeout per request, seconds.
    #[arg(long, default_value_t = 120.0)]
    request_timeout: f64,
    /// Longest wait after the arrival window for the last responses, seconds.
    #[arg(long, default_value_t = 90.0)]
    drain: f64,
    /// Run directory root; results go to DIR/seed-N/.
    #[arg(long, default_value = "target/bench_routing")]
    out_dir: PathBuf,
    /// Runs nothing: prints the figures and the target verdict pooled over every `seed-N/` run
    /// under this directory (a scenario's --out-dir), read from their per-request CSVs.
    #[arg(long)]
    pooled: Option<PathBuf>,
}

fn parse_range<T: std::str::FromStr + PartialOrd>(s: &str) -> Result<(T, T), String> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let a: T = a.trim().parse().map_err(|_| format!("bad range {s:?}"))?;
    let b: T = b.trim().parse().map_err(|_| format!("bad range {s:?}"))?;
    if a > b {
        return Err(format!("range {s:?} is backwards"));
    }
    Ok((a, b))
}
fn range_u32(s: &str) -> Result<(u32, u32), String> {
    parse_range(s)
}
fn range_usize(s: &str) -> Result<(usize, usize), String> {
    parse_range(s)
}

/// Worker `i`: the demo fleet's unevenness (relative to `WorkerProfile::new`) applied to the
/// benchmark's slower base timings.
fn profile(i: usize, a: &Args) -> WorkerProfile {
    let demo = gpulb::tools::demo::demo_profile(i);
    let base = WorkerProfile::new("base");
    let speed = demo.decode_step.as_secs_f64() / base.decode_step.as_secs_f64();
    let prefill = demo.prefill_per_token.as_secs_f64() / base.prefill_per_token.as_secs_f64();
    let kv = demo.kv_budget_tokens as f64 / base.kv_budget_tokens as f64;
    let mut p = demo.clone();
    p.decode_step = Duration::from_secs_f64(a.decode_ms / 1000.0 * speed);
    p.step_per_running = Duration::from_secs_f64(a.step_per_running_us / 1e6 * speed);
    p.prefill_per_token = Duration::from_secs_f64(a.prefill_us / 1e6 * prefill);
    p.max_running = a.max_running;
    p.kv_budget_tokens = (a.kv_tokens as f64 * kv) as usize;
    p.gpu_index = i as u32;
    p
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn command_line(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|e| format!("unavailable ({e})"))
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), load average at start {load}")
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Waits until the target answers a tiny completion (and, for gpulb, sees every worker healthy
/// with telemetry), bounded.
async fn wait_ready(
    child: &mut ChildGuard,
    base: &str,
    admin: Option<&str>,
    workers: usize,
    log: &Path,
) -> Result<(), String> {
    let client = client::client(Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut oks = 0;
    loop {
        if let Some(how) = child.exited() {
            return Err(format!(
                "{} exited ({how}); log tail:\n{}",
                child.name,
                tail(log)
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} not ready after 20 s; log tail:\n{}",
                child.name,
                tail(log)
            ));
        }
        let answered = client
            .post(format!("{base}/v1/completions"))
            .header("content-type", "application/json")
            .body(r#"{"model":"sim","prompt":"ready?","max_tokens":1}"#)
            .send()
            .await
            .map(|r| r.status().as_u16() == 200)
            .unwrap_or(false);
        oks = if answered { oks + 1 } else { 0 };
        let status_ok = match admin {
            None => true,
            Some(a) => match client.get(format!("{a}/status")).send().await {
                Ok(r) => r
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|v| v["backends"].as_array().cloned())
                    .is_some_and(|b| {
                        b.len() == workers
                            && b.iter().all(|b| {
                                b["eligible"].as_bool() == Some(true)
                                    && !b["telemetry"]["server"].is_null()
                            })
                    }),
                Err(_) => false,
            },
        };
        if oks >= 3 && status_ok {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (bounded) until no worker runs or queues anything.
async fn wait_fleet_idle(fleet: &[SimWorker]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if fleet.iter().all(|w| {
            let s = w.stats();
            s.running == 0 && s.waiting == 0
        }) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

struct Replay {
    outcomes: Vec<client::Outcome>,
    unfinished: usize,
    max_inflight: usize,
    cap_hits: usize,
    sim_max_waiting: Vec<usize>,
    sim_mean_running: Vec<f64>,
    gpulb_max_queue: BTreeMap<String, usize>,
}

/// Replays the trace against `base`, open loop, with the samplers running alongside.
async fn replay(
    a: &Args,
    base: &str,
    admin: Option<String>,
    status_log: PathBuf,
    trace: Arc<Vec<Req>>,
    bodies: Arc<Vec<String>>,
    fleet: Arc<Vec<SimWorker>>,
) -> Replay {
    let client = client::client(Duration::from_secs_f64(a.request_timeout));
    let t0 = Instant::now() + Duration::from_millis(300);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    // Sampler: the workers' own queues (every 100 ms, during the arrival window and drain).
    let sim_sampler = {
        let fleet = fleet.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let n = fleet.len();
            let (mut max_wait, mut sum_run, mut samples) = (vec![0usize; n], vec![0f64; n], 0u64);
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => break,
                }
                samples += 1;
                for (i, w) in fleet.iter().enumerate() {
                    let s = w.stats();
                    max_wait[i] = max_wait[i].max(s.waiting);
                    sum_run[i] += s.running as f64;
                }
            }
            let mean = sum_run
                .iter()
                .map(|s| s / samples.max(1) as f64)
                .collect::<Vec<_>>();
            (max_wait, mean)
        })
    };
    // Sampler: gpulb's /status (every 500 ms), kept as JSON lines for later reading.
    let status_sampler = admin.map(|admin| {
        let mut stop = stop_rx.clone();
        let client = client::client(Duration::from_secs(2));
        tokio::spawn(async move {
            let mut max_q: BTreeMap<String, usize> = BTreeMap::new();
            let mut lines = String::new();
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => break,
                }
                let Ok(resp) = client.get(format!("{admin}/status")).send().await else {
                    continue;
                };
                let Ok(v) = resp.json::<serde_json::Value>().await else {
                    continue;
                };
                for c in v["classes"].as_array().into_iter().flatten() {
                    let name = c["name"].as_str().unwrap_or("?").to_string();
                    let depth = c["queue_depth"].as_u64().unwrap_or(0) as usize;
                    let e = max_q.entry(name).or_default();
                    *e = (*e).max(depth);
                }
                let t = Instant::now().saturating_duration_since(t0).as_secs_f64();
                let _ = writeln!(lines, "{{\"t\":{t:.2},\"status\":{v}}}");
            }
            let _ = std::fs::write(&status_log, lines);
            max_q
        })
    });

    let sem = Arc::new(tokio::sync::Semaphore::new(a.max_inflight.max(1)));
    let inflight = Arc::new(AtomicUsize::new(0));
    let max_inflight = Arc::new(AtomicUsize::new(0));
    let cap_hits = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for index in 0..trace.len() {
        let (client, base, trace, bodies) = (
            client.clone(),
            base.to_string(),
            trace.clone(),
            bodies.clone(),
        );
        let (sem, inflight, max_inflight, cap_hits) = (
            sem.clone(),
            inflight.clone(),
            max_inflight.clone(),
            cap_hits.clone(),
        );
        set.spawn(async move {
            let req = &trace[index];
            let scheduled = t0 + Duration::from_secs_f64(req.at);
            tokio::time::sleep_until(scheduled).await;
            let _permit = match sem.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    cap_hits.fetch_add(1, Ordering::Relaxed);
                    sem.acquire_owned().await.expect("semaphore open")
                }
            };
            let now = inflight.fetch_add(1, Ordering::Relaxed) + 1;
            max_inflight.fetch_max(now, Ordering::Relaxed);
            let out =
                client::send(&client, &base, index, req, bodies[index].clone(), scheduled).await;
            inflight.fetch_sub(1, Ordering::Relaxed);
            out
        });
    }
    let deadline = t0 + Duration::from_secs_f64(a.duration + a.drain);
    let mut outcomes = Vec::with_capacity(trace.len());
    loop {
        match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(Some(Ok(o))) => outcomes.push(o),
            Ok(Some(Err(e))) => eprintln!("[bench] request task failed: {e}"),
            Ok(None) => break,
            Err(_) => {
                set.abort_all();
                while set.join_next().await.is_some() {}
                break;
            }
        }
    }
    // Requests without an outcome (drain limit, or a failed task) count as errors.
    let seen: HashSet<usize> = outcomes.iter().map(|o| o.index).collect();
    let mut unfinished = 0;
    for (index, req) in trace.iter().enumerate() {
        if !seen.contains(&index) {
            unfinished += 1;
            outcomes.push(client::Outcome {
                index,
                class: req.class,
                tenant: req.tenant,
                at: req.at,
                status: client::Status::Error("unfinished at the drain limit".into()),
                ttft: None,
                e2e: a.duration + a.drain - req.at,
                tokens: 0,
                worker: None,
                lateness: 0.0,
            });
        }
    }
    outcomes.sort_by_key(|o| o.index);
    let _ = stop_tx.send(true);
    let (sim_max_waiting, sim_mean_running) = sim_sampler.await.unwrap_or_default();
    let gpulb_max_queue = match status_sampler {
        Some(h) => h.await.unwrap_or_default(),
        None => BTreeMap::new(),
    };
    Replay {
        outcomes,
        unfinished,
        max_inflight: max_inflight.load(Ordering::Relaxed),
        cap_hits: cap_hits.load(Ordering::Relaxed),
        sim_max_waiting,
        sim_mean_running,
        gpulb_max_queue,
    }
}

fn default_gpulb_bin() -> PathBuf {
    if let Some(p) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(|d| d.join("gpulb")))
        .filter(|p| p.exists())
    {
        return p;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/gpulb")
}

fn main() {
    let args = Args::parse();
    let result = match &args.pooled {
        Some(dir) => pooled::report(dir).map(|md| println!("{md}")),
        None => run(args),
    };
    if let Err(e) = result {
        eprintln!("[bench] error: {e}");
        procs::kill_all_live();
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<(), String> {
    let targets: Vec<Target> = a
        .targets
        .iter()
        .map(|t| Target::parse(t))
        .collect::<Result<_, _>>()?;
    if a.workers == 0 || a.duration <= 0.0 {
        return Err("--workers and --duration must be > 0".into());
    }
    if !a.weights.is_empty() && (a.weights.len() != a.workers || a.weights.contains(&0)) {
        return Err(format!("--weights needs {} values, each >= 1", a.workers));
    }
    let gpulb_bin = a.gpulb_bin.clone().unwrap_or_else(default_gpulb_bin);
    if targets.contains(&Target::Gpulb) && !gpulb_bin.exists() {
        return Err(format!(
            "{} not found: run `cargo build --release --bin gpulb --examples` first",
            gpulb_bin.display()
        ));
    }
    let dir = a.out_dir.join(format!("seed-{}", a.seed));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let dir = dir.canonicalize().map_err(|e| e.to_string())?;
    // nginx workers may run as another user: let them into the run directory.
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
    }

    let spec = TraceSpec {
        seed: a.seed,
        duration: a.duration,
        interactive_rps: a.interactive_rps,
        bulk_rps: a.bulk_rps,
        interactive_burst: a.interactive_burst.unwrap_or(a.burst_factor),
        bulk_burst: a.bulk_burst.unwrap_or(a.burst_factor),
        burst_start: a.burst_start,
        burst_every: a.burst_every,
        burst_len: a.burst_len,
        interactive_max_tokens: a.interactive_tokens,
        interactive_prompt_chars: a.interactive_prompt,
        bulk_max_tokens: a.bulk_tokens,
        bulk_prompt_chars: a.bulk_prompt,
    };
    let trace = Arc::new(trace::generate(&spec));
    let bodies = Arc::new(trace.iter().map(client::body).collect::<Vec<_>>());
    let profiles: Vec<WorkerProfile> = (0..a.workers).map(|i| profile(i, &a)).collect();

    // Header: machine, command, fleet, trace.
    let mut head = String::new();
    let invocation: Vec<String> = std::env::args().collect();
    let _ = writeln!(head, "- command: `{}`", invocation.join(" "));
    let _ = writeln!(head, "- machine: {}", machine());
    let _ = writeln!(
        head,
        "- peers: {}; {}; gpulb: {} (git {})",
        command_line("nginx", &["-v"]),
        command_line("haproxy", &["-v"]),
        gpulb_bin.display(),
        command_line("git", &["describe", "--always", "--dirty"]),
    );
    let _ = writeln!(
        head,
        "- every proxy: {} worker thread(s)/process(es), logs off, backend weights {}; harness client: {} tokio thread(s); fleet: its own 1-thread runtime in the harness process",
        a.threads,
        if a.weights.is_empty() {
            "all equal".to_string()
        } else {
            a.weights.iter().map(ToString::to_string).collect::<Vec<_>>().join("/")
        },
        a.client_threads
    );
    let _ = writeln!(head, "- fleet ({} simulated workers):", a.workers);
    for p in &profiles {
        let _ = writeln!(
            head,
            "  - {}: decode step {:.0} ms + {:.1} ms per extra running sequence, prefill {:.0} µs/token, max_running {}, KV budget {} tokens",
            p.name,
            p.decode_step.as_secs_f64() * 1e3,
            p.step_per_running.as_secs_f64() * 1e3,
            p.prefill_per_token.as_secs_f64() * 1e6,
            p.max_running,
            p.kv_budget_tokens
        );
    }
    let capacity: f64 = profiles
        .iter()
        .map(|p| {
            let step =
                p.decode_step + p.step_per_running * (p.max_running.saturating_sub(1)) as u32;
            p.max_running as f64 / step.as_secs_f64()
        })
        .sum();
    let count = |c: Class| trace.iter().filter(|r| r.class == c).count();
    let tokens = |c: Class| {
        trace
            .iter()
            .filter(|r| r.class == c)
            .map(|r| u64::from(r.max_tokens))
            .sum::<u64>()
    };
    let avg = |lo: u32, hi: u32| f64::from(lo + hi) / 2.0;
    let interactive_load = a.interactive_rps * avg(a.interactive_tokens.0, a.interactive_tokens.1);
    let bulk_load = a.bulk_rps * avg(a.bulk_tokens.0, a.bulk_tokens.1);
    let base_load = interactive_load + bulk_load;
    let burst_load = interactive_load * spec.interactive_burst + bulk_load * spec.bulk_burst;
    let _ = writeln!(
        head,
        "- trace: seed {}, {} s of arrivals; interactive {} requests (Poisson {}/s; streaming chat, max_tokens {}-{}, prompt {}-{} chars, tenants a:b:c = 6:3:1), bulk {} requests (Poisson {}/s; non-streaming, max_tokens {}-{}, prompt {}-{} chars, tenants x:y = 3:1); bursts (interactive x{}, bulk x{}) at {} s",
        a.seed,
        a.duration,
        count(Class::Interactive),
        a.interactive_rps,
        a.interactive_tokens.0,
        a.interactive_tokens.1,
        a.interactive_prompt.0,
        a.interactive_prompt.1,
        count(Class::Bulk),
        a.bulk_rps,
        a.bulk_tokens.0,
        a.bulk_tokens.1,
        a.bulk_prompt.0,
        a.bulk_prompt.1,
        spec.interactive_burst,
        spec.bulk_burst,
        spec.burst_windows()
            .iter()
            .map(|(s, e)| format!("{s:.0}-{e:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let _ = writeln!(
        head,
        "- offered decode load: {:.0} tokens/s at base rates, {:.0} tokens/s in bursts, {} tokens in all; fleet decode capacity with full batches about {:.0} tokens/s (ignores prefill and KV limits)",
        base_load,
        burst_load,
        tokens(Class::Interactive) + tokens(Class::Bulk),
        capacity
    );
    eprint!("{head}");

    // Runtimes: the fleet on its own thread so the harness client cannot starve it.
    let sim_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-sim")
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.client_threads.max(1))
        .thread_name("bench-client")
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let fleet: Arc<Vec<SimWorker>> = Arc::new(
        sim_rt
            .block_on(async {
                let mut v = Vec::new();
                for p in &profiles {
                    v.push(SimWorker::bind_loopback(p.clone()).await?);
                }
                Ok::<_, std::io::Error>(v)
            })
            .map_err(|e| format!("cannot start the fleet: {e}"))?,
    );
    let worker_addrs: Vec<String> = fleet.iter().map(|w| w.addr().to_string()).collect();

    // Ctrl-C / SIGTERM: kill every child group, then exit.
    client_rt.spawn(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        eprintln!("[bench] interrupted: stopping the proxies");
        procs::kill_all_live();
        std::process::exit(130);
    });

    let knobs = GpulbKnobs {
        max_outstanding: a.gpulb_max_outstanding.unwrap_or(a.max_running),
        bulk_share: a.bulk_share,
        bulk_placement: a.bulk_placement.clone(),
        interactive_placement: a.interactive_placement.clone(),
        interactive_max_wait: a.interactive_max_wait.clone(),
        bulk_max_wait: a.bulk_max_wait.clone(),
        telemetry_interval: a.telemetry_interval.clone(),
        max_server_queue: a.max_server_queue,
        interactive_guard_queue: a.interactive_guard_queue,
        interactive_guard_kv: a.interactive_guard_kv,
        bulk_guard_kv: a.bulk_guard_kv,
        access_log: a.gpulb_access_log,
        template: a.gpulb_config.clone(),
    };
    let mut runs: Vec<TargetRun> = Vec::new();
    let mut configs: Vec<(String, PathBuf)> = Vec::new();
    for target in &targets {
        let name = target.name();
        let listen_port = free_port().map_err(|e| e.to_string())?;
        let admin_port = free_port().map_err(|e| e.to_string())?;
        let setup = targets::Setup {
            dir: &dir,
            listen_port,
            admin_port,
            workers: &worker_addrs,
            threads: a.threads,
            gpulb: &knobs,
            prio_maxconn: a.prio_maxconn.unwrap_or(a.max_running),
            weights: (!a.weights.is_empty()).then_some(&a.weights[..]),
        };
        let (mut child, config_path) = targets::start(*target, &setup, &gpulb_bin)?;
        configs.push((name.to_string(), config_path));
        let base = format!("http://127.0.0.1:{listen_port}");
        let admin = (*target == Target::Gpulb).then(|| format!("http://127.0.0.1:{admin_port}"));
        let log = dir.join(format!("{name}.log"));
        eprintln!(
            "[bench] {name}: starting (pid {}), config {}",
            child.pid(),
            dir.display()
        );
        client_rt.block_on(wait_ready(
            &mut child,
            &base,
            admin.as_deref(),
            a.workers,
            &log,
        ))?;
        if !client_rt.block_on(wait_fleet_idle(&fleet)) {
            eprintln!("[bench] warning: the fleet was still busy after 60 s before {name}");
        }
        let cpu_before = SelfCpu::read();
        let proxy_before = procs::group_cpu(child.pid());
        eprintln!("[bench] {name}: replaying {} requests", trace.len());
        let r = client_rt.block_on(replay(
            &a,
            &base,
            admin,
            dir.join(format!("{name}-status.jsonl")),
            trace.clone(),
            bodies.clone(),
            fleet.clone(),
        ));
        let proxy_cpu = procs::group_cpu(child.pid()) - proxy_before;
        let self_cpu = SelfCpu::read().since(cpu_before);
        if let Some(how) = child.exited() {
            eprintln!("[bench] warning: {name} exited during the run ({how})");
        }
        child.stop();
        let makespan = r.outcomes.iter().map(|o| o.at + o.e2e).fold(0.0, f64::max);
        let run = TargetRun {
            name: name.to_string(),
            outcomes: r.outcomes,
            unfinished: r.unfinished,
            self_cpu,
            proxy_cpu,
            max_inflight: r.max_inflight,
            cap_hits: r.cap_hits,
            sim_max_waiting: r.sim_max_waiting,
            sim_mean_running: r.sim_mean_running,
            gpulb_max_queue: r.gpulb_max_queue,
            makespan,
        };
        let _ = std::fs::write(dir.join(format!("{name}-requests.csv")), report::csv(&run));
        let i = report::class_stats(&run.outcomes, Class::Interactive, None);
        let b = report::class_stats(&run.outcomes, Class::Bulk, None);
        eprintln!(
            "[bench] {name}: interactive TTFT p99 {:.0} ms, bulk ok {}/{}, makespan {:.1} s",
            i.ttft_p99.unwrap_or(f64::NAN) * 1000.0,
            b.ok,
            b.sent,
            run.makespan
        );
        runs.push(run);
    }
    // Let the fleet settle before dropping it (bounded).
    let _ = client_rt.block_on(wait_fleet_idle(&fleet));

    let mut md = String::new();
    let _ = writeln!(md, "### Routing quality, seed {}\n", a.seed);
    md.push_str(&head);
    let _ = writeln!(
        md,
        "- configs: {}",
        configs
            .iter()
            .map(|(n, p)| format!("{n} `{}`", p.display()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(md, "\nPer target and class (latency percentiles over ok requests, measured from each request's scheduled time):\n");
    md.push_str(&report::main_table(&runs));
    let _ = writeln!(md, "\nAgainst the target (\"interactive p99 TTFT at most half the best baseline's, bulk throughput no worse\"):\n");
    md.push_str(&report::verdict(&runs));
    let _ = writeln!(md, "\nInteractive TTFT by tenant (ok requests):\n");
    md.push_str(&report::tenant_table(&runs));
    let _ = writeln!(md, "\nRouting and harness diagnostics (per-gpu lists are gpu0/gpu1/..; waiting/running sampled every 100 ms inside the workers; CPU seconds over the replay):\n");
    md.push_str(&report::diagnostics_table(&runs, a.workers));
    let errors = report::error_breakdown(&runs);
    if !errors.is_empty() {
        let _ = writeln!(md, "\nSheds and errors:\n");
        md.push_str(&errors);
    }
    let _ = writeln!(
        md,
        "\nHarness process CPU in all (client + fleet + setup): {:.1} s",
        procs::process_cpu()
    );
    let out = dir.join("results.md");
    std::fs::write(&out, &md).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    println!("{md}");
    eprintln!("[bench] written to {}", out.display());

    drop(fleet);
    client_rt.shutdown_timeout(Duration::from_secs(1));
    sim_rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
