//! Per-class admission settings: the queue and tenant fairness.

use super::{defaults, duration};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// A class's queue for requests that find no free backend slot.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// Most requests waiting at once; 0 turns queueing off (shed at once when no slot is free).
    #[serde(default = "defaults::queue_depth")]
    pub max_depth: usize,
    /// Longest a request waits before it is shed with 503.
    #[serde(default = "defaults::queue_wait", with = "duration")]
    pub max_wait: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_depth: defaults::queue_depth(),
            max_wait: defaults::queue_wait(),
        }
    }
}

/// How tenants share a class's queue.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FairnessPolicy {
    /// One FIFO, first come first served.
    #[default]
    BestEffort,
    /// Tenants take turns (deficit round robin).
    EqualShare,
    /// Tenants take turns in proportion to their weights.
    FixedShare,
}

/// Tenant fairness inside a class's queue.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FairnessConfig {
    /// The policy.
    #[serde(default)]
    pub policy: FairnessPolicy,
    /// `fixed_share` only: requests served per round, by tenant.
    #[serde(default)]
    pub weights: BTreeMap<String, u32>,
    /// `fixed_share` only: weight of tenants not named in `weights`.
    #[serde(default = "defaults::tenant_weight")]
    pub default_weight: u32,
    /// `fixed_share` only: guaranteed fraction (0..=1) of the class's in-flight requests.
    #[serde(default)]
    pub min_share: BTreeMap<String, f64>,
}

impl Default for FairnessConfig {
    fn default() -> Self {
        FairnessConfig {
            policy: FairnessPolicy::default(),
            weights: BTreeMap::new(),
            default_weight: defaults::tenant_weight(),
            min_share: BTreeMap::new(),
        }
    }
}
