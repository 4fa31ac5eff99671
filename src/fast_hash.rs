//! Hash maps keyed by request-supplied strings (tenants, models), hashed faster than std's SipHash.
//!
//! A request looks its tenant and model up in a few maps (admission, queues, metric labels);
//! with std's SipHash each lookup cost about 150–200 instructions, a fifth of a request's own
//! routing work. aHash keeps a random key per process, so clients still cannot choose
//! colliding tenant names ahead of time.

/// A [`std::collections::HashMap`] with aHash's keyed hasher.
pub type FastMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// A [`std::collections::HashSet`] with aHash's keyed hasher.
pub type FastSet<T> = std::collections::HashSet<T, ahash::RandomState>;
