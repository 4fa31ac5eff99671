//! The routing snapshot: backends, pools and classes built from one config, swapped whole.
//!
//! Live backend state (`Arc<BackendState>`) is carried from one snapshot to the next by backend
//! name, so a rebuild never loses in-flight counts.

use crate::backend::{BackendState, ClassState, Lease};
use crate::balance::{self, Candidate};
use crate::classify::ClassRule;
use crate::config::{backend_addr, Config};
use arc_swap::ArcSwap;
use http::{HeaderMap, Method};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A backend as this snapshot configures it, with its live state.
#[derive(Debug)]
pub struct Backend {
    /// Live counters, shared across snapshots.
    pub state: Arc<BackendState>,
    /// Configured URL, for display.
    pub url: String,
    /// Resolved address.
    pub addr: SocketAddr,
    /// Relative capacity.
    pub weight: u32,
    /// In-flight cap.
    pub max_outstanding: u32,
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
}

impl Snapshot {
    /// Builds a snapshot from a validated config, reusing live state from `previous` by name.
    pub fn build(config: Config, generation: u64, previous: Option<&Snapshot>) -> Snapshot {
        let old_backends: HashMap<&str, &Arc<BackendState>> = previous
            .map(|p| {
                p.backends
                    .iter()
                    .map(|b| (b.state.name.as_str(), &b.state))
                    .collect()
            })
            .unwrap_or_default();
        let old_classes: HashMap<&str, &Arc<ClassState>> = previous
            .map(|p| {
                p.classes
                    .iter()
                    .map(|c| (c.name.as_str(), &c.state))
                    .collect()
            })
            .unwrap_or_default();
        let backends: Vec<Backend> = config
            .backends
            .iter()
            .filter_map(|b| {
                let state = old_backends
                    .get(b.name.as_str())
                    .map(|s| Arc::clone(s))
                    .unwrap_or_else(|| Arc::new(BackendState::new(&b.name)));
                Some(Backend {
                    state,
                    url: b.url.clone(),
                    addr: backend_addr(&b.url).ok()?,
                    weight: b.weight,
                    max_outstanding: b.max_outstanding,
                })
            })
            .collect();
        let backend_index = |name: &str| backends.iter().position(|b| b.state.name == name);
        let pools: Vec<Pool> = config
            .pools
            .iter()
            .map(|p| Pool {
                name: p.name.clone(),
                members: p.backends.iter().filter_map(|n| backend_index(n)).collect(),
            })
            .collect();
        let classes: Vec<Class> = config
            .classes
            .iter()
            .map(|c| Class {
                name: c.name.clone(),
                rule: ClassRule::compile(&c.matcher),
                pool: pools.iter().position(|p| p.name == c.pool).unwrap_or(0),
                max_outstanding: c.max_outstanding.unwrap_or(u32::MAX),
                state: old_classes
                    .get(c.name.as_str())
                    .map(|s| Arc::clone(s))
                    .unwrap_or_default(),
            })
            .collect();
        let default_class = config
            .default_class
            .as_deref()
            .and_then(|name| classes.iter().position(|c| c.name == name))
            .unwrap_or(0);
        Snapshot {
            generation,
            config: Arc::new(config),
            backends,
            pools,
            classes,
            default_class,
        }
    }

    /// The class a request belongs to: the first whose rule matches, else the default.
    pub fn classify(&self, method: &Method, path: &str, headers: &HeaderMap) -> usize {
        self.classes
            .iter()
            .position(|c| c.rule.matches(method, path, headers))
            .unwrap_or(self.default_class)
    }

    /// Takes a slot on the least loaded available backend of `pool`, skipping `excluded`.
    pub fn acquire(&self, pool: usize, excluded: &[usize]) -> Option<Lease> {
        let members = &self.pools.get(pool)?.members;
        let mut candidates: Vec<Candidate> = members
            .iter()
            .map(|&i| {
                let b = &self.backends[i];
                Candidate {
                    outstanding: b.state.outstanding.get(),
                    weight: b.weight,
                    max_outstanding: b.max_outstanding,
                    eligible: !excluded.contains(&i),
                }
            })
            .collect();
        let mut rng = rand::rng();
        // Each failed acquire (another request took the last slot) removes one candidate.
        for _ in 0..candidates.len() {
            let chosen = balance::pick(&candidates, &mut rng)?;
            let backend = &self.backends[members[chosen]];
            if let Some(slot) = backend
                .state
                .outstanding
                .try_acquire(backend.max_outstanding)
            {
                backend.state.attempts_total.fetch_add(1, Ordering::Relaxed);
                return Some(Lease::new(members[chosen], slot));
            }
            candidates[chosen].eligible = false;
        }
        None
    }
}

/// The live snapshot, swapped atomically; readers keep the one they loaded until they finish.
pub struct Registry {
    current: ArcSwap<Snapshot>,
}

impl Registry {
    /// A registry serving `config` as generation 1.
    pub fn new(config: Config) -> Self {
        Registry {
            current: ArcSwap::from_pointee(Snapshot::build(config, 1, None)),
        }
    }

    /// The snapshot in force now.
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Builds a snapshot from a validated config and makes it current; returns its generation.
    pub fn apply(&self, config: Config) -> u64 {
        let previous = self.load();
        let next = Snapshot::build(config, previous.generation + 1, Some(&previous));
        let generation = next.generation;
        self.current.store(Arc::new(next));
        generation
    }
}

#[cfg(test)]
mod tests;
