//! The client listener's certificate, served from an `ArcSwap` that a reload replaces: new
//! handshakes see a renewed certificate at once, connections already open keep theirs.

use crate::config::ServingCert;
use arc_swap::ArcSwap;
use pingora::listeners::tls::TlsSettings;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::sync::Arc;

/// Hands every handshake the certificate in force.
#[derive(Debug)]
pub struct CertResolver {
    current: ArcSwap<CertifiedKey>,
}

impl CertResolver {
    /// Serves `cert` until replaced.
    pub fn new(cert: &ServingCert) -> CertResolver {
        CertResolver {
            current: ArcSwap::new(Arc::clone(&cert.0)),
        }
    }

    /// Serves `cert` from now on; whether it differs from the one served until now.
    pub fn replace(&self, cert: &ServingCert) -> bool {
        let changed = self.current.load().cert != cert.0.cert;
        if changed {
            self.current.store(Arc::clone(&cert.0));
        }
        changed
    }

    /// The TLS settings of a listener serving this resolver's certificate.
    pub fn listener_settings(self: &Arc<Self>) -> pingora::Result<TlsSettings> {
        // The paths stay empty: with a resolver installed pingora reads no files.
        let mut settings = TlsSettings::intermediate("", "")?;
        settings.set_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        Ok(settings)
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}
