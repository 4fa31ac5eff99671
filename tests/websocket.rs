//! A protocol upgrade (WebSocket, as vLLM's realtime endpoint uses) through gpulb: the `101`
//! reaches the client, bytes flow both ways on the upgraded connection, and the backend slot
//! is held for the connection's life and released when the client closes it; a tunnel cut for
//! its quietness (`timeouts.idle`) is closed, never written an HTTP error into.

mod common;

use common::{backend_field, eventually, message_len, Backend, Config, Proxy, Raw, WAIT};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SWITCHING: &[u8] =
    b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";

/// A backend that answers every request head with `101` and then echoes what it receives,
/// upper-cased, until the peer closes.
async fn upgrading_backend() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(echo_after_upgrade(socket));
        }
    });
    format!("http://{addr}")
}

async fn echo_after_upgrade(mut socket: TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while message_len(&head).is_none() {
        match tokio::time::timeout(WAIT, socket.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    if !text.contains("upgrade: websocket") {
        let _ = socket
            .write_all(b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n")
            .await;
        return;
    }
    let _ = socket.write_all(SWITCHING).await;
    loop {
        let n = match tokio::time::timeout(WAIT, socket.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return,
        };
        let upper = buf[..n].to_ascii_uppercase();
        if socket.write_all(&upper).await.is_err() {
            return;
        }
    }
}

/// Reads a response head from `raw`, byte by byte so nothing after it is taken, within the
/// usual bound.
async fn read_head(raw: &mut Raw) -> Vec<u8> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let _ = tokio::time::timeout(WAIT, async {
        while message_len(&head).is_none() {
            match raw.0.read(&mut byte).await {
                Ok(0) | Err(_) => break,
                Ok(_) => head.push(byte[0]),
            }
        }
    })
    .await;
    head
}

/// Reads from `raw` until `want` bytes have come, or the usual bound passes.
async fn read_exactly(raw: &mut Raw, want: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(WAIT, async {
        while got.len() < want {
            match raw.0.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    got
}

/// Starts gpulb (with `timeouts` when given) in front of an [`upgrading_backend`] named `ws0`,
/// and opens a WebSocket upgrade through it; returns both once the client has the `101`.
async fn open_tunnel(timeouts: Option<&str>) -> (Proxy, Raw) {
    let url = upgrading_backend().await;
    let mut config = Config::new()
        .set("models", "{discover: false}")
        .backend(Backend::at("ws0", &url).unchecked());
    if let Some(timeouts) = timeouts {
        config = config.set("timeouts", timeouts);
    }
    let proxy = Proxy::start(config).await;
    let mut raw = Raw::connect(&proxy.url).await;
    raw.send(
        "GET /v1/realtime?model=m HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await;
    let head = read_head(&mut raw).await;
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 101"), "{text}");
    assert!(text.contains("upgrade: websocket"), "{text}");
    (proxy, raw)
}

/// Waits for `ws0`'s slot to be released.
async fn slot_released(proxy: &Proxy) {
    eventually(Duration::from_secs(5), "the slot released", || async {
        (backend_field(&proxy.status().await, "ws0", "outstanding") == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_carries_bytes_both_ways_and_holds_its_slot_until_closed() {
    let (proxy, mut raw) = open_tunnel(None).await;
    // Several exchanges on the one connection, each answered in turn.
    for word in ["hello", "gpu", "fleet"] {
        raw.send(word).await;
        let echoed = read_exactly(&mut raw, word.len()).await;
        assert_eq!(echoed, word.to_ascii_uppercase().as_bytes());
    }
    assert_eq!(
        backend_field(&proxy.status().await, "ws0", "outstanding"),
        1,
        "the open connection holds its backend slot"
    );

    // The client closing its side ends the tunnel and releases the slot.
    raw.0.shutdown().await.unwrap();
    drop(raw);
    slot_released(&proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_quiet_past_the_idle_timeout_is_closed_without_an_http_error_written_into_it() {
    let (proxy, mut raw) = open_tunnel(Some("{first_byte: 1s, idle: 1s}")).await;
    raw.send("a").await;
    assert_eq!(read_exactly(&mut raw, 1).await, b"A");
    // Silent past both timeouts: the tunnel is cut, and what the client reads after the
    // upgrade is the end of the connection, not an HTTP answer in the middle of its protocol.
    let rest = read_exactly(&mut raw, 1).await;
    assert!(
        rest.is_empty(),
        "bytes written into the tunnel: {:?}",
        String::from_utf8_lossy(&rest)
    );
    slot_released(&proxy).await;
    // Logged as what it was: the 101 answered, the tunnel then cut for its quietness, which
    // is no client's stall (`body_timeout`) and no backend's failure.
    let record = proxy.first_access_records(1).await.remove(0);
    assert_eq!(record["status"], 101, "{record}");
    assert_eq!(record["reason"], "tunnel_idle", "{record}");
    assert_eq!(
        backend_field(&proxy.status().await, "ws0", "consecutive_failures"),
        0
    );
}
