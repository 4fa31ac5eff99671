//! Measured service time per backend for one class: how long its requests take there.
//!
//! gpulb measures this itself, from the moment a request gets its backend slot to the end of a
//! successful response, so it works for any HTTP worker. Speed-aware placement
//! (`placement: speed_weighted | earliest_finish`) reads it to tell a slow GPU from a fast one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Weight of the newest sample in the moving average.
const SMOOTHING: f64 = 0.2;
/// Samples needed before an estimate is used.
const MIN_SAMPLES: u32 = 3;
/// An estimate with no new sample for this long is forgotten (the backend may have changed).
const MAX_AGE: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy)]
struct Estimate {
    /// Moving average of the service time, in seconds.
    mean_secs: f64,
    samples: u32,
    /// When the latest sample came.
    last: Instant,
}

/// Service times of one class, by backend name; kept across reloads with the class.
#[derive(Debug, Default)]
pub struct ServiceTimes {
    by_backend: Mutex<HashMap<String, Estimate>>,
}

impl ServiceTimes {
    /// Records one successful request on `backend` that held its slot for `took`.
    pub fn record(&self, backend: &str, took: Duration, now: Instant) {
        let secs = took.as_secs_f64();
        let mut map = self.by_backend.lock().unwrap_or_else(|e| e.into_inner());
        match map.get_mut(backend) {
            Some(e) if now.saturating_duration_since(e.last) <= MAX_AGE => {
                e.mean_secs += SMOOTHING * (secs - e.mean_secs);
                e.samples = e.samples.saturating_add(1);
                e.last = now;
            }
            slot => {
                let fresh = Estimate {
                    mean_secs: secs,
                    samples: 1,
                    last: now,
                };
                match slot {
                    Some(e) => *e = fresh,
                    None => {
                        map.insert(backend.to_string(), fresh);
                    }
                }
            }
        }
    }

    /// The mean service time in seconds on each of `backends`, in order: `None` where too few
    /// samples or none recent enough.
    pub fn observe<'a>(
        &self,
        backends: impl Iterator<Item = &'a str>,
        now: Instant,
    ) -> Vec<Option<f64>> {
        let map = self.by_backend.lock().unwrap_or_else(|e| e.into_inner());
        backends
            .map(|name| {
                let e = map.get(name)?;
                (e.samples >= MIN_SAMPLES && now.saturating_duration_since(e.last) <= MAX_AGE)
                    .then_some(e.mean_secs)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe_one(times: &ServiceTimes, name: &str, now: Instant) -> Option<f64> {
        times.observe(std::iter::once(name), now)[0]
    }

    #[test]
    fn needs_a_few_samples_then_follows_the_average() {
        let times = ServiceTimes::default();
        let t0 = Instant::now();
        times.record("gpu0", Duration::from_secs(2), t0);
        times.record("gpu0", Duration::from_secs(2), t0);
        assert_eq!(observe_one(&times, "gpu0", t0), None);
        times.record("gpu0", Duration::from_secs(2), t0);
        let seen = observe_one(&times, "gpu0", t0).unwrap();
        assert!((seen - 2.0).abs() < 1e-9);
        for _ in 0..30 {
            times.record("gpu0", Duration::from_secs(4), t0);
        }
        let seen = observe_one(&times, "gpu0", t0).unwrap();
        assert!((seen - 4.0).abs() < 0.01, "{seen}");
        assert_eq!(observe_one(&times, "gpu1", t0), None);
    }

    #[test]
    fn old_estimates_are_forgotten() {
        let times = ServiceTimes::default();
        let t0 = Instant::now();
        for _ in 0..5 {
            times.record("gpu0", Duration::from_secs(1), t0);
        }
        assert!(observe_one(&times, "gpu0", t0 + MAX_AGE).is_some());
        let stale = t0 + MAX_AGE + Duration::from_secs(1);
        assert_eq!(observe_one(&times, "gpu0", stale), None);
        // A sample after that starts over rather than averaging with the stale value.
        times.record("gpu0", Duration::from_secs(9), stale);
        times.record("gpu0", Duration::from_secs(9), stale);
        times.record("gpu0", Duration::from_secs(9), stale);
        let seen = observe_one(&times, "gpu0", stale).unwrap();
        assert!((seen - 9.0).abs() < 1e-9);
    }
}
