//! gpulb: a reverse-proxy load balancer for GPU inference fleets.
//!
//! # The request path, in five lines
//!
//! 1. [`proxy`] (pingora's `ProxyHttp` hooks) loads the current [`routing::Snapshot`] and
//!    classifies the request into a class ([`routing::classify`]);
//!    A request its class batches ([`batching`]: embeddings) joins a batch instead, which is
//!    admitted, placed and sent as one request, and is answered with its own part;
//! 2. [`admission`] admits it: a class slot and a backend lease taken together, or a place in
//!    the class's fair queue, or a 429/503 ([`error`]);
//! 3. [`routing`] picks the backend: live candidates ranked and picked by the class's
//!    [`routing::placement`] over the pure functions of [`routing::balance`];
//! 4. [`proxy`] forwards the request and streams the answer back; the lease is an RAII guard
//!    released exactly once however the request ends;
//! 5. [`metrics`] and [`access_log`] record it; [`view`] reads live state for the
//!    [`admin`] endpoints (`/status`, `/history`, `/metrics`, the dashboard).
//!
//! Beside the request path: [`config`] (a leaf: typed YAML, defaults, validation, compiled
//! values), [`discovery`] (backends found by DNS), [`health`] and [`telemetry`] (what is
//! known of each backend), [`tasks`] (the
//! background loops that keep those current), [`reload`] (swap a new config in while traffic
//! flows), [`tls`] (the listener's certificate and https backends) and [`server`] (assembles
//! it all). [`tools`] holds the simulated GPU worker, the demo
//! fleet and the NVML agent.

pub mod access_log;
pub mod admin;
pub mod admission;
pub mod batching;
pub mod cli;
mod client_watch;
pub mod config;
pub mod connections;
pub mod discovery;
pub mod error;
mod fast_hash;
mod headers;
pub mod health;
mod hostinfo;
pub mod lifecycle;
pub mod metrics;
pub mod proxy;
pub mod reload;
pub mod request;
pub mod routing;
pub mod server;
pub mod tasks;
pub mod telemetry;
pub mod tls;
pub mod tools;
pub mod view;
