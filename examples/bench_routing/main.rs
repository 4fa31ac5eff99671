//! Routing-quality benchmark: gpulb against round-robin and least-connections peers (nginx and
//! HAProxy from the distribution) in front of the same uneven simulated GPU fleet, each sent the
//! identical open-loop trace of streaming interactive and long bulk requests.
//!
//! ```text
//! cargo build --release --bin gpulb --examples
//! target/release/examples/bench_routing                 # defaults: seed 1, 30 s trace, 5 targets
//! target/release/examples/bench_routing --seed 2 --targets gpulb,haproxy-lc
//! target/release/examples/bench_routing --targets gpulb,gpulb-body   # header vs body classes
//! target/release/examples/bench_routing --help          # every knob
//! ```
//! or `examples/bench_routing.sh` (build + run over several seeds); `--abuse`
//! (`examples/bench_abuse.sh`) and `--reload-every 100ms` (`examples/bench_reload.sh`) run each
//! target twice, clean and under abuse or config reloads, and print one comparison.
//!
//! What it does, in one process:
//! 1. starts `--workers` simulated GPU workers (`gpulb::tools::sim`) on loopback, uneven like the demo
//!    fleet (`gpulb::tools::demo::demo_profile`: gpu1 half speed, gpu2 half the KV budget), with
//!    timings slowed down (`--decode-ms` ...) so the fleet, not this harness, is the bottleneck;
//! 2. generates the trace from `--seed`: Poisson arrivals of interactive (streaming chat,
//!    `x-priority: interactive`, three tenants 6:3:1) and bulk (long non-streaming completions)
//!    requests, both rates multiplied by `--burst-factor` inside burst windows; the gpulb-body
//!    target gets the same requests without the `x-priority` header, and tells the classes
//!    apart from the JSON body (`--body-match`);
//! 3. for each target in turn: restarts the fleet (new workers on the same addresses, so every
//!    target starts with cold prefix caches, as the first did), writes its config into the run
//!    directory, starts it as a child process (own process group, killed by a guard on every
//!    exit path), waits until it answers and the fleet is idle, replays the trace open loop (one task per request, launched at its
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

mod abuse;
mod abuse_report;
mod client;
mod pooled;
mod prefix;
mod procs;
mod reload_report;
mod reloader;
mod report;
mod run;
mod targets;
mod trace;

use clap::Parser;
use std::path::PathBuf;

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

    /// Trace: `mixed` (interactive + bulk, the routing benchmark) or `prefix` (shared prefixes
    /// with Zipf popularity and multi-turn sessions; sessions start at --interactive-rps with
    /// the interactive burst factor, answers take --interactive-tokens; see prefix.rs).
    #[arg(long, default_value = "mixed", value_parser = ["mixed", "prefix"])]
    workload: String,
    /// prefix: number of shared prefixes (system prompts).
    #[arg(long, default_value_t = 40)]
    prefixes: usize,
    /// prefix: each shared prefix's length range in characters.
    #[arg(long, default_value = "4000-12000", value_parser = range_usize)]
    prefix_chars: (usize, usize),
    /// prefix: Zipf exponent of the prefixes' popularity (rank k has weight 1/k^s).
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// prefix: turns per session (each resends the whole history).
    #[arg(long, default_value = "1-4", value_parser = range_u32)]
    turns: (u32, u32),
    /// prefix: time between a session's turns, ms (open loop: fixed in the trace).
    #[arg(long, default_value = "2000-6000", value_parser = range_usize)]
    think_ms: (usize, usize),
    /// prefix: each new question's length in characters.
    #[arg(long, default_value = "200-800", value_parser = range_usize)]
    question_chars: (usize, usize),
    /// prefix: each earlier answer's length in characters, as resent in the history.
    #[arg(long, default_value = "100-400", value_parser = range_usize)]
    reply_chars: (usize, usize),
    /// The SGLang router command for target sglang-cache-aware (whitespace-separated; the
    /// harness adds --host, --port, --prometheus-*, --policy cache_aware and --worker-urls).
    #[arg(
        long,
        value_delimiter = ' ',
        default_value = "python3 -m sglang_router.launch_router"
    )]
    sglang_router: Vec<String>,

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

    /// Targets, in run order: gpulb, gpulb-body, gpulb-unread, gpulb-same, nginx-rr, nginx-lc,
    /// haproxy-rr, haproxy-lc, haproxy-prio, gpulb-prefix, gpulb-ll, sglang-cache-aware, gpulb-x2,
    /// gpulb-x3, gpulb-x2-blind. gpulb-body is gpulb
    /// with classes chosen from the body only (no `x-priority` header sent; the interactive class
    /// matches `--body-match`); gpulb-unread reads no body; gpulb-same is gpulb again, a second
    /// process with the same config (an A/A control); gpulb-prefix and gpulb-ll force the
    /// interactive placement to prefix_affinity and least_loaded; sglang-cache-aware is SGLang's
    /// router with --policy cache_aware; gpulb-x2 and gpulb-x3 run two and three gpulb replicas
    /// with gpulb's config, each request sent to one of them drawn at random from the seed, and
    /// gpulb-x2-blind two with `telemetry.count_others: false`.
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
    /// gpulb `telemetry.waiting_interval` (how often a server is read while requests wait and
    /// other replicas hold part of it; `off`).
    #[arg(long, default_value = "50ms")]
    waiting_interval: String,
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
    /// gpulb-body's interactive class `match` (YAML flow mapping of body rules). Interactive
    /// requests are streaming chats with max_tokens in --interactive-tokens, bulk ones
    /// non-streaming completions with max_tokens in --bulk-tokens.
    #[arg(long, default_value = "{stream: true, max_tokens: {max: 100}}")]
    body_match: String,
    /// Use this gpulb config instead of the generated one (for gpulb-body too, as written); {LISTEN} {ADMIN} {THREADS} {URL0}..
    /// are replaced.
    #[arg(long)]
    gpulb_config: Option<PathBuf>,
    /// haproxy-prio: maxconn per server (default: --max-running).
    #[arg(long)]
    prio_maxconn: Option<usize>,

    /// Abuse benchmark: every target runs the trace twice, clean and beside hostile clients
    /// (--slowloris, --idle, --stalled), and the comparison is printed (examples/bench_abuse.sh).
    #[arg(long)]
    abuse: bool,
    /// --abuse: slowloris connections kept up (a header line every --drip-ms, never ended).
    #[arg(long, default_value_t = 1000)]
    slowloris: usize,
    /// --abuse: idle keep-alive connections left open after one request.
    #[arg(long, default_value_t = 2000)]
    idle: usize,
    /// --abuse: uploads kept up that announce 100 kB and stall after 1 kB.
    #[arg(long, default_value_t = 20)]
    stalled: usize,
    /// --abuse: time between two header lines of a slowloris connection, ms.
    #[arg(long, default_value_t = 5000)]
    drip_ms: u64,

    /// Reload benchmark: every target runs the trace twice, steady and while its config is
    /// rewritten and reloaded this often (gpulb POST /reload, nginx SIGHUP, HAProxy
    /// master-worker SIGUSR2), and the comparison is printed (examples/bench_reload.sh).
    #[arg(long, value_parser = duration)]
    reload_every: Option<std::time::Duration>,

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
    /// Runs nothing: prints the trace's description (for `--workload prefix` with its offline
    /// oracle hit rate and TTFT floor) and exits.
    #[arg(long)]
    describe_only: bool,
}

/// `LO-HI` (or one value, for both ends) as an inclusive range.
fn parse_range<T: std::str::FromStr + PartialOrd>(s: &str) -> Result<(T, T), String> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let a: T = a.trim().parse().map_err(|_| format!("bad range {s:?}"))?;
    let b: T = b.trim().parse().map_err(|_| format!("bad range {s:?}"))?;
    if a > b {
        return Err(format!("range {s:?} is backwards"));
    }
    Ok((a, b))
}
/// A duration in humantime's grammar (`100ms`, `1s`), above zero.
fn duration(s: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(s.trim()) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be above zero".into()),
        Err(e) => Err(format!("bad duration {s:?}: {e}")),
    }
}
fn range_u32(s: &str) -> Result<(u32, u32), String> {
    parse_range(s)
}
fn range_usize(s: &str) -> Result<(usize, usize), String> {
    parse_range(s)
}

fn main() {
    let args = Args::parse();
    let result = match &args.pooled {
        Some(dir) => pooled::report(dir).map(|md| println!("{md}")),
        None => run::run(&args),
    };
    if let Err(e) = result {
        eprintln!("[bench] error: {e}");
        procs::kill_all_live();
        std::process::exit(1);
    }
}
