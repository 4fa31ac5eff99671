//! Live per-backend and per-class state: in-flight counters and the RAII slots that hold them.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// An in-flight counter with an optional cap; each unit is held by a [`Slot`].
#[derive(Debug, Default)]
pub struct InflightCounter {
    value: AtomicU32,
}

impl InflightCounter {
    /// Requests in flight now.
    pub fn get(&self) -> u32 {
        self.value.load(Ordering::Acquire)
    }

    /// Takes one unit if the count is below `cap`; the unit is given back when the slot drops.
    pub fn try_acquire(self: &Arc<Self>, cap: u32) -> Option<Slot> {
        self.value
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot {
                counter: Arc::clone(self),
            })
    }
}

/// One unit of an [`InflightCounter`], released exactly once when dropped.
#[derive(Debug)]
pub struct Slot {
    counter: Arc<InflightCounter>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counter.value.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Live state of one backend; shared by every pool that lists it and kept across reloads.
#[derive(Debug)]
pub struct BackendState {
    /// The backend's configured name.
    pub name: String,
    /// Requests this proxy has in flight on the backend.
    pub outstanding: Arc<InflightCounter>,
    /// Requests ever sent to the backend (each attempt counts).
    pub attempts_total: AtomicU64,
}

impl BackendState {
    /// Fresh state for a backend with no traffic yet.
    pub fn new(name: impl Into<String>) -> Self {
        BackendState {
            name: name.into(),
            outstanding: Arc::new(InflightCounter::default()),
            attempts_total: AtomicU64::new(0),
        }
    }
}

/// Live state of one class.
#[derive(Debug, Default)]
pub struct ClassState {
    /// Requests of this class in flight now.
    pub outstanding: Arc<InflightCounter>,
}

/// A backend slot held by one request attempt; dropping it releases the slot.
#[derive(Debug)]
pub struct Lease {
    /// Index of the backend in the snapshot the request runs under.
    pub backend: usize,
    _slot: Slot,
}

impl Lease {
    /// Wraps a slot taken on backend `backend` of a snapshot.
    pub fn new(backend: usize, slot: Slot) -> Self {
        Lease {
            backend,
            _slot: slot,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_respect_the_cap_and_release_on_drop() {
        let counter = Arc::new(InflightCounter::default());
        let a = counter.try_acquire(2).unwrap();
        let b = counter.try_acquire(2).unwrap();
        assert!(counter.try_acquire(2).is_none());
        assert_eq!(counter.get(), 2);
        drop(a);
        assert_eq!(counter.get(), 1);
        let c = counter.try_acquire(2).unwrap();
        drop((b, c));
        assert_eq!(counter.get(), 0);
    }

    #[test]
    fn concurrent_acquires_never_exceed_the_cap() {
        let counter = Arc::new(InflightCounter::default());
        let held: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        (0..100)
                            .filter_map(|_| counter.try_acquire(50))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(held.len(), 50);
        assert_eq!(counter.get(), 50);
        drop(held);
        assert_eq!(counter.get(), 0);
    }
}
