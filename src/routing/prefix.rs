//! Where prompt prefixes were sent: an approximate, bounded index from a prefix block's hash to
//! the backends that recently got it (and so likely hold its KV-cache), for prefix affinity.
//!
//! Entries are stamped with a counter on every use; past `capacity` entries the least recently
//! used tenth is dropped at once, so the index never holds more than `capacity` entries and
//! the cost of a sweep is spread over many insertions. A block may have several homes (a hot
//! prefix that one backend cannot carry alone), at most [`MAX_HOMES`], the newest kept.

use std::collections::HashMap;
use std::sync::Mutex;

/// Most backends remembered per block.
pub const MAX_HOMES: usize = 4;

/// Bytes one entry takes in the map, roughly: key, homes, stamp, and the map's own overhead.
pub const ENTRY_BYTES: usize = 8 + 4 * MAX_HOMES + 8 + 1 + 24;

#[derive(Debug, Clone, Copy)]
struct Entry {
    homes: [u32; MAX_HOMES],
    len: u8,
    used: u64,
}

impl Entry {
    fn homes(&self) -> &[u32] {
        &self.homes[..usize::from(self.len)]
    }

    fn add(&mut self, home: u32) {
        if let Some(at) = self.homes().iter().position(|&h| h == home) {
            // Newest last: move it to the end.
            self.homes[at..usize::from(self.len)].rotate_left(1);
            return;
        }
        if usize::from(self.len) == MAX_HOMES {
            self.homes.rotate_left(1);
            self.homes[MAX_HOMES - 1] = home;
        } else {
            self.homes[usize::from(self.len)] = home;
            self.len += 1;
        }
    }
}

#[derive(Debug, Default)]
struct Books {
    entries: HashMap<u64, Entry>,
    clock: u64,
}

/// The prefix index of one proxy; shared by every snapshot, keyed by stable backend ids.
#[derive(Debug)]
pub struct PrefixIndex {
    books: Mutex<Books>,
    capacity: usize,
}

impl PrefixIndex {
    /// An empty index holding at most `capacity` block entries.
    pub fn new(capacity: usize) -> Self {
        PrefixIndex {
            books: Mutex::new(Books::default()),
            capacity: capacity.max(1),
        }
    }

    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// For each of `backends`, how many leading blocks of `prefix` it was sent.
    pub fn matches(&self, prefix: &[u64], backends: &[u32]) -> Vec<u32> {
        let mut matched = vec![0u32; backends.len()];
        if prefix.is_empty() {
            return matched;
        }
        let mut books = self.books();
        books.clock += 1;
        let now = books.clock;
        let mut alive: Vec<bool> = vec![true; backends.len()];
        for (depth, hash) in prefix.iter().enumerate() {
            let Some(entry) = books.entries.get_mut(hash) else {
                break;
            };
            entry.used = now;
            let mut any = false;
            for (i, backend) in backends.iter().enumerate() {
                if alive[i] && entry.homes().contains(backend) {
                    matched[i] = depth as u32 + 1;
                    any = true;
                } else {
                    alive[i] = false;
                }
            }
            if !any {
                break;
            }
        }
        matched
    }

    /// Remembers that `prefix` was sent to `backend`.
    pub fn record(&self, prefix: &[u64], backend: u32) {
        if prefix.is_empty() {
            return;
        }
        let mut books = self.books();
        books.clock += 1;
        let now = books.clock;
        for hash in prefix {
            let entry = books.entries.entry(*hash).or_insert(Entry {
                homes: [0; MAX_HOMES],
                len: 0,
                used: now,
            });
            entry.used = now;
            entry.add(backend);
        }
        if books.entries.len() > self.capacity {
            evict(&mut books, self.capacity);
        }
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.books().entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most entries it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// Drops the least recently used entries until a tenth of `capacity` is free again.
fn evict(books: &mut Books, capacity: usize) {
    let keep = capacity - capacity / 10;
    let excess = books.entries.len().saturating_sub(keep);
    if excess == 0 {
        return;
    }
    let mut stamps: Vec<u64> = books.entries.values().map(|e| e.used).collect();
    let (_, cut, _) = stamps.select_nth_unstable(excess - 1);
    let cut = *cut;
    let mut to_drop = excess;
    books.entries.retain(|_, e| {
        if to_drop > 0 && e.used <= cut {
            to_drop -= 1;
            false
        } else {
            true
        }
    });
}

/// A stable score of `backend` (by name) for a prompt whose first block hashes to `first`:
/// every replica computes the same, so when none has seen the prompt they agree on its home
/// (rendezvous hashing).
pub fn rendezvous(first: u64, backend: &str) -> u64 {
    let mut h = first ^ 0x9e37_79b9_7f4a_7c15;
    for b in backend.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // A final mix so that close names spread.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_per_backend() {
        let index = PrefixIndex::new(1000);
        index.record(&[1, 2, 3, 4], 7);
        index.record(&[1, 2, 9], 8);
        assert_eq!(index.matches(&[1, 2, 3, 4, 5], &[7, 8, 9]), [4, 2, 0]);
        assert_eq!(index.matches(&[1, 2, 9], &[7, 8]), [2, 3]);
        assert_eq!(
            index.matches(&[5, 1], &[7, 8]),
            [0, 0],
            "leading blocks only"
        );
        assert_eq!(index.matches(&[], &[7]), [0]);
    }

    #[test]
    fn a_block_keeps_its_newest_homes() {
        let index = PrefixIndex::new(1000);
        for home in 0..6 {
            index.record(&[1], home);
        }
        assert_eq!(index.matches(&[1], &[0, 1, 2, 3, 4, 5]), [0, 0, 1, 1, 1, 1]);
        index.record(&[1], 2); // used again: newest now, survives the next arrival
        index.record(&[1], 6);
        assert_eq!(index.matches(&[1], &[2, 3, 6]), [1, 0, 1]);
    }

    #[test]
    fn a_flood_of_unique_prompts_stays_within_capacity_keeping_the_recent() {
        let index = PrefixIndex::new(1000);
        index.record(&[42], 1);
        for i in 0..100_000u64 {
            index.record(&[i * 7 + 1_000_000, i * 7 + 1_000_001], (i % 4) as u32);
            if i % 100 == 0 {
                // The hot prefix stays in use, so it stays.
                assert_eq!(index.matches(&[42], &[1]), [1]);
            }
            assert!(index.len() <= 1000, "{} entries", index.len());
        }
        assert_eq!(index.matches(&[42], &[1]), [1]);
        assert!(index.len() >= 800);
    }

    #[test]
    fn rendezvous_is_stable_and_spreads() {
        let names = ["gpu0", "gpu1", "gpu2", "gpu3"];
        let winner = |first: u64| {
            names
                .iter()
                .max_by_key(|n| rendezvous(first, n))
                .copied()
                .unwrap()
        };
        assert_eq!(winner(12345), winner(12345));
        let mut wins = [0; 4];
        for first in 0..4000u64 {
            let w = winner(first.wrapping_mul(0x9e37_79b9));
            wins[names.iter().position(|n| *n == w).unwrap()] += 1;
        }
        assert!(wins.iter().all(|&w| (800..1200).contains(&w)), "{wins:?}");
    }
}
