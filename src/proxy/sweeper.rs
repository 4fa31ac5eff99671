//! One task per thread that checks the deadlines of every upstream watchdog started on it, a
//! tick at a time, instead of a task and a timer per request.
//!
//! A watch is held weakly: dropping its owner ends it, and the sweeper forgets it at its next
//! tick. The task runs while it has watches and ends when the last is gone; the next watch
//! starts it again. If its runtime shuts down under it, the next watch on the thread starts a
//! new one. Its tick is the shortest any watch asked for since it started (a reload to longer
//! timeouts lengthens it once the task has been idle).

use std::cell::RefCell;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// Something with a deadline to check.
pub(super) trait Watched: Send + Sync + 'static {
    /// Acts on the deadline if it has passed; false once there is nothing more to check.
    fn check(&self) -> bool;
}

#[derive(Default)]
struct Sweeper {
    inner: Mutex<Inner>,
    /// Wakes the task when a watch asks for a shorter tick than it sleeps.
    shorter_tick: Notify,
}

#[derive(Default)]
struct Inner {
    watched: Vec<Weak<dyn Watched>>,
    tick: Duration,
    /// The running task's number, if one runs.
    running: Option<u64>,
    started: u64,
}

thread_local! {
    static SWEEPER: RefCell<Option<Arc<Sweeper>>> = const { RefCell::new(None) };
}

/// Checks `watched` every `tick` (or more often, when another watch asks for it) on this
/// thread's sweeper until it is dropped or its `check` says it is over. Must run inside a tokio
/// runtime.
pub(super) fn watch(watched: Weak<dyn Watched>, tick: Duration) {
    // `add` touches nothing thread-local, so the borrow is held across it.
    SWEEPER.with(|s| {
        s.borrow_mut()
            .get_or_insert_with(Arc::default)
            .add(watched, tick)
    });
}

impl Sweeper {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(self: &Arc<Self>, watched: Weak<dyn Watched>, tick: Duration) {
        let start = {
            let mut inner = self.lock();
            inner.watched.push(watched);
            if inner.running.is_none() {
                inner.started += 1;
                inner.running = Some(inner.started);
                inner.tick = tick;
                Some(inner.started)
            } else {
                if tick < inner.tick {
                    inner.tick = tick;
                    self.shorter_tick.notify_one();
                }
                None
            }
        };
        // Spawned with the lock released: a runtime shutting down drops the task at once.
        if let Some(number) = start {
            tokio::spawn(Sweeper::run(Running {
                sweeper: Arc::clone(self),
                number,
            }));
        }
    }

    /// The task: `running` marks the sweeper idle when it ends, however it ends (dropped by its
    /// runtime, even before its first poll, the next watch starts another).
    async fn run(running: Running) {
        let sweeper = &running.sweeper;
        loop {
            let tick = sweeper.lock().tick;
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                () = sweeper.shorter_tick.notified() => continue,
            }
            let mut inner = sweeper.lock();
            inner
                .watched
                .retain(|w| w.upgrade().is_some_and(|w| w.check()));
            if inner.watched.is_empty() {
                // Idle from here, under the lock: a watch added after this starts a new task.
                inner.running = None;
                return;
            }
        }
    }
}

/// Owned by the sweeper's task: marks the sweeper idle when the task ends.
struct Running {
    sweeper: Arc<Sweeper>,
    number: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut inner = self.sweeper.lock();
        if inner.running == Some(self.number) {
            inner.running = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts its checks; over after `checks`.
    struct Countdown {
        checked: AtomicUsize,
        checks: usize,
    }

    impl Countdown {
        fn new(checks: usize) -> Arc<Countdown> {
            Arc::new(Countdown {
                checked: AtomicUsize::new(0),
                checks,
            })
        }
        fn checked(&self) -> usize {
            self.checked.load(Ordering::SeqCst)
        }
    }

    impl Watched for Countdown {
        fn check(&self) -> bool {
            self.checked.fetch_add(1, Ordering::SeqCst) + 1 < self.checks
        }
    }

    fn start(w: &Arc<Countdown>, tick: Duration) {
        let weak: Weak<Countdown> = Arc::downgrade(w);
        watch(weak, tick);
    }

    fn running() -> bool {
        SWEEPER.with(|s| {
            s.borrow()
                .as_ref()
                .is_some_and(|s| s.lock().running.is_some())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_is_checked_each_tick_until_it_is_over_and_then_the_task_ends() {
        let w = Countdown::new(3);
        start(&w, Duration::from_millis(10));
        tokio::time::sleep(Duration::from_millis(25)).await;
        assert_eq!(w.checked(), 2);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(w.checked(), 3, "checked after it said it was over");
        assert!(!running(), "the task runs with nothing to watch");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_watch_is_not_checked_and_a_shorter_tick_wakes_the_task() {
        let slow = Countdown::new(usize::MAX);
        start(&slow, Duration::from_secs(1));
        // The task is asleep for a second when the shorter tick comes.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let dropped = Countdown::new(usize::MAX);
        start(&dropped, Duration::from_secs(1));
        let probe = Arc::clone(&dropped);
        drop(dropped);
        drop(probe);
        let fast = Countdown::new(usize::MAX);
        start(&fast, Duration::from_millis(10));
        tokio::time::sleep(Duration::from_millis(55)).await;
        assert_eq!(fast.checked(), 5, "the shorter tick did not take over");
        assert_eq!(slow.checked(), 5, "every watch is checked at each tick");
        let held = SWEEPER.with(|s| s.borrow().as_ref().map(|s| s.lock().watched.len()));
        assert_eq!(held, Some(2), "the dropped watch is still held");
    }

    #[test]
    fn a_watch_after_the_runtime_went_away_gets_a_new_task() {
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let forever = Countdown::new(usize::MAX);
        first.block_on(async { start(&forever, Duration::from_millis(5)) });
        drop(first);
        assert!(!running(), "the dropped task still counts as running");

        let second = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let w = Countdown::new(2);
        second.block_on(async {
            start(&w, Duration::from_millis(5));
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
        assert_eq!(w.checked(), 2);
    }
}
