//! Assembles the pingora server from a config and runs it: the proxy service, the background
//! loops (reload triggers, health checks, telemetry polls, admission dispatch, history) and the
//! admin service.

use crate::admin::AdminApp;
use crate::config::Config;
use crate::connections::GuardedApp;
use crate::lifecycle::{Drain, Handover, Lifecycle, StopAccepting};
use crate::proxy::Gpulb;
use crate::reload::{text_hash, ReloadService, Reloader};
use crate::routing::Registry;
use crate::tasks::{Dispatcher, HealthChecks, ModelDiscovery, PerBackend, TelemetryPolling};
use crate::tls::CertResolver;
use pingora::listeners::ListenerConfig;
use pingora::protocols::l4::stream::L4BufferSettings;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server, ShutdownSignalWatch, UnixShutdownSignalWatch};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

/// Each client connection's socket buffers in gpulb: pingora's default read buffer is 64 KiB,
/// held for the connection's whole life, idle or not. None at all: pingora reads a request
/// header into a buffer of its own (4 KiB, allocated per request) and bodies likewise, so a
/// read buffer under them is a copy that an idle connection would hold. (nginx's
/// `client_header_buffer_size` is 1 KiB.)
const CLIENT_BUFFERS: L4BufferSettings = L4BufferSettings {
    read: Some(0),
    write: None,
};

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
    /// The client listener's TLS settings could not be built.
    #[error("cannot set up TLS on the proxy listener: {0}")]
    Tls(String),
    /// An HTTP client for health checks or model discovery could not be built.
    #[error("cannot build an HTTP client for health checks or model discovery: {0}")]
    Client(String),
}

/// Checks that an address can be bound now, so a clash is a clear error instead of a panic later.
fn probe_listen(addr: SocketAddr, what: &'static str) -> Result<(), StartError> {
    TcpListener::bind(addr)
        .map(drop)
        .map_err(|source| StartError::Listen { addr, what, source })
}

/// Where the running config came from.
pub enum Source {
    /// A file, reloadable.
    File(std::path::PathBuf),
    /// Built in code (the demo); not reloadable.
    Builtin,
}

/// Builds the pingora server for `config`: proxy service, reload triggers when it came from a
/// file, and the admin service when configured. With `handover.take_over` the listening
/// sockets are taken from the running process (blocks until it sends them, or fails the start).
pub fn build_server(
    config: Config,
    source: Source,
    lifecycle: Arc<Lifecycle>,
    handover: &Handover,
) -> Result<(Server, Arc<Registry>), StartError> {
    // Taking over, the addresses are the old process's until it hands them over.
    if !handover.take_over {
        probe_listen(config.listen, "proxy")?;
        if let Some(admin) = &config.admin {
            probe_listen(admin.listen, "admin")?;
        }
    }
    // The drain (lifecycle.rs) has finished every request before pingora hears of the stop:
    // no grace period is needed after it, and the runtimes only have their loops to end.
    let conf = ServerConf {
        threads: config.threads,
        // No work stealing: each thread runs tokio's current-thread scheduler and a connection
        // stays on the thread it was handed to (pingora picks one at random per connection), as
        // nginx's workers and HAProxy's threads keep theirs. Less bookkeeping per wake-up and no
        // task crossing threads: 0.63–0.69x nginx's req/s at 2 threads against 0.48–0.59x with
        // stealing (BENCHMARKS.md, "Proxy overhead"). With one thread it is the same scheduler.
        work_stealing: false,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        upgrade_sock: handover.socket.to_string_lossy().into_owned(),
        ..ServerConf::default()
    };
    let opt = pingora::server::configuration::Opt {
        upgrade: handover.take_over,
        ..Default::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();
    let listen = config.listen;
    // With `listen_tls`, validation has read its files; the resolver serves them and takes
    // the files each reload reads.
    let listener_cert = config
        .compiled
        .listener_cert
        .as_ref()
        .map(|cert| Arc::new(CertResolver::new(cert)));
    let admin = config.admin.clone();
    let threads = config.threads;
    let reload_conf = config.reload.clone();
    let access_log = config.access_log.enabled;
    let metrics = Arc::new(crate::metrics::Metrics::new(config.metrics.max_tenants));
    let registry = Arc::new(Registry::new(config));
    let reloader = match source {
        Source::File(path) => {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            Some(Arc::new(
                Reloader::new(&path, text_hash(&text), Arc::clone(&registry))
                    .with_listener_cert(listener_cert.clone()),
            ))
        }
        Source::Builtin => None,
    };
    if let Some(reloader) = &reloader {
        let triggers = ReloadService::new(
            Arc::clone(reloader),
            reload_conf.watch,
            reload_conf.debounce,
        );
        server.add_service(background_service("gpulb reload", triggers));
    }

    match HealthChecks::new() {
        Ok(checks) => server.add_service(background_service(
            "gpulb health",
            PerBackend::new(Arc::clone(&registry), checks),
        )),
        Err(e) => return Err(StartError::Client(e.to_string())),
    };
    match ModelDiscovery::new() {
        Ok(discovery) => server.add_service(background_service(
            "gpulb model discovery",
            PerBackend::new(Arc::clone(&registry), discovery),
        )),
        Err(e) => return Err(StartError::Client(e.to_string())),
    };
    server.add_service(background_service(
        "gpulb dns discovery",
        crate::discovery::DnsDiscovery::new(Arc::clone(&registry)),
    ));
    server.add_service(background_service(
        "gpulb dispatch",
        Dispatcher::new(Arc::clone(&registry)),
    ));
    server.add_service(background_service(
        "gpulb telemetry",
        PerBackend::new(
            Arc::clone(&registry),
            TelemetryPolling::new(Arc::clone(&registry)),
        ),
    ));

    let proxy_app = pingora::proxy::http_proxy(
        &server.configuration,
        Gpulb::new(
            Arc::clone(&registry),
            Arc::clone(&metrics),
            access_log,
            Arc::clone(&lifecycle),
        ),
    );
    // Client connections are capped and given deadlines below HTTP (connections/).
    let guarded = GuardedApp::new(
        proxy_app,
        Arc::clone(&registry),
        Arc::clone(&metrics),
        lifecycle.open_http1(),
    );
    let mut proxy = Service::new("gpulb proxy".to_string(), guarded);
    let mut listener = ListenerConfig::tcp(listen.to_string()).l4_buffer(CLIENT_BUFFERS);
    if let Some(resolver) = &listener_cert {
        let settings = resolver
            .listener_settings()
            .map_err(|e| StartError::Tls(e.to_string()))?;
        listener = listener.tls(settings);
    }
    proxy.add_listener(listener);
    proxy.threads = Some(threads);
    server.add_service(StopAccepting::new(proxy, lifecycle.proxy_listener()));

    if let Some(admin) = admin {
        // Validation already proved the token readable; a failure here means it vanished since.
        let token = admin.token().unwrap_or_else(|e| {
            tracing::error!(error = %e, "admin token unavailable; mutating admin endpoints are refused");
            None
        });
        let guard = crate::admin::auth::Guard {
            all: !admin.listen.ip().is_loopback(),
            public_metrics: admin.public_metrics,
        };
        let history = Arc::new(crate::admin::history::History::default());
        server.add_service(background_service(
            "gpulb history",
            crate::admin::history::HistorySampler::new(
                Arc::clone(&history),
                Arc::clone(&registry),
                Arc::clone(&metrics),
            ),
        ));
        let app = AdminApp::new(
            Arc::clone(&registry),
            reloader,
            token,
            guard,
            metrics,
            history,
            Arc::clone(&lifecycle),
        );
        let mut service = Service::new("gpulb admin".to_string(), app);
        service.add_tcp(&admin.listen.to_string());
        service.threads = Some(1);
        server.add_service(StopAccepting::new(service, lifecycle.admin_listener()));
    }
    Ok((server, registry))
}

/// Runs the server until `shutdown` (by default the Unix signals: SIGTERM drains, SIGINT
/// stops at once, SIGQUIT hands the listeners over through `handover`'s socket) says to stop.
pub fn run(
    config: Config,
    source: Source,
    shutdown: Option<Box<dyn ShutdownSignalWatch + Send + Sync>>,
    handover: Handover,
) -> Result<(), StartError> {
    let listen = config.listen;
    let (drain_delay, timeout) = (config.drain_delay, config.shutdown_timeout);
    let lifecycle = Arc::new(Lifecycle::default());
    let scheme = if config.listen_tls.is_some() {
        "https"
    } else {
        "http"
    };
    let (server, registry) = build_server(config, source, Arc::clone(&lifecycle), &handover)?;
    tracing::info!(%listen, scheme, "gpulb serving");
    let signals = shutdown.unwrap_or_else(|| Box::new(UnixShutdownSignalWatch));
    let args = RunArgs {
        shutdown_signal: Box::new(
            Drain::new(signals, lifecycle, registry, drain_delay, timeout).with_handover(handover),
        ),
    };
    server.run(args);
    Ok(())
}
