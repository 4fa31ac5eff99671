//! Access log: one structured line per request, emitted through `tracing` under the target
//! [`TARGET`], so it can be routed, formatted (JSON or text) and switched off on its own.
//!
//! Never logs bodies, query strings or headers (so no `Authorization`): only the fields of
//! [`AccessRecord`].

use std::io::IsTerminal;
use std::time::Duration;
use tracing::Subscriber;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{filter, Layer};

pub use crate::config::AccessLogFormat;
use crate::request::BodyFacts;

/// The `tracing` target of access-log events.
pub const TARGET: &str = "gpulb::access";

/// Longest path logged; longer ones are cut (the path is client-chosen).
const MAX_PATH: usize = 256;

/// What is logged about one request.
#[derive(Debug, Clone, Default)]
pub struct AccessRecord<'a> {
    /// Request id (the client's, or the one gpulb added).
    pub request_id: &'a str,
    /// HTTP method.
    pub method: &'a str,
    /// Request path; any query string is dropped.
    pub path: &'a str,
    /// Class the request was put in.
    pub class: &'a str,
    /// Tenant, empty when none.
    pub tenant: &'a str,
    /// Backend of the last attempt; `None` when shed or never routed.
    pub backend: Option<&'a str>,
    /// Status code sent to the client.
    pub status: u16,
    /// Time spent in the class queue.
    pub queue_wait: Option<Duration>,
    /// Time to the first byte of the response body.
    pub ttfb: Option<Duration>,
    /// Time from arrival to the end of the response.
    pub duration: Duration,
    /// Response body bytes sent to the client.
    pub bytes_sent: u64,
    /// Attempts made (retries count); 0 when never routed.
    pub attempts: u32,
    /// Why it was shed or failed (`queue_full`, `connect_failed`, ...), when it was.
    pub reason: Option<&'a str>,
    /// The model asked for (after aliases), when the body was read and named one.
    pub model: Option<&'a str>,
    /// What the body said, when it was read: estimated prompt tokens, `max_tokens`, `stream`.
    pub body: Option<&'a BodyFacts>,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The path without its query string, cut to [`MAX_PATH`] bytes on a character boundary.
fn clean_path(path: &str) -> &str {
    let path = path.split(['?', '#']).next().unwrap_or("");
    if path.len() <= MAX_PATH {
        return path;
    }
    let mut end = MAX_PATH;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    &path[..end]
}

/// Emits one access line for `r` (at `info` on [`TARGET`]).
pub fn log(r: &AccessRecord) {
    tracing::info!(
        target: TARGET,
        request_id = r.request_id,
        method = r.method,
        path = clean_path(r.path),
        class = r.class,
        tenant = r.tenant,
        backend = r.backend,
        status = r.status,
        queue_wait_ms = r.queue_wait.map(ms),
        ttfb_ms = r.ttfb.map(ms),
        duration_ms = ms(r.duration),
        bytes_sent = r.bytes_sent,
        attempts = r.attempts,
        reason = r.reason,
        model = r.model,
        prompt_tokens = r.body.map(|b| b.prompt_tokens),
        max_tokens = r.body.and_then(|b| b.max_tokens),
        stream = r.body.map(|b| b.stream),
        "access"
    );
}

/// A layer writing only access-log events to `writer` in `format`.
pub fn layer<S, W>(format: AccessLogFormat, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let only_access = filter::Targets::new().with_target(TARGET, tracing::Level::INFO);
    match format {
        AccessLogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_target(false)
            .with_writer(writer)
            .with_filter(only_access)
            .boxed(),
        AccessLogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_target(false)
            .with_writer(writer)
            .with_filter(only_access)
            .boxed(),
    }
}

/// Installs the process's logging: diagnostics to stderr filtered by `RUST_LOG` (default
/// `info`), coloured only when stderr is a terminal (a container's log, journald or a file
/// gets plain text), and, when `access` is set, the access log to stdout in that format, whatever
/// `RUST_LOG` says. Call once; later calls do nothing.
///
/// Both filters state their most verbose level, so `tracing` (and pingora's `log` records,
/// bridged into it) skip disabled events at the call site instead of evaluating each one.
pub fn init(access: Option<AccessLogFormat>) {
    let env = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let env = match format!("{TARGET}=off").parse() {
        Ok(directive) => env.add_directive(directive),
        Err(_) => env,
    };
    let diagnostics = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_filter(env);
    let access = access.map(|format| layer(format, std::io::stdout));
    let _ = tracing_subscriber::registry()
        .with(diagnostics)
        .with(access)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture(format: AccessLogFormat, emit: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(layer(format, move || writer.clone()));
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn record() -> AccessRecord<'static> {
        AccessRecord {
            request_id: "req-1",
            method: "POST",
            path: "/v1/completions?api_key=secret",
            class: "bulk",
            tenant: "acme",
            backend: Some("gpu0"),
            status: 200,
            queue_wait: Some(Duration::from_micros(1500)),
            ttfb: Some(Duration::from_millis(80)),
            duration: Duration::from_millis(1234),
            bytes_sent: 512,
            attempts: 1,
            reason: None,
            model: Some("llama-3.1-8b"),
            body: Some(&FACTS),
        }
    }

    static FACTS: BodyFacts = BodyFacts {
        model: None,
        stream: true,
        max_tokens: Some(64),
        n: 1,
        prompt_tokens: 300,
        prefix: Vec::new(),
        previous_response_id: None,
    };

    #[test]
    fn json_lines_carry_every_field_and_no_query() {
        let out = capture(AccessLogFormat::Json, || {
            log(&record());
            tracing::info!(target: "gpulb::proxy", "not an access line");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["request_id"], "req-1");
        assert_eq!(v["path"], "/v1/completions");
        assert_eq!(v["backend"], "gpu0");
        assert_eq!(v["status"], 200);
        assert_eq!(v["queue_wait_ms"], 1.5);
        assert_eq!(v["duration_ms"], 1234.0);
        assert_eq!(v["bytes_sent"], 512);
        assert_eq!(v["model"], "llama-3.1-8b");
        assert_eq!(
            (&v["prompt_tokens"], &v["max_tokens"], &v["stream"]),
            (&300.into(), &64.into(), &true.into())
        );
        assert!(!out.contains("secret"));
    }

    #[test]
    fn shed_requests_log_their_reason_and_text_works() {
        let shed = AccessRecord {
            backend: None,
            status: 429,
            reason: Some("queue_full"),
            ..record()
        };
        let out = capture(AccessLogFormat::Text, || log(&shed));
        assert!(out.contains("reason=\"queue_full\""), "{out}");
        assert!(out.contains("status=429"), "{out}");
        assert!(!out.contains("backend="), "{out}");
    }

    #[test]
    fn long_paths_are_cut_on_a_character_boundary() {
        let long = "é".repeat(200);
        let cut = clean_path(&long);
        assert!(cut.len() <= MAX_PATH && long.starts_with(cut));
    }
}
