//! Backend health: active check status and passive ejection, and why a backend failed.
//! The checks themselves run as background tasks (the `tasks` module).

mod failure;
mod state;

pub use failure::{AttemptFailure, CheckFailure};
pub use state::{ms_at, now_ms, CheckStatus, Ejection, HealthState};
