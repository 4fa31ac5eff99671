//! Facts read once per request from its JSON body (OpenAI style): the model, whether it
//! streams, how many tokens it may generate, and an estimate of its prompt's tokens.
//!
//! Only the top-level fields needed are parsed, by a strict scanner of gpulb's own ([`scan`]:
//! serde_json's grammar, 16 bytes a step through strings); the prompt's text is measured
//! and fingerprinted ([`prefix`]), never copied, and the body itself is forwarded as received.

mod prefix;
mod scan;

use prefix::{PrefixHasher, SEPARATOR};
pub use prefix::{MAX_PREFIX_BLOCKS, PREFIX_BLOCK};
use scan::{Number, Scan, ScanError};
use std::borrow::Cow;

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
    /// `previous_response_id` (Responses API): the stored response it goes on from.
    pub previous_response_id: Option<String>,
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

/// The top-level keys read: the envelope's, then the prompt's. Everything else is skipped
/// (its grammar checked, nothing built).
const FIELDS: [&str; 10] = [
    "model",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "previous_response_id",
    "messages",
    "prompt",
    "input",
];

/// The top-level fields read besides the prompt's.
#[derive(Default)]
struct Envelope {
    model: Option<String>,
    stream: Option<bool>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
    n: Option<u64>,
    previous_response_id: Option<String>,
}

/// Reads the facts of a JSON request body.
pub fn parse(body: &[u8]) -> Result<BodyFacts, BodyError> {
    let mut scan = Scan::new(body);
    let mut envelope = Envelope::default();
    let mut text = TextState {
        bytes: 0,
        prefix: PrefixHasher::for_body(body.len()),
    };
    let mut seen = [false; FIELDS.len()];
    scan.object(0, |scan, key, depth| {
        let Some(index) = key.one_of(&FIELDS) else {
            return scan.skip(depth);
        };
        if std::mem::replace(&mut seen[index], true) {
            return Err(scan.error(format!("duplicate field `{}`", FIELDS[index])));
        }
        let field = FIELDS[index];
        let e = &mut envelope;
        match index {
            0 => e.model = optional_string(scan, field)?,
            1 => e.stream = optional_bool(scan, field)?,
            2 => e.max_tokens = optional_count(scan, field)?,
            3 => e.max_completion_tokens = optional_count(scan, field)?,
            4 => e.max_output_tokens = optional_count(scan, field)?,
            5 => e.n = optional_count(scan, field)?,
            6 => e.previous_response_id = optional_string(scan, field)?,
            _ => text.walk(scan, depth)?,
        }
        Ok(())
    })
    .and_then(|()| scan.end())
    .map_err(|e| BodyError(e.to_string()))?;
    let e = envelope;
    Ok(BodyFacts {
        model: e.model,
        stream: e.stream.unwrap_or(false),
        max_tokens: e
            .max_tokens
            .or(e.max_completion_tokens)
            .or(e.max_output_tokens),
        n: e.n.unwrap_or(1),
        prompt_tokens: text.bytes.div_ceil(BYTES_PER_TOKEN),
        prefix: text.prefix.finish(),
        previous_response_id: e.previous_response_id,
    })
}

/// `field`'s value: a string, or `null` for none.
fn optional_string(scan: &mut Scan<'_>, field: &str) -> Result<Option<String>, ScanError> {
    match scan.peek() {
        Some(b'"') => Ok(Some(scan.string()?.text()?.into_owned())),
        Some(b'n') => scan.literal().map(|_| None),
        _ => Err(scan.error(format!("invalid type for `{field}`: expected a string"))),
    }
}

/// `field`'s value: `true`, `false`, or `null` for none.
fn optional_bool(scan: &mut Scan<'_>, field: &str) -> Result<Option<bool>, ScanError> {
    match scan.peek() {
        Some(b't' | b'f' | b'n') => scan.literal(),
        _ => Err(scan.error(format!("invalid type for `{field}`: expected a boolean"))),
    }
}

/// `field`'s value: a whole number from 0 to `u64::MAX`, or `null` for none.
fn optional_count(scan: &mut Scan<'_>, field: &str) -> Result<Option<u64>, ScanError> {
    let value_at = scan.peek().map(|_| scan.position());
    let value = match scan.peek() {
        Some(b'n') => return scan.literal().map(|_| None),
        Some(b'-' | b'0'..=b'9') => scan.number()?,
        _ => Number::Float,
    };
    match value {
        Number::Unsigned(n) => Ok(Some(n)),
        _ => Err(scan.error_at(
            value_at.unwrap_or_else(|| scan.position()),
            format!("invalid value for `{field}`: expected a whole number from 0 (u64)"),
        )),
    }
}

/// What is measured of the prompt while it is walked once: its text's size and fingerprint.
struct TextState {
    bytes: u64,
    prefix: PrefixHasher,
}

impl TextState {
    /// Walks any JSON value of the prompt: string values count their length and feed the
    /// fingerprint, integers (token ids) count as one token each; object keys and the values of
    /// naming keys (`role`, `type`, `name`, `id`) do not count.
    fn walk(&mut self, scan: &mut Scan<'_>, depth: usize) -> Result<(), ScanError> {
        match scan.peek() {
            Some(b'"') => {
                let text = scan.string()?.bytes()?;
                self.bytes = self.bytes.saturating_add(text.len() as u64);
                self.prefix.feed(&text);
                self.prefix.feed(&[SEPARATOR]);
            }
            Some(b'[') => scan.array(depth, |scan, depth| self.walk(scan, depth))?,
            Some(b'{') => scan.object(depth, |scan, key, depth| {
                if key.one_of(&["role", "type", "name", "id"]).is_some() {
                    scan.skip(depth)
                } else {
                    self.walk(scan, depth)
                }
            })?,
            Some(b'-' | b'0'..=b'9') => match scan.number()? {
                Number::Unsigned(id) => self.token_id(id),
                Number::Negative(id) => self.token_id(id as u64),
                Number::Float => {}
            },
            _ => scan.skip(depth)?,
        }
        Ok(())
    }

    /// A token id of the prompt: one token, its bytes fed to the fingerprint.
    fn token_id(&mut self, id: u64) {
        self.bytes = self.bytes.saturating_add(BYTES_PER_TOKEN);
        self.prefix.feed(&id.to_le_bytes());
    }
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, as the model server's tokenizer counted them.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
}

/// Most bytes of a response kept from its last `usage` key on, to read that object.
pub const USAGE_TAIL: usize = 2048;
/// The key of the token counts in an answer, quotes included: JSON escapes every quote inside
/// a string, so these bytes can only be a key (or a value) of the answer's own structure.
pub const USAGE_KEY: &[u8] = b"\"usage\"";

/// Where the last [`USAGE_KEY`] in `bytes` begins. Its `g` is searched from the end, a vector
/// at a time, and each one found is checked in place: `usage` comes at or near the end of an
/// answer, so only the few `g`s after it are checked in vain.
pub fn last_usage_key(bytes: &[u8]) -> Option<usize> {
    const G_AT: usize = 4;
    const _: () = assert!(USAGE_KEY[G_AT] == b'g');
    memchr::memrchr_iter(b'g', bytes)
        .filter_map(|g| g.checked_sub(G_AT))
        .find(|&start| bytes[start..].starts_with(USAGE_KEY))
}

/// The last `usage` object in the end of a response body (a JSON answer, or the last SSE events
/// of a stream that asked for `stream_options.include_usage`). The proxy reads it through
/// `UsageTail`, which keeps the body from its last key on; tests check that against this.
#[cfg(test)]
pub fn usage_in(tail: &[u8]) -> Option<Usage> {
    usage_after_key(&tail[last_usage_key(tail)? + USAGE_KEY.len()..])
}

/// The `usage` object whose [`USAGE_KEY`] ends where `after_key` begins.
pub fn usage_after_key(after_key: &[u8]) -> Option<Usage> {
    // One value read from the front; what follows it is not looked at (the tail may end inside
    // a character: it is cut by bytes). A count that is not a whole number, a duplicated count
    // or a value cut short reads as no usage at all.
    let mut scan = Scan::new(after_key);
    scan.expect(b':', "`:`").ok()?;
    let mut counts = [None; USAGE_FIELDS.len()];
    scan.object(0, |scan, key, depth| {
        let Some(index) = key.one_of(&USAGE_FIELDS) else {
            return scan.skip(depth);
        };
        scan.peek();
        let Number::Unsigned(count) = scan.number()? else {
            return Err(scan.error("a token count is not a whole number"));
        };
        match counts[index].replace(count) {
            None => Ok(()),
            Some(_) => Err(scan.error("a token count given twice")),
        }
    })
    .ok()?;
    let [prompt_tokens, completion_tokens] = counts.map(Option::unwrap_or_default);
    Some(Usage {
        prompt_tokens,
        completion_tokens,
    })
}

/// The counts read from a `usage` object, in [`Usage`]'s order; a missing one is 0.
const USAGE_FIELDS: [&str; 2] = ["prompt_tokens", "completion_tokens"];

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
    fn a_responses_body_names_the_response_it_goes_on_from() {
        let f = parse(
            br#"{"model":"m","input":"12345678","previous_response_id":"resp_1","max_output_tokens":5}"#,
        )
        .unwrap();
        assert_eq!(f.previous_response_id.as_deref(), Some("resp_1"));
        assert_eq!((f.prompt_tokens, f.max_tokens), (2, Some(5)));
        let none = parse(br#"{"input":"x","previous_response_id":null}"#).unwrap();
        assert_eq!(none.previous_response_id, None);
        let error = parse(br#"{"previous_response_id":7}"#).unwrap_err();
        assert!(
            error.to_string().contains("previous_response_id"),
            "{error}"
        );
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
    fn the_last_usage_key_is_found_wherever_it_lies() {
        let naive = |bytes: &[u8]| {
            (0..bytes.len())
                .rev()
                .find(|&i| bytes[i..].starts_with(USAGE_KEY))
        };
        for text in [
            &br#""usage""#[..],
            br#"{"usage":1,"x":"going","usage":2,"tag":"g"}"#,
            br#"{"text":"say \"usage\" and go","usage":{}}"#,
            br#"{"text":"say \"usage\""}"#,
            b"gg\"usag\"usage",
            b"g",
            b"",
        ] {
            let shown = String::from_utf8_lossy(text);
            assert_eq!(last_usage_key(text), naive(text), "{shown}");
        }
        assert_eq!(last_usage_key(br#"{"usage":1,"usage":2}"#), Some(11));
    }

    #[test]
    fn a_usage_object_is_read_strictly_and_a_missing_count_is_zero() {
        let spaced = br#"{"usage" :  { "completion_tokens" : 5 , "x": [{"y": "}"}] } }"#;
        assert_eq!(
            usage_in(spaced),
            Some(Usage {
                prompt_tokens: 0,
                completion_tokens: 5,
            })
        );
        for unread in [
            &br#"{"usage":{"prompt_tokens":null}}"#[..],
            br#"{"usage":{"prompt_tokens":1.5}}"#,
            br#"{"usage":{"prompt_tokens":-1}}"#,
            br#"{"usage":{"prompt_tokens":"3"}}"#,
            br#"{"usage":{"prompt_tokens":1,"prompt_tokens":2}}"#,
            br#"{"usage":{"prompt_tokens":1"#,
            br#"{"usage":[1,2]}"#,
        ] {
            let text = String::from_utf8_lossy(unread);
            assert_eq!(usage_in(unread), None, "{text}");
        }
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
