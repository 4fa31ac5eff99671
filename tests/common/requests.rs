//! Requests through the proxy: what to send ([`Req`]), what came back ([`Answer`]), and the one
//! family that sends them one by one, all at once, or held in the background.

use super::Proxy;
use reqwest::header::HeaderMap;
use reqwest::Method;
use serde_json::Value;
use std::time::Instant;
use tokio::task::JoinHandle;

/// A request to send to a base URL: method, path (with query), headers and body.
#[derive(Clone, Debug)]
pub struct Req {
    method: Method,
    path: String,
    headers: Vec<(String, String)>,
    body: Option<String>,
}

impl Req {
    /// `GET path`.
    pub fn get(path: impl Into<String>) -> Req {
        Req {
            method: Method::GET,
            path: path.into(),
            headers: Vec::new(),
            body: None,
        }
    }

    /// `POST path` with `body`.
    pub fn post(path: impl Into<String>, body: impl Into<String>) -> Req {
        Req {
            method: Method::POST,
            body: Some(body.into()),
            ..Req::get(path)
        }
    }

    /// `HEAD path`.
    pub fn head(path: impl Into<String>) -> Req {
        Req {
            method: Method::HEAD,
            ..Req::get(path)
        }
    }

    /// `GET /sleep/{ms}`: the simulated worker answers after `ms` milliseconds.
    pub fn sleep(ms: u64) -> Req {
        Req::get(format!("/sleep/{ms}"))
    }

    /// A JSON completion asking for `max_tokens` tokens in one response.
    pub fn completion(max_tokens: u32) -> Req {
        Req::post("/v1/completions", completion(max_tokens, false))
            .header("content-type", "application/json")
    }

    /// A JSON completion streamed as server-sent events.
    pub fn completion_stream(max_tokens: u32) -> Req {
        Req::post("/v1/completions", completion(max_tokens, true))
            .header("content-type", "application/json")
    }

    /// A streamed chat completion of `max_tokens` tokens.
    pub fn chat_stream(max_tokens: u32) -> Req {
        let body = format!(
            r#"{{"model":"sim-model","stream":true,"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"hi"}}]}}"#
        );
        Req::post("/v1/chat/completions", body).header("content-type", "application/json")
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sends as tenant `tenant` (`x-tenant`).
    pub fn tenant(self, tenant: &str) -> Req {
        self.header("x-tenant", tenant)
    }

    /// It, ready to send to `base` with `client` (for tests that expect sending to fail).
    pub fn request(&self, client: &reqwest::Client, base: &str) -> reqwest::RequestBuilder {
        let mut req = client.request(self.method.clone(), format!("{base}{}", self.path));
        for (name, value) in &self.headers {
            req = req.header(name, value);
        }
        if let Some(body) = &self.body {
            req = req.body(body.clone());
        }
        req
    }

    /// Sends it to `base` with `client`; the response, its body unread.
    pub async fn send(&self, client: &reqwest::Client, base: &str) -> reqwest::Response {
        self.request(client, base)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{} {}: {e}", self.method, self.path))
    }
}

/// A JSON completion request body.
pub fn completion(max_tokens: u32, stream: bool) -> String {
    format!(
        r#"{{"model":"sim-model","prompt":"hello world","max_tokens":{max_tokens},"stream":{stream}}}"#
    )
}

/// A finished exchange, body read.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The simulated worker that answered (`x-sim-worker`), empty when none did.
    pub worker: String,
    /// Response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: String,
    /// When the body had been read.
    pub at: Instant,
}

impl Answer {
    /// Reads `resp` to the end.
    pub async fn read(resp: reqwest::Response) -> Answer {
        let status = resp.status().as_u16();
        let worker = worker_of(&resp);
        let headers = resp.headers().clone();
        let body = resp.text().await.expect("response body");
        Answer {
            status,
            worker,
            headers,
            body,
            at: Instant::now(),
        }
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }

    /// A header as text, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Which worker answered (the simulated worker's `x-sim-worker` header).
pub fn worker_of(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("x-sim-worker")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// The workers that served `answers`, each checked to be a 200.
pub fn served_by(answers: &[Answer]) -> Vec<String> {
    answers
        .iter()
        .map(|a| {
            assert_eq!(a.status, 200, "{}", a.body);
            a.worker.clone()
        })
        .collect()
}

impl Proxy {
    /// Sends `req` through the proxy; the response, its body unread (for streams).
    pub async fn open(&self, req: &Req) -> reqwest::Response {
        req.send(&self.client, &self.url).await
    }

    /// Sends `req` through the proxy and reads the answer.
    pub async fn send(&self, req: &Req) -> Answer {
        Answer::read(self.open(req).await).await
    }

    /// Sends `req` `n` times, one after the other.
    pub async fn send_n(&self, n: usize, req: &Req) -> Vec<Answer> {
        let mut answers = Vec::with_capacity(n);
        for _ in 0..n {
            answers.push(self.send(req).await);
        }
        answers
    }

    /// Sends `n` one-token completions one after the other, each checked to be a 200; the
    /// workers that served them.
    pub async fn route(&self, n: usize) -> Vec<String> {
        served_by(&self.send_n(n, &Req::completion(1)).await)
    }

    /// Sends `req` `n` times at once.
    pub async fn burst(&self, n: usize, req: &Req) -> Vec<Answer> {
        futures_util::future::join_all((0..n).map(|_| self.send(req))).await
    }

    /// Sends `req` in the background on its own connection (a request held while the test
    /// goes on); the task yields its answer.
    pub fn spawn(&self, req: Req) -> JoinHandle<Answer> {
        let base = self.url.clone();
        tokio::spawn(async move {
            let resp = req.send(&reqwest::Client::new(), &base).await;
            Answer::read(resp).await
        })
    }
}
