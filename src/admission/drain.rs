//! Observed drain rate of a queue (grants per second, smoothed), for an honest Retry-After.

use std::time::Duration;
use tokio::time::Instant;

/// Length of one sampling window.
const WINDOW: Duration = Duration::from_secs(1);
/// Weight of one window's sample in the moving average.
const ALPHA: f64 = 0.3;
/// Bounds of the Retry-After hint.
const MIN_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(60);

/// An exponentially weighted moving average of grants per second, sampled only while requests
/// wait (an idle queue says nothing about how fast it drains).
#[derive(Debug)]
pub(super) struct DrainRate {
    window_start: Instant,
    granted_at_start: u64,
    /// Whether a request waited at some point in the current window.
    pressured: bool,
    per_second: Option<f64>,
}

impl DrainRate {
    /// No observation yet.
    pub(super) fn new(now: Instant) -> Self {
        DrainRate {
            window_start: now,
            granted_at_start: 0,
            pressured: false,
            per_second: None,
        }
    }

    /// Marks the current window as one in which requests waited.
    pub(super) fn note_waiting(&mut self) {
        self.pressured = true;
    }

    /// Closes the current window if it is over; `granted` is the running total of grants.
    pub(super) fn roll(&mut self, now: Instant, granted: u64, depth: usize) {
        self.pressured |= depth > 0;
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed < WINDOW {
            return;
        }
        let count = granted.saturating_sub(self.granted_at_start);
        if self.pressured || count > 0 {
            let secs = elapsed.as_secs_f64();
            let sample = count as f64 / secs;
            // A gap of several windows weighs as much as that many windows would have.
            let alpha = 1.0 - (1.0 - ALPHA).powf(secs / WINDOW.as_secs_f64());
            self.per_second = Some(match self.per_second {
                Some(rate) => rate + alpha * (sample - rate),
                None => sample,
            });
        }
        self.window_start = now;
        self.granted_at_start = granted;
        self.pressured = depth > 0;
    }

    /// Time to drain `depth` requests at the observed rate, in [1 s, 60 s]; 1 s when unknown.
    pub(super) fn retry_after(&self, depth: usize) -> Duration {
        match self.per_second {
            Some(rate) if depth > 0 && rate > 0.0 => {
                let secs = (depth as f64 / rate).min(MAX_RETRY.as_secs_f64());
                Duration::from_secs_f64(secs).clamp(MIN_RETRY, MAX_RETRY)
            }
            // Requests wait and none has left the queue lately: the longest hint is the honest one.
            Some(_) if depth > 0 => MAX_RETRY,
            _ => MIN_RETRY,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_rate_or_empty_queue_gives_one_second() {
        let start = Instant::now();
        let mut rate = DrainRate::new(start);
        assert_eq!(rate.retry_after(50), MIN_RETRY);
        // Idle windows are not samples.
        rate.roll(start + Duration::from_secs(5), 0, 0);
        assert_eq!(rate.per_second, None);
        assert_eq!(rate.retry_after(0), MIN_RETRY);
    }

    #[test]
    fn steady_drain_gives_depth_over_rate() {
        let start = Instant::now();
        let mut rate = DrainRate::new(start);
        rate.note_waiting();
        for second in 1..=10u64 {
            rate.roll(start + Duration::from_secs(second), second * 10, 50);
        }
        let per_second = rate.per_second.unwrap();
        assert!((per_second - 10.0).abs() < 0.01, "{per_second}");
        let hint = rate.retry_after(50);
        assert!(hint > Duration::from_millis(4900) && hint < Duration::from_millis(5100));
        assert_eq!(rate.retry_after(5), MIN_RETRY, "clamped below");
        assert_eq!(rate.retry_after(100_000), MAX_RETRY, "clamped above");
    }

    #[test]
    fn a_stalled_queue_pushes_the_hint_up() {
        let start = Instant::now();
        let mut rate = DrainRate::new(start);
        rate.note_waiting();
        rate.roll(start + Duration::from_secs(1), 10, 20);
        let before = rate.retry_after(20);
        // Three seconds with requests waiting and nothing granted.
        rate.roll(start + Duration::from_secs(4), 10, 20);
        let after = rate.retry_after(20);
        assert!(after > before, "{after:?} > {before:?}");
        assert!(after <= MAX_RETRY);
    }
}
