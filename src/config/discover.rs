//! Backends found by DNS: a pool's `discover` block, and the config with what was found added.
//!
//! Every A/AAAA record of `discover.dns` is a backend of the pool, named from `discover.name`,
//! shaped by `discover.backend`, its URL `http://{ip}:{port}` and `{ip}`, `{port}` and `{pool}`
//! replaced in its telemetry URLs. What was found is added to the file's config as if it
//! had been written there, and validated the same way.

use super::validate::{ConfigError, ConfigErrors};
use super::{defaults, duration, BackendConfig, Config, HealthCheckOverride, SourceConfig};
use super::{LoadError, SourceKind};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Where a pool's backends are found, how often, and what each looks like.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiscoverConfig {
    /// `host:port`: every A/AAAA record of `host` is a backend listening on `port`.
    pub dns: String,
    /// Time between two lookups.
    #[serde(default = "defaults::dns_interval", with = "duration")]
    pub interval: Duration,
    /// Longest a lookup may take.
    #[serde(default = "defaults::dns_timeout", with = "duration")]
    pub timeout: Duration,
    /// DNS server asked (UDP); absent: the system resolver.
    #[serde(default)]
    pub resolver: Option<SocketAddr>,
    /// Backend name, from `{pool}`, `{ip}` and `{port}`; must contain `{ip}`.
    #[serde(default = "defaults::discovered_name")]
    pub name: String,
    /// What every backend found is, as a `backends[]` entry without `name` and `url`.
    #[serde(default)]
    pub backend: BackendTemplate,
}

/// The keys of a `backends[]` entry that a discovered backend takes from the template.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackendTemplate {
    /// See [`BackendConfig::weight`].
    #[serde(default = "defaults::weight")]
    pub weight: u32,
    /// See [`BackendConfig::max_outstanding`].
    #[serde(default = "defaults::max_outstanding")]
    pub max_outstanding: u32,
    /// See [`BackendConfig::health_check`].
    #[serde(default)]
    pub health_check: HealthCheckOverride,
    /// See [`BackendConfig::telemetry`]; `{ip}`, `{port}` and `{pool}` in URLs are replaced.
    #[serde(default)]
    pub telemetry: Vec<SourceConfig>,
    /// See [`BackendConfig::models`].
    #[serde(default)]
    pub models: Option<Vec<String>>,
}

impl Default for BackendTemplate {
    fn default() -> Self {
        BackendTemplate {
            weight: defaults::weight(),
            max_outstanding: defaults::max_outstanding(),
            health_check: HealthCheckOverride::default(),
            telemetry: Vec::new(),
            models: None,
        }
    }
}

impl DiscoverConfig {
    /// The host and port of `dns`.
    pub fn host_port(&self) -> Result<(&str, u16), String> {
        let (host, port) = self
            .dns
            .rsplit_once(':')
            .ok_or_else(|| format!("{:?} must be host:port", self.dns))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = port
            .parse()
            .map_err(|_| format!("{:?}: {port:?} is not a port", self.dns))?;
        if host.is_empty() {
            return Err(format!("{:?} has no host", self.dns));
        }
        Ok((host, port))
    }

    /// The backend found at `ip` for `pool`.
    pub fn backend(&self, pool: &str, ip: IpAddr, port: u16) -> BackendConfig {
        let fill = |text: &str| {
            text.replace("{pool}", pool)
                .replace("{ip}", &ip_in_url(ip))
                .replace("{port}", &port.to_string())
        };
        let template = &self.backend;
        let telemetry = template
            .telemetry
            .iter()
            .map(|source| {
                let mut source = source.clone();
                match &mut source.kind {
                    SourceKind::Dcgm { url, .. }
                    | SourceKind::ModelServer { url: Some(url), .. } => *url = fill(url),
                    SourceKind::ModelServer { url: None, .. } | SourceKind::Nvml { .. } => {}
                }
                source
            })
            .collect();
        BackendConfig {
            name: self
                .name
                .replace("{pool}", pool)
                .replace("{ip}", &ip.to_string())
                .replace("{port}", &port.to_string()),
            url: format!("http://{}:{port}", ip_in_url(ip)),
            weight: template.weight,
            max_outstanding: template.max_outstanding,
            health_check: template.health_check.clone(),
            telemetry,
            models: template.models.clone(),
            tls: None,
            auth: None,
        }
    }
}

/// An IP as written in a URL's host (IPv6 in brackets).
fn ip_in_url(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// What discovery found, by pool name.
pub type Found = BTreeMap<String, Vec<IpAddr>>;

impl Config {
    /// This config with the backends `found` added to the pools that discover them (pools
    /// with nothing found keep only their listed backends), validated like a file.
    pub fn with_discovered(&self, found: &Found) -> Result<Config, ConfigErrors> {
        let mut config = self.clone();
        for (i, pool) in self.pools.iter().enumerate() {
            let (Some(discover), Some(ips)) = (&pool.discover, found.get(&pool.name)) else {
                continue;
            };
            let Ok((_, port)) = discover.host_port() else {
                continue;
            };
            for &ip in ips {
                let backend = discover.backend(&pool.name, ip, port);
                config.pools[i].backends.push(backend.name.clone());
                config.backends.push(backend);
            }
        }
        config.compiled = config.validate()?;
        Ok(config)
    }

    /// Checks each `discover` block, and what it would add, with a stand-in address.
    pub(super) fn validate_discovery(&self) -> Result<(), LoadError> {
        let mut errors = Vec::new();
        let mut sample = Found::new();
        for (i, pool) in self.pools.iter().enumerate() {
            let Some(discover) = &pool.discover else {
                continue;
            };
            let at = format!("pools[{i}].discover");
            let mut error = |field: &str, message: String| {
                errors.push(ConfigError {
                    path: format!("{at}.{field}"),
                    message,
                })
            };
            if let Err(message) = discover.host_port() {
                error("dns", message);
            }
            for (field, value) in [
                ("interval", discover.interval),
                ("timeout", discover.timeout),
            ] {
                if value.is_zero() {
                    error(field, "must be > 0".into());
                }
            }
            if !discover.name.contains("{ip}") {
                error("name", format!("{:?} must contain {{ip}}", discover.name));
            }
            sample.insert(
                pool.name.clone(),
                vec![IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))],
            );
        }
        if errors.is_empty() && !sample.is_empty() {
            if let Err(found) = self.with_discovered(&sample) {
                let listed = self.backends.len();
                let shaped = found.0.into_iter().map(|e| ConfigError {
                    path: rename_sample(&e.path, listed),
                    message: e.message,
                });
                errors.extend(shaped);
            }
        }
        match errors.is_empty() {
            true => Ok(()),
            false => Err(LoadError::Invalid(ConfigErrors(errors))),
        }
    }
}

/// `backends[N].x` of a stand-in discovered backend (N >= `listed`) as `discovered backend.x`.
fn rename_sample(path: &str, listed: usize) -> String {
    let index = path
        .strip_prefix("backends[")
        .and_then(|rest| rest.split_once(']'))
        .and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, rest)));
    match index {
        Some((n, rest)) if n >= listed => {
            format!("discovered backend (pools[].discover.backend){rest}")
        }
        _ => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "
backends: []
pools:
  - name: gpus
    backends: []
    discover:
      dns: vllm.ns.svc:8000
      interval: 1s
      name: vllm-{ip}
      backend:
        max_outstanding: 48
        telemetry:
          - {kind: model_server, server: vllm}
          - {kind: dcgm, url: 'http://{ip}:9400/metrics'}
";

    #[test]
    fn found_addresses_become_named_templated_backends() {
        let config = Config::from_yaml(FILE).unwrap();
        let discover = config.pools[0].discover.as_ref().unwrap();
        assert_eq!(discover.host_port().unwrap(), ("vllm.ns.svc", 8000));
        let found = Found::from([(
            "gpus".to_string(),
            vec!["10.0.0.7".parse().unwrap(), "fd00::9".parse().unwrap()],
        )]);
        let expanded = config.with_discovered(&found).unwrap();
        assert_eq!(config.backends.len(), 0);
        let names: Vec<&str> = expanded.backends.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["vllm-10.0.0.7", "vllm-fd00::9"]);
        assert_eq!(expanded.pools[0].backends, names);
        let v6 = &expanded.backends[1];
        assert_eq!(v6.url, "http://[fd00::9]:8000");
        assert_eq!(v6.max_outstanding, 48);
        assert_eq!(
            v6.telemetry[1].url(&v6.url).as_deref(),
            Some("http://[fd00::9]:9400/metrics")
        );
        assert_eq!(
            v6.telemetry[0].url(&v6.url).as_deref(),
            Some("http://[fd00::9]:8000/metrics")
        );
        assert_eq!(expanded.compiled.upstreams.len(), 2);
    }

    #[test]
    fn discovered_backends_take_their_pools_auth() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "sk-pool").unwrap();
        let with_auth = FILE.replace(
            "    discover:",
            &format!(
                "    auth: {{token_file: {:?}}}\n    discover:",
                key.display().to_string()
            ),
        );
        let config = Config::from_yaml(&with_auth).unwrap();
        let found = Found::from([("gpus".to_string(), vec!["10.0.0.7".parse().unwrap()])]);
        let expanded = config.with_discovered(&found).unwrap();
        let auth = expanded.compiled.upstreams[0]
            .auth
            .as_ref()
            .expect("the pool's key");
        assert_eq!(auth.header(), "Bearer sk-pool");
    }

    #[test]
    fn bad_discover_blocks_are_refused_naming_the_field() {
        let bad = FILE
            .replace("vllm.ns.svc:8000", "vllm.ns.svc")
            .replace("vllm-{ip}", "vllm")
            .replace("interval: 1s", "interval: 0s");
        let errors = Config::from_yaml(&bad).unwrap_err().to_string();
        for field in ["discover.dns", "discover.name", "discover.interval"] {
            assert!(errors.contains(&format!("pools[0].{field}")), "{errors}");
        }
        let bad = FILE.replace("'http://{ip}:9400/metrics'", "'ftp://{ip}:9400/metrics'");
        let errors = Config::from_yaml(&bad).unwrap_err().to_string();
        assert!(errors.contains("discovered backend"), "{errors}");
        // A pool without discovery still needs a backend.
        let bare = "backends: []\npools:\n  - {name: gpus, backends: []}\n";
        assert!(Config::from_yaml(bare).is_err());
    }

    #[test]
    fn a_discovered_name_may_not_clash_with_a_listed_one() {
        let clash = FILE.replace(
            "backends: []\npools",
            "backends:\n  - {name: vllm-10.0.0.7, url: 'http://10.0.0.7:8000'}\npools",
        );
        let config = Config::from_yaml(&clash).unwrap();
        let found = Found::from([("gpus".to_string(), vec!["10.0.0.7".parse().unwrap()])]);
        let errors = config.with_discovered(&found).unwrap_err().to_string();
        assert!(errors.contains("duplicate backend name"), "{errors}");
    }
}
