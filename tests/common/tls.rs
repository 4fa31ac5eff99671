//! TLS for tests: throwaway CAs issuing certificates for 127.0.0.1, HTTPS clients that trust
//! one CA only, a raw TLS connection, and a TLS front that makes a plain worker an https one.

use pingora::tls::TlsAcceptor;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A certificate authority made for one test.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key, PEM.
pub struct Issued {
    /// The certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

impl Issued {
    /// Writes both to `dir` as `name.pem` and `name.key` (replacing them): their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, &self.cert).expect("write certificate");
        std::fs::write(&key, &self.key).expect("write key");
        (cert, key)
    }
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa { cert, key }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes the CA's certificate to `dir/name`: its path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.pem()).expect("write CA");
        path
    }

    /// A server certificate for 127.0.0.1 signed by this CA.
    pub fn issue(&self) -> Issued {
        let params = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
        let key = KeyPair::generate().expect("key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("sign certificate");
        Issued {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// The CA as a rustls root store.
    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.der().clone()).expect("CA as root");
        roots
    }
}

/// A client trusting only `ca`; each new client makes new connections (new handshakes).
pub fn https_client(ca: &TestCa) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .no_proxy()
        .build()
        .expect("https client")
}

/// A TLS connection to `addr` (server name 127.0.0.1) trusting only `ca`, handshake done.
pub async fn tls_connect(
    addr: SocketAddr,
    ca: &TestCa,
) -> std::io::Result<pingora::tls::ClientTlsStream<TcpStream>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").expect("server name");
    pingora::tls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// TLS terminated on a loopback port, each connection's bytes passed on to a plain server;
/// stopped (with every connection it holds) when dropped.
pub struct TlsFront {
    /// Where it accepts TLS.
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl TlsFront {
    /// Serves `issued` in front of `target`.
    pub async fn start(issued: &Issued, target: SocketAddr) -> TlsFront {
        let chain = CertificateDer::pem_slice_iter(issued.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("certificate PEM");
        let key = PrivateKeyDer::from_pem_slice(issued.key.as_bytes()).expect("key PEM");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind front");
        let addr = listener.local_addr().expect("front address");
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                connections.spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if let Ok(mut plain) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    }
                });
            }
        });
        TlsFront { addr, task }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
