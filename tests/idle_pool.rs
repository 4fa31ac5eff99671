//! The vendored pingora-core's pool of idle upstream connections (vendor/README.md, seventh
//! change) is not a workspace member, so its unit tests would not run with gpulb's; this
//! compiles the module here and runs them: most recent first per key, a cap evicting the least
//! recently released, idle timeouts at take and by sweeps, sweeps that stop when it is empty.

#[allow(dead_code)]
#[path = "../vendor/pingora-core/src/connectors/idle_pool.rs"]
mod idle_pool;
