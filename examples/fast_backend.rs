//! A tiny, fast HTTP/1.1 backend for the proxy-overhead benchmark: every request gets 200 and a ~200-byte OpenAI-completion-like JSON body.
//!
//! It reads and discards the request body, keeps connections alive and sets `TCP_NODELAY`, so
//! that the proxy in front of it, not the backend, is what a benchmark measures.
//!
//! ```text
//! cargo run --release --example fast_backend -- [--listen 127.0.0.1:0] [--threads 1] [--stream-ms N]
//! ```
//!
//! With `--stream-ms N` every answer is an SSE stream instead: one completion event sent as soon
//! as the request body has been read, then `data: [DONE]` N milliseconds later, so a client can
//! time the first streamed byte apart from the whole answer (`examples/first_byte.rs`).
//!
//! The first line on stdout is the bound address (`127.0.0.1:PORT`). `GET /__stats` answers
//! `{"connections":N,"requests":M,"reads":R}`: the connections accepted, requests served and
//! socket reads that returned bytes so far (the stats requests themselves excluded). The first
//! shows whether a proxy reuses its upstream connections; reads per request show whether a
//! request arrives in one piece or in several (a header and then its body).

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;

/// The answer to every request: 200 bytes of JSON shaped like an OpenAI completion.
const BODY: &[u8] = br#"{"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"bench","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#;

/// With `--stream-ms`: the first event of every streamed answer, and the one that ends it.
const FIRST_EVENT: &[u8] = b"data: {\"id\":\"cmpl-bench\",\"object\":\"text_completion\",\"model\":\"bench\",\"choices\":[{\"index\":0,\"text\":\"ok\"}]}\n\n";
const DONE_EVENT: &[u8] = b"data: [DONE]\n\n";

/// A streamed answer: [`FIRST_EVENT`] at once, [`DONE_EVENT`] after a pause, then the end.
struct SseAnswer {
    first_sent: bool,
    tail: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Body for SseAnswer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if !this.first_sent {
            this.first_sent = true;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(FIRST_EVENT)))));
        }
        let Some(tail) = this.tail.as_mut() else {
            return Poll::Ready(None);
        };
        ready!(tail.as_mut().poll(cx));
        this.tail = None;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(DONE_EVENT)))))
    }
}

/// What the backend answers: the JSON completion, or with `--stream-ms` an SSE stream.
type Answer = Either<Full<Bytes>, SseAnswer>;

#[derive(Default)]
struct Stats {
    connections: AtomicU64,
    requests: AtomicU64,
    reads: AtomicU64,
}

/// A connection that counts its reads that returned bytes (each one a `recv` call that did).
struct CountingStream {
    inner: tokio::net::TcpStream,
    stats: Arc<Stats>,
    /// Whether the connection has carried a request other than `/__stats`; its reads count
    /// from the first one on (curl's stats connection is never counted).
    counted: bool,
}

impl tokio::io::AsyncRead for CountingStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            if !self.counted && !buf.filled()[before..].starts_with(b"GET /__stats") {
                self.counted = true;
            }
            if self.counted {
                self.stats.reads.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }
}

impl tokio::io::AsyncWrite for CountingStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

struct Options {
    listen: SocketAddr,
    threads: usize,
    /// `--stream-ms`: answer with an SSE stream whose last event comes this long after its first.
    stream_tail: Option<Duration>,
}

fn usage(message: &str) -> ! {
    eprintln!("fast_backend: {message}");
    eprintln!(
        "usage: fast_backend [--listen ADDR (default 127.0.0.1:0)] [--threads N (default 1)] \
         [--stream-ms N (answer with an SSE stream lasting N ms)]"
    );
    std::process::exit(2);
}

fn parse_args() -> Options {
    let mut options = Options {
        listen: "127.0.0.1:0".parse().expect("default address"),
        threads: 1,
        stream_tail: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        match name.as_str() {
            "--listen" => {
                let v = value();
                options.listen = v
                    .parse()
                    .unwrap_or_else(|_| usage(&format!("bad --listen address {v:?}")));
            }
            "--threads" => {
                let v = value();
                options.threads = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .unwrap_or_else(|| usage(&format!("bad --threads {v:?}")));
            }
            "--stream-ms" => {
                let v = value();
                let ms: u64 = v
                    .parse()
                    .unwrap_or_else(|_| usage(&format!("bad --stream-ms {v:?}")));
                options.stream_tail = Some(Duration::from_millis(ms));
            }
            "-h" | "--help" => usage("help"),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    options
}

async fn handle(
    req: Request<Incoming>,
    stats: Arc<Stats>,
    stream_tail: Option<Duration>,
) -> Result<Response<Answer>, Infallible> {
    if req.uri().path() == "/__stats" {
        let body = format!(
            "{{\"connections\":{},\"requests\":{},\"reads\":{}}}",
            stats.connections.load(Ordering::Relaxed),
            stats.requests.load(Ordering::Relaxed),
            stats.reads.load(Ordering::Relaxed)
        );
        return Ok(json_response(Bytes::from(body)));
    }
    stats.requests.fetch_add(1, Ordering::Relaxed);
    // Read and discard the body, frame by frame, without buffering it.
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
    let Some(tail) = stream_tail else {
        return Ok(json_response(Bytes::from_static(BODY)));
    };
    let answer = SseAnswer {
        first_sent: false,
        tail: Some(Box::pin(tokio::time::sleep(tail))),
    };
    Ok(Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Either::Right(answer))
        .expect("static response parts are valid"))
}

fn json_response(body: Bytes) -> Response<Answer> {
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Either::Left(Full::new(body)))
        .expect("static response parts are valid")
}

async fn serve(listener: TcpListener, stats: Arc<Stats>, stream_tail: Option<Duration>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                eprintln!("fast_backend: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let stream = CountingStream {
            inner: stream,
            stats: Arc::clone(&stats),
            counted: false,
        };
        let stats = Arc::clone(&stats);
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, Arc::clone(&stats), stream_tail));
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn main() {
    let options = parse_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let listener = TcpListener::bind(options.listen)
            .await
            .unwrap_or_else(|e| usage(&format!("cannot listen on {}: {e}", options.listen)));
        let addr = listener.local_addr().expect("bound address");
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "{addr}");
        let _ = stdout.flush();
        serve(listener, Arc::new(Stats::default()), options.stream_tail).await;
    });
}
