//! Child processes (the proxies) in their own process groups, killed by a guard on every exit
//! path; CPU time read from /proc.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Process groups of every child still alive, for the signal handler.
static LIVE: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<i32>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// SIGKILLs every child process group still registered (used from the Ctrl-C handler).
pub fn kill_all_live() {
    for &pgid in live().iter() {
        // SAFETY: kill(2) on a process group this program created; no memory is touched.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// A child process leading its own process group; dropping the guard ends the whole group.
pub struct ChildGuard {
    pub name: String,
    child: Option<Child>,
    pgid: i32,
}

impl ChildGuard {
    /// Spawns `cmd` in a new process group with stdout and stderr going to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> std::io::Result<ChildGuard> {
        use std::os::unix::process::CommandExt;
        let out = File::create(log)?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        let child = cmd.spawn()?;
        let pgid = child.id() as i32;
        live().push(pgid);
        Ok(ChildGuard {
            name: name.to_string(),
            child: Some(child),
            pgid,
        })
    }

    pub fn pid(&self) -> i32 {
        self.pgid
    }

    /// `Some(description)` if the child has already exited.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    /// SIGTERM to the group, up to 3 s for the leader to exit, then SIGKILL to what is left.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: signals to the process group this guard created.
        unsafe {
            libc::kill(-self.pgid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Members left over (or a leader that ignored SIGTERM). While any member lives the
        // group id cannot be reused, so this only reaches our own processes.
        if child.try_wait().ok().flatten().is_none() || !group_members(self.pgid).is_empty() {
            // SAFETY: as above.
            unsafe {
                libc::kill(-self.pgid, libc::SIGKILL);
            }
        }
        let _ = child.wait();
        live().retain(|&p| p != self.pgid);
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// (comm, fields after the comm) of a /proc stat file.
fn parse_stat(text: &str) -> Option<(String, Vec<String>)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let rest = text[close + 1..]
        .split_whitespace()
        .map(str::to_string)
        .collect();
    Some((comm, rest))
}

/// utime + stime in seconds from the fields after the comm (fields 14 and 15 of stat).
fn cpu_of(rest: &[String]) -> f64 {
    let ticks = |i: usize| {
        rest.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / clk_tck()
}

/// Pids of the live processes of process group `pgid`.
fn group_members(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((_, rest)) = parse_stat(&text) {
            // rest[0] = state, rest[2] = pgrp
            if rest.get(2).and_then(|v| v.parse::<i32>().ok()) == Some(pgid)
                && rest.first().map(String::as_str) != Some("Z")
            {
                out.push(pid);
            }
        }
    }
    out
}

/// Pids of the live processes of process group `pgid` (a master and its workers).
pub fn group_pids(pgid: i32) -> Vec<i32> {
    group_members(pgid)
}

/// Resident memory, KiB, of every live process of group `pgid` together (nginx master + workers).
pub fn group_rss_kb(pgid: i32) -> u64 {
    group_members(pgid)
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum()
}

/// CPU seconds used so far by every live process of group `pgid` (nginx master + workers).
pub fn group_cpu(pgid: i32) -> f64 {
    group_members(pgid)
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|t| parse_stat(&t))
        .map(|(_, rest)| cpu_of(&rest))
        .sum()
}

/// CPU seconds of this process's threads, summed by thread-name prefix: the harness client
/// runtime ("bench-client"), the simulated fleet ("bench-sim") and everything else.
#[derive(Clone, Copy, Debug, Default)]
pub struct SelfCpu {
    pub client: f64,
    pub sim: f64,
    pub other: f64,
}

impl SelfCpu {
    pub fn read() -> SelfCpu {
        let mut cpu = SelfCpu::default();
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return cpu;
        };
        for entry in dir.flatten() {
            let path = entry.path().join("stat");
            let Some((comm, rest)) = std::fs::read_to_string(path)
                .ok()
                .and_then(|t| parse_stat(&t))
            else {
                continue;
            };
            let secs = cpu_of(&rest);
            if comm.starts_with("bench-client") {
                cpu.client += secs;
            } else if comm.starts_with("bench-sim") {
                cpu.sim += secs;
            } else {
                cpu.other += secs;
            }
        }
        cpu
    }

    pub fn since(self, before: SelfCpu) -> SelfCpu {
        SelfCpu {
            client: self.client - before.client,
            sim: self.sim - before.sim,
            other: self.other - before.other,
        }
    }
}

/// Whole-process CPU seconds from /proc/self/stat (every thread, live and exited).
pub fn process_cpu() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|t| parse_stat(&t))
        .map(|(_, rest)| cpu_of(&rest))
        .unwrap_or(0.0)
}
