//! Dynamic batching of compatible short requests (embeddings): requests of a class with
//! `batching` that are compatible (same path, same options, same credentials) are held up to
//! `max_wait`, merged into one upstream call admitted and placed as one request, and each client
//! is answered with its own part of the answer.
//!
//! - [`input`]: what a request brings (its items, estimates and compatibility key), and the
//!   merged body;
//! - [`assembly`]: the open batches of a class, joining and leaving them;
//! - [`runner`]: a batch's life once open (wait, admission, upstream call, answers);
//! - [`timer`]: when a batch stops waiting, early by the clock's recent lateness;
//! - [`clock`]: the thread that ends batches' waits on time;
//! - [`split`]: the answer cut back into each member's own, usage shared exactly;
//! - [`upstream`]: the HTTP exchange with the backend.
//!
//! The proxy side (joining from `request_filter` and answering there) is `proxy/batch.rs`.

pub mod assembly;
pub mod clock;
pub mod input;
pub mod runner;
pub mod split;
pub mod timer;
pub mod upstream;

pub use assembly::{Answer, Member, OpenBatches, Reply};
pub use input::BatchInput;
