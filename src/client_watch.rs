//! Noticing that a client went away while its request waits in a queue.
//!
//! Pingora reads nothing from the client while `request_filter` runs, so a queued request would
//! never learn that its client left. This watch reads a small request body into pingora's retry
//! buffer (which pingora then forwards upstream as usual), then peeks at the socket a few times
//! a second: end of stream or an error means the client is gone, and the queue drops the request.

use pingora::protocols::http::ServerSession;
use pingora::proxy::Session;
use std::time::Duration;

/// Largest body read ahead while queued: pingora's retry buffer holds this much.
const READ_AHEAD_LIMIT: u64 = 64 * 1024;

/// How often the socket is checked while a request waits.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// Completes when the client of `session` has gone away; pends forever when that cannot be
/// told (HTTP/2, or a body too large to read ahead, whose unread bytes hide the close).
pub async fn client_gone(session: &mut Session) {
    let fd = match session.as_downstream() {
        ServerSession::H1(h1) => h1.stream().id(),
        _ => return std::future::pending().await,
    };
    let length = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let chunked = session
        .req_header()
        .headers
        .contains_key(http::header::TRANSFER_ENCODING);
    match (length, chunked) {
        (Some(n), false) if n <= READ_AHEAD_LIMIT => {
            session.as_downstream_mut().enable_retry_buffering();
            while !session.as_downstream_mut().is_body_done() {
                match session.read_request_body().await {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => return, // the client broke off mid-body
                }
            }
        }
        (None, false) => {} // no body
        _ => return std::future::pending().await,
    }
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        if peer_closed(fd) {
            return;
        }
    }
}

/// Whether the peer of socket `fd` has closed it or it failed, without consuming any byte.
fn peer_closed(fd: i32) -> bool {
    let mut byte = 0u8;
    // SAFETY: `fd` is the open client socket owned by the session, which outlives this call;
    // MSG_PEEK | MSG_DONTWAIT reads nothing and never blocks.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => true,
        n if n > 0 => false,
        _ => !matches!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EAGAIN) | Some(libc::EINTR)
        ),
    }
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
        // The unread byte comes first; a real queued request has its body read already.
        let mut buf = [0u8; 1];
        std::io::Read::read(&mut &server, &mut buf).unwrap();
        assert!(peer_closed(server.as_raw_fd()), "closed by the peer");
    }
}
