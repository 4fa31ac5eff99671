//! Queue policy types: how a class's queue is bounded and ordered, and why a request is shed.

use crate::config::{FairnessConfig, FairnessPolicy, QueueConfig};
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

/// How waiting requests of different tenants share a class's capacity.
#[derive(Debug, Clone, PartialEq)]
pub enum Fairness {
    /// One FIFO for everyone; a full queue is first come, first served.
    BestEffort,
    /// Round robin across tenants, one request each per round.
    EqualShare,
    /// Weighted round robin across tenants, with optional minimum in-flight shares.
    FixedShare {
        /// Requests served per round, by tenant.
        weights: HashMap<String, u32>,
        /// Weight of a tenant not named in `weights`.
        default_weight: u32,
        /// Fraction (0..=1) of the class's in-flight requests below which a tenant is served first.
        min_share: HashMap<String, f64>,
    },
}

impl Fairness {
    /// A tenant's round-robin weight (at least 1).
    pub fn weight(&self, tenant: &str) -> u32 {
        match self {
            Fairness::BestEffort | Fairness::EqualShare => 1,
            Fairness::FixedShare {
                weights,
                default_weight,
                ..
            } => weights
                .get(tenant)
                .copied()
                .unwrap_or(*default_weight)
                .max(1),
        }
    }

    /// Whether a full queue is divided among tenants (else whoever came first keeps it).
    pub fn shares_queue(&self) -> bool {
        !matches!(self, Fairness::BestEffort)
    }
}

impl From<&FairnessConfig> for Fairness {
    fn from(config: &FairnessConfig) -> Self {
        match config.policy {
            FairnessPolicy::BestEffort => Fairness::BestEffort,
            FairnessPolicy::EqualShare => Fairness::EqualShare,
            FairnessPolicy::FixedShare => Fairness::FixedShare {
                weights: config.weights.clone().into_iter().collect(),
                default_weight: config.default_weight,
                min_share: config.min_share.clone().into_iter().collect(),
            },
        }
    }
}

/// Bounds and order of one class's queue; passed per call so a reload applies at once.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuePolicy {
    /// Most requests waiting at once; 0 turns queueing off (shed when no capacity).
    pub max_depth: usize,
    /// Longest a request waits in the queue before it is shed.
    pub max_wait: Duration,
    /// Order of service across tenants.
    pub fairness: Fairness,
    /// Most requests one tenant may have queued or in flight in this class.
    pub tenant_max_outstanding: Option<u32>,
}

impl QueuePolicy {
    /// The queue policy of a class from its config parts.
    pub fn from_config(
        queue: &QueueConfig,
        fairness: &FairnessConfig,
        tenant_max_outstanding: Option<u32>,
    ) -> Self {
        QueuePolicy {
            max_depth: queue.max_depth,
            max_wait: queue.max_wait,
            fairness: fairness.into(),
            tenant_max_outstanding,
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShedReason {
    /// The queue holds `max_depth` requests and no tenant is over its share.
    QueueFull,
    /// The request waited `max_wait` without getting capacity.
    WaitTimeout,
    /// The queue is full and this tenant holds more than its share of it.
    TenantOverShare,
    /// The tenant has `tenant_max_outstanding` requests queued or in flight.
    TenantCap,
    /// The process is shutting down and the request was still waiting.
    ShuttingDown,
}

impl ShedReason {
    /// Stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::QueueFull => "queue_full",
            ShedReason::WaitTimeout => "wait_timeout",
            ShedReason::TenantOverShare => "tenant_over_share",
            ShedReason::TenantCap => "tenant_cap",
            ShedReason::ShuttingDown => "shutting_down",
        }
    }

    /// HTTP status: 429 when the tenant is over its share or cap, 503 when the class is saturated.
    pub fn status(self) -> u16 {
        match self {
            ShedReason::TenantOverShare | ShedReason::TenantCap => 429,
            ShedReason::QueueFull | ShedReason::WaitTimeout | ShedReason::ShuttingDown => 503,
        }
    }
}

impl fmt::Display for ShedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal: why, the status to answer, and when to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shed {
    /// Why the request was refused.
    pub reason: ShedReason,
    /// Estimated time until the queue drains, in [1 s, 60 s].
    pub retry_after: Duration,
    /// HTTP status to answer: 429 or 503.
    pub status: u16,
}

impl Shed {
    /// A refusal for `reason` with the given Retry-After estimate.
    pub fn new(reason: ShedReason, retry_after: Duration) -> Self {
        Shed {
            reason,
            retry_after,
            status: reason.status(),
        }
    }

    /// The `Retry-After` header value: whole seconds, rounded up.
    pub fn retry_after_secs(&self) -> u64 {
        let secs = self.retry_after.as_secs();
        if self.retry_after.subsec_nanos() > 0 {
            secs + 1
        } else {
            secs
        }
    }
}
