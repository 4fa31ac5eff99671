//! Automatic prefix caching like vLLM's: prompts split into 16-token blocks named by chained
//! hashes, kept in the KV budget left free by running sequences and evicted least recently used.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

/// Tokens in one cache block (vLLM's default `block_size`).
pub(crate) const BLOCK_TOKENS: usize = 16;
/// Prompt characters in one block (the sim counts 4 characters as 1 token).
const BLOCK_CHARS: usize = BLOCK_TOKENS * 4;

/// Chained hashes of a prompt's full blocks: each covers its block's bytes and every block
/// before it, so equal hashes mean equal prefixes. A partial last block gets none.
pub(crate) fn block_hashes(text: &str) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(text.len() / BLOCK_CHARS);
    let (mut prev, mut start, mut chars) = (0u64, 0usize, 0usize);
    for (i, c) in text.char_indices() {
        chars += 1;
        if chars == BLOCK_CHARS {
            let end = i + c.len_utf8();
            let mut h = DefaultHasher::new();
            h.write_u64(prev);
            h.write(&text.as_bytes()[start..end]);
            prev = h.finish();
            hashes.push(prev);
            (start, chars) = (end, 0);
        }
    }
    hashes
}

/// A resident block: pinned while running sequences use it, evictable once none does.
#[derive(Debug)]
struct Block {
    /// Running sequences using the block.
    users: usize,
    /// Position in the eviction order while `users` is 0.
    lru_tick: Option<u64>,
}

/// The blocks a worker holds: pinned ones (counted in their sequences' KV) and free cached ones,
/// which live in the rest of the KV budget.
#[derive(Debug)]
pub(crate) struct PrefixCache {
    budget_tokens: usize,
    blocks: HashMap<u64, Block>,
    /// Free cached blocks, least recently freed first.
    lru: BTreeMap<u64, u64>,
    next_tick: u64,
}

impl PrefixCache {
    /// An empty cache that may fill what running sequences leave of `budget_tokens`.
    pub fn new(budget_tokens: usize) -> Self {
        PrefixCache {
            budget_tokens,
            blocks: HashMap::new(),
            lru: BTreeMap::new(),
            next_tick: 0,
        }
    }

    /// Pins an admitted sequence's blocks; returns how many of its `prompt_tokens` were already
    /// cached and skip prefill. As in vLLM, at least the last prompt token is always computed.
    pub fn acquire(&mut self, hashes: &[u64], prompt_tokens: usize) -> usize {
        let found = hashes
            .iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count();
        for &h in hashes {
            let block = self.blocks.entry(h).or_insert(Block {
                users: 0,
                lru_tick: None,
            });
            block.users += 1;
            if let Some(tick) = block.lru_tick.take() {
                self.lru.remove(&tick);
            }
        }
        found.min(prompt_tokens.saturating_sub(1) / BLOCK_TOKENS) * BLOCK_TOKENS
    }

    /// Unpins a finished or cancelled sequence's blocks; they stay cached, its last block
    /// first in line for eviction (its first block is the most reusable).
    pub fn release(&mut self, hashes: &[u64]) {
        for &h in hashes.iter().rev() {
            let Some(block) = self.blocks.get_mut(&h) else {
                continue;
            };
            block.users = block.users.saturating_sub(1);
            if block.users == 0 && block.lru_tick.is_none() {
                block.lru_tick = Some(self.next_tick);
                self.lru.insert(self.next_tick, h);
                self.next_tick += 1;
            }
        }
    }

    /// Evicts least recently freed blocks until `running_kv` plus the free cached blocks fit the budget.
    pub fn evict_to_fit(&mut self, running_kv: usize) {
        let room = self.budget_tokens.saturating_sub(running_kv) / BLOCK_TOKENS;
        while self.lru.len() > room {
            let Some((_, h)) = self.lru.pop_first() else {
                break;
            };
            self.blocks.remove(&h);
        }
    }

    /// Free cached blocks (not pinned by a running sequence).
    #[cfg(test)]
    pub fn free_blocks(&self) -> usize {
        self.lru.len()
    }

    /// Whether the block with this hash is resident, pinned or free.
    #[cfg(test)]
    pub fn contains(&self, hash: u64) -> bool {
        self.blocks.contains_key(&hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(blocks: &[char], tail: &str) -> String {
        let mut s: String = blocks
            .iter()
            .map(|c| c.to_string().repeat(BLOCK_CHARS))
            .collect();
        s.push_str(tail);
        s
    }

    #[test]
    fn chained_hashes_share_a_prefix_and_diverge_after_it() {
        let a = block_hashes(&text(&['a', 'b', 'c'], ""));
        let b = block_hashes(&text(&['a', 'b', 'x'], "partial"));
        let c = block_hashes(&text(&['z', 'b', 'c'], ""));
        assert_eq!(a.len(), 3);
        assert_eq!(b.len(), 3, "a partial last block has no hash");
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // Chained: the same block after a different prefix hashes differently.
        assert!(a.iter().zip(&c).all(|(x, y)| x != y));
        assert!(block_hashes(&"a".repeat(BLOCK_CHARS - 1)).is_empty());
        // Blocks are counted in characters, not bytes.
        assert_eq!(block_hashes(&"é".repeat(BLOCK_CHARS)).len(), 1);
    }

    #[test]
    fn hits_are_leading_blocks_and_spare_the_last_token() {
        let mut cache = PrefixCache::new(1000);
        let a = block_hashes(&text(&['a', 'b', 'c'], "tail"));
        assert_eq!(cache.acquire(&a, 49), 0);
        cache.release(&a);
        // Same first block, different second: only the first counts.
        let b = block_hashes(&text(&['a', 'x', 'c'], "tail"));
        assert_eq!(cache.acquire(&b, 49), BLOCK_TOKENS);
        // Exactly three blocks, all cached: the last block is computed again.
        assert_eq!(cache.acquire(&a[..3], 48), 2 * BLOCK_TOKENS);
        assert_eq!(cache.acquire(&a, 49), 3 * BLOCK_TOKENS);
    }

    #[test]
    fn running_blocks_are_pinned_and_free_ones_evicted_lru() {
        let mut cache = PrefixCache::new(4 * BLOCK_TOKENS);
        let a = block_hashes(&text(&['a', 'a'], ""));
        let b = block_hashes(&text(&['b', 'b'], ""));
        cache.acquire(&a, 32);
        cache.acquire(&b, 32);
        // Running sequences use the whole budget: nothing free to evict.
        cache.evict_to_fit(4 * BLOCK_TOKENS);
        assert!(a.iter().chain(&b).all(|h| cache.contains(*h)));
        cache.release(&a);
        cache.release(&b);
        assert_eq!(cache.free_blocks(), 4);
        // A new sequence takes three blocks' worth: a (freed first) goes, its tail first.
        cache.evict_to_fit(3 * BLOCK_TOKENS);
        assert_eq!(cache.free_blocks(), 1);
        assert!(cache.contains(b[0]) && !cache.contains(b[1]));
        assert!(!cache.contains(a[0]) && !cache.contains(a[1]));
        // A cache hit pins the block again, so it is no longer evictable.
        assert_eq!(cache.acquire(&b[..1], 17), BLOCK_TOKENS);
        cache.evict_to_fit(4 * BLOCK_TOKENS);
        assert!(cache.contains(b[0]));
        cache.release(&b[..1]);
        cache.evict_to_fit(4 * BLOCK_TOKENS);
        assert!(!cache.contains(b[0]));
    }
}
