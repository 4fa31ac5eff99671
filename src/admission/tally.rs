//! Counts of waiting requests kept beside each queue's own: per class (its queues, one per
//! model route, summed without a lock) and over every queue the process has (a released slot
//! wakes the admission dispatcher only while some request waits somewhere).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Where a class's queues report how many requests wait in them.
#[derive(Debug, Default)]
pub struct WaitTally {
    class: AtomicUsize,
    anywhere: Arc<AtomicUsize>,
}

impl WaitTally {
    /// A class's tally, also adding to `anywhere`, the process-wide count.
    pub fn new(anywhere: Arc<AtomicUsize>) -> Self {
        WaitTally {
            class: AtomicUsize::new(0),
            anywhere,
        }
    }

    /// Requests waiting now in the class's queues.
    pub fn class_depth(&self) -> usize {
        self.class.load(Ordering::SeqCst)
    }

    /// One queue's depth went from `before` to `after`.
    pub(super) fn moved(&self, before: usize, after: usize) {
        if after > before {
            self.class.fetch_add(after - before, Ordering::SeqCst);
            self.anywhere.fetch_add(after - before, Ordering::SeqCst);
        } else if before > after {
            self.class.fetch_sub(before - after, Ordering::SeqCst);
            self.anywhere.fetch_sub(before - after, Ordering::SeqCst);
        }
    }
}
