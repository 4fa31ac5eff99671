//! The one place defaults are defined.

use std::net::SocketAddr;
use std::time::Duration;

/// Name of the pool created when the file defines none.
pub const POOL: &str = "default";
/// Name of the class created when the file defines none.
pub const CLASS: &str = "default";
/// Name given to a backend found by DNS (`pools[].discover.name`).
pub const DISCOVERED_NAME: &str = "{pool}-{ip}";

pub(crate) fn dns_interval() -> Duration {
    Duration::from_secs(5)
}
pub(crate) fn dns_timeout() -> Duration {
    Duration::from_secs(2)
}
pub(crate) fn discovered_name() -> String {
    DISCOVERED_NAME.to_string()
}

pub(crate) fn listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
/// Whether an https backend's certificate is checked when its `tls.verify` is not set.
pub(crate) fn backend_tls_verify() -> bool {
    true
}
pub(crate) fn threads() -> usize {
    2
}
pub(crate) fn connect_retries() -> usize {
    2
}
/// A backend's `429 Too Many Requests`: it refused before starting.
pub(crate) fn retry_statuses() -> Vec<u16> {
    vec![429]
}
pub(crate) fn shutdown_timeout() -> Duration {
    Duration::from_secs(30)
}
pub(crate) fn request_id_header() -> String {
    "x-request-id".to_string()
}
pub(crate) fn connect_timeout() -> Duration {
    Duration::from_secs(2)
}
/// A model server may queue a request and prefill a long prompt before its first token.
pub(crate) fn first_byte_timeout() -> Duration {
    Duration::from_secs(300)
}
/// A stream silent this long mid-response is hung (nginx's `proxy_read_timeout` is 60s).
pub(crate) fn idle_timeout() -> Duration {
    Duration::from_secs(60)
}
pub(crate) fn write_timeout() -> Duration {
    Duration::from_secs(30)
}
pub(crate) fn client_body_timeout() -> Duration {
    Duration::from_secs(60)
}
/// nginx's `client_header_timeout` is 60s; HAProxy's usual `timeout http-request` is 10s.
pub(crate) fn client_header_timeout() -> Duration {
    Duration::from_secs(10)
}
/// nginx's `keepalive_timeout`.
pub(crate) fn client_idle_timeout() -> Duration {
    Duration::from_secs(75)
}
/// Largest request header: 64 KiB (nginx allows 4 x 8 KiB lines by default).
pub(crate) fn max_header_bytes() -> usize {
    64 * 1024
}
pub(crate) fn upstream_idle_timeout() -> Duration {
    Duration::from_secs(60)
}
pub(crate) fn reload_watch() -> bool {
    true
}
pub(crate) fn reload_debounce() -> Duration {
    Duration::from_millis(200)
}
pub(crate) fn reload_timeout() -> Duration {
    Duration::from_secs(10)
}
pub(crate) fn resolve_timeout() -> Duration {
    Duration::from_secs(2)
}
pub(crate) fn health_enabled() -> bool {
    true
}
pub(crate) fn health_path() -> String {
    "/health".to_string()
}
pub(crate) fn health_interval() -> Duration {
    Duration::from_secs(2)
}
pub(crate) fn health_timeout() -> Duration {
    Duration::from_secs(1)
}
pub(crate) fn health_rise() -> u32 {
    2
}
pub(crate) fn health_fall() -> u32 {
    3
}
pub(crate) fn outlier_failures() -> u32 {
    5
}
pub(crate) fn outlier_base() -> Duration {
    Duration::from_secs(10)
}
pub(crate) fn outlier_max() -> Duration {
    Duration::from_secs(300)
}
pub(crate) fn outlier_max_percent() -> u32 {
    50
}
pub(crate) fn stale_after() -> Duration {
    Duration::from_secs(5)
}
pub(crate) fn count_others() -> bool {
    true
}
pub(crate) fn others_max_age() -> Duration {
    Duration::from_secs(2)
}
pub(crate) fn waiting_interval() -> Option<Duration> {
    Some(Duration::from_millis(50))
}
pub(crate) fn queue_depth() -> usize {
    128
}
pub(crate) fn queue_wait() -> Duration {
    Duration::from_secs(10)
}
pub(crate) fn tenant_weight() -> u32 {
    1
}
pub(crate) fn tenant_header() -> String {
    "x-tenant".to_string()
}
pub(crate) fn access_log_enabled() -> bool {
    true
}
/// Distinct tenant label values kept before further tenants fold into `other`.
pub const MAX_TENANTS: usize = 20;
pub(crate) fn max_tenants() -> usize {
    MAX_TENANTS
}
pub(crate) fn weight() -> u32 {
    1
}
pub(crate) fn max_outstanding() -> u32 {
    256
}

/// The shortest interval a health check, telemetry source or model poll may run at: polling
/// faster only loads the backends (and a typo such as `1ms` would flood them).
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Time between two reads of a telemetry source.
pub(crate) fn telemetry_interval() -> Duration {
    Duration::from_secs(1)
}
/// Longest a read of a telemetry source may take.
pub(crate) fn telemetry_timeout() -> Duration {
    Duration::from_millis(500)
}
/// The paths whose JSON bodies are read by default: OpenAI's, and the model servers' own
/// that name a model in the body (vLLM's tokenizer, scoring and pooling endpoints), so each
/// reaches a backend serving its model.
pub(crate) fn body_paths() -> Vec<String> {
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/tokenize",
        "/detokenize",
        "/v1/score",
        "/score",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/pooling",
        "/classify",
    ]
    .map(String::from)
    .to_vec()
}
/// Largest request body read: 4 MiB (a long RAG prompt is a few hundred KiB).
pub(crate) fn body_max_bytes() -> usize {
    4 << 20
}
/// Most request-body bytes held at once: 256 MiB (a thousand 256 KiB prompts, or 64 bodies of
/// the largest size).
pub(crate) fn body_max_held_bytes() -> usize {
    256 << 20
}
pub(crate) fn discover_models() -> bool {
    true
}
pub(crate) fn discover_interval() -> Duration {
    Duration::from_secs(10)
}
pub(crate) fn discover_timeout() -> Duration {
    Duration::from_secs(2)
}
pub(crate) fn batch_max_items() -> usize {
    32
}
pub(crate) fn batch_send_when_idle() -> bool {
    true
}
pub(crate) fn batch_max_wait() -> Duration {
    Duration::from_millis(5)
}
