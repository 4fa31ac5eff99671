//! TLS at both ends of the proxy, through pingora's rustls support: the client listener's
//! certificate, replaced on reload ([`CertResolver`]); the pingora peer of an https backend
//! ([`http_peer`]); and the clients of gpulb's own calls to backends ([`target`]).

mod clients;
mod listener;

pub use clients::{authorized, client_for, target, with_system_roots, Target};
pub use listener::CertResolver;

use crate::config::Upstream;
use pingora::upstreams::peer::HttpPeer;
use std::net::SocketAddr;

/// The pingora peer for `upstream` at `addr`: plain, or TLS with the URL's host as SNI, its CA
/// file's certificates (else the system's roots) and its verify setting.
pub fn http_peer(addr: SocketAddr, upstream: &Upstream) -> HttpPeer {
    let Some(tls) = &upstream.tls else {
        return HttpPeer::new(addr, false, String::new());
    };
    let mut peer = HttpPeer::new(addr, true, tls.server_name.clone());
    peer.options.verify_cert = tls.verify;
    peer.options.verify_hostname = tls.verify;
    peer.options.ca = tls.ca.as_ref().map(|ca| ca.for_pingora());
    peer
}
