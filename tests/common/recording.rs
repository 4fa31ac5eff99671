//! A raw HTTP/1 backend for tests that look at what gpulb sent on the wire: it answers every
//! request with the same bytes, keeps each connection open, and records each request.

use super::{message_len, WAIT};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request a [`recording_backend`] received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The connection it came on, numbered from 1 in the order they were accepted.
    pub connection: usize,
    /// The socket reads that carried it (0 when it came whole in the read that ended the one
    /// before it).
    pub reads: usize,
    /// The request, as read.
    pub bytes: Vec<u8>,
}

impl Received {
    /// The request as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// What a [`recording_backend`] has received so far, in order; gpulb's own model discovery
/// (`GET /v1/models`) is left out.
pub type ReceivedLog = Arc<Mutex<Vec<Received>>>;

/// Starts a backend on a free loopback port that answers every request with `answer` and leaves
/// the connection open, even after `Connection: close`, so a request gpulb should not have sent
/// on it would still arrive and be recorded. Returns its URL and what it receives.
pub async fn recording_backend(answer: &'static [u8]) -> (String, ReceivedLog) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received: ReceivedLog = Arc::default();
    let record = Arc::clone(&received);
    tokio::spawn(async move {
        let mut connection = 0;
        while let Ok((socket, _)) = listener.accept().await {
            connection += 1;
            tokio::spawn(serve(socket, connection, answer, Arc::clone(&record)));
        }
    });
    (format!("http://{addr}"), received)
}

async fn serve(mut socket: TcpStream, connection: usize, answer: &[u8], record: ReceivedLog) {
    let mut pending = Vec::new();
    let mut reads = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match tokio::time::timeout(WAIT, socket.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return,
        };
        reads += 1;
        pending.extend_from_slice(&buf[..n]);
        while let Some(len) = message_len(&pending) {
            let bytes: Vec<u8> = pending.drain(..len).collect();
            if !bytes.starts_with(b"GET /v1/models ") {
                record.lock().unwrap().push(Received {
                    connection,
                    reads,
                    bytes,
                });
            }
            reads = 0;
            if socket.write_all(answer).await.is_err() {
                return;
            }
        }
    }
}
