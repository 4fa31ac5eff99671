//! The routing snapshot: backends, pools and classes built from one config, swapped whole.
//!
//! Live backend state (`Arc<BackendState>`) is carried from one snapshot to the next by backend
//! name, so a rebuild never loses in-flight counts.

use super::build::{resolve_backends, Resolved};
use super::classify::{BodyView, ClassRule, Envelope};
use super::placement::Placement;
use super::prefix::PrefixIndex;
use super::responses::ResponseOwners;
use super::state::{BackendState, ClassState};
use crate::admission::QueuePolicy;
use crate::config::{Config, Guards, HealthCheck, ResolveError, SourceConfig, Upstream};
use crate::discovery::{Discovered, DnsError, GroupStatus};
use crate::request::BodyError;
use crate::routing::state::CapacitySignal;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A backend as this snapshot configures it, with its live state.
#[derive(Debug)]
pub struct Backend {
    /// Live counters, shared across snapshots.
    pub state: Arc<BackendState>,
    /// Configured URL, for display.
    pub url: String,
    /// Host and port from the URL; the address it resolves to is live state
    /// ([`BackendState::address`]).
    pub upstream: Upstream,
    /// Whether this snapshot found it at a new URL or address (so a new server).
    pub moved: bool,
    /// Relative capacity.
    pub weight: u32,
    /// In-flight cap.
    pub max_outstanding: u32,
    /// Its active health check, defaults and overrides resolved.
    pub health_check: HealthCheck,
    /// Where its telemetry is read.
    pub telemetry: Vec<SourceConfig>,
}

/// A named set of backends (indices into [`Snapshot::backends`]).
#[derive(Debug)]
pub struct Pool {
    /// Pool name.
    pub name: String,
    /// Member backends.
    pub members: Vec<usize>,
}

/// A request class as this snapshot configures it.
#[derive(Debug)]
pub struct Class {
    /// Class name.
    pub name: String,
    /// Which requests belong to it.
    pub rule: ClassRule,
    /// Index into [`Snapshot::pools`].
    pub pool: usize,
    /// Class-wide in-flight cap.
    pub max_outstanding: u32,
    /// Telemetry guards: the class's own, else its pool's.
    pub guards: Guards,
    /// Pool tried when `pool` has no free slot, with the guards that apply there.
    pub fallback: Option<(usize, Guards)>,
    /// Share of each backend's cap this class may fill.
    pub backend_share: Option<f64>,
    /// How a backend is chosen for it.
    pub placement: Arc<dyn Placement>,
    /// How the class's queue is bounded and ordered.
    pub policy: QueuePolicy,
    /// Live counters, shared across snapshots.
    pub state: Arc<ClassState>,
}

/// Everything a request needs to be routed, immutable once built.
#[derive(Debug)]
pub struct Snapshot {
    /// Increases by one with every applied config.
    pub generation: u64,
    /// The config this snapshot was built from.
    pub config: Arc<Config>,
    /// All backends, in config order.
    pub backends: Vec<Backend>,
    /// All pools, in config order.
    pub pools: Vec<Pool>,
    /// All classes, in match order.
    pub classes: Vec<Class>,
    /// Index of the class for requests no rule matches.
    pub default_class: usize,
    /// Signalled whenever a backend or class slot is released; shared by all snapshots.
    pub capacity: Arc<CapacitySignal>,
    /// Where prompt prefixes were sent; shared by all snapshots.
    pub prefixes: Arc<PrefixIndex>,
    /// Which backend stored each response (Responses API); shared by all snapshots.
    pub responses: Arc<ResponseOwners>,
}

impl Snapshot {
    /// Whether this snapshot, replacing `previous`, may have room `previous` had not: a backend
    /// or class it lacked, a higher cap on one, a class sent to another pool or given a fallback,
    /// a pool with a member it lacked. Other room a reload frees (guards, health settings) is
    /// found by the queues' recheck, within `admission`'s `RECHECK`.
    pub fn may_add_room(&self, previous: &Snapshot) -> bool {
        fn backend_names<'a>(s: &'a Snapshot, pool: &Pool) -> Vec<&'a str> {
            pool.members
                .iter()
                .map(|&m| s.backends[m].state.name.as_str())
                .collect()
        }
        fn pool_name(s: &Snapshot, index: usize) -> Option<&str> {
            s.pools.get(index).map(|p| p.name.as_str())
        }
        let backends = self.backends.iter().any(|b| {
            previous
                .backends
                .iter()
                .find(|o| o.state.name == b.state.name)
                .is_none_or(|o| b.max_outstanding > o.max_outstanding)
        });
        let classes = self.classes.iter().any(|c| {
            previous
                .classes
                .iter()
                .find(|o| o.name == c.name)
                .is_none_or(|o| {
                    c.max_outstanding > o.max_outstanding
                        || pool_name(self, c.pool) != pool_name(previous, o.pool)
                        || c.fallback.as_ref().map(|f| pool_name(self, f.0))
                            != o.fallback.as_ref().map(|f| pool_name(previous, f.0))
                })
        });
        let pools = self.pools.iter().any(|p| {
            let old = previous.pools.iter().find(|o| o.name == p.name);
            old.is_none_or(|o| {
                let before = backend_names(previous, o);
                backend_names(self, p).iter().any(|n| !before.contains(n))
            })
        });
        backends || classes || pools
    }

    /// Names of the backends of pool `pool`, in member order.
    pub fn member_names<'a>(&'a self, pool: &'a Pool) -> impl Iterator<Item = &'a str> + Clone {
        pool.members
            .iter()
            .map(|&i| self.backends[i].state.name.as_str())
    }

    /// `class`'s expected service time, seconds, on each backend of its pool that has a usable
    /// estimate.
    pub fn service_seconds(&self, class: &Class, now: Instant) -> Vec<(&str, f64)> {
        let names = self.member_names(&self.pools[class.pool]);
        let measured = class.state.service_times.observe(names.clone(), now);
        names
            .zip(measured)
            .filter_map(|(name, measured)| Some((name, measured?.secs)))
            .collect()
    }

    /// The class a request belongs to: the first whose rule matches, else the default; the
    /// body's error when a rule tried in order needs the body and it is not a JSON request.
    pub fn classify<'a>(
        &self,
        req: &Envelope<'_>,
        body: BodyView<'a>,
    ) -> Result<usize, &'a BodyError> {
        for (index, class) in self.classes.iter().enumerate() {
            if class.rule.matches(req, body)? {
                return Ok(index);
            }
        }
        Ok(self.default_class)
    }
}

/// The live snapshot, swapped atomically; readers keep the one they loaded until they finish.
/// The config in force is the file's with the backends DNS discovery found added.
pub struct Registry {
    current: ArcSwap<Snapshot>,
    generations: tokio::sync::watch::Sender<u64>,
    sources: Mutex<Sources>,
}

/// Where the config in force comes from: the file (its backend names resolved when it was
/// applied) and what discovery found (address literals, resolved without I/O).
struct Sources {
    discovered: Discovered,
    file_addresses: HashMap<Upstream, Result<SocketAddr, ResolveError>>,
}

impl Sources {
    /// The address of every backend of `config`: the file's as resolved when it was applied,
    /// discovered ones from their literal address.
    fn addresses(&self, config: &Config) -> Resolved {
        let limit = config.reload.resolve_timeout;
        config
            .compiled
            .upstreams
            .iter()
            .map(|upstream| match self.file_addresses.get(upstream) {
                Some(address) => address.clone(),
                None => upstream.resolve_within(limit),
            })
            .collect()
    }
}

impl Registry {
    /// A registry serving `config` as generation 1.
    pub fn new(config: Config) -> Self {
        let resolved = resolve_backends(&config);
        let file_addresses = file_addresses(&config, &resolved);
        Registry {
            current: ArcSwap::from_pointee(Snapshot::build_resolved(
                config.clone(),
                resolved,
                1,
                None,
            )),
            generations: tokio::sync::watch::Sender::new(1),
            sources: Mutex::new(Sources {
                discovered: Discovered::new(config),
                file_addresses,
            }),
        }
    }

    /// Notified with the new generation whenever a config is applied.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generations.subscribe()
    }

    /// The snapshot in force now.
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a validated config from the file, with what discovery found added; returns the
    /// new generation. Resolves the file's backend names first (bounded, no lock held).
    pub fn apply(&self, config: Config) -> u64 {
        let resolved = resolve_backends(&config);
        self.apply_resolved(config, resolved)
    }

    /// [`Registry::apply`] with the file's backend names already resolved (no I/O).
    pub fn apply_resolved(&self, config: Config, resolved: Resolved) -> u64 {
        let mut sources = self.sources();
        sources.file_addresses = file_addresses(&config, &resolved);
        let config = sources.discovered.set_file(config);
        let resolved = sources.addresses(&config);
        self.install(config, resolved)
    }

    /// Records a DNS lookup for `pool`; rebuilds the snapshot when the set of backends changed.
    pub fn discovered(
        &self,
        pool: &str,
        dns: &str,
        result: Result<Vec<std::net::IpAddr>, DnsError>,
    ) -> Option<u64> {
        let mut sources = self.sources();
        let config = sources.discovered.record(pool, dns, result)?;
        let resolved = sources.addresses(&config);
        Some(self.install(config, resolved))
    }

    /// The config as the file says it, without what discovery added.
    pub fn file_config(&self) -> Config {
        self.sources().discovered.file().clone()
    }

    /// How each discovering pool's lookups go.
    pub fn discovery(&self) -> Vec<GroupStatus> {
        self.sources().discovered.status()
    }

    /// Builds a snapshot from a validated config and makes it current; returns its generation.
    fn install(&self, config: Config, resolved: Resolved) -> u64 {
        let previous = self.load();
        let next =
            Snapshot::build_resolved(config, resolved, previous.generation + 1, Some(&previous));
        let generation = next.generation;
        let more_room = next.may_add_room(&previous);
        self.current.store(Arc::new(next));
        self.generations.send_replace(generation);
        // Only a config that may bring room wakes the queues now: a dispatch at every reload
        // would place queued requests at moments no release chose (measured: a queued
        // interactive burst sent to the slowest GPU while reloading every 100 ms). Room a
        // reload frees in other ways is found by the waiters' own recheck.
        if more_room {
            self.load().capacity.notify.notify_one();
        }
        generation
    }
}

/// Each of `config`'s backend addresses as `resolved` found it.
fn file_addresses(
    config: &Config,
    resolved: &Resolved,
) -> HashMap<Upstream, Result<SocketAddr, ResolveError>> {
    config
        .compiled
        .upstreams
        .iter()
        .cloned()
        .zip(resolved.iter().cloned())
        .collect()
}
