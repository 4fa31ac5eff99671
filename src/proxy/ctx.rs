//! Per-request state carried through pingora's filters.

use crate::admission::TenantSlot;
use crate::error::ProxyError;
use crate::headers::RequestId;
use crate::metrics::ClassMetrics;
use crate::request::BodyFacts;
use crate::routing::Snapshot;
use crate::routing::{Demand, Lease, Slot};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Per-request state. The slots are RAII guards: dropping the context releases them.
#[derive(Default)]
pub struct RequestCtx {
    /// The snapshot the request runs under, loaded once.
    pub(crate) snapshot: Option<Arc<Snapshot>>,
    /// Index of its class in the snapshot.
    pub(crate) class: usize,
    /// Its tenant (the tenant header's value, or `default`); the built-in names unallocated.
    pub(crate) tenant: Cow<'static, str>,
    /// Counts the request against its class.
    pub(crate) class_slot: Option<Slot>,
    /// Counts the request against its tenant in the class queue's books.
    pub(crate) tenant_slot: Option<TenantSlot>,
    /// The current attempt's backend slot.
    pub(crate) lease: Option<Lease>,
    /// Backends whose connect failed for this request, or that refused it with a
    /// `retry_statuses` status; never chosen again for it.
    pub(crate) failed: Vec<usize>,
    /// Request id, forwarded and echoed.
    pub(crate) request_id: Option<RequestId>,
    /// Why the request failed or was refused, when it did.
    pub(crate) failure: Option<ProxyError>,
    /// The current attempt's outcome already went to outlier detection.
    pub(crate) outcome_reported: bool,
    /// When `request_filter` began.
    pub(crate) started: Option<Instant>,
    /// Time spent waiting in the class queue.
    pub(crate) queued_for: Duration,
    /// When the response header arrived from the backend.
    pub(crate) first_byte: Option<Instant>,
    /// When the first response body byte went to the client (the first token, when streaming).
    pub(crate) first_body_byte: Option<Instant>,
    /// Attempts sent to backends (retries included).
    pub(crate) attempts: u32,
    /// Index of the backend of the latest attempt.
    pub(crate) backend: Option<usize>,
    /// The request body, when gpulb read it (replayed to every attempt).
    pub(crate) held_body: Option<bytes::Bytes>,
    /// The held body's share of `request_body.max_held_bytes`, given back with the context.
    pub(crate) body_budget: super::body_budget::BodyBudget,
    /// The held body is not the one received (an alias rewritten to its model).
    pub(crate) body_rewritten: bool,
    /// gpulb answered the client's `Expect: 100-continue` itself and holds the body, so the
    /// expectation is not sent on (a backend's `100` would reach the client a second time).
    pub(crate) continue_answered: bool,
    /// What the body says, when it was read and is a JSON request.
    pub(crate) facts: Option<BodyFacts>,
    /// The model asked for, after aliases.
    pub(crate) model: Option<String>,
    /// Which backends its model allows, and its estimated size.
    pub(crate) demand: Demand,
    /// The response body from its last `usage` key on, for a read body's reported tokens.
    pub(crate) tail: super::usage_tail::UsageTail,
    /// The stored response (Responses API) the request names, when no backend is known to
    /// hold it: a backend's `404` sends it on to the next ([`super::refused`]), and the one
    /// that takes it is remembered as its holder.
    pub(crate) seeking_response: Option<String>,
    /// Looking for the id of the response this answer stores (`POST /v1/responses`).
    pub(crate) response_id: Option<crate::routing::responses::ResponseIdScan>,
    /// Metric handles of the request's class.
    pub(crate) class_metrics: Option<Arc<ClassMetrics>>,
    /// The current attempt's first-byte and idle deadlines, when they differ.
    pub(crate) upstream_watch: Option<super::watch::UpstreamWatch>,
}

impl RequestCtx {
    /// Names of the request's class and that class's pool.
    pub fn class_and_pool(&self) -> (String, String) {
        match &self.snapshot {
            Some(snap) => {
                let class = &snap.classes[self.class];
                (class.name.clone(), snap.pools[class.pool].name.clone())
            }
            None => (String::new(), String::new()),
        }
    }

    /// The error for "no backend of the class's pool can take the request".
    pub fn no_backend(&self) -> ProxyError {
        let (class, pool) = self.class_and_pool();
        ProxyError::NoBackendAvailable {
            class,
            pool,
            retry_after: 1,
        }
    }

    /// The request id header name in force.
    pub fn id_header(&self) -> http::HeaderName {
        self.snapshot.as_ref().map_or_else(
            || http::HeaderName::from_static("x-request-id"),
            |s| s.config.compiled.request_id_header.clone(),
        )
    }
}
