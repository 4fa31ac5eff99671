//! When a batch stops waiting for members: before its `max_wait`, early by how late the batch
//! clock has lately rung, so that a batch closes by its `max_wait` on a busy machine too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// How much earlier than the lateness lately seen a batch's alarm is set: room for a wake-up a
/// little later than any of the last hundred (a thread's sleep alone overshoots by ~0.1 ms).
const SLACK: Duration = Duration::from_micros(250);

/// How late a class's batch alarms have lately rung: a maximum that each wake-up raises to its
/// own lateness and otherwise lowers by a sixty-fourth, so it stays near the latest of roughly
/// the last hundred wake-ups (their p99, which the assembly delay's p99 follows): a busy runtime
/// moves the next timers earlier and a quiet spell moves them back.
#[derive(Debug, Default)]
pub struct TimerLateness {
    micros: AtomicU64,
}

impl TimerLateness {
    /// When a batch opened at `opened` stops waiting: early by [`SLACK`] more than the lateness
    /// lately seen, or a twentieth of `max_wait` when that is more, but never by more than half
    /// of `max_wait`.
    pub fn closing_time(&self, opened: Instant, max_wait: Duration) -> Instant {
        let late = Duration::from_micros(self.micros.load(Ordering::Relaxed));
        let early = (SLACK + late).max(max_wait / 20).min(max_wait / 2);
        opened + max_wait - early
    }

    /// Notes that an alarm set for `target` rang only now; how late that is.
    pub fn woke(&self, target: Instant) -> Duration {
        let late = Instant::now().saturating_duration_since(target);
        self.noted(late);
        late
    }

    fn noted(&self, late: Duration) {
        let late = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |lately| {
                Some(late.max(lately - lately.div_ceil(64)))
            });
    }

    /// The lateness lately seen.
    #[cfg(test)]
    fn lately(&self) -> Duration {
        Duration::from_micros(self.micros.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(lateness: &TimerLateness, max_wait_ms: u64) -> Duration {
        let opened = Instant::now();
        lateness.closing_time(opened, Duration::from_millis(max_wait_ms)) - opened
    }

    #[test]
    fn on_time_the_alarm_is_set_early_by_the_slack_a_twentieth_or_at_most_half() {
        let lateness = TimerLateness::default();
        assert_eq!(wait(&lateness, 4), Duration::from_micros(3_750));
        assert_eq!(wait(&lateness, 100), Duration::from_millis(95));
        assert_eq!(wait(&lateness, 0), Duration::ZERO);
    }

    #[test]
    fn late_wake_ups_move_the_alarm_earlier_within_half_of_max_wait_then_decay() {
        let lateness = TimerLateness::default();
        lateness.noted(Duration::from_micros(1_500));
        // The slack more than the 1.5 ms lately seen.
        assert_eq!(wait(&lateness, 10), Duration::from_micros(8_250));
        assert_eq!(wait(&lateness, 100), Duration::from_millis(95));
        lateness.noted(Duration::from_millis(40));
        assert_eq!(wait(&lateness, 10), Duration::from_millis(5));
        // Wake-ups on time lower it by a sixty-fourth each (rounded up, so it reaches zero).
        lateness.noted(Duration::ZERO);
        assert!(lateness.lately() > Duration::from_millis(39));
        for _ in 0..1_000 {
            lateness.noted(Duration::ZERO);
        }
        assert!(lateness.lately().is_zero(), "{:?}", lateness.lately());
        assert_eq!(wait(&lateness, 5), Duration::from_micros(4_750));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_is_timed_against_its_target() {
        let lateness = TimerLateness::default();
        let target = Instant::now();
        tokio::time::advance(Duration::from_millis(3)).await;
        lateness.woke(target);
        assert_eq!(lateness.lately(), Duration::from_millis(3));
    }
}
