//! A client connection under gpulb's own deadlines: the whole request header within
//! `timeouts.client_header` (pingora's header timeout is per read, so a slowloris client
//! sending a byte at a time would otherwise stay forever), at most `limits.max_header_bytes` of
//! it, and at most `timeouts.client_idle` of silence between two requests on a kept-alive
//! connection (pingora keeps an HTTP/1.1 connection with no idle limit after its first request).
//!
//! The stream does not parse HTTP: the proxy's hooks tell it where the exchange stands
//! ([`mark_active`] once a header is parsed, [`mark_idle`] once a response is done), and the
//! first byte read while idle starts the next header's clock.
//!
//! Between two requests the connection waits in [`GuardedStream::wait_readable`], outside
//! pingora: what the client sends first is read there and handed to pingora's next read.

use crate::metrics::{ClientTimeout, ConnectionMetrics};
use async_trait::async_trait;
use bytes::{Buf, Bytes};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use pingora::proxy::Session;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Where the exchange on a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Waiting for (the rest of) a request header: `client_header` runs.
    Header = 0,
    /// A request is being served: body and response have their own timeouts.
    Active = 1,
    /// Between two requests: `client_idle` runs.
    Idle = 2,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Header,
            1 => Phase::Active,
            _ => Phase::Idle,
        }
    }
}

/// The deadlines and limits applied to one client connection.
#[derive(Debug, Clone, Copy)]
pub struct ClientLimits {
    /// Whole-header deadline.
    pub header: Duration,
    /// Keep-alive idle limit.
    pub idle: Duration,
    /// Largest header, bytes.
    pub max_header_bytes: usize,
}

/// A client connection whose reads are bounded by [`ClientLimits`].
pub struct GuardedStream {
    inner: Stream,
    limits: ClientLimits,
    /// Set by the proxy's hooks (through a shared reference), read on every poll.
    phase: AtomicU8,
    /// The phase the timer is armed for.
    armed: Phase,
    timer: Pin<Box<Sleep>>,
    header_bytes: usize,
    metrics: ConnectionMetrics,
    /// What [`GuardedStream::wait_readable`] read, for the next reads to return first.
    held: Option<Held>,
}

/// The outcome of a read made while waiting for a request, kept for pingora's next read.
enum Held {
    /// Bytes of the next request.
    Bytes(Bytes),
    /// The client closed, or the idle limit passed (a quiet end).
    End,
    /// The read failed; pingora sees the same error.
    Error(io::Error),
}

/// Most bytes [`GuardedStream::wait_readable`] reads at once: the start of a request header
/// (a stack buffer during the read, so an idle connection holds none).
const WAIT_READ_BYTES: usize = 1024;

impl std::fmt::Debug for GuardedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedStream")
            .field("inner", &self.inner)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl GuardedStream {
    /// Wraps a freshly accepted connection: its first header's clock starts now.
    pub fn new(inner: Stream, limits: ClientLimits, metrics: ConnectionMetrics) -> GuardedStream {
        GuardedStream {
            inner,
            limits,
            phase: AtomicU8::new(Phase::Header as u8),
            armed: Phase::Header,
            timer: Box::pin(tokio::time::sleep(limits.header)),
            header_bytes: 0,
            metrics,
            held: None,
        }
    }

    /// Waits until the client sends the start of its next request, closes, fails or runs out
    /// of the current phase's time, as a read would; the outcome is returned by the next read.
    /// Cancel-safe: nothing read is lost when the wait is dropped.
    pub async fn wait_readable(&mut self) {
        if self.held.is_some() {
            return;
        }
        let held = std::future::poll_fn(|cx| {
            let mut space = [0u8; WAIT_READ_BYTES];
            let mut buf = ReadBuf::new(&mut space);
            match Pin::new(&mut *self).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => Poll::Ready(Held::End),
                Poll::Ready(Ok(())) => {
                    Poll::Ready(Held::Bytes(Bytes::copy_from_slice(buf.filled())))
                }
                Poll::Ready(Err(e)) => Poll::Ready(Held::Error(e)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        self.held = Some(held);
    }

    /// Serves a read from what [`Self::wait_readable`] kept, if anything.
    fn take_held(&mut self, buf: &mut ReadBuf<'_>) -> Option<io::Result<()>> {
        match self.held.take()? {
            Held::Bytes(mut bytes) => {
                let n = bytes.len().min(buf.remaining());
                buf.put_slice(&bytes[..n]);
                bytes.advance(n);
                if !bytes.is_empty() {
                    self.held = Some(Held::Bytes(bytes));
                }
                Some(Ok(()))
            }
            Held::End => Some(Ok(())),
            Held::Error(e) => Some(Err(e)),
        }
    }

    fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// Re-arms the timer when the phase changed since the last poll.
    fn arm(&mut self, phase: Phase) {
        if phase == self.armed {
            return;
        }
        self.armed = phase;
        let limit = match phase {
            Phase::Header => {
                self.header_bytes = 0;
                self.limits.header
            }
            Phase::Idle => self.limits.idle,
            Phase::Active => return,
        };
        self.timer.as_mut().reset(Instant::now() + limit);
    }

    /// The answer to a read whose deadline passed: a quiet end for an idle connection, an
    /// error for a header cut short.
    fn expired(&self, phase: Phase) -> Poll<io::Result<()>> {
        match phase {
            Phase::Idle => {
                self.metrics.closed(ClientTimeout::Idle);
                Poll::Ready(Ok(()))
            }
            _ => {
                self.metrics.closed(ClientTimeout::Header);
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "request header not received within {:?}",
                        self.limits.header
                    ),
                )))
            }
        }
    }
}

/// The guarded stream under `session`, when it has one (HTTP/1 on a gpulb listener).
fn guarded(session: &Session) -> Option<&GuardedStream> {
    session
        .as_downstream()
        .stream()
        .and_then(|s| s.as_any().downcast_ref::<GuardedStream>())
}

/// The request header of `session` is in: no header deadline until the response is done.
pub fn mark_active(session: &Session) {
    if let Some(stream) = guarded(session) {
        stream.set_phase(Phase::Active);
    }
}

/// The exchange on `session` is over: the connection may idle for `client_idle`.
pub fn mark_idle(session: &Session) {
    if let Some(stream) = guarded(session) {
        stream.set_phase(Phase::Idle);
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() > 0 {
            if let Some(done) = this.take_held(buf) {
                return Poll::Ready(done);
            }
        }
        let phase = Phase::from_u8(this.phase.load(Ordering::Acquire));
        this.arm(phase);
        if phase == Phase::Header && this.header_bytes >= this.limits.max_header_bytes {
            this.metrics.closed(ClientTimeout::HeaderTooLarge);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "request header over limits.max_header_bytes ({})",
                    this.limits.max_header_bytes
                ),
            )));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                if phase == Phase::Idle && read > 0 {
                    // The next request has begun: its header's clock starts now.
                    this.set_phase(Phase::Header);
                    this.arm(Phase::Header);
                }
                if this.armed == Phase::Header {
                    this.header_bytes += read;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if phase != Phase::Active => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => this.expired(phase),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for GuardedStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for GuardedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for GuardedStream {
    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for GuardedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for GuardedStream {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for GuardedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for GuardedStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    fn limits() -> ClientLimits {
        ClientLimits {
            header: Duration::from_secs(5),
            idle: Duration::from_secs(5),
            max_header_bytes: 64 * 1024,
        }
    }

    /// A guarded server end, idle between two requests, and its client end.
    async fn idle_pair(limits: ClientLimits) -> (GuardedStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let stream: Stream = Box::new(pingora::protocols::l4::stream::Stream::from(server));
        let metrics = crate::metrics::Metrics::new(1).connections().clone();
        let guarded = GuardedStream::new(stream, limits, metrics);
        guarded.set_phase(Phase::Idle);
        (guarded, client)
    }

    #[tokio::test]
    async fn what_the_wait_read_comes_first_and_counts_once() {
        let (mut guarded, mut client) = idle_pair(limits()).await;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        guarded.wait_readable().await;
        let phase = Phase::from_u8(guarded.phase.load(Ordering::Acquire));
        assert_eq!(
            phase,
            Phase::Header,
            "the first byte starts the header clock"
        );
        client.write_all(b"host: x\r\n\r\n").await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4]; // reads smaller than what was held get it in pieces
        while got.len() < 27 {
            let n = guarded.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n");
        assert_eq!(guarded.header_bytes, 27);
    }

    #[tokio::test]
    async fn a_close_during_the_wait_is_the_end_of_the_next_read() {
        let (mut guarded, client) = idle_pair(limits()).await;
        drop(client);
        guarded.wait_readable().await;
        let mut buf = [0u8; 8];
        assert_eq!(guarded.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn the_wait_ends_at_client_idle() {
        let short = ClientLimits {
            idle: Duration::from_millis(50),
            ..limits()
        };
        let (mut guarded, _client) = idle_pair(short).await;
        tokio::time::timeout(Duration::from_secs(5), guarded.wait_readable())
            .await
            .expect("client_idle ends the wait");
        let mut buf = [0u8; 8];
        assert_eq!(guarded.read(&mut buf).await.unwrap(), 0);
    }
}
