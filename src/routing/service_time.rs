//! Measured service time per backend for one class: how long its requests take there.
//!
//! gpulb measures this itself, from the moment a request gets its backend slot to the end of a
//! successful response, so it works for any HTTP worker. Speed-aware placement
//! (`placement: speed_weighted | earliest_finish`) reads it to tell a slow GPU from a fast one.
//!
//! Requests of one class differ in size (a 128-token and a 384-token job), and a handful of
//! them decides a moving average, so two identical GPUs could look 2x apart. Each sample is
//! therefore taken per byte of response (for an LLM server, roughly per generated token), and
//! the estimate for a backend is its time per byte times the class's mean response size.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Weight of the newest sample in the moving averages.
const SMOOTHING: f64 = 0.2;
/// Samples needed on a backend before its estimate is used.
const MIN_SAMPLES: u32 = 3;
/// An estimate with no new sample for this long is forgotten (the backend may have changed).
const MAX_AGE: Duration = Duration::from_secs(120);

/// What has been measured of a class on one backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Expected service time of a request of the class's mean size, in seconds.
    pub secs: f64,
    /// Samples behind it (recent ones weigh most).
    pub samples: u32,
}

#[derive(Debug, Clone, Copy)]
struct Estimate {
    /// Moving average of seconds per response byte.
    secs_per_byte: f64,
    samples: u32,
    /// When the latest sample came.
    last: Instant,
}

#[derive(Debug, Default)]
struct Books {
    by_backend: HashMap<String, Estimate>,
    /// Moving average of the class's response size in bytes, over all backends.
    mean_bytes: f64,
}

/// Service times of one class, by backend name; kept across reloads with the class.
#[derive(Debug, Default)]
pub struct ServiceTimes {
    books: Mutex<Books>,
}

/// A moving average step, starting from the first sample.
fn smooth(mean: f64, sample: f64, first: bool) -> f64 {
    if first {
        sample
    } else {
        mean + SMOOTHING * (sample - mean)
    }
}

impl ServiceTimes {
    /// Records one successful request on `backend` that held its slot for `took` and answered
    /// `bytes` of body. An empty body says nothing about speed and is not recorded.
    pub fn record(&self, backend: &str, took: Duration, bytes: u64, now: Instant) {
        if bytes == 0 {
            return;
        }
        let bytes = bytes as f64;
        let per_byte = took.as_secs_f64() / bytes;
        let mut books = self.books.lock().unwrap_or_else(|e| e.into_inner());
        let first_of_class = books.by_backend.is_empty();
        books.mean_bytes = smooth(books.mean_bytes, bytes, first_of_class);
        match books.by_backend.get_mut(backend) {
            Some(e) => {
                let stale = now.saturating_duration_since(e.last) > MAX_AGE;
                e.secs_per_byte = smooth(e.secs_per_byte, per_byte, stale);
                e.samples = if stale {
                    1
                } else {
                    e.samples.saturating_add(1)
                };
                e.last = now;
            }
            None => {
                let fresh = Estimate {
                    secs_per_byte: per_byte,
                    samples: 1,
                    last: now,
                };
                books.by_backend.insert(backend.to_string(), fresh);
            }
        }
    }

    /// Drops what was measured on `backend` (a new server behind the name starts unknown).
    pub fn forget(&self, backend: &str) {
        let mut books = self.books.lock().unwrap_or_else(|e| e.into_inner());
        books.by_backend.remove(backend);
    }

    /// The expected service time in seconds of a request of the class (of its mean size) on
    /// each of `backends`, in order: `None` where too few samples or none recent enough.
    pub fn observe<'a>(
        &self,
        backends: impl Iterator<Item = &'a str>,
        now: Instant,
    ) -> Vec<Option<Measured>> {
        let books = self.books.lock().unwrap_or_else(|e| e.into_inner());
        backends
            .map(|name| {
                let e = books.by_backend.get(name)?;
                (e.samples >= MIN_SAMPLES && now.saturating_duration_since(e.last) <= MAX_AGE)
                    .then_some(Measured {
                        secs: e.secs_per_byte * books.mean_bytes,
                        samples: e.samples,
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe_one(times: &ServiceTimes, name: &str, now: Instant) -> Option<f64> {
        times.observe(std::iter::once(name), now)[0].map(|m| m.secs)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn needs_a_few_samples_then_follows_the_average() {
        let times = ServiceTimes::default();
        let t0 = Instant::now();
        times.record("gpu0", Duration::from_secs(2), 1000, t0);
        times.record("gpu0", Duration::from_secs(2), 1000, t0);
        assert_eq!(observe_one(&times, "gpu0", t0), None);
        times.record("gpu0", Duration::from_secs(2), 1000, t0);
        assert!(close(observe_one(&times, "gpu0", t0).unwrap(), 2.0));
        for _ in 0..40 {
            times.record("gpu0", Duration::from_secs(4), 1000, t0);
        }
        let seen = observe_one(&times, "gpu0", t0).unwrap();
        assert!((seen - 4.0).abs() < 0.01, "{seen}");
        assert_eq!(observe_one(&times, "gpu1", t0), None);
    }

    #[test]
    fn job_size_does_not_make_identical_backends_look_different() {
        let times = ServiceTimes::default();
        let t0 = Instant::now();
        // Same speed (1 ms per byte); gpu0 happened to get small jobs, gpu1 big ones.
        for _ in 0..3 {
            times.record("gpu0", Duration::from_millis(100), 100, t0);
            times.record("gpu1", Duration::from_millis(300), 300, t0);
        }
        // gpu2 is twice as slow per byte.
        for _ in 0..3 {
            times.record("gpu2", Duration::from_millis(400), 200, t0);
        }
        let seen: Vec<f64> = times
            .observe(["gpu0", "gpu1", "gpu2"].into_iter(), t0)
            .into_iter()
            .map(|m| m.unwrap().secs)
            .collect();
        assert!(close(seen[0], seen[1]), "{seen:?}");
        assert!(close(seen[2], 2.0 * seen[0]), "{seen:?}");
        // Estimates are for a request of the class's mean size (between 100 and 300 bytes).
        assert!((0.1..0.3).contains(&seen[0]), "{seen:?}");
    }

    #[test]
    fn empty_bodies_are_ignored_and_old_estimates_forgotten() {
        let times = ServiceTimes::default();
        let t0 = Instant::now();
        for _ in 0..5 {
            times.record("gpu0", Duration::from_secs(1), 0, t0);
        }
        assert_eq!(observe_one(&times, "gpu0", t0), None);
        for _ in 0..5 {
            times.record("gpu0", Duration::from_secs(1), 10, t0);
        }
        assert!(observe_one(&times, "gpu0", t0 + MAX_AGE).is_some());
        let stale = t0 + MAX_AGE + Duration::from_secs(1);
        assert_eq!(observe_one(&times, "gpu0", stale), None);
        // A sample after that starts over rather than averaging with the stale value.
        for _ in 0..3 {
            times.record("gpu0", Duration::from_secs(9), 10, stale);
        }
        assert!(close(observe_one(&times, "gpu0", stale).unwrap(), 9.0));
    }
}
