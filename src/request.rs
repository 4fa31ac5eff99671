//! Facts read once per request from its JSON body (OpenAI style): the model, whether it
//! streams, how many tokens it may generate, and an estimate of its prompt's tokens.
//!
//! Only the top-level fields needed are parsed; the prompt's text is measured, never copied, and
//! the body itself is forwarded as received.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// Bytes of prompt text counted as one token: the usual rule of thumb for English and code.
pub const BYTES_PER_TOKEN: u64 = 4;

/// What an OpenAI-style request body says about the work it asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyFacts {
    /// `model`, as the client wrote it.
    pub model: Option<String>,
    /// `stream` (absent: false).
    pub stream: bool,
    /// `max_tokens`, `max_completion_tokens` or `max_output_tokens`, whichever is given.
    pub max_tokens: Option<u64>,
    /// `n`: completions asked for (absent: 1).
    pub n: u64,
    /// Estimated prompt tokens: the bytes of text in `prompt`, `messages` or `input`, divided by
    /// [`BYTES_PER_TOKEN`], rounded up; a token-id array counts one per id.
    pub prompt_tokens: u64,
    /// The prompt's fingerprint: chained hashes of its [`PREFIX_BLOCK`]-byte blocks, in order
    /// (of `messages`, `prompt` and `input` as the body gives them), at most
    /// [`MAX_PREFIX_BLOCKS`] (a partial last block is left out). Two prompts sharing their first
    /// `k` blocks share their first `k` hashes.
    pub prefix: Vec<u64>,
}

impl BodyFacts {
    /// Estimated tokens of work: the prompt plus what may be generated for every completion.
    pub fn estimated_tokens(&self) -> u64 {
        let generated = self.max_tokens.unwrap_or(0).saturating_mul(self.n.max(1));
        self.prompt_tokens.saturating_add(generated)
    }
}

/// Why a body could not be read as an OpenAI-style request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request body is not a JSON object of an OpenAI-style request: {0}")]
pub struct BodyError(String);

/// The top-level fields read besides the prompt's; everything else is skipped unparsed.
#[derive(Default)]
struct Envelope {
    model: Option<String>,
    stream: Option<bool>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
    n: Option<u64>,
}

/// The top-level keys read: the envelope's, then the prompt's.
const FIELDS: [&str; 9] = [
    "model",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "messages",
    "prompt",
    "input",
];

/// Parses the top-level object once: the envelope's fields typed, the prompt's (`messages`,
/// `prompt`, `input`, in the order the body gives them) walked by [`TextSeed`] where they lie,
/// so their text is scanned once, not skipped and then parsed again. A key given twice is an
/// error, as for a derived struct.
struct EnvelopeSeed<'s>(&'s mut TextState);

impl<'de> DeserializeSeed<'de> for EnvelopeSeed<'_> {
    type Value = Envelope;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Envelope, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EnvelopeSeed<'_> {
    type Value = Envelope;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Envelope, A::Error> {
        let mut e = Envelope::default();
        let mut seen = [false; FIELDS.len()];
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let Some(index) = FIELDS.iter().position(|f| *f == key) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            if std::mem::replace(&mut seen[index], true) {
                return Err(de::Error::duplicate_field(FIELDS[index]));
            }
            match index {
                0 => e.model = map.next_value()?,
                1 => e.stream = map.next_value()?,
                2 => e.max_tokens = map.next_value()?,
                3 => e.max_completion_tokens = map.next_value()?,
                4 => e.max_output_tokens = map.next_value()?,
                5 => e.n = map.next_value()?,
                _ => map.next_value_seed(TextSeed(&mut *self.0))?,
            }
        }
        Ok(e)
    }
}

/// Reads the facts of a JSON request body.
pub fn parse(body: &[u8]) -> Result<BodyFacts, BodyError> {
    // JSON is UTF-8 (RFC 8259): checked once here, so the parser need not check each string.
    let body = std::str::from_utf8(body)
        .map_err(|e| BodyError(format!("the body is not UTF-8 ({e}), so not JSON")))?;
    let mut text = TextState::default();
    // Room for every block the body could hold, so the fingerprint never grows while walked.
    text.prefix.hashes = Vec::with_capacity((body.len() / PREFIX_BLOCK).min(MAX_PREFIX_BLOCKS));
    text.prefix.block = Vec::with_capacity(PREFIX_BLOCK);
    let mut de = serde_json::Deserializer::from_str(body);
    let e = EnvelopeSeed(&mut text)
        .deserialize(&mut de)
        .and_then(|e| de.end().map(|()| e))
        .map_err(|e| BodyError(e.to_string()))?;
    Ok(BodyFacts {
        model: e.model,
        stream: e.stream.unwrap_or(false),
        max_tokens: e
            .max_tokens
            .or(e.max_completion_tokens)
            .or(e.max_output_tokens),
        n: e.n.unwrap_or(1),
        prompt_tokens: text.bytes.div_ceil(BYTES_PER_TOKEN),
        prefix: text.prefix.hashes,
    })
}

/// The body with its top-level `model` value replaced by `model`; every other byte as it was.
/// `None` when the body is not a JSON object with a `model`.
pub fn with_model(body: &[u8], model: &str) -> Option<Vec<u8>> {
    use serde_json::value::RawValue;
    let fields: std::collections::HashMap<Cow<'_, str>, &RawValue> =
        serde_json::from_slice(body).ok()?;
    let value = fields.get("model")?.get().as_bytes();
    // The raw value borrows from `body`: its place there is its pointer's offset.
    let start = (value.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start + value.len();
    if end > body.len() {
        return None;
    }
    let replacement = serde_json::to_vec(model).ok()?;
    let mut out = Vec::with_capacity(body.len() + replacement.len());
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(&replacement);
    out.extend_from_slice(&body[end..]);
    Some(out)
}

/// Token counts a backend reported in its answer's `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    /// Prompt tokens, as the model server's tokenizer counted them.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens generated.
    #[serde(default)]
    pub completion_tokens: u64,
}

/// Most bytes of a response kept from its last `usage` key on, to read that object.
pub const USAGE_TAIL: usize = 2048;
/// The key of the token counts in an answer, quotes included: JSON escapes every quote inside
/// a string, so these bytes can only be a key (or a value) of the answer's own structure.
pub const USAGE_KEY: &[u8] = b"\"usage\"";

/// [`USAGE_KEY`]'s searcher, built once (a forward search is vectorised; a reverse one is not).
static USAGE_FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(USAGE_KEY));

/// Where the last [`USAGE_KEY`] in `bytes` begins.
pub fn last_usage_key(bytes: &[u8]) -> Option<usize> {
    USAGE_FINDER.find_iter(bytes).last()
}

/// The last `usage` object in the end of a response body (a JSON answer, or the last SSE events
/// of a stream that asked for `stream_options.include_usage`).
pub fn usage_in(tail: &[u8]) -> Option<Usage> {
    let at = last_usage_key(tail)?;
    let rest = &tail[at + USAGE_KEY.len()..];
    let colon = rest.iter().position(|&b| b == b':')?;
    let value = &rest[colon + 1..];
    // One value read from the front; what follows it is not looked at. The tail may end inside
    // a character (it is cut by bytes), so only its valid UTF-8 prefix is read.
    let value = match std::str::from_utf8(value) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&value[..e.valid_up_to()]).ok()?,
    };
    Usage::deserialize(&mut serde_json::Deserializer::from_str(value)).ok()
}

/// Bytes of prompt text per fingerprint block: about 16 tokens, a KV-cache block of vLLM's.
pub const PREFIX_BLOCK: usize = 64;
/// Most blocks fingerprinted (32 KiB of prompt): bounds the cost of a huge prompt.
pub const MAX_PREFIX_BLOCKS: usize = 512;

/// Marks the end of one string of the prompt, so `"ab" + "c"` differs from `"a" + "bc"`.
const SEPARATOR: u8 = 0x1e;

/// Chained hashes of fixed-size blocks of the bytes fed in: fixed, so every gpulb replica
/// computes the same fingerprint for the same prompt.
#[derive(Debug, Default)]
struct PrefixHasher {
    /// The start of a block whose end has not come yet.
    block: Vec<u8>,
    chain: u64,
    hashes: Vec<u64>,
}

impl PrefixHasher {
    /// Whole blocks are hashed where they lie; only a block split between two strings is copied.
    fn feed(&mut self, mut bytes: &[u8]) {
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

/// A block's hash chained to the one before, eight bytes a step (a multiply-xorshift mix, the
/// kind of FxHash and wyhash): about a tenth of the instructions of a byte-at-a-time hash.
fn block_hash(chain: u64, block: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut hash = (chain ^ 0xcbf2_9ce4_8422_2325).wrapping_mul(K);
    for word in block.chunks_exact(8) {
        let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        hash = (hash ^ word).wrapping_mul(K);
        hash ^= hash >> 29;
    }
    hash
}

/// What is measured of the prompt while it is walked once: its text's size and fingerprint.
#[derive(Debug, Default)]
struct TextState {
    bytes: u64,
    prefix: PrefixHasher,
}

/// Walks any JSON value of the prompt: string values count their length and feed the
/// fingerprint, numbers (token ids) count as one token each; object keys and the values of
/// naming keys (`role`, `type`, `name`, `id`) do not count.
struct TextSeed<'s>(&'s mut TextState);

impl<'de> DeserializeSeed<'de> for TextSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TextSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("prompt text")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.bytes = self.0.bytes.saturating_add(v.len() as u64);
        self.0.prefix.feed(v.as_bytes());
        self.0.prefix.feed(&[SEPARATOR]);
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.0.bytes = self.0.bytes.saturating_add(BYTES_PER_TOKEN);
        self.0.prefix.feed(&v.to_le_bytes());
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.visit_u64(v as u64)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(TextSeed(&mut *self.0))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if matches!(key.as_ref(), "role" | "type" | "name" | "id") {
                map.next_value::<IgnoredAny>()?;
            } else {
                map.next_value_seed(TextSeed(&mut *self.0))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_request_facts() {
        let body = br#"{"messages":[{"role":"system","content":"You are terse."},
            {"role":"user","content":[{"type":"text","text":"Hello there"}]}],
            "model":"llama-3.1-8b","stream":true,"max_completion_tokens":64,"n":2,
            "temperature":0.2,"tools":[{"type":"function"}]}"#;
        let f = parse(body).unwrap();
        assert_eq!(f.model.as_deref(), Some("llama-3.1-8b"));
        assert!(f.stream);
        assert_eq!(f.max_tokens, Some(64));
        assert_eq!(f.n, 2);
        // "You are terse." (14) + "Hello there" (11) = 25 bytes: 7 tokens.
        assert_eq!(f.prompt_tokens, 7);
        assert_eq!(f.estimated_tokens(), 7 + 128);
    }

    #[test]
    fn the_envelope_is_read_in_one_pass_whatever_the_order_of_its_keys() {
        let a = parse(br#"{"prompt":"ab\"cd","model":"m","extra":{"prompt":"x"},"n":3}"#);
        let b = parse(br#"{"n":3,"model":"m","prompt":"ab\"cd"}"#);
        assert_eq!(a, b);
        let a = a.unwrap();
        assert_eq!(
            (a.model.as_deref(), a.n, a.prompt_tokens),
            (Some("m"), 3, 2)
        );
        for (bad, why) in [
            (
                &br#"{"model":"a","model":"b"}"#[..],
                "duplicate field `model`",
            ),
            (
                br#"{"prompt":"a","prompt":"b"}"#,
                "duplicate field `prompt`",
            ),
            (br#"["m", true]"#, "expected a JSON object"),
            (br#"{"model":"m"} {}"#, "trailing characters"),
            (br#"{"stream":"yes"}"#, "expected a boolean"),
            (br#"{"prompt":"a""#, "EOF"),
        ] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(error.contains(why), "{error}");
        }
    }

    #[test]
    fn completion_and_embedding_prompts() {
        let f = parse(br#"{"model":"m","prompt":"12345678","max_tokens":5}"#).unwrap();
        assert_eq!(
            (f.prompt_tokens, f.max_tokens, f.stream, f.n),
            (2, Some(5), false, 1)
        );
        let ids = parse(br#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(ids.prompt_tokens, 3);
        let batch = parse(br#"{"model":"e","input":["abcd","efgh\u00e9"]}"#).unwrap();
        assert_eq!(batch.prompt_tokens, 3, "4 + 6 bytes");
        let empty = parse(b"{}").unwrap();
        assert_eq!(
            empty,
            BodyFacts {
                n: 1,
                ..BodyFacts::default()
            }
        );
    }

    /// A chat body with these message contents.
    fn chat(contents: &[&str]) -> Vec<u8> {
        let messages: Vec<_> = contents
            .iter()
            .map(|c| serde_json::json!({"role": "user", "content": c}))
            .collect();
        serde_json::to_vec(&serde_json::json!({"model": "m", "messages": messages})).unwrap()
    }

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

    #[test]
    fn prompts_sharing_a_prefix_share_its_fingerprint() {
        let system = "You are a careful assistant. ".repeat(10); // 290 bytes: 4 whole blocks
        let a = parse(&chat(&[&system, "What is the capital of France?"])).unwrap();
        let b = parse(&chat(&[
            &system,
            "Name three prime numbers, please, quickly.",
        ]))
        .unwrap();
        assert_eq!(a.prefix.len(), (290 + 1 + 30 + 1) / PREFIX_BLOCK);
        assert_eq!(
            a.prefix[..4],
            b.prefix[..4],
            "the system prompt's blocks agree"
        );
        assert_ne!(
            a.prefix.get(4),
            b.prefix.get(4),
            "they part where the questions differ"
        );
        // The same text split differently is another prompt.
        let split = parse(&chat(&[&system[..100], &system[100..]])).unwrap();
        assert_eq!(split.prefix[0], a.prefix[0]);
        assert_ne!(split.prefix[1], a.prefix[1]);
        // Computed again (another replica): the same hashes.
        assert_eq!(parse(&chat(&[&system])).unwrap().prefix[..4], a.prefix[..4]);
        // Bounded, and a short prompt has no whole block.
        let huge = parse(&chat(&[&"x".repeat(100_000)])).unwrap();
        assert_eq!(huge.prefix.len(), MAX_PREFIX_BLOCKS);
        assert!(parse(&chat(&["hi"])).unwrap().prefix.is_empty());
    }

    #[test]
    fn nulls_count_as_absent() {
        let f = parse(br#"{"model":null,"stream":null,"max_tokens":null,"prompt":null}"#);
        assert_eq!(f.unwrap().model, None);
    }

    #[test]
    fn a_model_is_rewritten_in_place_and_nothing_else_moves() {
        let body = br#"{ "messages": [{"content": "model"}], "model" :  "gpt-4o-mini" , "n":1}"#;
        let out = with_model(body, "llama-3.1-8b").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{ "messages": [{"content": "model"}], "model" :  "llama-3.1-8b" , "n":1}"#
        );
        assert_eq!(with_model(br#"{"n":1}"#, "x"), None);
        assert_eq!(with_model(b"nope", "x"), None);
        let quoted = with_model(br#"{"model":"a"}"#, "b\"c").unwrap();
        assert_eq!(quoted, br#"{"model":"b\"c"}"#);
    }

    #[test]
    fn usage_is_found_at_the_end_of_json_and_sse_answers() {
        let json = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#;
        let expected = Usage {
            prompt_tokens: 12,
            completion_tokens: 5,
        };
        assert_eq!(usage_in(json), Some(expected));
        let sse = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n";
        assert_eq!(usage_in(sse), Some(expected));
        assert_eq!(usage_in(b"data: [DONE]\n\n"), None);
        assert_eq!(usage_in(br#"{"usage": null}"#), None);
        // A tail cut inside a character after the usage object still gives it.
        let mut cut = sse[..sse.len() - 16].to_vec();
        cut.extend_from_slice(&"é".as_bytes()[..1]);
        assert_eq!(usage_in(&cut), Some(expected));
    }

    #[test]
    fn a_body_that_is_not_utf8_is_named_as_such() {
        let e = parse(b"{\"model\":\"m\xff\"}").unwrap_err();
        assert!(e.0.contains("not UTF-8"), "{}", e.0);
    }

    #[test]
    fn what_is_not_a_request_is_an_error_that_says_why() {
        for bad in [
            &b"not json"[..],
            b"[1,2]",
            br#"{"stream":"yes"}"#,
            br#"{"model":"#,
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("request body is not"), "{e}");
        }
    }
}
