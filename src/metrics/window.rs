//! Recent latency percentiles: one small log-scale histogram per second for the last minute, so
//! `/status` and the dashboard can show p50/p99 without keeping every sample.
//!
//! Buckets grow by 20% from 1 ms to past 10 minutes; a percentile is reported as its bucket's
//! geometric middle, so it is within about 10% of the true value.

use std::sync::Mutex;
use std::time::Duration;

/// Seconds of history kept.
pub const WINDOW_SECS: u64 = 60;
const BUCKETS: usize = 76;
const FIRST: f64 = 0.001;
const GROWTH: f64 = 1.2;

/// p50 and p99 of some latency, seconds; `None` when nothing was observed in the span.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

#[derive(Clone, Copy)]
struct Second {
    at: u64,
    duration: [u32; BUCKETS],
    ttfb: [u32; BUCKETS],
}

const EMPTY: Second = Second {
    at: u64::MAX,
    duration: [0; BUCKETS],
    ttfb: [0; BUCKETS],
};

/// Request latencies of the last [`WINDOW_SECS`] seconds, by second.
pub struct LatencyWindow {
    seconds: Mutex<Box<[Second; WINDOW_SECS as usize]>>,
}

impl Default for LatencyWindow {
    fn default() -> Self {
        LatencyWindow {
            seconds: Mutex::new(Box::new([EMPTY; WINDOW_SECS as usize])),
        }
    }
}

impl std::fmt::Debug for LatencyWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyWindow").finish_non_exhaustive()
    }
}

fn bucket(d: Duration) -> usize {
    let s = d.as_secs_f64();
    if s <= FIRST {
        return 0;
    }
    (((s / FIRST).ln() / GROWTH.ln()).ceil() as usize).min(BUCKETS - 1)
}

/// Geometric middle of bucket `i`'s range, seconds.
fn middle(i: usize) -> f64 {
    match i {
        0 => FIRST,
        _ => FIRST * GROWTH.powf(i as f64 - 0.5),
    }
}

fn quantile(counts: &[u32; BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, &c) in counts.iter().enumerate() {
        seen += u64::from(c);
        if seen >= rank {
            return Some(middle(i));
        }
    }
    Some(middle(BUCKETS - 1))
}

impl LatencyWindow {
    /// Records one finished request at second `now_s` (any monotonic second count).
    pub fn record(&self, now_s: u64, duration: Duration, ttfb: Option<Duration>) {
        let Ok(mut seconds) = self.seconds.lock() else {
            return;
        };
        let slot = &mut seconds[(now_s % WINDOW_SECS) as usize];
        if slot.at != now_s {
            *slot = EMPTY;
            slot.at = now_s;
        }
        let b = &mut slot.duration[bucket(duration)];
        *b = b.saturating_add(1);
        if let Some(t) = ttfb {
            let b = &mut slot.ttfb[bucket(t)];
            *b = b.saturating_add(1);
        }
    }

    /// Percentiles of (duration, time to first byte) over the last `span_s` seconds up to `now_s`.
    pub fn percentiles(&self, now_s: u64, span_s: u64) -> (Percentiles, Percentiles) {
        let mut duration = [0u32; BUCKETS];
        let mut ttfb = [0u32; BUCKETS];
        if let Ok(seconds) = self.seconds.lock() {
            let oldest = now_s.saturating_sub(span_s.clamp(1, WINDOW_SECS) - 1);
            for s in seconds.iter().filter(|s| s.at >= oldest && s.at <= now_s) {
                for i in 0..BUCKETS {
                    duration[i] = duration[i].saturating_add(s.duration[i]);
                    ttfb[i] = ttfb[i].saturating_add(s.ttfb[i]);
                }
            }
        }
        let p = |c: &[u32; BUCKETS]| Percentiles {
            p50: quantile(c, 0.5),
            p99: quantile(c, 0.99),
        };
        (p(&duration), p(&ttfb))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn close(got: Option<f64>, want: f64) -> bool {
        got.is_some_and(|g| (g - want).abs() <= want * 0.11)
    }

    #[test]
    fn percentiles_are_within_a_bucket() {
        let w = LatencyWindow::default();
        for i in 1..=100 {
            w.record(5, ms(i * 10), Some(ms(i)));
        }
        let (d, t) = w.percentiles(5, 60);
        assert!(close(d.p50, 0.5), "{d:?}");
        assert!(close(d.p99, 0.99), "{d:?}");
        assert!(close(t.p50, 0.05), "{t:?}");
        assert!(close(t.p99, 0.099), "{t:?}");
    }

    #[test]
    fn old_seconds_leave_the_window() {
        let w = LatencyWindow::default();
        w.record(10, ms(100), None);
        assert!(close(w.percentiles(10, 60).0.p50, 0.1));
        assert_eq!(w.percentiles(10, 60).1, Percentiles::default());
        // Still inside a one-minute span, outside a ten-second one.
        assert!(w.percentiles(30, 60).0.p50.is_some());
        assert_eq!(w.percentiles(30, 10).0.p50, None);
        // A minute later the slot is reused and the old sample is gone.
        w.record(70, ms(2000), None);
        let (d, _) = w.percentiles(70, 60);
        assert!(close(d.p50, 2.0), "{d:?}");
        assert!(close(d.p99, 2.0), "{d:?}");
    }

    #[test]
    fn extremes_land_in_the_end_buckets() {
        assert_eq!(bucket(Duration::ZERO), 0);
        assert_eq!(bucket(Duration::from_secs(100_000)), BUCKETS - 1);
        assert!(middle(BUCKETS - 1) > 600.0);
        let w = LatencyWindow::default();
        assert_eq!(w.percentiles(0, 60).0, Percentiles::default());
    }
}
