//! HTTP clients for gpulb's own calls to backends (health checks, model lists, telemetry,
//! batches). A plain backend is called with the caller's shared client; an https backend with a
//! client that trusts what its `tls` keys say and, given the address gpulb resolved for it,
//! connects there while checking the certificate against the URL's host. Such clients are
//! built once and kept, so their connections are reused.
//!
//! reqwest is built with no roots of its own: "the system's roots" are read once, from the same
//! store pingora's connector reads, so both ends of gpulb trust the same CAs (and a plain
//! client costs no certificate loading).

use crate::config::{Upstream, UpstreamTls};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Clients kept at most; past it the cache starts again (addresses that moved leave theirs).
const MAX_CLIENTS: usize = 1024;

/// Where one call to a backend goes.
#[derive(Debug, Clone)]
pub struct Target {
    /// The client to send it with.
    pub client: reqwest::Client,
    /// `scheme://authority`, the path to be appended.
    pub base: String,
    /// The `Authorization` the backend's model server requires (its `auth`).
    auth: Option<crate::config::Credential>,
}

/// `request` carrying `auth` as its `Authorization`, when there is one.
pub fn authorized(
    request: reqwest::RequestBuilder,
    auth: Option<&crate::config::Credential>,
) -> reqwest::RequestBuilder {
    match auth {
        Some(auth) => request.header(http::header::AUTHORIZATION, auth.header().clone()),
        None => request,
    }
}

impl Target {
    /// A `method` call of `url` (the base and a path), with the backend's credential.
    pub fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        authorized(self.client.request(method, url), self.auth.as_ref())
    }

    /// Whether the backend has a credential of its own (which replaces a client's).
    pub fn has_auth(&self) -> bool {
        self.auth.is_some()
    }
}

/// The client, base URL and credential for calling `upstream` at `addr`; a plain backend uses
/// `plain`.
pub fn target(
    upstream: &Upstream,
    addr: SocketAddr,
    plain: &reqwest::Client,
) -> Result<Target, String> {
    Ok(match &upstream.tls {
        None => Target {
            client: plain.clone(),
            base: format!("http://{addr}"),
            auth: upstream.auth.clone(),
        },
        Some(tls) => Target {
            client: client_for(tls, Some(addr))?,
            base: format!("https://{upstream}"),
            auth: upstream.auth.clone(),
        },
    })
}

/// A client trusting what `tls` says; with `addr`, its server name is connected there.
pub fn client_for(tls: &UpstreamTls, addr: Option<SocketAddr>) -> Result<reqwest::Client, String> {
    type Cache = Mutex<HashMap<(UpstreamTls, Option<SocketAddr>), reqwest::Client>>;
    static CLIENTS: OnceLock<Cache> = OnceLock::new();
    let mut clients = CLIENTS
        .get_or_init(Cache::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let key = (tls.clone(), addr);
    if let Some(client) = clients.get(&key) {
        return Ok(client.clone());
    }
    let client = build(tls, addr)?;
    if clients.len() >= MAX_CLIENTS {
        clients.clear();
    }
    clients.insert(key, client.clone());
    Ok(client)
}

/// `builder` trusting the system's root certificates.
pub fn with_system_roots(builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
    system_roots()
        .iter()
        .cloned()
        .fold(builder, reqwest::ClientBuilder::add_root_certificate)
}

/// The system's root certificates (`SSL_CERT_FILE`/`SSL_CERT_DIR` honoured), read once.
fn system_roots() -> &'static [reqwest::Certificate] {
    static ROOTS: OnceLock<Vec<reqwest::Certificate>> = OnceLock::new();
    ROOTS.get_or_init(|| match pingora::tls::load_native_certs() {
        Ok(certs) => certs
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der).ok())
            .collect(),
        Err(error) => {
            tracing::warn!(%error, "cannot read the system's root certificates; https backends without tls.ca_file will fail verification");
            Vec::new()
        }
    })
}

fn build(tls: &UpstreamTls, addr: Option<SocketAddr>) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .use_rustls_tls()
        .pool_idle_timeout(Duration::from_secs(30))
        .danger_accept_invalid_certs(!tls.verify);
    match &tls.ca {
        Some(ca) => {
            for der in ca.certificates() {
                let certificate = reqwest::Certificate::from_der(der).map_err(|e| {
                    format!("a certificate of {} is not usable: {e}", ca.path.display())
                })?;
                builder = builder.add_root_certificate(certificate);
            }
        }
        None => builder = with_system_roots(builder),
    }
    if let Some(addr) = addr {
        builder = builder.resolve(&tls.server_name, addr);
    }
    builder
        .build()
        .map_err(|e| format!("cannot build an HTTPS client for {}: {e}", tls.server_name))
}
