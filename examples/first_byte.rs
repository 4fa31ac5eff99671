//! A load client that times each streamed answer's first body byte, for the proxy-overhead benchmark's `LOAD=first-byte` mode.
//!
//! `--connections` loops on keep-alive connections, each POSTing one body (the bytes of
//! `--body-file`) and pausing `--pace-ms` after every complete answer, for `--duration`. For
//! every answer it records the time from just before the request is sent to the arrival of the
//! first chunk of the response body, then reads the rest. When the run ends it prints one line
//! in the shape of `examples/bench/post.lua`'s, so the benchmark's report reads either:
//!
//! ```text
//! cargo run --release --example first_byte -- --url http://127.0.0.1:PORT/v1/completions \
//!     --body-file body.json [--connections 16] [--duration 10s] [--pace-ms 0]
//! BENCH_RESULT requests=N duration_us=D p50_us=A p99_us=B mean_us=M err_connect=0 err_read=0 ...
//! ```
//!
//! Here p50/p99/mean are of the time to the first body byte, not to the whole answer. A
//! request that fails, answers other than 200 or has an empty body counts as an error and is
//! not timed.

use bytes::Bytes;
use std::time::{Duration, Instant};

struct Options {
    url: String,
    body: Bytes,
    connections: usize,
    duration: Duration,
    pace: Duration,
}

fn usage(message: &str) -> ! {
    eprintln!("first_byte: {message}");
    eprintln!(
        "usage: first_byte --url URL --body-file FILE [--connections N (16)] \
         [--duration 10s] [--pace-ms MS (0)]"
    );
    std::process::exit(2);
}

/// `10s`, `500ms` or a whole number of seconds.
fn parse_duration(text: &str) -> Option<Duration> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    text.strip_suffix('s')
        .unwrap_or(text)
        .parse()
        .ok()
        .map(Duration::from_secs)
}

fn parse_args() -> Options {
    let (mut url, mut body) = (None, None);
    let mut options = Options {
        url: String::new(),
        body: Bytes::new(),
        connections: 16,
        duration: Duration::from_secs(10),
        pace: Duration::ZERO,
    };
    let mut args = std::env::args().skip(1);
    while let Some(name) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        match name.as_str() {
            "--url" => url = Some(value()),
            "--body-file" => {
                let path = value();
                let bytes = std::fs::read(&path)
                    .unwrap_or_else(|e| usage(&format!("cannot read --body-file {path}: {e}")));
                body = Some(Bytes::from(bytes));
            }
            "--connections" => {
                let v = value();
                options.connections = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .unwrap_or_else(|| usage(&format!("bad --connections {v:?}")));
            }
            "--duration" => {
                let v = value();
                options.duration = parse_duration(&v)
                    .filter(|d| !d.is_zero())
                    .unwrap_or_else(|| usage(&format!("bad --duration {v:?}")));
            }
            "--pace-ms" => {
                let v = value();
                options.pace = v
                    .parse()
                    .map(Duration::from_millis)
                    .unwrap_or_else(|_| usage(&format!("bad --pace-ms {v:?}")));
            }
            "-h" | "--help" => usage("help"),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    options.url = url.unwrap_or_else(|| usage("--url is required"));
    options.body = body.unwrap_or_else(|| usage("--body-file is required"));
    options
}

/// What one connection's loop saw: first-byte times of good answers, and errors by kind.
#[derive(Default)]
struct Tally {
    first_byte_us: Vec<u64>,
    connect: u64,
    read: u64,
    status: u64,
}

/// Sends requests one after another until `until`, timing each answer's first body chunk.
async fn run_connection(client: reqwest::Client, options: &Options, until: Instant) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < until {
        let start = Instant::now();
        let sent = client
            .post(&options.url)
            .header("content-type", "application/json")
            .body(options.body.clone())
            .send()
            .await;
        let mut response = match sent {
            Ok(response) => response,
            Err(_) => {
                tally.connect += 1;
                continue;
            }
        };
        if response.status() != 200 {
            tally.status += 1;
        }
        match response.chunk().await {
            Ok(Some(_)) if response.status() == 200 => {
                tally.first_byte_us.push(start.elapsed().as_micros() as u64);
            }
            Ok(_) => {}
            Err(_) => tally.read += 1,
        }
        loop {
            match response.chunk().await {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    tally.read += 1;
                    break;
                }
            }
        }
        if !options.pace.is_zero() {
            tokio::time::sleep(options.pace).await;
        }
    }
    tally
}

/// The `p`th percentile (0–100) of sorted samples, nearest rank.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() {
    let options = parse_args();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(options.connections)
            .timeout(Duration::from_secs(5))
            .build()
            .expect("http client");
        let start = Instant::now();
        let until = start + options.duration;
        let loops =
            (0..options.connections).map(|_| run_connection(client.clone(), &options, until));
        let tallies = futures_util::future::join_all(loops).await;
        let elapsed = start.elapsed();
        let mut times: Vec<u64> = tallies
            .iter()
            .flat_map(|t| t.first_byte_us.iter().copied())
            .collect();
        times.sort_unstable();
        let mean = times.iter().sum::<u64>() as f64 / times.len().max(1) as f64;
        let sum = |f: fn(&Tally) -> u64| tallies.iter().map(f).sum::<u64>();
        println!(
            "BENCH_RESULT requests={} duration_us={} p50_us={} p99_us={} mean_us={mean:.1} \
             err_connect={} err_read={} err_write=0 err_status={} err_timeout=0",
            times.len(),
            elapsed.as_micros(),
            percentile(&times, 50.0),
            percentile(&times, 99.0),
            sum(|t| t.connect),
            sum(|t| t.read),
            sum(|t| t.status),
        );
    });
}
