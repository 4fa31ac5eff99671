//! Host and process figures from the kernel's counters (Linux `/proc`), so GPU starvation (GPUs
//! idle, host CPU busy) can be told from GPU overload. Elsewhere every reading is `None`.

use std::time::Duration;

/// Cumulative CPU time of the whole host, in clock ticks, as `/proc/stat`'s `cpu` line has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every tick counted (user, nice, system, idle, iowait, irq, softirq, steal).
    pub total: u64,
    /// Ticks spent idle.
    pub idle: u64,
    /// Ticks spent idle while waiting for I/O.
    pub iowait: u64,
}

/// Host CPU use over one interval, each a fraction 0..=1 of all CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CpuRatios {
    /// Share of time neither idle nor waiting for I/O.
    pub busy: f64,
    /// Share of time idle while waiting for I/O.
    pub iowait: f64,
}

/// Parses the aggregate `cpu` line of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already
    // inside user and nice, so only the first eight fields add up to the total.
    let total = fields.iter().take(8).sum();
    Some(CpuTimes {
        total,
        idle: *fields.get(3)?,
        iowait: fields.get(4).copied().unwrap_or(0),
    })
}

impl CpuTimes {
    /// Host CPU times now; `None` where `/proc/stat` is not readable.
    pub fn read() -> Option<CpuTimes> {
        parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Use between `earlier` and `self`; `None` when no tick passed (or the counters went back).
    pub fn since(&self, earlier: &CpuTimes) -> Option<CpuRatios> {
        let total = self.total.checked_sub(earlier.total).filter(|&t| t > 0)? as f64;
        let idle = self.idle.saturating_sub(earlier.idle) as f64;
        let iowait = self.iowait.saturating_sub(earlier.iowait) as f64;
        Some(CpuRatios {
            busy: ((total - idle - iowait) / total).clamp(0.0, 1.0),
            iowait: (iowait / total).clamp(0.0, 1.0),
        })
    }
}

/// Turns successive [`CpuTimes`] reads into per-interval [`CpuRatios`].
#[derive(Debug, Default)]
pub struct CpuSampler {
    last: Option<CpuTimes>,
}

impl CpuSampler {
    /// Reads the counters; returns the use since the previous call (`None` on the first).
    pub fn sample(&mut self) -> Option<CpuRatios> {
        let now = CpuTimes::read()?;
        self.feed(now)
    }

    /// Like [`CpuSampler::sample`], with the counters given.
    pub fn feed(&mut self, now: CpuTimes) -> Option<CpuRatios> {
        let ratios = self.last.and_then(|last| now.since(&last));
        self.last = Some(now);
        ratios
    }
}

/// This process's CPU time and resident memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time.
    pub cpu: Duration,
    /// Resident set size, bytes.
    pub resident_bytes: u64,
}

/// Parses `/proc/self/stat` (utime, stime in ticks) and `/proc/self/statm` (resident pages).
pub fn parse_process(stat: &str, statm: &str, ticks_per_s: u64, page: u64) -> Option<ProcessStats> {
    // The command name (field 2) may hold spaces and parentheses: fields count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ... utime(14) stime(15); index 0 here is field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let ticks = ticks_per_s.max(1);
    let cpu_ticks = utime + stime;
    Some(ProcessStats {
        cpu: Duration::from_secs(cpu_ticks / ticks)
            + Duration::from_nanos((cpu_ticks % ticks) * 1_000_000_000 / ticks),
        resident_bytes: resident * page,
    })
}

impl ProcessStats {
    /// This process's figures now; `None` where `/proc/self` is not readable.
    pub fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        // SAFETY: sysconf only reads a constant of the running system.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        parse_process(
            &stat,
            &statm,
            u64::try_from(ticks).ok()?,
            u64::try_from(page).ok()?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 0 0\nintr 1 2\n";

    #[test]
    fn proc_stat_cpu_line_is_summed_without_guest_time() {
        let t = parse_proc_stat(STAT).unwrap();
        assert_eq!(
            t,
            CpuTimes {
                total: 1000,
                idle: 800,
                iowait: 40
            }
        );
        assert_eq!(parse_proc_stat("cpu0 1 2 3\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 x 3 4\n"), None);
    }

    #[test]
    fn ratios_cover_the_interval_only() {
        let mut sampler = CpuSampler::default();
        assert_eq!(sampler.feed(parse_proc_stat(STAT).unwrap()), None);
        let later = CpuTimes {
            total: 1200,
            idle: 850,
            iowait: 70,
        };
        let r = sampler.feed(later).unwrap();
        assert!((r.busy - 0.6).abs() < 1e-9, "{r:?}");
        assert!((r.iowait - 0.15).abs() < 1e-9, "{r:?}");
        // No tick passed: no ratio rather than a division by zero.
        assert_eq!(sampler.feed(later), None);
    }

    #[test]
    fn process_stat_handles_names_with_spaces() {
        let stat = "42 (gpu lb (x)) S 1 42 42 0 -1 4194560 100 0 0 0 250 130 0 0 20 0 8 0 5 0";
        let p = parse_process(stat, "1000 300 50 1 0 100 0", 100, 4096).unwrap();
        assert_eq!(p.cpu, Duration::from_millis(3800));
        assert_eq!(p.resident_bytes, 300 * 4096);
        assert_eq!(parse_process("garbage", "1 2", 100, 4096), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_host() {
        assert!(CpuTimes::read().is_some());
        let p = ProcessStats::read().unwrap();
        assert!(p.resident_bytes > 0);
    }
}
