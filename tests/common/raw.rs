//! Raw TCP clients for the abuse tests: requests written byte by byte as a hostile or careless
//! client would, and the proxy's answer read back with a bound on every wait.

use super::WAIT;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw connection to a proxy.
pub struct Raw(pub TcpStream);

/// What came back on a raw connection: the status (0 when the connection closed without an
/// answer) and the whole text received.
#[derive(Debug)]
pub struct RawAnswer {
    /// The status line's code, or 0.
    pub status: u16,
    /// Everything received, lossy UTF-8.
    pub text: String,
}

impl RawAnswer {
    /// The header, lower-cased, and the body after its blank line (none when no whole header
    /// came).
    pub fn head_and_body(&self) -> (String, &str) {
        let (head, body) = self.text.split_once("\r\n\r\n").unwrap_or((&self.text, ""));
        (head.to_ascii_lowercase(), body)
    }
}

impl Raw {
    /// Connects to `url` (`http://127.0.0.1:PORT`).
    pub async fn connect(url: &str) -> Raw {
        let addr = url.trim_start_matches("http://");
        Raw(TcpStream::connect(addr).await.expect("connect to proxy"))
    }

    /// Writes `bytes` as they are.
    pub async fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.0
            .write_all(bytes.as_ref())
            .await
            .expect("write to proxy");
    }

    /// Reads until the connection closes, or one response whose `Content-Length` body is
    /// complete has arrived, or `limit` passes.
    pub async fn answer_within(&mut self, limit: Duration) -> RawAnswer {
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        let _ = tokio::time::timeout(limit, async {
            loop {
                match self.0.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                if complete(&got) {
                    break;
                }
            }
        })
        .await;
        let text = String::from_utf8_lossy(&got).into_owned();
        let status = text
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        RawAnswer { status, text }
    }

    /// [`Raw::answer_within`] the usual bound.
    pub async fn answer(&mut self) -> RawAnswer {
        self.answer_within(WAIT).await
    }

    /// Whether the proxy closed the connection within `limit` (reads until EOF or reset).
    pub async fn closed_within(&mut self, limit: Duration) -> bool {
        let mut buf = [0u8; 4096];
        tokio::time::timeout(limit, async {
            loop {
                match self.0.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }
}

/// A backend on a free loopback port that answers the first read of every connection with
/// `answer`, byte for byte, whatever it is (HTTP or not); its URL.
pub async fn canned_backend(answer: &'static [u8]) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tokio::time::timeout(WAIT, socket.read(&mut buf)).await;
                let _ = socket.write_all(answer).await;
            });
        }
    });
    format!("http://{addr}")
}

/// A whole HTTP/1.1 `POST` of the JSON `body` to `path`, as bytes a raw client writes.
pub fn json_post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Whether `got` holds a whole response with a `Content-Length` body.
fn complete(got: &[u8]) -> bool {
    head(got).is_some_and(|(_, length)| length.is_some()) && message_len(got).is_some()
}

/// The length of the first whole HTTP/1 message in `bytes` (its header, then as many body bytes
/// as its `Content-Length` says, none without one), once it has all arrived.
pub fn message_len(bytes: &[u8]) -> Option<usize> {
    let (head_len, length) = head(bytes)?;
    let len = head_len + length.unwrap_or(0);
    (bytes.len() >= len).then_some(len)
}

/// The length of the header at the start of `bytes` (blank line included) and its
/// `Content-Length`, once the whole header has arrived.
fn head(bytes: &[u8]) -> Option<(usize, Option<usize>)> {
    let head_len = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = String::from_utf8_lossy(&bytes[..head_len]);
    let length = text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().expect("a numeric content-length"))
    });
    Some((head_len, length))
}
