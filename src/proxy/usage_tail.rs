//! What gpulb keeps of a response body to read the backend's `usage` from: the bytes from the
//! last `"usage"` key on, and before any key only the few bytes a key split between two
//! chunks needs, so a long token stream that never reports usage holds almost nothing.

use crate::request::{self, last_usage_key as last_key, Usage, USAGE_KEY as KEY, USAGE_TAIL};

/// Bytes of a key that can end one chunk while the rest of it begins the next.
const SEAM: usize = KEY.len() - 1;

/// The end of a response body from its last `"usage"` key on, at most [`USAGE_TAIL`] bytes of
/// it; before any key, the last few bytes seen.
#[derive(Debug, Default)]
pub struct UsageTail {
    kept: Vec<u8>,
}

impl UsageTail {
    /// Takes the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if let Some(at) = last_key(chunk) {
            self.kept.clear();
            self.capture(&chunk[at..]);
            return;
        }
        if let Some(at) = self.key_across_seam(chunk) {
            self.kept.drain(..at);
            self.capture(chunk);
            return;
        }
        if self.kept.starts_with(KEY) {
            self.capture(chunk);
            return;
        }
        // No key yet: only what could be the start of one split by the next chunk.
        self.kept
            .extend_from_slice(&chunk[chunk.len().saturating_sub(SEAM)..]);
        let excess = self.kept.len().saturating_sub(SEAM);
        self.kept.drain(..excess);
    }

    /// The bytes kept: `usage_in` finds the last usage object in them.
    #[cfg(test)]
    pub fn bytes(&self) -> &[u8] {
        &self.kept
    }

    /// The last usage object of the body fed so far. What is kept starts with the last key
    /// whenever a key was seen (each branch of [`Self::feed`] keeps that so), so the object is
    /// read there without searching again.
    pub fn usage(&self) -> Option<Usage> {
        self.kept
            .strip_prefix(KEY)
            .and_then(request::usage_after_key)
    }

    /// Where in `kept` a key begins whose end is in the first bytes of `chunk`.
    fn key_across_seam(&self, chunk: &[u8]) -> Option<usize> {
        let carried_from = self.kept.len().saturating_sub(SEAM);
        let carried = &self.kept[carried_from..];
        let head = &chunk[..chunk.len().min(SEAM)];
        let mut seam = [0u8; 2 * SEAM];
        seam[..carried.len()].copy_from_slice(carried);
        seam[carried.len()..carried.len() + head.len()].copy_from_slice(head);
        last_key(&seam[..carried.len() + head.len()])
            .filter(|&at| at < carried.len())
            .map(|at| carried_from + at)
    }

    /// Appends what fits under [`USAGE_TAIL`] (the usage object follows its key closely).
    fn capture(&mut self, bytes: &[u8]) {
        let room = USAGE_TAIL.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::usage_in;

    /// The tail's usage, checked against a search of all it kept.
    fn read(tail: &UsageTail) -> Option<Usage> {
        let usage = tail.usage();
        assert_eq!(usage, usage_in(tail.bytes()), "{:?}", tail.bytes());
        usage
    }

    fn fed(chunks: &[&[u8]]) -> UsageTail {
        let mut tail = UsageTail::default();
        for chunk in chunks {
            tail.feed(chunk);
        }
        tail
    }

    const STREAM_END: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
        data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":34}}\n\n\
        data: [DONE]\n\n";
    const REPORTED: Usage = Usage {
        prompt_tokens: 12,
        completion_tokens: 34,
    };

    #[test]
    fn a_stream_that_never_reports_usage_keeps_only_a_few_bytes() {
        let mut tail = UsageTail::default();
        for i in 0..5_000u32 {
            let event =
                format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n");
            tail.feed(event.as_bytes());
            assert!(tail.bytes().len() <= SEAM);
        }
        assert!(tail.kept.capacity() <= 16, "{}", tail.kept.capacity());
        assert_eq!(read(&tail), None);
    }

    #[test]
    fn usage_is_found_however_the_body_is_cut_into_chunks() {
        assert_eq!(read(&fed(&[STREAM_END])), Some(REPORTED));
        for cut in 0..=STREAM_END.len() {
            let (a, b) = STREAM_END.split_at(cut);
            assert_eq!(read(&fed(&[a, b])), Some(REPORTED), "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = STREAM_END.chunks(1).collect();
        assert_eq!(read(&fed(&bytes)), Some(REPORTED), "one byte a chunk");
    }

    #[test]
    fn a_json_answer_keeps_its_usage_after_a_long_text() {
        let text = "x".repeat(3 * USAGE_TAIL);
        let answer = format!(
            "{{\"choices\":[{{\"text\":\"{text}\"}}],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":34}}}}"
        );
        let (a, b) = answer.as_bytes().split_at(USAGE_TAIL);
        let tail = fed(&[a, b]);
        assert_eq!(read(&tail), Some(REPORTED));
        assert!(tail.bytes().len() < 100, "{}", tail.bytes().len());
    }

    #[test]
    fn the_last_usage_wins_and_what_is_kept_stays_bounded() {
        let first = b"{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}";
        let filler = vec![b' '; 3 * USAGE_TAIL];
        let tail = fed(&[first, &filler]);
        assert_eq!(tail.bytes().len(), USAGE_TAIL);
        assert_eq!(
            read(&tail),
            Some(Usage {
                prompt_tokens: 1,
                completion_tokens: 2
            })
        );
        assert_eq!(read(&fed(&[first, STREAM_END])), Some(REPORTED));
    }
}
