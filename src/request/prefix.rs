//! The prompt's fingerprint: chained hashes of its fixed-size blocks, so requests that share a
//! prefix (a system prompt, a conversation so far) can be sent where that prefix is cached.

/// Bytes of prompt text per fingerprint block: about 16 tokens, a KV-cache block of vLLM's.
pub const PREFIX_BLOCK: usize = 64;
/// Most blocks fingerprinted (32 KiB of prompt): bounds the cost of a huge prompt.
pub const MAX_PREFIX_BLOCKS: usize = 512;

/// Marks the end of one string of the prompt, so `"ab" + "c"` differs from `"a" + "bc"`.
pub const SEPARATOR: u8 = 0x1e;

/// Chained hashes of fixed-size blocks of the bytes fed in: fixed, so every gpulb replica
/// computes the same fingerprint for the same prompt.
#[derive(Debug, Default)]
pub struct PrefixHasher {
    /// The start of a block whose end has not come yet.
    block: Vec<u8>,
    chain: u64,
    hashes: Vec<u64>,
}

impl PrefixHasher {
    /// A hasher with room for the blocks of a prompt in a body of `body_len` bytes, so the
    /// fingerprint never grows while it is walked.
    pub fn for_body(body_len: usize) -> Self {
        Self {
            block: Vec::with_capacity(PREFIX_BLOCK),
            chain: 0,
            hashes: Vec::with_capacity((body_len / PREFIX_BLOCK).min(MAX_PREFIX_BLOCKS)),
        }
    }

    /// The chained hashes of the whole blocks fed.
    pub fn finish(self) -> Vec<u64> {
        self.hashes
    }

    /// Whole blocks are hashed where they lie; only a block split between two strings is copied.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.hashes.len() < MAX_PREFIX_BLOCKS {
            if self.block.is_empty() && bytes.len() >= PREFIX_BLOCK {
                let (block, rest) = bytes.split_at(PREFIX_BLOCK);
                self.chain = block_hash(self.chain, block);
                self.hashes.push(self.chain);
                bytes = rest;
                continue;
            }
            let take = (PREFIX_BLOCK - self.block.len()).min(bytes.len());
            self.block.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.block.len() == PREFIX_BLOCK {
                self.chain = block_hash(self.chain, &self.block);
                self.hashes.push(self.chain);
                self.block.clear();
            }
        }
    }
}

const _: () = assert!(PREFIX_BLOCK.is_multiple_of(8), "a block is hashed in words");

/// A block's hash chained to the one before, eight bytes a step (FxHash's rotate-xor-multiply,
/// rustc's own hash, three instructions a word), its high bits folded down once at the end.
fn block_hash(chain: u64, block: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut hash = (chain ^ 0xcbf2_9ce4_8422_2325).wrapping_mul(K);
    for word in block.chunks_exact(8) {
        let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        hash = (hash.rotate_left(5) ^ word).wrapping_mul(K);
    }
    hash ^ (hash >> 29)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_does_not_depend_on_how_the_bytes_were_fed() {
        let text: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut whole = PrefixHasher::default();
        whole.feed(&text);
        for piece in [1, 5, 63, 64, 65, 200] {
            let mut pieces = PrefixHasher::default();
            text.chunks(piece).for_each(|c| pieces.feed(c));
            assert_eq!(pieces.hashes, whole.hashes, "pieces of {piece}");
        }
        assert_eq!(whole.hashes.len(), 1000 / PREFIX_BLOCK);
        let mut other = text.clone();
        other[700] ^= 1;
        let mut changed = PrefixHasher::default();
        changed.feed(&other);
        let same = 700 / PREFIX_BLOCK;
        assert_eq!(changed.hashes[..same], whole.hashes[..same]);
        assert!(changed.hashes[same..]
            .iter()
            .zip(&whole.hashes[same..])
            .all(|(a, b)| a != b));
    }
}
