//! Routing: the snapshot of backends, pools and classes built from one config, the live state
//! each carries across reloads, and the choice of a backend for a request.
//!
//! A request is classified ([`classify`]) under the current [`Snapshot`], then takes a class
//! slot and a backend [`Lease`] together ([`Snapshot::grant`]): candidates are read from live
//! state ([`select`]), ranked and picked by the class's [`placement`] over the pure functions
//! of [`balance`].

pub mod balance;
mod build;
pub use build::{resolve_backends, Resolved};
pub mod classify;
pub mod models;
pub mod placement;
pub mod prefix;
mod queues;
pub mod responses;
mod select;
pub mod service_time;
mod snapshot;
mod state;

pub use models::{ModelInfo, ModelList, ModelRefusal, ModelRoute, ModelSource};
pub use queues::ClassQueues;
pub use select::Demand;
pub use snapshot::{Backend, Class, Pool, Registry, Snapshot};
pub use state::{BackendState, ClassState, Grant, InflightCounter, Lease, Slot};

#[cfg(test)]
mod tests;
