//! Deadlines on a backend's answer that pingora's one per-read timeout cannot express:
//! `timeouts.first_byte` from the request sent to the response's first body byte (the first
//! token when streaming: a model server sends its header at once and its first token after its
//! own queue and prefill), then `timeouts.idle` between body chunks.
//!
//! pingora reads the backend with one timeout for every read; gpulb gives it the larger of the
//! two and a watchdog enforces both. Its thread's sweeper (`sweeper.rs`) checks it every tenth
//! of the shorter timeout (5 ms at least, 1 s at most), so a deadline is enforced within that
//! tick of its time. A deadline that passes shuts the upstream socket down through a duplicate
//! of its descriptor, so the descriptor can never name another socket by then: the connection's
//! socket digest makes the duplicate once and keeps it as long as the connection or a watchdog
//! holds the digest (vendor/README.md, pingora-core's tenth change), so a request on a pooled
//! connection duplicates nothing. pingora's pending read then fails and the request ends as a
//! timeout of the backend.

use super::sweeper::{self, Watched};
use pingora::protocols::SocketDigest;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ARMED: u8 = 0;
const DONE: u8 = 1;
const FIRED_FIRST_BYTE: u8 = 2;
const FIRED_IDLE: u8 = 3;

/// Which deadline cut an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// No response body byte within `timeouts.first_byte` of the request.
    FirstByte(Duration),
    /// No body chunk within `timeouts.idle` of the previous one.
    Idle(Duration),
}

impl std::fmt::Display for Expired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expired::FirstByte(d) => write!(f, "no first byte within timeouts.first_byte, {d:?}"),
            Expired::Idle(d) => write!(f, "silent mid-response for timeouts.idle, {d:?}"),
        }
    }
}

struct Shared {
    started: Instant,
    /// Milliseconds after `started` when the exchange is cut.
    deadline_ms: AtomicU64,
    /// Body chunks read from the backend.
    received: AtomicU64,
    /// Body chunks handed on to the client.
    forwarded: AtomicU64,
    state: AtomicU8,
    /// Keeps `duplicate` open.
    _socket: Arc<SocketDigest>,
    /// The digest's duplicate of the upstream socket's descriptor.
    duplicate: RawFd,
    first_byte: Duration,
    idle: Duration,
}

impl Shared {
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn push_deadline(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.deadline_ms
            .store(self.elapsed_ms().saturating_add(ms), Ordering::Release);
    }
}

/// The watchdog of one attempt; dropping it ends the watch.
pub struct UpstreamWatch {
    /// The only strong reference: the sweeper holds the watch weakly.
    shared: Arc<Shared>,
}

/// How often a watch with these timeouts is checked.
fn tick(first_byte: Duration, idle: Duration) -> Duration {
    (first_byte.min(idle) / 10).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

impl UpstreamWatch {
    /// Starts watching the upstream socket of an attempt whose request is being sent now;
    /// `None` when its descriptor cannot be duplicated (pingora's own timeout still applies).
    pub fn start(
        socket: Arc<SocketDigest>,
        first_byte: Duration,
        idle: Duration,
    ) -> Option<UpstreamWatch> {
        // SAFETY: the digest is the one of the connection pingora hands to
        // `connected_to_upstream`, open and owned by the request while the hook runs.
        let duplicate = unsafe { socket.duplicate_fd() }?.as_raw_fd();
        let shared = Arc::new(Shared {
            started: Instant::now(),
            deadline_ms: AtomicU64::new(0),
            received: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            state: AtomicU8::new(ARMED),
            _socket: socket,
            duplicate,
            first_byte,
            idle,
        });
        shared.push_deadline(first_byte);
        let watched: std::sync::Weak<Shared> = Arc::downgrade(&shared);
        sweeper::watch(watched, tick(first_byte, idle));
        Some(UpstreamWatch { shared })
    }

    /// A piece of the request body left for the backend: its answer is awaited from now.
    pub fn request_sent(&self) {
        if self.shared.received.load(Ordering::Acquire) == 0 {
            self.shared.push_deadline(self.shared.first_byte);
        }
    }

    /// A response body chunk arrived from the backend; `end` when it was the last.
    pub fn received(&self, non_empty: bool, end: bool) {
        if end {
            let _ = self.shared.state.compare_exchange(
                ARMED,
                DONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return;
        }
        if non_empty {
            self.shared.received.fetch_add(1, Ordering::AcqRel);
            self.shared.push_deadline(self.shared.idle);
        }
    }

    /// A response body chunk went on towards the client.
    pub fn forwarded(&self, non_empty: bool) {
        if non_empty {
            self.shared.forwarded.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The deadline that cut the exchange, if one did.
    pub fn expired(&self) -> Option<Expired> {
        match self.shared.state.load(Ordering::Acquire) {
            FIRED_FIRST_BYTE => Some(Expired::FirstByte(self.shared.first_byte)),
            FIRED_IDLE => Some(Expired::Idle(self.shared.idle)),
            _ => None,
        }
    }
}

impl Drop for UpstreamWatch {
    fn drop(&mut self) {
        let _ =
            self.shared
                .state
                .compare_exchange(ARMED, DONE, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl Watched for Shared {
    /// Cuts the exchange if its deadline has passed; false once the watch is over. The deadline
    /// moves on while the client, not the backend, is behind.
    fn check(&self) -> bool {
        if self.state.load(Ordering::Acquire) != ARMED {
            return false;
        }
        if self.elapsed_ms() < self.deadline_ms.load(Ordering::Acquire) {
            return true;
        }
        let received = self.received.load(Ordering::Acquire);
        if received > self.forwarded.load(Ordering::Acquire) {
            // The client is behind, not the backend: pingora stopped reading for it.
            self.push_deadline(self.idle);
            return true;
        }
        let fired = match received {
            0 => FIRED_FIRST_BYTE,
            _ => FIRED_IDLE,
        };
        if self
            .state
            .compare_exchange(ARMED, fired, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // SAFETY: `duplicate` stays open while `_socket`, the digest that made it, is held.
            unsafe { libc::shutdown(self.duplicate, libc::SHUT_RDWR) };
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    fn digest_of(stream: &TcpStream) -> Arc<SocketDigest> {
        Arc::new(SocketDigest::from_raw_fd(stream.as_raw_fd()))
    }

    /// Reads from `stream` until EOF or error, within 5 s; true when the read ended.
    fn read_ends(mut stream: TcpStream) -> bool {
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 64];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
            }
        }
    }

    #[tokio::test]
    async fn a_silent_backend_is_cut_at_first_byte_then_at_idle() {
        let (client, _server) = pair();
        let watch = UpstreamWatch::start(
            digest_of(&client),
            Duration::from_millis(50),
            Duration::from_secs(60),
        )
        .unwrap();
        let reader = client.try_clone().unwrap();
        let ended = tokio::task::spawn_blocking(move || read_ends(reader));
        assert!(ended.await.unwrap(), "the read did not end");
        assert_eq!(
            watch.expired(),
            Some(Expired::FirstByte(Duration::from_millis(50)))
        );

        let (client, mut server) = pair();
        let watch = UpstreamWatch::start(
            digest_of(&client),
            Duration::from_secs(60),
            Duration::from_millis(50),
        )
        .unwrap();
        server.write_all(b"x").unwrap();
        watch.received(true, false);
        watch.forwarded(true);
        let reader = client.try_clone().unwrap();
        let ended = tokio::task::spawn_blocking(move || read_ends(reader));
        assert!(ended.await.unwrap(), "the read did not end");
        assert_eq!(
            watch.expired(),
            Some(Expired::Idle(Duration::from_millis(50)))
        );
    }

    #[tokio::test]
    async fn chunks_in_time_and_a_lagging_client_keep_the_exchange() {
        let (client, _server) = pair();
        let watch = UpstreamWatch::start(
            digest_of(&client),
            Duration::from_millis(60),
            Duration::from_millis(60),
        )
        .unwrap();
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(30)).await;
            watch.received(true, false);
            watch.forwarded(true);
        }
        // One chunk read but not yet taken by the client: the backend is not blamed.
        watch.received(true, false);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(watch.expired(), None);
        watch.received(false, true);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(watch.expired(), None);
        client.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 1];
        let still_open = matches!(
            (&client).read(&mut buf),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        );
        assert!(still_open, "the socket was shut down");
    }
}
