//! TLS keys and the files they name: the client listener's certificate (`listen_tls`) and how
//! an https backend's certificate is trusted (`tls` on a backend or a pool). The files are read
//! and checked here, when a config is loaded, so a bad one refuses the config naming its path.

use pingora::protocols::tls::CaType;
use pingora::utils::tls::{parse_x509, WrappedX509};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use serde::Deserialize;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `listen_tls`: the proxy listener speaks HTTPS with this certificate.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ListenTls {
    /// PEM file: the server certificate first, then its intermediates.
    pub cert: PathBuf,
    /// PEM file: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// `tls` of a backend or a pool: how an https backend's certificate is checked. A backend's
/// own keys win over its pool's; what neither sets takes the defaults.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackendTls {
    /// Check the certificate chain and that it names the URL's host (default `true`);
    /// `false` accepts any certificate: self-signed development setups only.
    #[serde(default)]
    pub verify: Option<bool>,
    /// PEM file of the CA certificates trusted for it, in place of the system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

impl BackendTls {
    /// These settings, each one unset here taken from `fallback`.
    pub fn or(&self, fallback: &BackendTls) -> BackendTls {
        BackendTls {
            verify: self.verify.or(fallback.verify),
            ca_file: self.ca_file.clone().or_else(|| fallback.ca_file.clone()),
        }
    }
}

/// How gpulb speaks TLS to one https backend, compiled from its URL and `tls` keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamTls {
    /// The URL's host: sent as SNI and checked against the certificate.
    pub server_name: String,
    /// Whether the certificate is checked at all.
    pub verify: bool,
    /// The CAs trusted for it; `None`: the system's roots.
    pub ca: Option<CaBundle>,
}

/// The certificates of a `ca_file`, read and checked.
#[derive(Clone)]
pub struct CaBundle {
    /// The file they came from.
    pub path: PathBuf,
    certificates: Arc<[CertificateDer<'static>]>,
    /// The same certificates as pingora's connector takes them, built once.
    for_pingora: Arc<CaType>,
}

impl CaBundle {
    /// Reads a PEM file of CA certificates; the message names the file and what is wrong.
    pub fn load(path: &Path) -> Result<CaBundle, String> {
        let shown = path.display();
        let pem = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let certificates = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{shown} is not a PEM file of certificates: {e}"))?;
        if certificates.is_empty() {
            return Err(format!("{shown} holds no PEM certificate"));
        }
        let mut store = rustls::RootCertStore::empty();
        for (i, certificate) in certificates.iter().enumerate() {
            store.add(certificate.clone()).map_err(|e| {
                format!(
                    "certificate {} in {shown} is not usable as a CA: {e}",
                    i + 1
                )
            })?;
        }
        let wrapped: Vec<WrappedX509> = certificates
            .iter()
            .map(|c| WrappedX509::new(c.to_vec(), parse_x509))
            .collect();
        Ok(CaBundle {
            path: path.to_path_buf(),
            certificates: certificates.into(),
            for_pingora: wrapped.into(),
        })
    }

    /// The certificates, DER.
    pub fn certificates(&self) -> &[CertificateDer<'static>] {
        &self.certificates
    }

    /// The certificates as pingora's per-peer CA list.
    pub fn for_pingora(&self) -> Arc<CaType> {
        Arc::clone(&self.for_pingora)
    }
}

impl PartialEq for CaBundle {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.certificates == other.certificates
    }
}

impl Eq for CaBundle {}

impl Hash for CaBundle {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.path.hash(state);
        self.certificates.hash(state);
    }
}

impl fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CaBundle({}, {} certificates)",
            self.path.display(),
            self.certificates.len()
        )
    }
}

/// Which `listen_tls` file a problem is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertFile {
    /// `listen_tls.cert`.
    Cert,
    /// `listen_tls.key`.
    Key,
}

impl CertFile {
    /// The config key naming the file.
    pub fn key(self) -> &'static str {
        match self {
            CertFile::Cert => "listen_tls.cert",
            CertFile::Key => "listen_tls.key",
        }
    }
}

/// Why `listen_tls`'s files cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", .file.key())]
pub struct CertError {
    /// The key naming the file at fault.
    pub file: CertFile,
    /// What is wrong, naming the file's path.
    pub message: String,
}

/// The certificate chain and key read from `listen_tls`'s files, ready to serve.
#[derive(Clone)]
pub struct ServingCert(pub Arc<CertifiedKey>);

impl ServingCert {
    /// Reads and checks both files: a certificate chain, a private key, and that they match.
    pub fn load(files: &ListenTls) -> Result<ServingCert, CertError> {
        let cert_error = |message: String| CertError {
            file: CertFile::Cert,
            message,
        };
        let key_error = |message: String| CertError {
            file: CertFile::Key,
            message,
        };
        let (cert, key) = (files.cert.display(), files.key.display());
        let pem = std::fs::read(&files.cert)
            .map_err(|e| cert_error(format!("cannot read {cert}: {e}")))?;
        let chain = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| cert_error(format!("{cert} is not a PEM certificate chain: {e}")))?;
        if chain.is_empty() {
            return Err(cert_error(format!("{cert} holds no PEM certificate")));
        }
        let pem =
            std::fs::read(&files.key).map_err(|e| key_error(format!("cannot read {key}: {e}")))?;
        let private = PrivateKeyDer::from_pem_slice(&pem)
            .map_err(|e| key_error(format!("{key} holds no usable PEM private key: {e}")))?;
        let provider = rustls::crypto::ring::default_provider();
        let certified = CertifiedKey::from_der(chain, private, &provider).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => key_error(format!(
                "{key} is not the private key of the certificate in {cert}"
            )),
            rustls::Error::InvalidCertificate(e) => {
                cert_error(format!("{cert} holds no usable certificate: {e}"))
            }
            other => key_error(format!("{key} cannot be used with {cert}: {other}")),
        })?;
        Ok(ServingCert(Arc::new(certified)))
    }
}

impl PartialEq for ServingCert {
    fn eq(&self, other: &Self) -> bool {
        self.0.cert == other.0.cert
    }
}

impl fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServingCert({} certificates)", self.0.cert.len())
    }
}
