//! The process-wide budget of request-body bytes held in memory (`request_body.max_held_bytes`):
//! gpulb reads a body whole before routing and keeps it until the request ends (for retries), so
//! without a bound many large uploads at once (or a client opening many connections) could hold
//! `max_connections` x `max_bytes` of memory.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Body bytes held by all requests now.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Body bytes held by all requests now (`gpulb_request_body_held_bytes`).
pub fn held_now() -> usize {
    HELD.load(Ordering::Relaxed)
}

/// One request's share of the budget, given back when it is dropped (with the request).
#[derive(Debug, Default)]
pub struct BodyBudget {
    bytes: usize,
}

impl BodyBudget {
    /// Takes `more` bytes for this request's body if all requests' together stay within
    /// `limit`; `false` (nothing taken) if they would not.
    pub fn take(&mut self, more: usize, limit: usize) -> bool {
        let taken = HELD.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            held.checked_add(more).filter(|&total| total <= limit)
        });
        if taken.is_ok() {
            self.bytes += more;
        }
        taken.is_ok()
    }

    /// Bytes this request holds.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for BodyBudget {
    fn drop(&mut self) {
        if self.bytes > 0 {
            HELD.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_taken_within_the_limit_and_given_back_on_drop() {
        // Other unit tests do not touch the budget, so the total starts from what is here.
        let base = held_now();
        let limit = base + 100;
        let mut a = BodyBudget::default();
        assert!(a.take(60, limit));
        let mut b = BodyBudget::default();
        assert!(!b.take(50, limit), "160 of 100");
        assert!(b.take(40, limit));
        assert_eq!((a.bytes(), b.bytes()), (60, 40));
        assert_eq!(held_now(), base + 100);
        drop(a);
        assert_eq!(held_now(), base + 40);
        assert!(b.take(60, limit));
        drop(b);
        assert_eq!(held_now(), base);
        let mut c = BodyBudget::default();
        assert!(c.take(1, usize::MAX));
        assert!(!c.take(usize::MAX, usize::MAX), "overflow");
    }
}
