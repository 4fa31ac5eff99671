// gpulb's patch (vendor/README.md, seventh change).

//! Kept-alive upstream connections waiting for reuse: a list per peer key, most recently
//! released first, a cap on how many are kept in all (the least recently released goes first),
//! idle timeouts checked when a connection is taken and by a periodic sweep. No task and no
//! lock per connection: pingora's `ConnectionPool` spawned a task for every released
//! connection to watch it, and handed it over through an async mutex when it was taken again.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a sweep looks for connections closed by their peer or past their idle timeout
/// while nothing takes them.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A connection waiting in the pool.
struct Idle<S> {
    connection: S,
    since: Instant,
    expires: Option<Instant>,
    /// Release order across all keys, for evicting the least recently released.
    order: u64,
}

impl<S> Idle<S> {
    fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|at| at <= now)
    }
}

/// The pool's keys are already hashes (`Peer::reuse_hash`): used as they are.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

struct State<S> {
    by_key: HashMap<u64, VecDeque<Idle<S>>, BuildHasherDefault<KeyHasher>>,
    count: usize,
    next_order: u64,
    /// Whether a sweep is scheduled; none is while the pool is empty.
    sweeping: bool,
}

/// What [`IdlePool::put`] did beside keeping the connection.
pub(crate) struct Put<S> {
    /// The least recently released connection, evicted to stay within the cap, and how long it
    /// had waited; to be dropped (closed) by the caller, outside the pool's lock.
    pub evicted: Option<(S, Duration)>,
    /// No sweep was scheduled: the caller schedules one ([`IdlePool::sweep`] every
    /// [`SWEEP_EVERY`] until it reports the pool empty).
    pub start_sweeping: bool,
}

/// What [`IdlePool::sweep`] removed, and whether to sweep again after [`SWEEP_EVERY`].
pub(crate) struct Sweep<S> {
    /// Connections to drop (close) outside the pool's lock.
    pub gone: Vec<S>,
    /// The pool still holds connections; `false` ends the sweeps until a `put` starts them.
    pub again: bool,
}

/// Idle connections by key. See the module's doc.
pub(crate) struct IdlePool<S> {
    state: Mutex<State<S>>,
    capacity: usize,
}

impl<S> IdlePool<S> {
    /// A pool keeping at most `capacity` connections in all (0 keeps none).
    pub fn new(capacity: usize) -> Self {
        IdlePool {
            state: Mutex::new(State {
                by_key: HashMap::default(),
                count: 0,
                next_order: 0,
                sweeping: false,
            }),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<S>> {
        // The state stays consistent at every unlock (nothing in it can panic half-way).
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps `connection` for reuse under `key`, for at most `idle_timeout` (`None`: no limit).
    /// With the pool at its cap the least recently released connection makes room; with a cap
    /// of 0 the connection itself is handed back as evicted.
    pub fn put(&self, key: u64, connection: S, idle_timeout: Option<Duration>) -> Put<S> {
        let now = Instant::now();
        if self.capacity == 0 {
            return Put {
                evicted: Some((connection, Duration::ZERO)),
                start_sweeping: false,
            };
        }
        let mut state = self.lock();
        let evicted = if state.count >= self.capacity {
            state.evict_oldest().map(|idle| {
                let waited = now.saturating_duration_since(idle.since);
                (idle.connection, waited)
            })
        } else {
            None
        };
        let order = state.next_order;
        state.next_order += 1;
        state.by_key.entry(key).or_default().push_back(Idle {
            connection,
            since: now,
            expires: idle_timeout.and_then(|t| now.checked_add(t)),
            order,
        });
        state.count += 1;
        let start_sweeping = !state.sweeping;
        state.sweeping = true;
        Put {
            evicted,
            start_sweeping,
        }
    }

    /// The most recently released connection under `key` that is not past its idle timeout.
    /// Connections past it are returned in `expired`, to be dropped outside the lock (under one
    /// key they are the oldest, so all of them go once the newest has expired).
    pub fn take(&self, key: u64, expired: &mut Vec<S>) -> Option<S> {
        let now = Instant::now();
        let mut state = self.lock();
        let list = state.by_key.get_mut(&key)?;
        let newest = list.pop_back()?;
        let (taken, gone) = if newest.expired(now) {
            let gone = 1 + list.len();
            expired.push(newest.connection);
            expired.extend(list.drain(..).map(|idle| idle.connection));
            (None, gone)
        } else {
            (Some(newest.connection), 1)
        };
        if list.is_empty() {
            state.by_key.remove(&key);
        }
        state.count -= gone;
        taken
    }

    /// Removes the connections past their idle timeout and those `still_usable` rejects (closed
    /// by their peer, or sending unasked). When the pool is left empty no further sweep is
    /// scheduled until the next `put` asks for one.
    pub fn sweep(&self, mut still_usable: impl FnMut(&mut S) -> bool) -> Sweep<S> {
        let now = Instant::now();
        let mut state = self.lock();
        let mut gone = Vec::new();
        state.by_key.retain(|_, list| {
            let mut index = 0;
            while index < list.len() {
                let idle = &mut list[index];
                if idle.expired(now) || !still_usable(&mut idle.connection) {
                    if let Some(idle) = list.remove(index) {
                        gone.push(idle.connection);
                    }
                } else {
                    index += 1;
                }
            }
            !list.is_empty()
        });
        state.count -= gone.len();
        let again = state.count > 0;
        state.sweeping = again;
        Sweep { gone, again }
    }

    /// How many connections the pool holds.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().count
    }
}

impl<S> State<S> {
    /// Removes the least recently released connection of any key.
    fn evict_oldest(&mut self) -> Option<Idle<S>> {
        let key = self
            .by_key
            .iter()
            .filter_map(|(key, list)| list.front().map(|idle| (idle.order, *key)))
            .min()?
            .1;
        let list = self.by_key.get_mut(&key)?;
        let oldest = list.pop_front();
        if list.is_empty() {
            self.by_key.remove(&key);
        }
        if oldest.is_some() {
            self.count -= 1;
        }
        oldest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Option<Duration> = Some(Duration::from_secs(60));

    #[test]
    fn the_most_recently_released_connection_of_a_key_is_taken_first() {
        let pool = IdlePool::new(8);
        let mut expired = Vec::new();
        assert!(
            pool.put(1, "a1", LONG).start_sweeping,
            "the first put asks for sweeps"
        );
        assert!(
            !pool.put(1, "a2", LONG).start_sweeping,
            "one sweep at a time"
        );
        pool.put(2, "b1", None);
        assert_eq!(pool.take(1, &mut expired), Some("a2"));
        assert_eq!(pool.take(2, &mut expired), Some("b1"));
        assert_eq!(pool.take(2, &mut expired), None, "key 2 is empty");
        assert_eq!(pool.take(3, &mut expired), None, "key 3 never had one");
        assert_eq!(pool.take(1, &mut expired), Some("a1"));
        assert_eq!(pool.len(), 0);
        assert!(expired.is_empty());
    }

    #[test]
    fn at_its_cap_the_pool_evicts_the_least_recently_released_of_any_key() {
        let pool = IdlePool::new(2);
        let mut expired = Vec::new();
        assert!(pool.put(1, "a1", LONG).evicted.is_none());
        assert!(pool.put(2, "b1", LONG).evicted.is_none());
        let put = pool.put(2, "b2", LONG);
        assert_eq!(put.evicted.map(|(c, _)| c), Some("a1"));
        assert_eq!(pool.len(), 2);
        assert_eq!(pool.take(1, &mut expired), None);
        let put = pool.put(1, "a2", LONG);
        assert_eq!(put.evicted.map(|(c, _)| c), Some("b1"));
        assert_eq!(pool.take(2, &mut expired), Some("b2"));
        assert_eq!(pool.take(1, &mut expired), Some("a2"));

        let none_kept = IdlePool::new(0);
        let put = none_kept.put(1, "c", LONG);
        assert_eq!(
            put.evicted.map(|(c, _)| c),
            Some("c"),
            "a cap of 0 keeps nothing"
        );
        assert!(!put.start_sweeping);
    }

    #[test]
    fn a_connection_past_its_idle_timeout_is_not_taken_and_neither_are_older_ones() {
        let pool = IdlePool::new(8);
        let mut expired = Vec::new();
        pool.put(1, "old", Some(Duration::ZERO));
        pool.put(1, "newer", Some(Duration::ZERO));
        pool.put(2, "other", LONG);
        assert_eq!(pool.take(1, &mut expired), None);
        expired.sort();
        assert_eq!(expired, vec!["newer", "old"], "handed back to be closed");
        assert_eq!(pool.len(), 1, "the other key's connection stays");
        assert_eq!(pool.take(2, &mut expired), Some("other"));
    }

    #[test]
    fn a_sweep_removes_expired_and_unusable_connections_and_stops_once_the_pool_is_empty() {
        let pool = IdlePool::new(8);
        let mut expired = Vec::new();
        pool.put(1, "expired", Some(Duration::ZERO));
        pool.put(1, "closed by its peer", LONG);
        pool.put(2, "fine", LONG);
        let sweep = pool.sweep(|c| *c != "closed by its peer");
        let mut gone = sweep.gone;
        gone.sort();
        assert_eq!(gone, vec!["closed by its peer", "expired"]);
        assert!(sweep.again, "a connection is left to watch");
        assert!(
            !pool.put(2, "fine too", LONG).start_sweeping,
            "still sweeping"
        );

        assert_eq!(pool.take(1, &mut expired), None);
        assert_eq!(pool.take(2, &mut expired), Some("fine too"));
        let sweep = pool.sweep(|_| false);
        assert_eq!(sweep.gone, vec!["fine"]);
        assert!(!sweep.again, "nothing left: the sweeps end");
        assert_eq!(pool.len(), 0);
        assert!(
            pool.put(2, "back", LONG).start_sweeping,
            "a put starts them again"
        );
    }
}
