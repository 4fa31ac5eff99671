//! Batching benchmark: a flood of one-sentence embedding requests on simulated embedding workers
//! (a fixed cost per call plus a small cost per item), open loop at rising rates, through gpulb
//! with batching, gpulb without, and nginx `least_conn`, in one run.
//!
//! ```text
//! bash examples/bench_batching.sh            # build, then run with the defaults below
//! target/release/examples/bench_batching --help
//! ```
//!
//! What it does, in one process: starts `--workers` simulated workers (`gpulb::tools::sim`,
//! `--call-ms` per call + `--item-ms` per item, `--concurrency` calls at once each); for each
//! target in turn starts it (own process group, killed on every exit path), waits until it
//! answers, then runs one step per rate in `--rates`: Poisson arrivals for `--seconds`, or
//! longer at low rates, until `--min-requests` are due (the same at every target), each
//! request timed from its scheduled send to its last byte. A step is sustained when at least 99%
//! are answered 200 and the answers kept pace (ok per second, first arrival to last completion,
//! at least 95% of the rate sent); a target's first unsustained step is its last. The knee is
//! the highest sustained step (its throughput is reported). gpulb-batch's batch size and batch
//! assembly delay come from its `/metrics` (histogram deltas per step; the delay's p99 is the
//! upper bound of the bucket holding it). Results go to stdout and `--out-dir/results.md`.

#[allow(dead_code)]
#[path = "../bench_routing/procs.rs"]
mod procs;

mod load;
mod report;
mod targets;

use clap::Parser;
use gpulb::tools::sim::{EmbeddingProfile, SimWorker, WorkerProfile};
use std::path::PathBuf;
use std::time::Duration;
use targets::{Setup, Target};

#[derive(Parser, Debug)]
#[command(about = "Batching benchmark: gpulb with and without batching vs nginx least_conn")]
struct Args {
    /// Arrival rates to step through, per second.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "50,100,150,200,300,600,1200,2400,4800"
    )]
    rates: Vec<f64>,
    /// Length of each step's arrivals, seconds (at least; see --min-requests).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Requests each step sends at least, on average: a slow step runs longer than --seconds
    /// to send them (a p99 of 250 requests is their 3rd slowest, a noisy figure).
    #[arg(long, default_value_t = 1500)]
    min_requests: u64,
    /// Simulated embedding workers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Cost of one call on a worker, milliseconds.
    #[arg(long, default_value_t = 20.0)]
    call_ms: f64,
    /// Cost of each item of a call, milliseconds.
    #[arg(long, default_value_t = 0.5)]
    item_ms: f64,
    /// Calls a worker computes at once (gpulb's max_outstanding per backend).
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// Most items a worker takes in one call.
    #[arg(long, default_value_t = 64)]
    worker_max_batch: usize,
    /// gpulb-batch's batching.max_batch.
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// gpulb-batch's batching.max_wait, milliseconds.
    #[arg(long, default_value_t = 5)]
    max_wait_ms: u64,
    /// gpulb worker threads = nginx worker_processes.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Targets, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "gpulb-batch,gpulb,nginx-lc"
    )]
    targets: Vec<String>,
    /// Seed of the arrivals (the same for every target).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The gpulb binary.
    #[arg(long, default_value = "target/release/gpulb")]
    gpulb: PathBuf,
    /// Run directory: configs, logs, results.md.
    #[arg(long, default_value = "target/bench_batching")]
    out_dir: PathBuf,
}

fn runtime(threads: usize, name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

impl Args {
    /// How long the step at `rate` sends: `--seconds`, or long enough for `--min-requests`.
    fn step_length(&self, rate: f64) -> Duration {
        let for_requests = self.min_requests as f64 / rate.max(f64::MIN_POSITIVE);
        Duration::from_secs_f64(self.seconds.max(for_requests))
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("bench_batching: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let chosen: Vec<Target> = args
        .targets
        .iter()
        .map(|n| {
            Target::ALL
                .into_iter()
                .find(|t| t.name() == n)
                .ok_or_else(|| format!("unknown target {n:?} (gpulb-batch, gpulb, nginx-lc)"))
        })
        .collect::<Result<_, _>>()?;
    std::fs::create_dir_all(&args.out_dir).map_err(|e| e.to_string())?;
    let dir = std::fs::canonicalize(&args.out_dir).map_err(|e| e.to_string())?;
    let sim_rt = runtime(1, "bench-sim");
    let client_rt = runtime(2, "bench-client");
    let workers: Vec<SimWorker> = sim_rt
        .block_on(async {
            let mut workers = Vec::new();
            for i in 0..args.workers {
                let mut profile = WorkerProfile::new(format!("e{i}"));
                profile.models = vec!["embed-model".into()];
                profile.embedding = EmbeddingProfile {
                    call_cost: Duration::from_secs_f64(args.call_ms / 1000.0),
                    item_cost: Duration::from_secs_f64(args.item_ms / 1000.0),
                    max_batch: args.worker_max_batch,
                    concurrency: args.concurrency,
                    dimensions: 16,
                };
                workers.push(SimWorker::bind_loopback(profile).await);
            }
            workers.into_iter().collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| format!("cannot start the workers: {e}"))?;
    let addrs: Vec<String> = workers.iter().map(|w| w.addr().to_string()).collect();
    let max_wait = format!("{}ms", args.max_wait_ms);
    let mut results = Vec::new();
    for target in chosen {
        let setup = Setup {
            dir: &dir,
            workers: &addrs,
            threads: args.threads,
            concurrency: args.concurrency,
            max_batch: args.max_batch,
            max_wait: &max_wait,
            listen_port: free_port(),
            admin_port: free_port(),
        };
        eprintln!("[bench_batching] {}", target.name());
        let steps = client_rt.block_on(report::measure(target, &setup, args))?;
        results.push((target, steps));
    }
    let text = report::render(args, &results);
    print!("{text}");
    std::fs::write(dir.join("results.md"), &text).map_err(|e| e.to_string())?;
    drop(workers);
    Ok(())
}
