//! Zero-downtime binary upgrade, as nginx and HAProxy offer it, through pingora's listening
//! socket hand-over: a new `gpulb serve --upgrade` waits on a Unix socket for the listening
//! sockets; SIGQUIT makes the running process send them there (the kernel keeps every queued
//! connection), stop accepting, and exit once what it has in flight is done.

use pingora::server::ListenFds;
use std::path::PathBuf;

/// Where listening sockets are handed over, and whether this process takes them over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handover {
    /// The Unix socket the sockets pass through (the old process and the new one agree on it).
    pub socket: PathBuf,
    /// Take the listening sockets over from the running process instead of binding them.
    pub take_over: bool,
}

/// The hand-over socket when none is given.
pub const DEFAULT_SOCKET: &str = "/tmp/gpulb-upgrade.sock";

impl Default for Handover {
    fn default() -> Self {
        Handover {
            socket: PathBuf::from(DEFAULT_SOCKET),
            take_over: false,
        }
    }
}

/// Why the sockets could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// No listener has started yet.
    #[error("no listening sockets to hand over yet")]
    NoSockets,
    /// The socket path is not valid Unicode (pingora takes a string).
    #[error("upgrade socket {0:?} is not a valid path")]
    BadPath(PathBuf),
    /// Sending failed: no new process waits on the socket, or it went away.
    #[error("cannot send the listening sockets to {path}: {reason} (start the new process with --upgrade first)")]
    Send {
        /// The hand-over socket.
        path: String,
        /// The cause, as pingora reports it.
        reason: String,
    },
    /// The sending task died.
    #[error("hand-over task failed: {0}")]
    Task(String),
}

impl Handover {
    /// Sends the listening sockets in `fds` to the process waiting on [`Handover::socket`];
    /// blocks (off the runtime) up to pingora's retries, about five seconds.
    pub async fn send(&self, fds: Option<ListenFds>) -> Result<(), HandoverError> {
        let fds = fds.ok_or(HandoverError::NoSockets)?;
        let path = self
            .socket
            .to_str()
            .ok_or_else(|| HandoverError::BadPath(self.socket.clone()))?
            .to_string();
        tracing::info!(socket = %path, "SIGQUIT: handing the listening sockets over");
        let sent = tokio::task::spawn_blocking(move || {
            let fds = fds.lock();
            fds.send_to_sock(path.as_str())
                .map(drop)
                .map_err(|e| HandoverError::Send {
                    path,
                    reason: e.to_string(),
                })
        });
        sent.await.map_err(|e| HandoverError::Task(e.to_string()))?
    }
}
