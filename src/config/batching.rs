//! Per-class dynamic batching: how long compatible short requests (embeddings) are held to be
//! merged into one upstream call, and how large that call may grow.

use super::{defaults, duration};
use serde::Deserialize;
use std::time::Duration;

/// A class's batching settings; absent means the class never batches.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BatchingConfig {
    /// Most input items (strings or token arrays) merged into one upstream call.
    #[serde(default = "defaults::batch_max_items")]
    pub max_batch: usize,
    /// Longest the first request of a batch waits for others before the batch is sent.
    #[serde(default = "defaults::batch_max_wait", with = "duration")]
    pub max_wait: Duration,
    /// Most estimated prompt tokens (text bytes / 4, or token ids) in one upstream call; absent:
    /// no limit beyond `max_batch`.
    #[serde(default)]
    pub max_batch_tokens: Option<u64>,
    /// A request that finds a backend slot free and no batch forming goes alone, unbatched, and
    /// a batch never waits for company while a slot is free for it: it asks for a slot as it
    /// opens and is sent when the slot comes (at once when one is free), when full, or past
    /// `max_wait` as soon as a slot comes; `false`: every batchable request joins a batch, and
    /// every batch waits `max_wait` or until full before asking for a slot.
    #[serde(default = "defaults::batch_send_when_idle")]
    pub send_when_idle: bool,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        BatchingConfig {
            max_batch: defaults::batch_max_items(),
            max_wait: defaults::batch_max_wait(),
            max_batch_tokens: None,
            send_when_idle: defaults::batch_send_when_idle(),
        }
    }
}
