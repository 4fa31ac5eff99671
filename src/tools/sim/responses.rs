//! The Responses API as vLLM serves it, enough to route by: answers and stream events in its
//! shape, and responses stored in this worker's memory (`store`, the default), so a request
//! naming one (`previous_response_id`, `GET /v1/responses/{id}`) is answered only by the
//! worker that stored it, and with `404` by any other, as vLLM does.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::body::{json_response, Body};
use super::openai::{self, now_s, token_text, GenRequest};

/// Stored responses a worker keeps at most; past it the store starts empty again (a sim's
/// bound, not vLLM's, which keeps every one).
const MAX_STORED: usize = 100_000;

/// The ids of the responses this worker stored.
#[derive(Default)]
pub(crate) struct Store(Mutex<HashSet<String>>);

impl Store {
    /// Keeps `id`.
    pub fn keep(&self, id: &str) {
        let mut ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if ids.len() >= MAX_STORED {
            ids.clear();
        }
        ids.insert(id.to_string());
    }

    /// Whether `id` was stored here.
    pub fn has(&self, id: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(id)
    }
}

/// vLLM's answer for a response id it does not hold.
pub(crate) fn not_found(id: &str) -> Response<Body> {
    let message = format!("Response with id '{id}' not found.");
    let body = openai::error_body(&message, "invalid_request_error", json!(404));
    json_response(StatusCode::NOT_FOUND, &body)
}

/// `GET /v1/responses/{id}`: the stored response's envelope, or [`not_found`].
pub(crate) fn retrieve(store: &Store, id: &str) -> Response<Body> {
    if !store.has(id) {
        return not_found(id);
    }
    let body = json!({"id": id, "object": "response", "status": "completed"});
    json_response(StatusCode::OK, &body)
}

/// The response object of `req` with `completion_tokens` generated, in `status`.
pub(crate) fn response_object(
    id: &str,
    req: &GenRequest,
    completion_tokens: u32,
    status: &str,
) -> Value {
    let text: String = (0..completion_tokens).map(token_text).collect();
    let output = if status == "completed" {
        json!([{"type": "message", "id": message_id(id), "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}])
    } else {
        json!([])
    };
    json!({"id": id, "object": "response", "created_at": now_s(), "model": req.model,
           "status": status, "previous_response_id": req.previous_response_id,
           "output": output,
           "usage": {"input_tokens": req.prompt_tokens, "output_tokens": completion_tokens,
                     "total_tokens": req.prompt_tokens + completion_tokens as usize}})
}

/// The stream events carrying token `i`: `response.created` before the first.
pub(crate) fn token_events(id: &str, req: &GenRequest, i: u32) -> String {
    let delta = json!({"type": "response.output_text.delta", "sequence_number": i + 1,
                       "item_id": message_id(id), "output_index": 0, "content_index": 0,
                       "delta": token_text(i)});
    let delta = event("response.output_text.delta", &delta);
    if i > 0 {
        return delta;
    }
    let created = json!({"type": "response.created", "sequence_number": 0,
                         "response": response_object(id, req, 0, "in_progress")});
    event("response.created", &created) + &delta
}

/// The event that ends a stream: `response.completed`, with the whole response.
pub(crate) fn completed_event(id: &str, req: &GenRequest, completion_tokens: u32) -> String {
    let done = json!({"type": "response.completed", "sequence_number": completion_tokens + 1,
                      "response": response_object(id, req, completion_tokens, "completed")});
    event("response.completed", &done)
}

fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

fn message_id(id: &str) -> String {
    format!("msg_{}", id.trim_start_matches("resp_"))
}
