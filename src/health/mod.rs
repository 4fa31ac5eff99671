//! Backend health: active checks on a cadence, passive ejection from live traffic.

mod checker;
mod state;

pub use checker::HealthChecks;
pub use state::{now_ms, CheckStatus, Ejection, HealthState};
