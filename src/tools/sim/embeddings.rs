//! `POST /v1/embeddings`: an embedding server that pays a fixed cost per call plus a smaller
//! cost per input item, runs a few calls at once, caps the items of one call, and answers
//! deterministic vectors (the same text always gets the same vector, wherever it sits in a call).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::body::{json_response, Body};
use super::http::{error, model_not_found, read_body, Shared, MAX_BODY};
use super::openai::count_tokens;

/// An input containing this text makes the server reject the whole call with 400, the way a
/// real server rejects a request with one bad item (a test's "poisoned" input).
pub const REJECT_MARKER: &str = "<<reject>>";

/// Cost and capacity model of the embedding endpoint.
#[derive(Clone, Debug)]
pub struct EmbeddingProfile {
    /// Paid once per call (a GPU pass and its launch overhead, the HTTP round trip).
    pub call_cost: Duration,
    /// Paid per input item of a call, on top of `call_cost`.
    pub item_cost: Duration,
    /// Most input items in one call; a call with more is refused with 400 (as TEI and vLLM
    /// refuse a batch over their limit), never split or queued.
    pub max_batch: usize,
    /// Calls computed at once; further calls wait their turn (the server's own queue).
    pub concurrency: usize,
    /// Dimensions of a vector when the request does not ask for fewer.
    pub dimensions: usize,
}

impl Default for EmbeddingProfile {
    fn default() -> Self {
        EmbeddingProfile {
            call_cost: Duration::from_millis(20),
            item_cost: Duration::from_millis(1),
            max_batch: 64,
            concurrency: 2,
            dimensions: 16,
        }
    }
}

/// The endpoint's live state: its profile, its turn-taking and its counters.
pub(crate) struct Embedder {
    pub profile: EmbeddingProfile,
    turns: Semaphore,
    /// Calls answered 200.
    pub calls: AtomicU64,
    /// Input items embedded in calls answered 200.
    pub items: AtomicU64,
}

impl Embedder {
    pub(crate) fn new(profile: EmbeddingProfile) -> Self {
        Embedder {
            turns: Semaphore::new(profile.concurrency.max(1)),
            profile,
            calls: AtomicU64::new(0),
            items: AtomicU64::new(0),
        }
    }
}

#[derive(Deserialize)]
struct RawEmbeddingRequest {
    model: Option<String>,
    input: Option<Value>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
}

/// One input item: a text, or a text already tokenized.
#[derive(Debug, PartialEq)]
enum Item {
    Text(String),
    Tokens(Vec<u64>),
}

impl Item {
    fn tokens(&self) -> usize {
        match self {
            Item::Text(t) => count_tokens(t),
            Item::Tokens(ids) => ids.len(),
        }
    }

    fn seed(&self) -> u64 {
        let mut hash = 0xcbf2_9ce4_8422_2325_u64;
        let mut feed = |bytes: &[u8]| {
            for &b in bytes {
                hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        match self {
            Item::Text(t) => feed(t.as_bytes()),
            Item::Tokens(ids) => ids.iter().for_each(|id| feed(&id.to_le_bytes())),
        }
        hash
    }
}

/// The items of an `input`: a string, an array of strings, one token array, or an array of
/// token arrays (OpenAI's four shapes).
fn items_of(input: &Value) -> Result<Vec<Item>, String> {
    let tokens =
        |v: &Value| -> Option<Vec<u64>> { v.as_array()?.iter().map(Value::as_u64).collect() };
    match input {
        Value::String(s) => Ok(vec![Item::Text(s.clone())]),
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            Ok(vec![Item::Tokens(tokens(input).unwrap_or_default())])
        }
        Value::Array(a) if !a.is_empty() => a
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(Item::Text(s.clone())),
                v => tokens(v)
                    .filter(|t| !t.is_empty())
                    .map(Item::Tokens)
                    .ok_or_else(|| "'input' items must be strings or arrays of token ids".into()),
            })
            .collect(),
        Value::Array(_) => Err("'input' must not be empty".into()),
        _ => Err("'input' must be a string or an array".into()),
    }
}

/// The deterministic unit vector of `item`, `dims` long.
fn vector(item: &Item, dims: usize) -> Vec<f32> {
    let mut state = item.seed() | 1;
    let mut v: Vec<f32> = (0..dims)
        .map(|_| {
            // xorshift64: cheap, fixed, the same on every platform.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect();
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::EPSILON);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

/// Standard base64 of `bytes` (OpenAI's `encoding_format: base64`: little-endian f32s).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Handles `POST /v1/embeddings`.
pub(crate) async fn embed(sh: &Shared, req: Request<Incoming>, slow: f64) -> Response<Body> {
    let body = match read_body(req, MAX_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let bad = |msg: &str| error(StatusCode::BAD_REQUEST, msg, "invalid_request");
    let raw: RawEmbeddingRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad(&format!("could not parse JSON body: {e}")),
    };
    let model = match sh.models.resolve(raw.model) {
        Ok(m) => m,
        Err(e) => return model_not_found(&e),
    };
    let items = match raw.input.as_ref().map(items_of) {
        Some(Ok(items)) => items,
        Some(Err(msg)) => return bad(&msg),
        None => return bad("'input' is a required property"),
    };
    let embedder = &sh.embedder;
    let profile = &embedder.profile;
    if items.len() > profile.max_batch {
        return bad(&format!(
            "{} inputs in one request; this server takes at most {}",
            items.len(),
            profile.max_batch
        ));
    }
    if let Some(at) = items
        .iter()
        .position(|i| matches!(i, Item::Text(t) if t.contains(REJECT_MARKER)))
    {
        return bad(&format!(
            "input[{at}] is rejected: it contains {REJECT_MARKER}"
        ));
    }
    let dims = match raw.dimensions {
        None => profile.dimensions,
        Some(d) if (1..=profile.dimensions).contains(&d) => d,
        Some(d) => {
            return bad(&format!(
                "dimensions {d} is not supported; 1 to {}",
                profile.dimensions
            ))
        }
    };
    let base64_wanted = match raw.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => return bad(&format!("unknown encoding_format {other:?}")),
    };
    {
        let Ok(_turn) = embedder.turns.acquire().await else {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "closed", "closed");
        };
        let cost = profile.call_cost + profile.item_cost * items.len() as u32;
        tokio::time::sleep(cost.mul_f64(slow)).await;
    }
    let data: Vec<Value> = items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let v = vector(item, dims);
            let embedding = if base64_wanted {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let tokens: usize = items.iter().map(Item::tokens).sum();
    embedder.calls.fetch_add(1, Ordering::Relaxed);
    embedder
        .items
        .fetch_add(items.len() as u64, Ordering::Relaxed);
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": data, "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_come_in_four_shapes() {
        let items = |v: Value| items_of(&v);
        assert_eq!(items(json!("a")).unwrap(), [Item::Text("a".into())]);
        assert_eq!(items(json!(["a", "b"])).unwrap().len(), 2);
        assert_eq!(
            items(json!([1, 2, 3])).unwrap(),
            [Item::Tokens(vec![1, 2, 3])]
        );
        assert_eq!(
            items(json!([[1, 2], "c"])).unwrap(),
            [Item::Tokens(vec![1, 2]), Item::Text("c".into())]
        );
        assert!(items(json!([])).is_err());
        assert!(items(json!([[]])).is_err());
        assert!(items(json!(5)).is_err());
    }

    #[test]
    fn vectors_are_deterministic_unit_vectors() {
        let a = vector(&Item::Text("hello".into()), 16);
        assert_eq!(a, vector(&Item::Text("hello".into()), 16));
        assert_ne!(a, vector(&Item::Text("hellp".into()), 16));
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
