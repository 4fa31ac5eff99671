//! The vendored pingora-proxy's task pipe (vendor/README.md, pingora-proxy) is not a workspace
//! member, so its unit tests would not run with gpulb's; this compiles the module here and runs
//! them: order, the bound, permits given back, wake-ups, and a receiver or sender going away.

#[path = "../vendor/pingora-proxy/src/task_pipe.rs"]
mod task_pipe;
