//! Opens many client connections to a proxy and holds them, for the memory benchmark: each
//! connection is either an SSE stream kept reading for as long as it is held, or an idle
//! keep-alive connection that was sent one small request, read its answer and then stays silent.
//!
//! ```text
//! cargo run --release --example hold_connections -- --addr 127.0.0.1:PORT --mode sse \
//!     --count 2000 [--rate 500] [--hold 10m] [--status-file FILE]
//! ```
//!
//! Connections are opened at `--rate` per second. Once every one has been answered (or has
//! failed), or `--ready-timeout` passed, `READY ...` is printed on stdout. Every second the
//! counts are written to `--status-file` (replaced whole) and, when they changed, to stderr.
//! On SIGTERM, SIGINT or after `--hold` it prints `RESULT ...` on stdout and exits, which
//! closes every connection. The counts, `key=value` on one line:
//!
//! - `attempted`: connections tried; `established`: TCP connect succeeded;
//! - `answered`: a 2xx response header came back (idle: the whole response was read);
//! - `failed`: connect error or timeout, a non-2xx answer, or an error or close before the answer;
//! - `open`: answered and not closed since; `closed`: answered, then closed by the peer
//!   (an SSE stream that ended counts here too, with `ended`);
//! - `streaming`: SSE connections open that received bytes within the last `--fresh` window;
//! - `events`: SSE `data:` events received in all; `bytes`: response bytes received in all.

use clap::{Parser, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::signal::unix::{signal, SignalKind};

/// What each connection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// POST a streaming completion and keep reading its events.
    Sse,
    /// GET one small resource, read the answer, then stay silent.
    Idle,
}

#[derive(Debug, Parser)]
#[command(about = "Open many connections to a proxy and hold them (memory benchmark)")]
struct Args {
    /// Address to connect to.
    #[arg(long)]
    addr: SocketAddr,
    /// sse: streaming completions; idle: one GET each, then silence.
    #[arg(long, value_enum)]
    mode: Mode,
    /// Number of connections.
    #[arg(long)]
    count: usize,
    /// New connections per second.
    #[arg(long, default_value_t = 500.0)]
    rate: f64,
    /// Path requested (default /v1/completions for sse, /v1/models for idle).
    #[arg(long)]
    path: Option<String>,
    /// max_tokens of each streamed completion.
    #[arg(long, default_value_t = 100_000)]
    max_tokens: u32,
    /// Longest the whole run lasts; then the result is printed and every connection closed.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    hold: Duration,
    /// Longest wait for a connect, and for an answer's header.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Longest wait, from the start, for every connection to be answered before READY anyway.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    ready_timeout: Duration,
    /// An SSE stream counts as streaming if it received bytes within this window.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    fresh: Duration,
    /// File the counts are written to every second.
    #[arg(long)]
    status_file: Option<PathBuf>,
}

/// Counters shared by every connection task.
#[derive(Default)]
struct Counts {
    attempted: AtomicU64,
    established: AtomicU64,
    answered: AtomicU64,
    failed: AtomicU64,
    closed: AtomicU64,
    ended: AtomicU64,
    events: AtomicU64,
    bytes: AtomicU64,
}

/// Per-connection time of the last bytes received (ms since start, 0 = never or closed).
struct Freshness {
    start: Instant,
    last: Vec<AtomicU64>,
}

impl Freshness {
    fn touch(&self, i: usize) {
        let ms = self.start.elapsed().as_millis().max(1);
        self.last[i].store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn clear(&self, i: usize) {
        self.last[i].store(0, Ordering::Relaxed);
    }

    fn fresh(&self, window: Duration) -> usize {
        let now = self.start.elapsed().as_millis();
        let window = window.as_millis();
        self.last
            .iter()
            .map(|t| u128::from(t.load(Ordering::Relaxed)))
            .filter(|&t| t != 0 && now.saturating_sub(t) <= window)
            .count()
    }
}

struct Shared {
    args: Args,
    request: Vec<u8>,
    counts: Counts,
    fresh: Freshness,
}

impl Shared {
    fn line(&self) -> String {
        let c = &self.counts;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let answered = get(&c.answered);
        let closed = get(&c.closed);
        let streaming = match self.args.mode {
            Mode::Sse => self.fresh.fresh(self.args.fresh),
            Mode::Idle => 0,
        };
        format!(
            "attempted={} established={} answered={} failed={} open={} closed={} ended={} streaming={} events={} bytes={}",
            get(&c.attempted),
            get(&c.established),
            answered,
            get(&c.failed),
            answered - closed,
            closed,
            get(&c.ended),
            streaming,
            get(&c.events),
            get(&c.bytes),
        )
    }

    fn settled(&self) -> bool {
        let c = &self.counts;
        let done = c.answered.load(Ordering::Relaxed) + c.failed.load(Ordering::Relaxed);
        done >= self.args.count as u64
    }
}

fn build_request(args: &Args) -> Vec<u8> {
    let host = args.addr;
    match args.mode {
        Mode::Sse => {
            let path = args.path.as_deref().unwrap_or("/v1/completions");
            let body = format!(
                r#"{{"model":"bench","prompt":"hold this stream","max_tokens":{},"stream":true}}"#,
                args.max_tokens
            );
            format!(
                "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n\
                 accept: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        }
        Mode::Idle => {
            let path = args.path.as_deref().unwrap_or("/v1/models");
            format!("GET {path} HTTP/1.1\r\nhost: {host}\r\n\r\n").into_bytes()
        }
    }
}

/// Where a response header ends, if it is all in `buf`.
fn header_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// The status code and, if given, the content length of a response header.
fn parse_header(header: &[u8]) -> (u16, Option<usize>, bool) {
    let text = String::from_utf8_lossy(header);
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
            if name == "content-length" {
                length = value.parse().ok();
            } else if name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    (status, length, chunked)
}

/// Why a connection stopped before it was answered.
struct Failed;

/// Opens connection `i`, sends the request and reads the answer's header (idle: the whole
/// answer). Returns the stream and the body bytes already read after the header.
async fn open(shared: &Shared) -> Result<(TcpStream, Vec<u8>), Failed> {
    let timeout = shared.args.timeout;
    let c = &shared.counts;
    let mut stream = match tokio::time::timeout(timeout, TcpStream::connect(shared.args.addr)).await
    {
        Ok(Ok(s)) => s,
        _ => return Err(Failed),
    };
    c.established.fetch_add(1, Ordering::Relaxed);
    let _ = stream.set_nodelay(true);
    stream
        .write_all(&shared.request)
        .await
        .map_err(|_| Failed)?;
    let mut buf = Vec::with_capacity(2048);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut chunk = [0u8; 2048];
    let end = loop {
        if let Some(end) = header_end(&buf) {
            break end;
        }
        if buf.len() > 16 * 1024 {
            return Err(Failed);
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return Err(Failed),
        }
    };
    let (status, length, chunked) = parse_header(&buf[..end]);
    if !(200..300).contains(&status) {
        return Err(Failed);
    }
    let mut body = buf.split_off(end);
    if shared.args.mode == Mode::Idle {
        // Read the whole (small) answer, so that the connection is back to idle.
        loop {
            let complete = match (length, chunked) {
                (Some(n), _) => body.len() >= n,
                (None, true) => body.ends_with(b"0\r\n\r\n"),
                (None, false) => return Err(Failed), // would end with the connection
            };
            if complete {
                break;
            }
            match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => body.extend_from_slice(&chunk[..n]),
                _ => return Err(Failed),
            }
        }
    }
    c.bytes
        .fetch_add((end + body.len()) as u64, Ordering::Relaxed);
    Ok((stream, body))
}

/// Counts the SSE events in `bytes` (a `data:` at the start of a line).
fn count_events(bytes: &[u8]) -> u64 {
    bytes.windows(6).filter(|w| w == b"\ndata:").count() as u64
        + u64::from(bytes.starts_with(b"data:"))
}

/// One connection, from connect to the end of the run (or the peer's close).
async fn connection(shared: Arc<Shared>, i: usize) {
    let c = &shared.counts;
    let (mut stream, first) = match open(&shared).await {
        Ok(opened) => opened,
        Err(Failed) => {
            c.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    c.answered.fetch_add(1, Ordering::Relaxed);
    let mut chunk = vec![
        0u8;
        if shared.args.mode == Mode::Sse {
            1024
        } else {
            16
        }
    ];
    if shared.args.mode == Mode::Sse {
        c.events.fetch_add(count_events(&first), Ordering::Relaxed);
        if !first.is_empty() {
            shared.fresh.touch(i);
        }
    }
    drop(first);
    loop {
        match stream.read(&mut chunk).await {
            Ok(n) if n > 0 => {
                c.bytes.fetch_add(n as u64, Ordering::Relaxed);
                if shared.args.mode == Mode::Sse {
                    let got = &chunk[..n];
                    c.events.fetch_add(count_events(got), Ordering::Relaxed);
                    shared.fresh.touch(i);
                    if got.ends_with(b"0\r\n\r\n") {
                        c.ended.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            _ => break,
        }
    }
    shared.fresh.clear(i);
    c.closed.fetch_add(1, Ordering::Relaxed);
}

fn write_status(shared: &Shared, line: &str) {
    if let Some(path) = &shared.args.status_file {
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, format!("{line}\n")).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}

async fn run(shared: Arc<Shared>) {
    let start = Instant::now();
    let count = shared.args.count;
    let pace = Duration::from_secs_f64(1.0 / shared.args.rate.max(0.001));
    let opener = {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(pace);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for i in 0..count {
                ticks.tick().await;
                shared.counts.attempted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(connection(Arc::clone(&shared), i));
            }
        })
    };
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut report = tokio::time::interval(Duration::from_secs(1));
    let hold = tokio::time::sleep(shared.args.hold);
    tokio::pin!(hold);
    let mut ready = false;
    let mut last = String::new();
    loop {
        tokio::select! {
            _ = report.tick() => {
                let line = shared.line();
                write_status(&shared, &line);
                if line != last {
                    eprintln!("[hold_connections {:>4}s] {line}", start.elapsed().as_secs());
                    last = line.clone();
                }
                if !ready && (shared.settled() || start.elapsed() >= shared.args.ready_timeout) {
                    ready = true;
                    println!("READY {}", shared.line());
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = &mut hold => break,
        }
    }
    opener.abort();
    let line = shared.line();
    write_status(&shared, &line);
    println!("RESULT {line}");
}

fn main() {
    let args = Args::parse();
    if args.count == 0 {
        eprintln!("hold_connections: --count must be at least 1");
        std::process::exit(2);
    }
    let shared = Arc::new(Shared {
        request: build_request(&args),
        counts: Counts::default(),
        fresh: Freshness {
            start: Instant::now(),
            last: (0..args.count).map(|_| AtomicU64::new(0)).collect(),
        },
        args,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(shared));
    // Dropping the runtime drops every connection task, closing its socket.
    runtime.shutdown_timeout(Duration::from_secs(2));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_header() {
        let h = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX: y\r\n\r\n";
        assert_eq!(header_end(h), Some(h.len()));
        assert_eq!(parse_header(h), (200, Some(12), false));
        let h = b"HTTP/1.1 503 Busy\r\ntransfer-encoding: chunked\r\n\r\n";
        assert_eq!(parse_header(h), (503, None, true));
        assert_eq!(header_end(b"HTTP/1.1 200 OK\r\n"), None);
    }

    #[test]
    fn counts_events() {
        assert_eq!(count_events(b"data: {}\n\ndata: {}\n\n"), 2);
        assert_eq!(count_events(b"20\r\ndata: {}\n\n\r\n"), 1);
        assert_eq!(count_events(b""), 0);
    }
}
