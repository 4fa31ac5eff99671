//! Where backends come from beyond the config file: pools whose backends are found by DNS.
//!
//! The registry keeps the file's config and, for each discovering pool, the last good set of
//! addresses; the config in force is the file's with those added ([`Config::with_discovered`]),
//! rebuilt whole like a reload, so live state is kept by backend name. A lookup that fails
//! keeps the last good set and is reported in `/status` and `/metrics`.

mod dns;
mod task;

pub use dns::{lookup, DnsError};
pub use task::DnsDiscovery;

use crate::config::{Config, ConfigErrors, Found};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// How one pool's lookups go.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GroupStatus {
    /// The pool the backends join.
    pub pool: String,
    /// The `host:port` looked up.
    pub dns: String,
    /// The last good set of addresses (in force).
    pub addresses: Vec<IpAddr>,
    /// Why the last lookup failed, when it did (the last good set stays in force).
    pub last_error: Option<String>,
    /// Lookups so far.
    pub lookups_total: u64,
    /// Failed lookups so far.
    pub errors_total: u64,
}

/// The file's config and what discovery found for it.
#[derive(Debug)]
pub struct Discovered {
    file: Config,
    groups: BTreeMap<String, GroupStatus>,
}

impl Discovered {
    /// Nothing found yet for `file`.
    pub fn new(file: Config) -> Self {
        Discovered {
            file,
            groups: BTreeMap::new(),
        }
    }

    /// The file's config.
    pub fn file(&self) -> &Config {
        &self.file
    }

    /// Replaces the file's config (a reload); returns the config to serve: the file's with
    /// what was found added, or the file's alone when that does not validate (the reason goes
    /// into every group's `last_error`).
    pub fn set_file(&mut self, file: Config) -> Config {
        self.file = file;
        match self.file.with_discovered(&self.found()) {
            Ok(config) => config,
            Err(errors) => {
                let error = adding_failed(&errors);
                tracing::error!(%error, "discovered backends left out");
                // Out of the config served: the next good lookup adds them again.
                for group in self.groups.values_mut() {
                    group.addresses.clear();
                    group.last_error = Some(error.clone());
                }
                self.file.clone()
            }
        }
    }

    /// Records a lookup for `pool`; returns the config to serve when the set in force changed.
    pub fn record(
        &mut self,
        pool: &str,
        dns: &str,
        result: Result<Vec<IpAddr>, DnsError>,
    ) -> Option<Config> {
        let group = self.groups.entry(pool.to_string()).or_default();
        if group.dns != dns {
            *group = GroupStatus {
                pool: pool.to_string(),
                dns: dns.to_string(),
                ..GroupStatus::default()
            };
        }
        group.lookups_total += 1;
        let addresses = match result {
            Ok(addresses) => addresses,
            Err(e) => {
                group.errors_total += 1;
                let error = e.to_string();
                if group.last_error.as_ref() != Some(&error) {
                    tracing::warn!(pool, dns, %error, "DNS discovery failed; the last good set stays");
                }
                group.last_error = Some(error);
                return None;
            }
        };
        if addresses == group.addresses {
            group.last_error = None;
            return None;
        }
        let mut found = self.found();
        found.insert(pool.to_string(), addresses.clone());
        match self.file.with_discovered(&found) {
            Ok(config) => {
                let group = self.groups.get_mut(pool)?;
                tracing::info!(pool, dns, ?addresses, "DNS discovery: backends changed");
                group.addresses = addresses;
                group.last_error = None;
                Some(config)
            }
            Err(errors) => {
                let group = self.groups.get_mut(pool)?;
                group.errors_total += 1;
                group.last_error = Some(adding_failed(&errors));
                None
            }
        }
    }

    /// The last good set of each pool that discovers backends now.
    fn found(&self) -> Found {
        self.current()
            .map(|g| (g.pool.clone(), g.addresses.clone()))
            .collect()
    }

    /// How each pool of the file's config that discovers backends is doing.
    pub fn status(&self) -> Vec<GroupStatus> {
        self.current().cloned().collect()
    }

    fn current(&self) -> impl Iterator<Item = &GroupStatus> {
        self.groups.values().filter(|g| {
            self.file
                .pools
                .iter()
                .any(|p| p.name == g.pool && p.discover.as_ref().is_some_and(|d| d.dns == g.dns))
        })
    }
}

fn adding_failed(errors: &ConfigErrors) -> String {
    format!("cannot add the discovered backends: {errors}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "
backends: [{name: fixed, url: 'http://127.0.0.1:9'}]
pools:
  - name: gpus
    backends: [fixed]
    discover: {dns: 'gpus.test:8000', name: 'g-{ip}'}
";

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn names(config: &Config) -> Vec<&str> {
        config.backends.iter().map(|b| b.name.as_str()).collect()
    }

    #[test]
    fn changes_apply_failures_keep_the_last_good_set() {
        let mut discovered = Discovered::new(Config::from_yaml(FILE).unwrap());
        let first = discovered.record("gpus", "gpus.test:8000", Ok(ips(&["10.0.0.1", "10.0.0.2"])));
        assert_eq!(
            names(&first.unwrap()),
            ["fixed", "g-10.0.0.1", "g-10.0.0.2"]
        );
        let same = discovered.record("gpus", "gpus.test:8000", Ok(ips(&["10.0.0.1", "10.0.0.2"])));
        assert!(same.is_none(), "an unchanged set rebuilds nothing");
        let down = Err(DnsError::NoRecords {
            name: "gpus.test".into(),
        });
        assert!(discovered.record("gpus", "gpus.test:8000", down).is_none());
        let status = &discovered.status()[0];
        assert_eq!(status.addresses, ips(&["10.0.0.1", "10.0.0.2"]));
        assert!(status.last_error.as_ref().unwrap().contains("no A or AAAA"));
        assert_eq!((status.lookups_total, status.errors_total), (3, 1));
        let fewer = discovered.record("gpus", "gpus.test:8000", Ok(ips(&["10.0.0.2"])));
        assert_eq!(names(&fewer.unwrap()), ["fixed", "g-10.0.0.2"]);
        assert_eq!(discovered.status()[0].last_error, None);

        // A reload keeps what was found; a reload that drops the pool's discovery drops it.
        let reloaded = discovered.set_file(Config::from_yaml(FILE).unwrap());
        assert_eq!(names(&reloaded), ["fixed", "g-10.0.0.2"]);
        let plain = FILE.replace(
            "    discover: {dns: 'gpus.test:8000', name: 'g-{ip}'}\n",
            "",
        );
        let reloaded = discovered.set_file(Config::from_yaml(&plain).unwrap());
        assert_eq!(names(&reloaded), ["fixed"]);
        assert!(discovered.status().is_empty());
    }

    #[test]
    fn a_set_that_does_not_validate_is_refused() {
        let clash = FILE.replace("name: fixed", "name: g-10.0.0.1");
        let clash = clash.replace("backends: [fixed]", "backends: [g-10.0.0.1]");
        let mut discovered = Discovered::new(Config::from_yaml(&clash).unwrap());
        let refused = discovered.record("gpus", "gpus.test:8000", Ok(ips(&["10.0.0.1"])));
        assert!(refused.is_none());
        let status = &discovered.status()[0];
        assert!(status.addresses.is_empty());
        assert!(status.last_error.as_ref().unwrap().contains("duplicate"));
    }
}
