//! The batch clock: one thread of its own that ends batches' waits for company on time. A
//! tokio timer fires on a whole millisecond, rounded up, and only when a busy worker gets round
//! to its timers: on a loaded machine that was 1–3 ms late at p99, more than half of a 5 ms
//! `max_wait`. A thread that sleeps on a condition variable until the next deadline (as
//! Triton's dynamic batcher waits for its queue delay) wakes within a fraction of that.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// What to do when a deadline comes: a short, non-blocking call.
type Ring = Box<dyn FnOnce() + Send>;

struct Alarm {
    at: Instant,
    seq: u64,
    ring: Ring,
}

impl PartialEq for Alarm {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Alarm {}

impl PartialOrd for Alarm {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Alarm {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Default)]
struct Alarms {
    due: BinaryHeap<Reverse<Alarm>>,
    next_seq: u64,
}

/// Deadlines kept by one thread, soonest first; each is rung once, at or just after its time.
#[derive(Default)]
pub struct BatchClock {
    alarms: Mutex<Alarms>,
    changed: Condvar,
}

impl BatchClock {
    /// The process's clock; its thread starts with the first alarm set.
    pub fn global() -> &'static BatchClock {
        static CLOCK: OnceLock<&'static BatchClock> = OnceLock::new();
        CLOCK.get_or_init(|| {
            let clock: &'static BatchClock = Box::leak(Box::default());
            std::thread::Builder::new()
                .name("gpulb-batch-clock".into())
                .spawn(move || clock.keep())
                .expect("the batch clock's thread starts");
            clock
        })
    }

    /// Calls `ring` on the clock's thread once `at` comes (at once when it has passed).
    pub fn set(&self, at: Instant, ring: impl FnOnce() + Send + 'static) {
        let mut alarms = self.lock();
        let seq = alarms.next_seq;
        alarms.next_seq += 1;
        let sooner = alarms.due.peek().is_none_or(|Reverse(next)| at < next.at);
        alarms.due.push(Reverse(Alarm {
            at,
            seq,
            ring: Box::new(ring),
        }));
        drop(alarms);
        if sooner {
            self.changed.notify_one();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Alarms> {
        self.alarms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The clock's thread: rings each alarm as it comes due, sleeping until the next.
    fn keep(&self) {
        let mut alarms = self.lock();
        loop {
            let now = Instant::now();
            let next = alarms.due.peek().map(|Reverse(next)| next.at);
            alarms = match next {
                Some(at) if at <= now => {
                    let Some(Reverse(alarm)) = alarms.due.pop() else {
                        continue;
                    };
                    drop(alarms);
                    // A ring that panics must not stop the clock for every later batch.
                    if catch_unwind(AssertUnwindSafe(alarm.ring)).is_err() {
                        tracing::error!("a batch clock alarm panicked; the clock goes on");
                    }
                    self.lock()
                }
                Some(at) => {
                    let (alarms, _) = self
                        .changed
                        .wait_timeout(alarms, at - now)
                        .unwrap_or_else(|e| e.into_inner());
                    alarms
                }
                None => self.changed.wait(alarms).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn alarms_ring_in_time_order_whatever_order_they_were_set_in() {
        let clock = BatchClock::global();
        let (tx, rx) = mpsc::channel();
        let start = Instant::now();
        for (name, ms) in [("third", 60), ("first", 20), ("second", 40), ("now", 0)] {
            let tx = tx.clone();
            clock.set(start + Duration::from_millis(ms), move || {
                let _ = tx.send((name, Instant::now()));
            });
        }
        let mut rung = Vec::new();
        for _ in 0..4 {
            let (name, at) = rx.recv_timeout(Duration::from_secs(10)).expect("rung");
            rung.push((name, at - start));
        }
        let names: Vec<_> = rung.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["now", "first", "second", "third"]);
        // One that panics leaves the clock running.
        clock.set(Instant::now(), || panic!("a faulty alarm"));
        let tx = tx.clone();
        clock.set(Instant::now() + Duration::from_millis(5), move || {
            let _ = tx.send(("after", Instant::now()));
        });
        let (name, _) = rx.recv_timeout(Duration::from_secs(10)).expect("rung");
        assert_eq!(name, "after");
        for ((_, after), ms) in rung.iter().zip([0, 20, 40, 60]) {
            assert!(*after >= Duration::from_millis(ms), "rung early: {after:?}");
        }
    }
}
