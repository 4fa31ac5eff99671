//! Reloads a running target's config on a fixed cadence while the trace is served: each tick
//! rewrites its config file with a real change and asks the target to reload it the way its
//! operators do — gpulb `POST /reload` on its admin listener, nginx `SIGHUP` to the master
//! (what `nginx -s reload` sends), HAProxy `SIGUSR2` to the master-worker master.

use crate::procs;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The environment variable holding the admin token of the gpulb configs this harness writes
/// (`admin.token_env`), and the token it sets there.
pub const TOKEN_ENV: &str = "GPULB_BENCH_ADMIN_TOKEN";
pub const TOKEN: &str = "bench-reload-token";

/// How a target is told to reload.
#[derive(Clone, Debug)]
pub enum Trigger {
    /// `POST /reload` with the bench token on gpulb's admin listener; its answer says whether
    /// a new config was applied.
    Admin(SocketAddr),
    /// A signal to the master process (nginx `SIGHUP`, HAProxy master-worker `SIGUSR2`).
    Signal { pid: i32, signal: i32 },
}

/// One target's reload plan: where its config lives, what to toggle in it, how to trigger.
#[derive(Clone, Debug)]
pub struct Plan {
    pub every: Duration,
    pub config: PathBuf,
    /// A line fragment switched back and forth on every reload (the real change), as
    /// (original, alternate); the file also gets a numbered comment.
    pub toggle: (&'static str, &'static str),
    pub trigger: Trigger,
    /// The target's process group, sampled each tick for the worker processes it starts.
    pub pgid: i32,
}

/// What the reloads did.
#[derive(Clone, Debug, Default)]
pub struct Count {
    /// Reloads triggered (file rewritten and signal sent or POST answered).
    pub sent: usize,
    /// Triggers that went through: for gpulb, POSTs answered `applied` (a new generation in
    /// force); for a signal, delivered.
    pub applied: usize,
    /// Triggers that failed (signal refused, POST not answered or not applied), with the last
    /// reason.
    pub failed: usize,
    pub last_error: Option<String>,
    /// Processes seen in the target's group that were not there when reloading began
    /// (nginx and HAProxy start new workers on each reload; sampled each tick, so a worker
    /// that came and went between two ticks is missed).
    pub new_processes: usize,
    /// Most processes of the group alive at one tick (old workers still draining included).
    pub max_processes: usize,
}

/// Reloads running on a thread of their own until [`Reloader::finish`].
pub struct Reloader {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<Count>,
}

impl Reloader {
    /// Starts reloading per `plan`; the first reload comes one period from now.
    pub fn start(plan: Plan) -> Result<Reloader, String> {
        let original = std::fs::read_to_string(&plan.config)
            .map_err(|e| format!("cannot read {}: {e}", plan.config.display()))?;
        if !original.contains(plan.toggle.0) {
            return Err(format!(
                "{} has no {:?} to toggle on reload",
                plan.config.display(),
                plan.toggle.0
            ));
        }
        let (stop, stopped) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("bench-reload".into())
            .spawn(move || reload_loop(&plan, &original, &stopped))
            .map_err(|e| format!("cannot start the reload thread: {e}"))?;
        Ok(Reloader { stop, handle })
    }

    /// Stops reloading (after the reload in progress, if any) and returns the count.
    pub fn finish(self) -> Count {
        let _ = self.stop.send(());
        self.handle.join().unwrap_or_default()
    }
}

fn reload_loop(plan: &Plan, original: &str, stopped: &mpsc::Receiver<()>) -> Count {
    let mut count = Count::default();
    let before: HashSet<i32> = procs::group_pids(plan.pgid).into_iter().collect();
    let mut seen = before.clone();
    let mut next = Instant::now() + plan.every;
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        match stopped.recv_timeout(wait) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => break,
        }
        // Ticks keep their schedule; a reload that overran skips the ticks it covered.
        next += plan.every;
        while next < Instant::now() {
            next += plan.every;
        }
        count.sent += 1;
        let result = rewrite(&plan.config, original, plan.toggle, count.sent)
            .and_then(|()| trigger(&plan.trigger));
        match result {
            Ok(()) => count.applied += 1,
            Err(e) => {
                count.failed += 1;
                count.last_error = Some(e);
            }
        }
        let now = procs::group_pids(plan.pgid);
        count.max_processes = count.max_processes.max(now.len());
        seen.extend(now);
    }
    count.new_processes = seen.difference(&before).count();
    count
}

/// Writes the `n`th version of the config: the toggle switched on odd `n`, a comment with `n`
/// appended; written beside and renamed over, so a reader never sees half a file.
fn rewrite(path: &Path, original: &str, toggle: (&str, &str), n: usize) -> Result<(), String> {
    let mut text = if n % 2 == 1 {
        original.replace(toggle.0, toggle.1)
    } else {
        original.to_string()
    };
    text.push_str(&format!("# bench reload {n}\n"));
    let tmp = path.with_extension("reload-tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot rename onto {}: {e}", path.display()))
}

/// Asks the target to reload: Ok once the signal is delivered, or once gpulb answers that it
/// applied the new file.
fn trigger(how: &Trigger) -> Result<(), String> {
    match *how {
        Trigger::Admin(addr) => post_reload(addr),
        Trigger::Signal { pid, signal } => {
            // SAFETY: kill(2) to the master of a process group this harness started.
            match unsafe { libc::kill(pid, signal) } {
                0 => Ok(()),
                _ => Err(format!("kill: {}", std::io::Error::last_os_error())),
            }
        }
    }
}

/// `POST /reload` with the bench token; Ok when gpulb answers 200 `"result":"applied"`.
fn post_reload(addr: SocketAddr) -> Result<(), String> {
    let timeout = Duration::from_secs(5);
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let request = format!(
        "POST /reload HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let answer = read_answer(&mut s)?;
    // The answer is pretty-printed JSON: compare without whitespace.
    let compact: String = answer.split_whitespace().collect();
    if answer.starts_with("HTTP/1.1 200") && compact.contains("\"result\":\"applied\"") {
        Ok(())
    } else {
        let first = answer.lines().next().unwrap_or("no answer");
        Err(format!("POST /reload: {first}"))
    }
}

/// One HTTP/1.1 answer: its head and a body of its `Content-Length` (or up to the close).
fn read_answer(s: &mut TcpStream) -> Result<String, String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(usize::MAX);
            if buf.len() >= end + 4 + length {
                break;
            }
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rewrite_changes_the_file_and_switches_the_setting_back_and_forth() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        let original = "a: 1\nkeepalive 64;\n";
        let toggle = ("keepalive 64;", "keepalive 63;");
        let mut seen = HashSet::new();
        for n in 1..=4 {
            rewrite(&path, original, toggle, n).unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(text.contains("keepalive 63;"), n % 2 == 1, "{text}");
            assert!(text.ends_with(&format!("# bench reload {n}\n")));
            assert!(seen.insert(text), "reload {n} wrote the same file again");
        }
        assert!(!path.with_extension("reload-tmp").exists());
    }
}
