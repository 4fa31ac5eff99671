//! Client connection figures: how many are open, how many were refused at the limit, and how
//! many were closed for a slow header or a long idle.

use super::register;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};

/// Why a client connection was closed by gpulb's own deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientTimeout {
    /// The request header did not arrive whole within `timeouts.client_header`.
    Header,
    /// The keep-alive connection stayed idle past `timeouts.client_idle`.
    Idle,
    /// The request header grew past `limits.max_header_bytes`.
    HeaderTooLarge,
}

impl ClientTimeout {
    fn label(self) -> &'static str {
        match self {
            ClientTimeout::Header => "header",
            ClientTimeout::Idle => "idle",
            ClientTimeout::HeaderTooLarge => "header_too_large",
        }
    }
}

/// The client connection collectors.
#[derive(Clone)]
pub struct ConnectionMetrics {
    open: IntGauge,
    refused: IntCounter,
    closed: IntCounterVec,
}

impl ConnectionMetrics {
    /// Registers the collectors in `r`.
    pub(super) fn new(r: &prometheus::Registry) -> ConnectionMetrics {
        let open = IntGauge::new("gpulb_client_connections", "Client connections open now.")
            .expect("valid gauge");
        let refused = IntCounter::new(
            "gpulb_client_connections_refused_total",
            "Client connections closed at once because limits.max_connections were open.",
        )
        .expect("valid counter");
        let closed = IntCounterVec::new(
            Opts::new(
                "gpulb_client_connections_closed_total",
                "Client connections gpulb closed, by reason: header (timeouts.client_header), idle (timeouts.client_idle), header_too_large (limits.max_header_bytes).",
            ),
            &["reason"],
        )
        .expect("valid counter");
        ConnectionMetrics {
            open: register(r, open),
            refused: register(r, refused),
            closed: register(r, closed),
        }
    }

    /// A connection opened (`+1`) or closed (`-1`).
    pub fn open_changed(&self, delta: i64) {
        self.open.add(delta);
    }

    /// A connection was refused at the limit.
    pub fn refused(&self) {
        self.refused.inc();
    }

    /// Refusals so far.
    pub fn refused_total(&self) -> u64 {
        self.refused.get()
    }

    /// A connection was closed by one of gpulb's client deadlines or limits.
    pub fn closed(&self, why: ClientTimeout) {
        self.closed.with_label_values(&[why.label()]).inc();
    }
}
