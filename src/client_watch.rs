//! Noticing that a client went away while its request waits in a queue.
//!
//! Pingora reads nothing from the client while `request_filter` runs, so a queued request would
//! never learn that its client left. This watch polls the socket a few times a second for the
//! peer's close (`POLLRDHUP`: seen even while body bytes are still unread in the socket, so a
//! chunked or large streamed body hides nothing); then the queue drops the request. A body gpulb
//! holds was read whole before the request was queued.

use pingora::protocols::http::ServerSession;
use pingora::proxy::Session;
use std::time::Duration;

/// How often the socket is checked while a request waits.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// Completes when the client of `session` has gone away; pends forever when that cannot be
/// told (HTTP/2).
pub async fn client_gone(session: &mut Session) {
    let fd = match session.as_downstream() {
        ServerSession::H1(h1) => h1.stream().id(),
        _ => return std::future::pending().await,
    };
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        if peer_closed(fd) {
            return;
        }
    }
}

/// Whether the peer of socket `fd` has closed it (or its sending side) or it failed, without
/// consuming any byte.
fn peer_closed(fd: i32) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `fd` is the open client socket owned by the session, which outlives this call;
    // a zero timeout never blocks, and only `poll.revents` is written.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn peek_tells_open_from_closed() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert!(!peer_closed(server.as_raw_fd()), "idle open connection");
        client.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !peer_closed(server.as_raw_fd()),
            "unread data is not a close"
        );
        drop(client);
        std::thread::sleep(Duration::from_millis(20));
        // Bytes left unread do not hide the close.
        assert!(peer_closed(server.as_raw_fd()), "closed by the peer");
    }
}
