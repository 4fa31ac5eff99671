//! When a batch stops waiting for members: before its `max_wait`, early by how late this
//! process has lately woken from a batch timer, so that a batch closes by its `max_wait` on a
//! busy machine too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// tokio's timer fires on whole milliseconds, rounding up.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// How late a class's batch timers have lately fired: a maximum that each wake-up raises to its
/// own lateness and otherwise lowers by a sixty-fourth, so it stays near the latest of roughly
/// the last hundred wake-ups (their p99, which the assembly delay's p99 follows): a busy runtime
/// moves the next timers earlier and a quiet spell moves them back.
#[derive(Debug, Default)]
pub struct TimerLateness {
    micros: AtomicU64,
}

impl TimerLateness {
    /// When a batch opened at `opened` stops waiting: early by two ticks or by a tick more than
    /// the lateness lately seen, or a twentieth of `max_wait` when that is more, but never by
    /// more than half of `max_wait`.
    pub fn closing_time(&self, opened: Instant, max_wait: Duration) -> Instant {
        let late = Duration::from_micros(self.micros.load(Ordering::Relaxed));
        let early = (2 * TIMER_TICK)
            .max(TIMER_TICK + late)
            .max(max_wait / 20)
            .min(max_wait / 2);
        opened + max_wait - early
    }

    /// Notes that a timer set for `target` fired only now; how late that is.
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
                Some(late.max(lately - lately / 64))
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
    fn on_time_the_timer_is_set_early_by_two_ticks_a_twentieth_or_at_most_half() {
        let lateness = TimerLateness::default();
        assert_eq!(wait(&lateness, 5), Duration::from_millis(3));
        assert_eq!(wait(&lateness, 100), Duration::from_millis(95));
        assert_eq!(wait(&lateness, 2), Duration::from_millis(1));
    }

    #[test]
    fn late_wake_ups_move_the_timer_earlier_within_half_of_max_wait_then_decay() {
        let lateness = TimerLateness::default();
        lateness.noted(Duration::from_micros(1_500));
        // A tick more than the 1.5 ms lately seen.
        assert_eq!(wait(&lateness, 10), Duration::from_micros(7_500));
        assert_eq!(wait(&lateness, 100), Duration::from_millis(95));
        lateness.noted(Duration::from_millis(40));
        assert_eq!(wait(&lateness, 10), Duration::from_millis(5));
        // Wake-ups on time lower it by a sixty-fourth each.
        lateness.noted(Duration::ZERO);
        assert!(lateness.lately() > Duration::from_millis(39));
        for _ in 0..300 {
            lateness.noted(Duration::ZERO);
        }
        assert!(
            lateness.lately() < Duration::from_millis(1),
            "{:?}",
            lateness.lately()
        );
        assert_eq!(wait(&lateness, 5), Duration::from_millis(3));
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
