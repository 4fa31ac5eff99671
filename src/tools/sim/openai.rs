//! OpenAI wire shapes: request parsing, prompt token counting, response and SSE chunk bodies.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{json, Value};

use super::models::{NotServed, ServedModels};
use super::prefix;

/// Model a worker serves unless its profile names others.
pub(crate) const DEFAULT_MODEL: &str = "sim-model";

/// Which OpenAI endpoint a generation request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/v1/completions`
    Completion,
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/responses`
    Response,
}

#[derive(Deserialize)]
struct RawRequest {
    model: Option<String>,
    prompt: Option<Value>,
    messages: Option<Vec<Value>>,
    input: Option<Value>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    max_output_tokens: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    previous_response_id: Option<String>,
    store: Option<bool>,
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// A parsed generation request.
#[derive(Clone, Debug)]
pub(crate) struct GenRequest {
    /// Model serving the request, echoed in the response.
    pub model: String,
    /// Prompt length in tokens (ceil(chars / 4), at least 1).
    pub prompt_tokens: usize,
    /// Chained hashes of the prompt's full 16-token blocks, for the prefix cache.
    pub prompt_blocks: Vec<u64>,
    /// Tokens to generate.
    pub max_tokens: u32,
    /// Whether to answer with server-sent events.
    pub stream: bool,
    /// Whether a stream ends with a `usage` chunk (`stream_options.include_usage`), as vLLM's
    /// and OpenAI's do.
    pub include_usage: bool,
    /// The stored response a Responses API request goes on from.
    pub previous_response_id: Option<String>,
    /// Whether a Responses API answer is stored (`store`, default true).
    pub store: bool,
}

/// Why a generation request is refused before it reaches the engine.
#[derive(Debug)]
pub(crate) enum RequestError {
    /// The body is not a valid request; a human-readable message.
    Invalid(String),
    /// The request names a model the worker does not serve.
    NotServed(NotServed),
}

impl From<String> for RequestError {
    fn from(msg: String) -> Self {
        RequestError::Invalid(msg)
    }
}

/// Parses a generation request body and picks the served model it goes to.
pub(crate) fn parse_request(
    body: &[u8],
    kind: Kind,
    default_max: u32,
    models: &ServedModels,
) -> Result<GenRequest, RequestError> {
    let raw: RawRequest =
        serde_json::from_slice(body).map_err(|e| format!("could not parse JSON body: {e}"))?;
    let messages = |m: &Vec<Value>| m.iter().map(message_text).collect::<String>();
    let text = match (kind, &raw.prompt, &raw.messages) {
        (Kind::Response, _, _) => match &raw.input {
            Some(input) => input_text(input)?,
            None => {
                return Err(RequestError::Invalid(
                    "'input' is a required property".into(),
                ))
            }
        },
        (Kind::Completion, Some(p), _) | (Kind::Chat, Some(p), None) => prompt_text(p)?,
        (_, _, Some(m)) => messages(m),
        (Kind::Chat, None, None) => {
            return Err(RequestError::Invalid(
                "'messages' is a required property".into(),
            ))
        }
        (Kind::Completion, None, None) => {
            return Err(RequestError::Invalid(
                "'prompt' is a required property".into(),
            ))
        }
    };
    Ok(GenRequest {
        model: models.resolve(raw.model).map_err(RequestError::NotServed)?,
        prompt_tokens: count_tokens(&text),
        prompt_blocks: prefix::block_hashes(&text),
        max_tokens: raw
            .max_tokens
            .or(raw.max_completion_tokens)
            .or(raw.max_output_tokens)
            .unwrap_or(default_max)
            .max(1),
        stream: raw.stream.unwrap_or(false),
        include_usage: raw
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        previous_response_id: raw.previous_response_id,
        store: raw.store.unwrap_or(true),
    })
}

/// The text of a Responses API `input`: a string, or a list of strings and messages.
fn input_text(input: &Value) -> Result<String, String> {
    match input {
        Value::String(s) => Ok(s.clone()),
        Value::Array(items) => Ok(items
            .iter()
            .map(|item| match item {
                Value::String(s) => s.clone(),
                message => message_text(message),
            })
            .collect()),
        _ => Err("'input' must be a string or a list of items".into()),
    }
}

fn prompt_text(p: &Value) -> Result<String, String> {
    match p {
        Value::String(s) => Ok(s.clone()),
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.as_str()),
                _ => Err("'prompt' must be a string or an array of strings".to_string()),
            })
            .collect(),
        _ => Err("'prompt' must be a string or an array of strings".into()),
    }
}

fn message_text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// Token count of a text: ceil(chars / 4), at least 1.
pub(crate) fn count_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4).max(1)
}

/// Text of the generated token with index `i`.
pub(crate) fn token_text(i: u32) -> String {
    format!(" tok{i}")
}

/// Milliseconds since the UNIX epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Seconds since the UNIX epoch.
pub(crate) fn now_s() -> u64 {
    now_ms() / 1000
}

/// OpenAI-style error body (`code` is a string in OpenAI's errors, the status number in vLLM's).
pub(crate) fn error_body(message: &str, typ: &str, code: Value) -> Value {
    json!({"error": {"message": message, "type": typ, "param": null, "code": code}})
}

/// The `usage` object of a request that generated `completion_tokens`.
fn usage(req: &GenRequest, completion_tokens: u32) -> Value {
    json!({
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": req.prompt_tokens + completion_tokens as usize,
    })
}

/// Full (non-streaming) response body.
pub(crate) fn full_response(
    id: &str,
    req: &GenRequest,
    kind: Kind,
    completion_tokens: u32,
) -> Value {
    if kind == Kind::Response {
        return super::responses::response_object(id, req, completion_tokens, "completed");
    }
    let text: String = (0..completion_tokens).map(token_text).collect();
    let usage = usage(req, completion_tokens);
    let (object, choice) = match kind {
        // (A Response is answered above.)
        Kind::Completion | Kind::Response => (
            "text_completion",
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}),
        ),
        Kind::Chat => (
            "chat.completion",
            json!({"index": 0, "message": {"role": "assistant", "content": text},
                   "logprobs": null, "finish_reason": "length"}),
        ),
    };
    json!({"id": id, "object": object, "created": now_s(), "model": req.model,
           "choices": [choice], "usage": usage})
}

/// One SSE event (`data: {...}\n\n`) carrying token `i`.
pub(crate) fn stream_event(id: &str, req: &GenRequest, kind: Kind, i: u32) -> String {
    if kind == Kind::Response {
        return super::responses::token_events(id, req, i);
    }
    let finish = if i + 1 >= req.max_tokens {
        json!("length")
    } else {
        Value::Null
    };
    let (object, choice) = match kind {
        // (A Response is answered above.)
        Kind::Completion | Kind::Response => (
            "text_completion",
            json!({"index": 0, "text": token_text(i), "logprobs": null, "finish_reason": finish}),
        ),
        Kind::Chat => {
            let delta = if i == 0 {
                json!({"role": "assistant", "content": token_text(i)})
            } else {
                json!({"content": token_text(i)})
            };
            (
                "chat.completion.chunk",
                json!({"index": 0, "delta": delta, "finish_reason": finish}),
            )
        }
    };
    let chunk = json!({"id": id, "object": object, "created": now_s(), "model": req.model,
                       "choices": [choice], "sim_emitted_at_ms": now_ms()});
    format!("data: {chunk}\n\n")
}

/// The SSE event that ends a stream asked for `include_usage`: no choices, the `usage` of
/// `completion_tokens`.
pub(crate) fn usage_event(
    id: &str,
    req: &GenRequest,
    kind: Kind,
    completion_tokens: u32,
) -> String {
    let object = match kind {
        // (A Response stream ends with `response.completed` instead.)
        Kind::Completion | Kind::Response => "text_completion",
        Kind::Chat => "chat.completion.chunk",
    };
    let chunk = json!({"id": id, "object": object, "created": now_s(), "model": req.model,
                       "choices": [], "usage": usage(req, completion_tokens)});
    format!("data: {chunk}\n\n")
}

/// Final SSE event.
pub(crate) const DONE_EVENT: &str = "data: [DONE]\n\n";

/// The event that ends a stream of `kind` that generated `completion_tokens`: `[DONE]`, or the
/// Responses API's `response.completed`.
pub(crate) fn end_event(id: &str, req: &GenRequest, kind: Kind, completion_tokens: u32) -> String {
    match kind {
        Kind::Response => super::responses::completed_event(id, req, completion_tokens),
        Kind::Completion | Kind::Chat => DONE_EVENT.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> ServedModels {
        ServedModels::new(vec![DEFAULT_MODEL.to_string()], false, 0, 1000)
    }

    #[test]
    fn counts_tokens() {
        assert_eq!(count_tokens(""), 1);
        assert_eq!(count_tokens("abcd"), 1);
        assert_eq!(count_tokens("abcde"), 2);
        assert_eq!(count_tokens("ééééé"), 2);
    }

    #[test]
    fn parses_prompt_and_messages() {
        let r = parse_request(
            br#"{"prompt":["abcd","efgh1"],"max_tokens":3}"#,
            Kind::Completion,
            16,
            &served(),
        )
        .unwrap();
        assert_eq!((r.prompt_tokens, r.max_tokens, r.stream), (3, 3, false));
        assert_eq!(r.model, DEFAULT_MODEL);
        let r = parse_request(
            br#"{"model":"m","messages":[{"role":"user","content":"12345678"},{"content":[{"type":"text","text":"x"}]}],"stream":true}"#,
            Kind::Chat,
            16,
            &served(),
        )
        .unwrap();
        assert_eq!((r.prompt_tokens, r.max_tokens, r.stream), (3, 16, true));
        assert!(parse_request(b"{nope", Kind::Chat, 16, &served()).is_err());
        assert!(parse_request(b"{}", Kind::Chat, 16, &served()).is_err());
        assert!(parse_request(br#"{"prompt":5}"#, Kind::Completion, 16, &served()).is_err());
    }

    #[test]
    fn event_shapes() {
        let r = parse_request(
            br#"{"prompt":"hi","max_tokens":2}"#,
            Kind::Chat,
            16,
            &served(),
        )
        .unwrap();
        let ev = stream_event("x", &r, Kind::Chat, 1);
        let v: Value = serde_json::from_str(ev.trim_start_matches("data: ").trim()).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        assert_eq!(v["choices"][0]["delta"]["content"], " tok1");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert!(v["sim_emitted_at_ms"].as_u64().unwrap() > 0);
        let full = full_response("x", &r, Kind::Completion, 2);
        assert_eq!(full["choices"][0]["text"], " tok0 tok1");
        assert_eq!(full["usage"]["total_tokens"], 3);
        assert!(!r.include_usage);
    }

    #[test]
    fn a_stream_asked_for_usage_ends_with_a_usage_chunk() {
        let body = br#"{"prompt":"hi","max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}"#;
        let r = parse_request(body, Kind::Chat, 16, &served()).unwrap();
        assert!(r.include_usage);
        let ev = usage_event("x", &r, Kind::Chat, 2);
        let v: Value = serde_json::from_str(ev.trim_start_matches("data: ").trim()).unwrap();
        assert_eq!(v["choices"], json!([]));
        assert_eq!(v["usage"]["completion_tokens"], 2);
        assert_eq!(v["usage"]["total_tokens"], 3);
    }

    #[test]
    fn a_responses_request_reads_input_and_is_stored_unless_told_not_to() {
        let body = br#"{"input":[{"role":"user","content":"abcdefgh"},"ij"],"max_output_tokens":3,"previous_response_id":"resp_1"}"#;
        let r = parse_request(body, Kind::Response, 16, &served()).unwrap();
        assert_eq!((r.prompt_tokens, r.max_tokens, r.store), (3, 3, true));
        assert_eq!(r.previous_response_id.as_deref(), Some("resp_1"));
        let unstored = br#"{"input":"x","store":false}"#;
        assert!(
            !parse_request(unstored, Kind::Response, 16, &served())
                .unwrap()
                .store
        );
        assert!(parse_request(b"{}", Kind::Response, 16, &served()).is_err());
        let full = full_response("resp_a", &r, Kind::Response, 2);
        assert_eq!(full["object"], "response");
        assert_eq!(full["output"][0]["content"][0]["text"], " tok0 tok1");
        assert_eq!(full["usage"]["output_tokens"], 2);
        let events = stream_event("resp_a", &r, Kind::Response, 0);
        assert!(events.starts_with("event: response.created\n"), "{events}");
        let end = end_event("resp_a", &r, Kind::Response, 3);
        assert!(end.starts_with("event: response.completed\n"), "{end}");
        assert_eq!(end_event("x", &r, Kind::Chat, 3), DONE_EVENT);
    }

    #[test]
    fn model_is_resolved_against_the_served_list() {
        let strict = ServedModels::new(vec!["a".into()], true, 0, 1000);
        let body = br#"{"model":"c","prompt":"x"}"#;
        let err = parse_request(body, Kind::Completion, 16, &strict).unwrap_err();
        assert!(matches!(err, RequestError::NotServed(e) if e.model.as_deref() == Some("c")));
    }
}
