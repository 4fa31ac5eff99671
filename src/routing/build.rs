//! Building a snapshot from a validated config, carrying live state over by name.

use super::classify::ClassRule;
use super::prefix::PrefixIndex;
use super::responses::{ResponseOwners, MAX_RESPONSES_TRACKED};
use super::{
    placement, Backend, BackendState, Class, ClassState, ModelList, ModelSource, Pool, Snapshot,
};
use crate::admission::QueuePolicy;
use crate::config::{BackendConfig, Config, ResolveError, Upstream};
use crate::health::CheckStatus;
use crate::routing::state::CapacitySignal;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// Block entries the prefix index holds at most: about 15 MiB, and a quarter of a million
/// 16-token blocks (4 million tokens of distinct prompt prefixes) remembered.
pub const PREFIX_INDEX_ENTRIES: usize = 1 << 18;

/// The address each backend of a config resolves to, in `config.backends` order.
pub type Resolved = Vec<Result<SocketAddr, ResolveError>>;

/// Resolves every backend name of `config` at once, each bounded by `reload.resolve_timeout`.
pub fn resolve_backends(config: &Config) -> Resolved {
    let limit = config.reload.resolve_timeout;
    std::thread::scope(|scope| {
        let lookups: Vec<_> = config
            .compiled
            .upstreams
            .iter()
            .map(|upstream| scope.spawn(move || upstream.resolve_within(limit)))
            .collect();
        lookups
            .into_iter()
            .zip(&config.compiled.upstreams)
            .map(|(lookup, upstream)| {
                lookup.join().unwrap_or_else(|_| {
                    Err(ResolveError::Failed {
                        authority: upstream.to_string(),
                        cause: "the lookup panicked".into(),
                    })
                })
            })
            .collect()
    })
}

impl Snapshot {
    /// Builds a snapshot from a validated config, reusing live state from `previous` by name;
    /// backend names are resolved first (bounded).
    pub fn build(config: Config, generation: u64, previous: Option<&Snapshot>) -> Snapshot {
        let resolved = resolve_backends(&config);
        Snapshot::build_resolved(config, resolved, generation, previous)
    }

    /// [`Snapshot::build`] with the backends' names already resolved: no I/O, quick.
    pub fn build_resolved(
        config: Config,
        resolved: Resolved,
        generation: u64,
        previous: Option<&Snapshot>,
    ) -> Snapshot {
        let old_backends: HashMap<&str, &Backend> = previous
            .map(|p| {
                p.backends
                    .iter()
                    .map(|b| (b.state.name.as_str(), b))
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
        let capacity = previous
            .map(|p| Arc::clone(&p.capacity))
            .unwrap_or_default();
        let prefixes = previous.map_or_else(
            || Arc::new(PrefixIndex::new(PREFIX_INDEX_ENTRIES)),
            |p| Arc::clone(&p.prefixes),
        );
        let responses = previous.map_or_else(
            || Arc::new(ResponseOwners::new(MAX_RESPONSES_TRACKED)),
            |p| Arc::clone(&p.responses),
        );
        let backends: Vec<Backend> = config
            .backends
            .iter()
            .zip(&config.compiled.upstreams)
            .zip(resolved)
            .map(|((b, upstream), resolved)| {
                let old = old_backends.get(b.name.as_str()).copied();
                build_backend(&config, b, (upstream, resolved), old, &capacity)
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
            .zip(&config.compiled.class_rules)
            .map(|(c, rule)| {
                let pool = config
                    .pools
                    .iter()
                    .position(|p| p.name == c.pool)
                    .unwrap_or(0);
                // A class's own guards apply wherever it goes; else each pool's.
                let guards_in = |pool: usize| {
                    c.guards
                        .clone()
                        .unwrap_or_else(|| config.pools[pool].guards.clone())
                };
                Class {
                    name: c.name.clone(),
                    rule: ClassRule::new(rule.clone()),
                    pool,
                    max_outstanding: c.max_outstanding.unwrap_or(u32::MAX),
                    guards: guards_in(pool),
                    fallback: c.fallback_pool.as_ref().and_then(|name| {
                        let index = config.pools.iter().position(|p| &p.name == name)?;
                        Some((index, guards_in(index)))
                    }),
                    backend_share: c.backend_share,
                    placement: placement::build(c.placement),
                    policy: QueuePolicy::from_config(
                        &c.queue,
                        &c.fairness,
                        c.tenant_max_outstanding,
                    ),
                    state: old_classes
                        .get(c.name.as_str())
                        .map(|s| Arc::clone(s))
                        .unwrap_or_else(|| Arc::new(ClassState::new(Arc::clone(&capacity)))),
                }
            })
            .collect();
        // A backend that moved is a new server: what was measured of the old one says nothing
        // about it.
        for moved in backends.iter().filter(|b| b.moved) {
            for class in &classes {
                class.state.service_times.forget(&moved.state.name);
            }
        }
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
            capacity,
            prefixes,
            responses,
        }
    }
}

/// One backend of the new snapshot at the address its name resolved to; its health restarts
/// when checks turn on or it moved (a new URL or a new address).
fn build_backend(
    config: &Config,
    b: &BackendConfig,
    (upstream, resolved): (&Upstream, Result<SocketAddr, ResolveError>),
    old: Option<&Backend>,
    capacity: &Arc<CapacitySignal>,
) -> Backend {
    let state = old
        .map(|o| Arc::clone(&o.state))
        .unwrap_or_else(|| Arc::new(BackendState::new(&b.name, Arc::clone(capacity))));
    if let Err(e) = &resolved {
        tracing::warn!(backend = %b.name, error = %e, "backend gets no traffic until its name resolves");
    }
    let moved = old.is_some_and(|o| {
        !o.upstream.same_server(upstream)
            || resolved
                .as_ref()
                .is_ok_and(|addr| o.state.address.get() != Some(*addr))
    });
    state.address.update(
        resolved,
        old.is_none_or(|o| !o.upstream.same_server(upstream)),
    );
    let health_check = config.health_check.with(&b.health_check);
    match (health_check.enabled, state.health.status()) {
        (false, _) => state.health.set_unchecked(),
        (true, CheckStatus::Unchecked) => state.health.reset(),
        // A new address is a new server: no traffic until it passes a check.
        (true, _) if moved => state.health.reset(),
        _ => {}
    }
    if moved {
        state.telemetry.store(None);
    }
    set_models(&state, b.models.as_deref(), moved);
    Backend {
        state,
        url: b.url.clone(),
        upstream: upstream.clone(),
        moved,
        weight: b.weight,
        max_outstanding: b.max_outstanding,
        health_check,
        telemetry: b.telemetry.clone(),
    }
}

/// A backend's model list from config, else what discovery found (forgotten when it moved, or
/// when its config list was just removed, so discovery starts afresh).
fn set_models(state: &BackendState, configured: Option<&[String]>, moved: bool) {
    let was_configured = state
        .models
        .get()
        .is_some_and(|l| l.source == ModelSource::Config);
    match configured {
        Some(ids) => state.models.set(Some(ModelList::configured(ids))),
        None if moved || was_configured => state.models.set(None),
        None => {}
    }
}
