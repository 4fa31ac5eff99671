//! Semantic checks of a parsed config; every problem found is reported with its field path.

mod rules;
mod tls;

use rules::validate_admission;

use super::compiled::{BodyRule, Compiled, MatchRule, Upstream};
use super::{BackendConfig, ClassConfig, Config, MatchConfig, PoolConfig};
use http::{HeaderName, HeaderValue, Method};
use std::collections::HashSet;
use std::fmt;

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
    /// Checks cross-references and value ranges and compiles the typed values the runtime
    /// uses; returns every problem found.
    pub fn validate(&self) -> Result<Compiled, ConfigErrors> {
        let mut report = Report::default();
        let (tenant_header, request_id_header) = self.validate_globals(&mut report);
        let (backend_names, mut upstreams) = validate_backends(
            &self.backends,
            self.pools.iter().any(|p| p.discover.is_some()),
            &mut report,
        );
        if upstreams.len() == self.backends.len() {
            self.validate_backend_tls(&mut upstreams, &mut report);
            self.validate_backend_auth(&mut upstreams, &mut report);
        }
        let listener_cert = self.validate_listen_tls(&mut report);
        self.validate_health(&mut report);
        self.validate_requests(&mut report);
        let pool_names = validate_pools(&self.pools, &backend_names, &mut report);
        let (class_names, class_rules) = validate_classes(&self.classes, &pool_names, &mut report);
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
        let api_keys = self.validate_tenants(&mut report);
        match (tenant_header, request_id_header) {
            (Some(tenant_header), Some(request_id_header)) if report.0.is_empty() => Ok(Compiled {
                tenant_header,
                api_keys,
                request_id_header,
                upstreams,
                class_rules,
                listener_cert,
            }),
            _ => Err(ConfigErrors(report.0)),
        }
    }

    /// Checks `tenants`; the API keys read from its keys file when tenants come from them.
    fn validate_tenants(&self, report: &mut Report) -> Option<super::ApiKeys> {
        let tenants = &self.tenants;
        match (tenants.from, &tenants.keys_file) {
            (super::TenantSource::ApiKey, Some(path)) => match super::ApiKeys::load(path) {
                Ok(keys) => Some(keys),
                Err(problem) => {
                    report.error("tenants.keys_file", problem);
                    None
                }
            },
            (super::TenantSource::ApiKey, None) => {
                report.error("tenants.keys_file", "required with from: api_key");
                None
            }
            (super::TenantSource::Header, _) => {
                report.check(
                    tenants.keys_file.is_none() && !tenants.reject_unknown,
                    "tenants",
                    "keys_file and reject_unknown apply to from: api_key only",
                );
                None
            }
        }
    }

    /// Checks the process-wide keys; the two header names when valid.
    fn validate_globals(&self, report: &mut Report) -> (Option<HeaderName>, Option<HeaderName>) {
        report.check(
            (1..=1024).contains(&self.threads),
            "threads",
            "must be between 1 and 1024",
        );
        let t = &self.timeouts;
        for (name, value) in [
            ("connect", t.connect),
            ("first_byte", t.first_byte()),
            ("idle", t.idle()),
            ("write", t.write),
            ("upstream_keepalive", t.upstream_keepalive),
            ("client_body", t.client_body),
            ("client_header", t.client_header),
            ("client_idle", t.client_idle),
        ] {
            report.check(!value.is_zero(), format!("timeouts.{name}"), "must be > 0");
        }
        report.check(
            t.read.is_none_or(|read| !read.is_zero()),
            "timeouts.read",
            "must be > 0",
        );
        report.check(
            !self.reload.timeout.is_zero(),
            "reload.timeout",
            "must be > 0",
        );
        report.check(
            !self.reload.resolve_timeout.is_zero(),
            "reload.resolve_timeout",
            "must be > 0",
        );
        report.check(
            self.limits.max_connections != Some(0),
            "limits.max_connections",
            "must be >= 1",
        );
        report.check(
            self.limits.max_header_bytes >= 1024,
            "limits.max_header_bytes",
            "must be at least 1024",
        );
        report.check(
            self.connect_retries <= 16,
            "connect_retries",
            "must be at most 16",
        );
        for (i, status) in self.retry_statuses.iter().enumerate() {
            report.check(
                matches!(status, 429 | 500..=599),
                format!("retry_statuses[{i}]"),
                format!("{status} is not a refusal a backend makes before starting: 429 or 5xx"),
            );
        }
        let header = |report: &mut Report, key: &str, name: &str| {
            let parsed = HeaderName::from_bytes(name.as_bytes()).ok();
            report.check(
                parsed.is_some(),
                key,
                format!("{name:?} is not a valid header name"),
            );
            parsed
        };
        let tenant_header = header(report, "tenant_header", &self.tenant_header);
        let request_id_header = header(report, "request_id_header", &self.request_id_header);
        if let Some(admin) = &self.admin {
            report.check(
                admin.listen != self.listen,
                "admin.listen",
                "must differ from listen",
            );
            match admin.token() {
                Err(problem) => report.error("admin", problem.to_string()),
                Ok(None) if !admin.listen.ip().is_loopback() => report.error(
                    "admin.listen",
                    "a non-loopback admin listener needs token_env or token_file",
                ),
                Ok(_) => {}
            }
        }
        (tenant_header, request_id_header)
    }
}

fn validate_backends<'a>(
    backends: &'a [BackendConfig],
    discovering: bool,
    report: &mut Report,
) -> (HashSet<&'a str>, Vec<Upstream>) {
    report.check(
        !backends.is_empty() || discovering,
        "backends",
        "at least one backend is required",
    );
    let mut names = HashSet::new();
    let mut upstreams = Vec::with_capacity(backends.len());
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
        match Upstream::parse(&backend.url) {
            Ok(upstream) => upstreams.push(upstream),
            Err(message) => report.error(format!("{at}.url"), message),
        }
        report.check(backend.weight >= 1, format!("{at}.weight"), "must be >= 1");
        report.check(
            backend.max_outstanding >= 1,
            format!("{at}.max_outstanding"),
            "must be >= 1",
        );
    }
    (names, upstreams)
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
            !pool.backends.is_empty() || pool.discover.is_some(),
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
) -> (HashSet<&'a str>, Vec<MatchRule>) {
    let mut names = HashSet::new();
    let mut rules = Vec::with_capacity(classes.len());
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
        rules.push(compile_match(&class.matcher, &at, report));
    }
    (names, rules)
}

/// A class's match rules, typed; each part that does not parse is reported and left out.
fn compile_match(rules: &MatchConfig, at: &str, report: &mut Report) -> MatchRule {
    if let Some(prefix) = &rules.path_prefix {
        report.check(
            prefix.starts_with('/'),
            format!("{at}.match.path_prefix"),
            "must start with '/'",
        );
    }
    let mut methods = Vec::with_capacity(rules.methods.len());
    for (j, method) in rules.methods.iter().enumerate() {
        match Method::from_bytes(method.to_ascii_uppercase().as_bytes()) {
            Ok(m) => methods.push(m),
            Err(_) => report.error(
                format!("{at}.match.methods[{j}]"),
                format!("{method:?} is not an HTTP method"),
            ),
        }
    }
    let mut headers = Vec::with_capacity(rules.headers.len());
    for (name, value) in &rules.headers {
        let path = format!("{at}.match.headers.{name}");
        let parsed_name = HeaderName::from_bytes(name.as_bytes()).ok();
        report.check(
            parsed_name.is_some(),
            path.clone(),
            "not a valid header name",
        );
        let parsed_value = match value.as_str() {
            "*" => Some(None),
            v => HeaderValue::from_str(v).ok().map(Some),
        };
        report.check(parsed_value.is_some(), path, "not a valid header value");
        if let (Some(name), Some(value)) = (parsed_name, parsed_value) {
            headers.push((name, value));
        }
    }
    let body = (rules.model.is_some()
        || rules.stream.is_some()
        || rules.max_tokens.is_some()
        || rules.prompt_tokens.is_some())
    .then(|| BodyRule {
        model: rules.model.clone(),
        stream: rules.stream,
        max_tokens: rules.max_tokens,
        prompt_tokens: rules.prompt_tokens,
    });
    MatchRule {
        path_prefix: rules.path_prefix.clone(),
        methods,
        headers,
        min_content_length: rules.min_content_length,
        max_content_length: rules.max_content_length,
        body,
    }
}
