//! The vendored pingora-core's write buffer (vendor/README.md, sixth change) is not a workspace
//! member, so its unit tests would not run with gpulb's; this compiles the module here and runs
//! them: small writes wait and the buffer is freed once flushed, order kept, large and
//! zero-capacity writes go straight through.

#[allow(dead_code)]
#[path = "../vendor/pingora-core/src/protocols/l4/lazy_buf_writer.rs"]
mod lazy_buf_writer;
