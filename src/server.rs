//! Assembles the pingora server (proxy service, admin service) from a config and runs it.

use crate::admin::AdminApp;
use crate::config::Config;
use crate::proxy::Gpulb;
use crate::registry::Registry;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server, ShutdownSignalWatch};
use pingora::services::listening::Service;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listen address is taken or not ours.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Which listener.
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
}

/// Checks that an address can be bound now, so a clash is a clear error instead of a panic later.
fn probe_listen(addr: SocketAddr, what: &'static str) -> Result<(), StartError> {
    TcpListener::bind(addr)
        .map(drop)
        .map_err(|source| StartError::Listen { addr, what, source })
}

/// Builds the pingora server for `config`: proxy service plus, when configured, the admin one.
pub fn build_server(config: Config) -> Result<(Server, Arc<Registry>), StartError> {
    probe_listen(config.listen, "proxy")?;
    if let Some(admin) = &config.admin {
        probe_listen(admin.listen, "admin")?;
    }
    let conf = ServerConf {
        threads: config.threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(config.shutdown_timeout.as_secs()),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let listen = config.listen;
    let admin_listen = config.admin.as_ref().map(|a| a.listen);
    let threads = config.threads;
    let registry = Arc::new(Registry::new(config));

    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        Gpulb::new(Arc::clone(&registry)),
        "gpulb proxy",
    );
    proxy.add_tcp(&listen.to_string());
    proxy.threads = Some(threads);
    server.add_service(proxy);

    if let Some(addr) = admin_listen {
        let mut admin = Service::new(
            "gpulb admin".to_string(),
            AdminApp::new(Arc::clone(&registry)),
        );
        admin.add_tcp(&addr.to_string());
        admin.threads = Some(1);
        server.add_service(admin);
    }
    Ok((server, registry))
}

/// Runs the server until `shutdown` fires (SIGTERM: graceful, SIGINT: fast, by default).
pub fn run(
    config: Config,
    shutdown: Option<Box<dyn ShutdownSignalWatch>>,
) -> Result<(), StartError> {
    let listen = config.listen;
    let (server, _registry) = build_server(config)?;
    tracing::info!(%listen, "gpulb serving");
    let mut args = RunArgs::default();
    if let Some(signal) = shutdown {
        args.shutdown_signal = signal;
    }
    server.run(args);
    Ok(())
}
