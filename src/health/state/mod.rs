//! A backend's health as the proxy sees it: active check status plus passive ejection.
//!
//! Hot reads (`eligible`) are atomics; transitions are rare and log one line with their cause.

use super::CheckFailure;
use crate::config::{HealthCheck, OutlierDetection};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Milliseconds since the process's first call: a cheap monotonic clock for ejection deadlines.
pub fn now_ms() -> u64 {
    ms_at(Instant::now())
}

/// [`now_ms`] as of `now`, for a caller that has read the clock already.
pub fn ms_at(now: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    now.saturating_duration_since(*EPOCH.get_or_init(Instant::now))
        .as_millis() as u64
}

/// Result of active checking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum CheckStatus {
    /// No check has passed yet: gets no traffic.
    Unknown = 0,
    /// Checks pass.
    Healthy = 1,
    /// `fall` consecutive checks failed: gets no new traffic.
    Unhealthy = 2,
    /// Checks are off: counts as healthy.
    Unchecked = 3,
}

impl CheckStatus {
    fn from_u8(v: u8) -> CheckStatus {
        match v {
            1 => CheckStatus::Healthy,
            2 => CheckStatus::Unhealthy,
            3 => CheckStatus::Unchecked,
            _ => CheckStatus::Unknown,
        }
    }
}

/// Health of one backend.
#[derive(Debug, Default)]
pub struct HealthState {
    status: AtomicU8,
    /// Passive: consecutive failed attempts on live traffic.
    consecutive_failures: AtomicU32,
    /// Passive: ejected and not yet returned.
    ejected: AtomicBool,
    ejected_until_ms: AtomicU64,
    ejections_total: AtomicU64,
    /// Active: consecutive passes / failures, owned by the one checking task.
    passes: AtomicU32,
    fails: AtomicU32,
}

/// A passive ejection that just happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    /// How long the backend stays out.
    pub duration: Duration,
    /// How many times it has been ejected, this one included.
    pub count: u64,
}

impl HealthState {
    /// Active check status now.
    pub fn status(&self) -> CheckStatus {
        CheckStatus::from_u8(self.status.load(Ordering::Acquire))
    }

    /// Whether the backend is out on a passive ejection at `now` (monotonic ms).
    pub fn is_ejected(&self, now: u64) -> bool {
        if !self.ejected.load(Ordering::Acquire) {
            return false;
        }
        // Unchecked backends return when the time is up; checked ones also need a passing check.
        self.status() != CheckStatus::Unchecked
            || now < self.ejected_until_ms.load(Ordering::Acquire)
    }

    /// Whether new requests may go to this backend at `now`.
    pub fn eligible(&self, now: u64) -> bool {
        matches!(self.status(), CheckStatus::Healthy | CheckStatus::Unchecked)
            && !self.is_ejected(now)
    }

    /// Times ejected so far.
    pub fn ejections_total(&self) -> u64 {
        self.ejections_total.load(Ordering::Relaxed)
    }

    /// Consecutive failures on live traffic.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    /// Checks are off for this backend: it counts as healthy.
    pub fn set_unchecked(&self) {
        self.status
            .store(CheckStatus::Unchecked as u8, Ordering::Release);
    }

    /// Forget check history (the backend's address changed): no traffic until a check passes.
    pub fn reset(&self) {
        self.status
            .store(CheckStatus::Unknown as u8, Ordering::Release);
        self.passes.store(0, Ordering::Relaxed);
        self.fails.store(0, Ordering::Relaxed);
    }

    /// Records one active check; logs and returns the new status when it changed.
    pub fn observe_check(
        &self,
        name: &str,
        result: Result<(), CheckFailure>,
        cfg: &HealthCheck,
        now: u64,
    ) -> Option<CheckStatus> {
        let before = self.status();
        let after = match &result {
            Ok(()) => {
                self.fails.store(0, Ordering::Relaxed);
                let passes = self.passes.fetch_add(1, Ordering::Relaxed) + 1;
                if self.ejected.load(Ordering::Acquire)
                    && now >= self.ejected_until_ms.load(Ordering::Acquire)
                {
                    self.ejected.store(false, Ordering::Release);
                    tracing::info!(
                        backend = name,
                        "backend returns from ejection: its check passes"
                    );
                }
                match before {
                    CheckStatus::Unknown => CheckStatus::Healthy,
                    CheckStatus::Unhealthy if passes >= cfg.rise => CheckStatus::Healthy,
                    other => other,
                }
            }
            Err(_) => {
                self.passes.store(0, Ordering::Relaxed);
                let fails = self.fails.fetch_add(1, Ordering::Relaxed) + 1;
                match before {
                    CheckStatus::Healthy | CheckStatus::Unknown if fails >= cfg.fall => {
                        CheckStatus::Unhealthy
                    }
                    other => other,
                }
            }
        };
        if after == before {
            return None;
        }
        self.status.store(after as u8, Ordering::Release);
        match (&result, after) {
            (Err(cause), _) => {
                tracing::warn!(backend = name, %cause, fails = cfg.fall, "backend unhealthy: consecutive checks failed")
            }
            (Ok(()), CheckStatus::Healthy) if before == CheckStatus::Unknown => {
                tracing::info!(backend = name, "backend healthy: first check passed")
            }
            _ => tracing::info!(
                backend = name,
                passes = cfg.rise,
                "backend healthy again: consecutive checks passed"
            ),
        }
        Some(after)
    }

    /// Records a successful attempt on live traffic.
    pub fn record_success(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    /// Records a failed attempt; ejects when the policy says so and `may_eject` agrees.
    pub fn record_failure(
        &self,
        policy: &OutlierDetection,
        now: u64,
        may_eject: impl FnOnce() -> bool,
    ) -> Option<Ejection> {
        let failures = self.consecutive_failures.fetch_add(1, Ordering::AcqRel) + 1;
        if policy.consecutive_failures == 0
            || failures < policy.consecutive_failures
            || self.is_ejected(now)
            || !may_eject()
        {
            return None;
        }
        let count = self.ejections_total.fetch_add(1, Ordering::AcqRel) + 1;
        let duration = policy
            .base_ejection
            .saturating_mul(count.min(u64::from(u32::MAX)) as u32)
            .min(policy.max_ejection);
        self.ejected_until_ms
            .store(now + duration.as_millis() as u64, Ordering::Release);
        self.ejected.store(true, Ordering::Release);
        self.consecutive_failures.store(0, Ordering::Release);
        Some(Ejection { duration, count })
    }
}

#[cfg(test)]
mod tests;
