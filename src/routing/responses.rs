//! Which backend stored each response of the OpenAI Responses API, so that a request naming
//! one (`previous_response_id`, `/v1/responses/{id}`) goes to the server that holds it: vLLM
//! and SGLang keep stored responses in the serving process's memory, and another server
//! answers `404` for them.

use super::{ModelRoute, Snapshot};
use crate::fast_hash::FastMap;
use crate::health::now_ms;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// Response ids remembered at most (the oldest forgotten first): about 110 bytes each for
/// vLLM's 37-byte ids (the id, its map entry and its place in the order), some 7 MiB in all
/// (estimated, not measured).
pub const MAX_RESPONSES_TRACKED: usize = 1 << 16;

/// Longest response id remembered; a longer one is not an id any server here makes.
pub const MAX_RESPONSE_ID_BYTES: usize = 256;

/// Response id → the [`crate::routing::BackendState::id`] of the backend that answered it.
#[derive(Debug)]
pub struct ResponseOwners {
    inner: Mutex<Owners>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct Owners {
    by_id: FastMap<Arc<str>, u32>,
    /// Ids in the order first recorded, to forget the oldest.
    order: VecDeque<Arc<str>>,
}

impl ResponseOwners {
    /// An empty map holding at most `capacity` ids.
    pub fn new(capacity: usize) -> Self {
        ResponseOwners {
            inner: Mutex::default(),
            capacity: capacity.max(1),
        }
    }

    /// Records that backend `owner` answered response `id`.
    pub fn record(&self, id: &str, owner: u32) {
        if id.is_empty() || id.len() > MAX_RESPONSE_ID_BYTES {
            return;
        }
        let mut owners = self.lock();
        if let Some(known) = owners.by_id.get_mut(id) {
            *known = owner;
            return;
        }
        if owners.order.len() >= self.capacity {
            if let Some(oldest) = owners.order.pop_front() {
                owners.by_id.remove(&oldest);
            }
        }
        let id: Arc<str> = Arc::from(id);
        owners.order.push_back(Arc::clone(&id));
        owners.by_id.insert(id, owner);
    }

    /// The backend that answered response `id`, when remembered.
    pub fn owner(&self, id: &str) -> Option<u32> {
        self.lock().by_id.get(id).copied()
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    /// Whether no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Owners> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Snapshot {
    /// Where a request of class `class` that names a stored response held by backend `owner`
    /// (a [`crate::routing::BackendState::id`]) goes: only there, while that backend is in the
    /// class's pools and may take requests (then it waits for it when it is full); `None`
    /// (routed as any other, and the backend's own answer, `404`, reaches the client) when it
    /// is gone or out.
    pub fn stored_response_route(&self, class: usize, owner: u32) -> Option<ModelRoute> {
        let now = now_ms();
        self.class_members(class)
            .any(|b| b.state.id == owner && b.state.eligible(now))
            .then_some(ModelRoute::Stored(owner))
    }
}

/// The id a request path names under the Responses API (`/v1/responses/{id}`, and its
/// `/cancel` and `/input_items`), if any.
pub fn id_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// Whether `path` creates responses (`POST /v1/responses`), whose answers' ids are recorded.
pub fn creates_responses(path: &str) -> bool {
    path == "/v1/responses"
}

/// Bytes of an answer looked through for its response id: it comes first in the body
/// (`{"id": ...`) and in a stream's first event (`response.created`).
pub const ID_SCAN_BYTES: usize = 8 * 1024;

/// Finds the response id at the start of an answer to `POST /v1/responses`, fed chunk by chunk:
/// the string value of the first `"id"` key.
#[derive(Debug, Default)]
pub struct ResponseIdScan {
    seen: Vec<u8>,
}

impl ResponseIdScan {
    /// Takes the next chunk. `Some(Ok(id))`: found; `Some(Err(()))`: given up (none in the first
    /// [`ID_SCAN_BYTES`]); `None`: not yet.
    pub fn feed(&mut self, chunk: &[u8]) -> Option<Result<String, ()>> {
        let room = ID_SCAN_BYTES.saturating_sub(self.seen.len());
        self.seen.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if let Some(id) = first_id(&self.seen) {
            return Some(id.ok_or(()));
        }
        (self.seen.len() >= ID_SCAN_BYTES).then_some(Err(()))
    }
}

/// In `bytes`: `None` while the first `"id"` key and its value are not all there yet;
/// `Some(None)` when that value is not a plain string. An `"id"` that is not a key (a value,
/// say) is passed by.
fn first_id(bytes: &[u8]) -> Option<Option<String>> {
    const KEY: &[u8] = b"\"id\"";
    let mut from = 0;
    loop {
        let at = from + bytes[from..].windows(KEY.len()).position(|w| w == KEY)?;
        from = at + KEY.len();
        let after = bytes[from..].trim_ascii_start();
        match after.first()? {
            b':' => return string_value(after[1..].trim_ascii_start()),
            _ => continue,
        }
    }
}

/// The JSON string at the start of `value`: `None` while incomplete, `Some(None)` when it is
/// not a plain string (another type, or escapes).
fn string_value(value: &[u8]) -> Option<Option<String>> {
    let Some(text) = value.strip_prefix(b"\"") else {
        return (!value.is_empty()).then_some(None);
    };
    let end = text.iter().position(|&b| b == b'"' || b == b'\\')?;
    if text[end] == b'\\' {
        return Some(None);
    }
    Some(std::str::from_utf8(&text[..end]).ok().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_kept_by_id_and_the_oldest_forgotten_first() {
        let owners = ResponseOwners::new(2);
        owners.record("resp_a", 1);
        owners.record("resp_b", 2);
        owners.record("resp_a", 3); // known: its owner changes, it is not added again
        assert_eq!((owners.owner("resp_a"), owners.len()), (Some(3), 2));
        owners.record("resp_c", 4);
        assert_eq!(owners.owner("resp_a"), None, "the oldest goes first");
        assert_eq!(
            (owners.owner("resp_b"), owners.owner("resp_c")),
            (Some(2), Some(4))
        );
        owners.record("", 5);
        owners.record(&"x".repeat(MAX_RESPONSE_ID_BYTES + 1), 5);
        assert_eq!(owners.len(), 2);
    }

    #[test]
    fn paths_name_ids_under_v1_responses_only() {
        assert_eq!(id_in_path("/v1/responses/resp_1"), Some("resp_1"));
        assert_eq!(id_in_path("/v1/responses/resp_1/cancel"), Some("resp_1"));
        assert_eq!(
            id_in_path("/v1/responses/resp_1/input_items"),
            Some("resp_1")
        );
        assert_eq!(id_in_path("/v1/responses/"), None);
        assert_eq!(id_in_path("/v1/responses"), None);
        assert_eq!(id_in_path("/v1/chat/completions"), None);
        assert!(creates_responses("/v1/responses") && !creates_responses("/v1/responses/x"));
    }

    #[test]
    fn the_first_id_is_found_in_a_body_or_a_stream_split_anywhere() {
        let body = br#"{"object": "id", "id": "resp_42", "output": [{"id": "msg_1"}]}"#;
        let stream = b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_7\",\"status\":\"in_progress\"}}\n\n";
        for (answer, id) in [(&body[..], "resp_42"), (&stream[..], "resp_7")] {
            for split in 0..answer.len() {
                let mut scan = ResponseIdScan::default();
                let first = scan.feed(&answer[..split]);
                let found = first.or_else(|| scan.feed(&answer[split..]));
                assert_eq!(found, Some(Ok(id.to_string())), "split at {split}");
            }
        }
    }

    #[test]
    fn a_scan_gives_up_on_an_odd_id_or_after_its_bytes() {
        assert_eq!(
            ResponseIdScan::default().feed(br#"{"id": 5}"#),
            Some(Err(()))
        );
        assert_eq!(
            ResponseIdScan::default().feed(br#"{"id": "a\"b"}"#),
            Some(Err(()))
        );
        let mut scan = ResponseIdScan::default();
        assert_eq!(scan.feed(&[b' '; ID_SCAN_BYTES - 1]), None);
        assert_eq!(scan.feed(b"  {\"id\": \"late\"}"), Some(Err(())));
    }
}
