//! Semantic checks of a parsed config; every problem found is reported with its field path.

mod rules;

use rules::validate_admission;

use super::{BackendConfig, ClassConfig, Config, PoolConfig};
use std::collections::HashSet;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

/// One problem in a config file, located by its field path (`classes[1].pool`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Field path, e.g. `backends[0].url`.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in one config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}

/// Collects errors while walking the config.
#[derive(Default)]
pub(super) struct Report(Vec<ConfigError>);

impl Report {
    fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigError {
            path: path.into(),
            message: message.into(),
        });
    }

    fn check(&mut self, ok: bool, path: impl Into<String>, message: impl Into<String>) {
        if !ok {
            self.error(path, message);
        }
    }
}

impl Config {
    /// Checks cross-references and value ranges; returns every problem found.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut report = Report::default();
        self.validate_globals(&mut report);
        let backend_names = validate_backends(&self.backends, &mut report);
        self.validate_health(&mut report);
        let pool_names = validate_pools(&self.pools, &backend_names, &mut report);
        let class_names = validate_classes(&self.classes, &pool_names, &mut report);
        if self.classes.is_empty() && self.pools.len() > 1 {
            report.error("classes", "required when more than one pool is defined");
        }
        match &self.default_class {
            Some(name) if !class_names.contains(name.as_str()) => {
                report.error("default_class", format!("unknown class {name:?}"))
            }
            Some(_) => {}
            None if self.classes.len() > 1 => {
                report.error("default_class", "required when several classes are defined")
            }
            None => {}
        }
        if report.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(report.0))
        }
    }

    fn validate_globals(&self, report: &mut Report) {
        report.check(
            (1..=1024).contains(&self.threads),
            "threads",
            "must be between 1 and 1024",
        );
        let t = &self.timeouts;
        for (name, value) in [
            ("connect", t.connect),
            ("read", t.read),
            ("write", t.write),
            ("upstream_keepalive", t.upstream_keepalive),
        ] {
            report.check(!value.is_zero(), format!("timeouts.{name}"), "must be > 0");
        }
        report.check(
            self.connect_retries <= 16,
            "connect_retries",
            "must be at most 16",
        );
        report.check(
            http::HeaderName::from_bytes(self.tenant_header.as_bytes()).is_ok(),
            "tenant_header",
            format!("{:?} is not a valid header name", self.tenant_header),
        );
        report.check(
            http::HeaderName::from_bytes(self.request_id_header.as_bytes()).is_ok(),
            "request_id_header",
            format!("{:?} is not a valid header name", self.request_id_header),
        );
        if let Some(admin) = &self.admin {
            report.check(
                admin.listen != self.listen,
                "admin.listen",
                "must differ from listen",
            );
            match admin.token() {
                Err(message) => report.error("admin", message),
                Ok(None) if !admin.listen.ip().is_loopback() => report.error(
                    "admin.listen",
                    "a non-loopback admin listener needs token_env or token_file",
                ),
                Ok(_) => {}
            }
        }
    }
}

fn validate_backends<'a>(backends: &'a [BackendConfig], report: &mut Report) -> HashSet<&'a str> {
    report.check(
        !backends.is_empty(),
        "backends",
        "at least one backend is required",
    );
    let mut names = HashSet::new();
    for (i, backend) in backends.iter().enumerate() {
        let at = format!("backends[{i}]");
        if backend.name.is_empty() {
            report.error(format!("{at}.name"), "must not be empty");
        } else if !names.insert(backend.name.as_str()) {
            report.error(
                format!("{at}.name"),
                format!("duplicate backend name {:?}", backend.name),
            );
        }
        if let Err(message) = backend_addr(&backend.url) {
            report.error(format!("{at}.url"), message);
        }
        report.check(backend.weight >= 1, format!("{at}.weight"), "must be >= 1");
        report.check(
            backend.max_outstanding >= 1,
            format!("{at}.max_outstanding"),
            "must be >= 1",
        );
    }
    names
}

fn validate_pools<'a>(
    pools: &'a [PoolConfig],
    backends: &HashSet<&str>,
    report: &mut Report,
) -> HashSet<&'a str> {
    let mut names = HashSet::new();
    for (i, pool) in pools.iter().enumerate() {
        let at = format!("pools[{i}]");
        if !names.insert(pool.name.as_str()) {
            report.error(
                format!("{at}.name"),
                format!("duplicate pool name {:?}", pool.name),
            );
        }
        report.check(
            !pool.backends.is_empty(),
            format!("{at}.backends"),
            "a pool needs at least one backend",
        );
        let mut seen = HashSet::new();
        for (j, member) in pool.backends.iter().enumerate() {
            let path = format!("{at}.backends[{j}]");
            if !backends.contains(member.as_str()) {
                report.error(path, format!("unknown backend {member:?}"));
            } else if !seen.insert(member.as_str()) {
                report.error(path, format!("backend {member:?} listed twice"));
            }
        }
    }
    names
}

fn validate_classes<'a>(
    classes: &'a [ClassConfig],
    pools: &HashSet<&str>,
    report: &mut Report,
) -> HashSet<&'a str> {
    let mut names = HashSet::new();
    for (i, class) in classes.iter().enumerate() {
        let at = format!("classes[{i}]");
        if class.name.is_empty() {
            report.error(format!("{at}.name"), "must not be empty");
        } else if !names.insert(class.name.as_str()) {
            report.error(
                format!("{at}.name"),
                format!("duplicate class name {:?}", class.name),
            );
        }
        if !pools.contains(class.pool.as_str()) {
            report.error(
                format!("{at}.pool"),
                format!("unknown pool {:?}", class.pool),
            );
        }
        validate_admission(class, &at, pools, report);
        if class.max_outstanding == Some(0) {
            report.error(format!("{at}.max_outstanding"), "must be >= 1");
        }
        let rules = &class.matcher;
        if let Some(prefix) = &rules.path_prefix {
            report.check(
                prefix.starts_with('/'),
                format!("{at}.match.path_prefix"),
                "must start with '/'",
            );
        }
        for (j, method) in rules.methods.iter().enumerate() {
            report.check(
                http::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).is_ok(),
                format!("{at}.match.methods[{j}]"),
                format!("{method:?} is not an HTTP method"),
            );
        }
        for (name, value) in &rules.headers {
            let path = format!("{at}.match.headers.{name}");
            report.check(
                http::HeaderName::from_bytes(name.as_bytes()).is_ok(),
                path.clone(),
                "not a valid header name",
            );
            report.check(
                http::HeaderValue::from_str(value).is_ok(),
                path,
                "not a valid header value",
            );
        }
    }
    names
}

/// Resolves a backend URL of the form `http://host:port` to a socket address.
pub fn backend_addr(url: &str) -> Result<SocketAddr, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        if url.starts_with("https://") {
            format!("{url:?}: https backends are not supported; use http://host:port")
        } else {
            format!("{url:?}: expected http://host:port")
        }
    })?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "{url:?}: expected http://host:port with no path, query or credentials"
        ));
    }
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.contains(']'))
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let mut addrs = with_port
        .to_socket_addrs()
        .map_err(|e| format!("{url:?}: cannot resolve ({e})"))?;
    addrs
        .next()
        .ok_or_else(|| format!("{url:?}: resolves to no address"))
}
