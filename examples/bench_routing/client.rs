//! Sending one request of the trace and measuring it; reading gpulb's `/status`.

use crate::trace::{prompt_text, Class, Req};
use futures_util::StreamExt;
use std::time::Duration;
use tokio::time::Instant;

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// 200 with every requested token.
    Ok,
    /// 429 or 503: the load balancer (or nothing behind it) refused it.
    Shed(u16),
    /// Anything else: another status, a transport error, a short answer, a timeout.
    Error(String),
}

/// One measured request. Times are seconds from the request's *scheduled* send time, so any
/// lateness of the harness counts against the target, never for it.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub index: usize,
    pub class: Class,
    pub tenant: &'static str,
    pub at: f64,
    pub status: Status,
    /// Streaming: first SSE `data:` event with a token. Non-streaming: response headers
    /// (the sim answers after the last token, so this is about the end-to-end time).
    pub ttft: Option<f64>,
    /// Until the last byte of the body.
    pub e2e: f64,
    pub tokens: u32,
    /// `x-sim-worker` of the worker that answered.
    pub worker: Option<String>,
    /// How late the harness started sending it (s).
    pub lateness: f64,
}

impl Outcome {
    /// `req`'s outcome with nothing measured yet: no TTFT, no time, no tokens, no worker.
    pub fn new(index: usize, req: &Req, status: Status, lateness: f64) -> Outcome {
        Outcome {
            index,
            class: req.class,
            tenant: req.tenant,
            at: req.at,
            status,
            ttft: None,
            e2e: 0.0,
            tokens: 0,
            worker: None,
            lateness,
        }
    }
}

/// The JSON body of `req`: a streaming chat for interactive, a plain completion for bulk. A
/// request with its own messages gets them, the system message led by one 64-character cache
/// block naming `target` and the prefix (`prefix::salt`), so no target finds blocks an earlier
/// one left cached.
pub fn body(req: &Req, target: &str) -> String {
    if let Some(messages) = &req.messages {
        let salt = crate::prefix::salt(target, &messages[0]);
        let messages: Vec<serde_json::Value> = messages
            .iter()
            .enumerate()
            .map(|(i, text)| match i {
                0 => serde_json::json!({"role": "system", "content": format!("{salt}{text}")}),
                i if i % 2 == 1 => serde_json::json!({"role": "user", "content": text}),
                _ => serde_json::json!({"role": "assistant", "content": text}),
            })
            .collect();
        return serde_json::json!({
            "model": "sim-model",
            "stream": true,
            "max_tokens": req.max_tokens,
            "messages": messages,
        })
        .to_string();
    }
    let text = prompt_text(req.prompt_chars);
    match req.class {
        Class::Interactive => serde_json::json!({
            "model": "sim-model",
            "stream": true,
            "max_tokens": req.max_tokens,
            "messages": [{"role": "user", "content": text}],
        }),
        Class::Bulk => serde_json::json!({
            "model": "sim-model",
            "max_tokens": req.max_tokens,
            "prompt": text,
        }),
    }
    .to_string()
}

/// Sends `req` (scheduled at `scheduled`) to `base` and measures it; an interactive request
/// carries `x-priority: interactive` when `priority_header` is set.
pub async fn send(
    client: &reqwest::Client,
    base: &str,
    index: usize,
    req: &Req,
    body: String,
    priority_header: bool,
    scheduled: Instant,
) -> Outcome {
    let lateness = Instant::now()
        .saturating_duration_since(scheduled)
        .as_secs_f64();
    let since = |t: Instant| t.saturating_duration_since(scheduled).as_secs_f64();
    let mut out = Outcome::new(index, req, Status::Error("not sent".into()), lateness);
    let path = match req.class {
        Class::Interactive => "/v1/chat/completions",
        Class::Bulk => "/v1/completions",
    };
    let mut rb = client
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .header("x-tenant", req.tenant)
        .body(body);
    if priority_header && req.class == Class::Interactive {
        rb = rb.header("x-priority", "interactive");
    }
    let resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => {
            out.e2e = since(Instant::now());
            out.status = Status::Error(error_kind(&e));
            return out;
        }
    };
    let headers_at = Instant::now();
    let code = resp.status().as_u16();
    out.worker = resp
        .headers()
        .get("x-sim-worker")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if code != 200 {
        // Drain the (small) error body so the connection can be reused.
        let _ = resp.bytes().await;
        out.e2e = since(Instant::now());
        out.status = if code == 429 || code == 503 {
            Status::Shed(code)
        } else {
            Status::Error(format!("HTTP {code}"))
        };
        return out;
    }
    match req.class {
        Class::Interactive => {
            let mut stream = resp.bytes_stream();
            let mut buf: Vec<u8> = Vec::new();
            let mut done = false;
            while let Some(chunk) = stream.next().await {
                let chunk = match chunk {
                    Ok(c) => c,
                    Err(e) => {
                        out.e2e = since(Instant::now());
                        out.status = Status::Error(format!("mid-stream: {}", error_kind(&e)));
                        return out;
                    }
                };
                buf.extend_from_slice(&chunk);
                while let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
                    let event: Vec<u8> = buf.drain(..pos + 2).collect();
                    let line = String::from_utf8_lossy(&event);
                    let Some(data) = line.trim().strip_prefix("data:") else {
                        continue;
                    };
                    if data.trim() == "[DONE]" {
                        done = true;
                    } else {
                        out.tokens += 1;
                        if out.ttft.is_none() {
                            out.ttft = Some(since(Instant::now()));
                        }
                    }
                }
            }
            out.e2e = since(Instant::now());
            out.status = if done && out.tokens == req.max_tokens {
                Status::Ok
            } else {
                Status::Error(format!(
                    "short stream ({} of {} tokens)",
                    out.tokens, req.max_tokens
                ))
            };
        }
        Class::Bulk => {
            out.ttft = Some(since(headers_at));
            match resp.bytes().await {
                Ok(bytes) => {
                    out.e2e = since(Instant::now());
                    let tokens = serde_json::from_slice::<serde_json::Value>(&bytes)
                        .ok()
                        .and_then(|v| v["usage"]["completion_tokens"].as_u64())
                        .unwrap_or(0) as u32;
                    out.tokens = tokens;
                    out.status = if tokens == req.max_tokens {
                        Status::Ok
                    } else {
                        Status::Error(format!(
                            "short body ({tokens} of {} tokens)",
                            req.max_tokens
                        ))
                    };
                }
                Err(e) => {
                    out.e2e = since(Instant::now());
                    out.status = Status::Error(format!("body: {}", error_kind(&e)));
                }
            }
        }
    }
    out
}

fn error_kind(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "client timeout".into()
    } else if e.is_connect() {
        "connect error".into()
    } else {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(inner) = src {
            s = format!("{s}: {inner}");
            src = inner.source();
        }
        s.chars().take(120).collect()
    }
}

/// A fresh client per target: keep-alive pool, no proxy, one overall timeout per request.
pub fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(4096)
        .timeout(timeout)
        .build()
        .expect("reqwest client")
}

/// gpulb's admin `/status` as JSON; `None` if it does not answer or the body is not JSON.
pub async fn gpulb_status(client: &reqwest::Client, admin: &str) -> Option<serde_json::Value> {
    let resp = client.get(format!("{admin}/status")).send().await.ok()?;
    resp.json::<serde_json::Value>().await.ok()
}
