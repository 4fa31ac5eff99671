//! What a batchable request brings to a batch: its input items, their estimated tokens, and the
//! key that says which other requests it may be merged with; and the merged body itself.

use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Bytes of text counted as one token (as [`crate::request::BYTES_PER_TOKEN`]).
const BYTES_PER_TOKEN: u64 = crate::request::BYTES_PER_TOKEN;

/// An embeddings request taken apart for merging.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchInput {
    /// Requests with equal keys may share an upstream call: every field but `input` and `user`
    /// (model, `encoding_format`, `dimensions`, anything else), whether the items are texts or
    /// token arrays, and the client's credentials.
    pub key: String,
    /// The fields the merged body carries besides `input`.
    pub options: BTreeMap<String, Value>,
    /// Its input items, in order: texts, or token-id arrays.
    pub items: Vec<Value>,
    /// Estimated tokens of each item (text bytes / 4 rounded up, or the ids of a token array).
    pub item_tokens: Vec<u64>,
}

impl BatchInput {
    /// Reads an embeddings body; `None` when it cannot be merged with others (not a JSON
    /// object, no `input`, an empty or mixed `input`, or `stream` asked for). `credentials` is
    /// the client's `Authorization` value: requests of different credentials never merge.
    pub fn parse(body: &[u8], credentials: Option<&[u8]>) -> Option<BatchInput> {
        let Value::Object(mut fields): Value = serde_json::from_slice(body).ok()? else {
            return None;
        };
        let input = fields.remove("input")?;
        fields.remove("user");
        // An embeddings answer is never streamed; a `stream: false` changes nothing.
        match fields.remove("stream") {
            None | Some(Value::Null | Value::Bool(false)) => {}
            Some(_) => return None,
        }
        let (kind, items) = items_of(input)?;
        let options: BTreeMap<String, Value> = fields.into_iter().collect();
        let key =
            serde_json::to_string(&(kind, &options, credentials.map(String::from_utf8_lossy)))
                .ok()?;
        let item_tokens = items.iter().map(tokens_of).collect();
        Some(BatchInput {
            key,
            options,
            items,
            item_tokens,
        })
    }

    /// Estimated tokens of all its items.
    pub fn tokens(&self) -> u64 {
        self.item_tokens.iter().sum()
    }
}

/// The items of an `input` and their kind (`text` or `tokens`), for OpenAI's four shapes: a
/// string, an array of strings, one token array, an array of token arrays.
fn items_of(input: Value) -> Option<(&'static str, Vec<Value>)> {
    let is_ids = |v: &Value| {
        v.as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_u64))
    };
    match input {
        Value::String(_) => Some(("text", vec![input])),
        ref ids if is_ids(ids) => Some(("tokens", vec![input])),
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_string) => {
            Some(("text", items))
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(is_ids) => {
            Some(("tokens", items))
        }
        _ => None,
    }
}

/// An item's estimated tokens, at least 1.
fn tokens_of(item: &Value) -> u64 {
    match item {
        Value::String(s) => (s.len() as u64).div_ceil(BYTES_PER_TOKEN).max(1),
        Value::Array(ids) => ids.len().max(1) as u64,
        _ => 1,
    }
}

/// The body of one upstream call carrying `items` under the shared `options`.
pub fn merged_body<'a>(
    options: &BTreeMap<String, Value>,
    items: impl IntoIterator<Item = &'a Value>,
) -> Vec<u8> {
    let mut body: Map<String, Value> = options.clone().into_iter().collect();
    body.insert(
        "input".into(),
        Value::Array(items.into_iter().cloned().collect()),
    );
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Option<BatchInput> {
        BatchInput::parse(v.to_string().as_bytes(), None)
    }

    #[test]
    fn items_and_tokens_of_each_input_shape() {
        let one = parse(json!({"model": "e", "input": "abcdefgh!"})).unwrap();
        assert_eq!((one.items.len(), one.tokens()), (1, 3));
        let texts = parse(json!({"model": "e", "input": ["a", "abcde"]})).unwrap();
        assert_eq!(texts.item_tokens, [1, 2]);
        let ids = parse(json!({"model": "e", "input": [1, 2, 3]})).unwrap();
        assert_eq!((ids.items.len(), ids.tokens()), (1, 3));
        let many_ids = parse(json!({"model": "e", "input": [[1, 2], [3]]})).unwrap();
        assert_eq!(many_ids.item_tokens, [2, 1]);
        for unmergeable in [
            json!({"model": "e"}),
            json!({"input": []}),
            json!({"input": ["a", [1]]}),
            json!({"input": 5}),
            json!({"input": "a", "stream": true}),
            json!(["a"]),
        ] {
            assert_eq!(parse(unmergeable.clone()), None, "{unmergeable}");
        }
    }

    #[test]
    fn keys_differ_by_options_and_kind_but_not_by_user() {
        let key = |v: Value| parse(v).unwrap().key;
        let base = key(json!({"model": "e", "input": "a"}));
        assert_eq!(
            base,
            key(json!({"input": ["b", "c"], "model": "e", "user": "u1"}))
        );
        assert_eq!(
            base,
            key(json!({"model": "e", "input": "a", "stream": false}))
        );
        for other in [
            json!({"model": "f", "input": "a"}),
            json!({"model": "e", "input": "a", "encoding_format": "base64"}),
            json!({"model": "e", "input": "a", "dimensions": 8}),
            json!({"model": "e", "input": [1, 2]}),
        ] {
            assert_ne!(base, key(other.clone()), "{other}");
        }
        let with = |auth: &[u8]| {
            BatchInput::parse(br#"{"model":"e","input":"a"}"#, Some(auth))
                .unwrap()
                .key
        };
        assert_ne!(with(b"Bearer a"), with(b"Bearer b"));
    }

    #[test]
    fn the_merged_body_carries_the_options_and_every_item_in_order() {
        let a = parse(json!({"model": "e", "dimensions": 4, "input": "x", "user": "u"})).unwrap();
        let b = parse(json!({"model": "e", "dimensions": 4, "input": ["y", "z"]})).unwrap();
        let body = merged_body(&a.options, a.items.iter().chain(&b.items));
        let merged: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            merged,
            json!({"model": "e", "dimensions": 4, "input": ["x", "y", "z"]})
        );
    }
}
