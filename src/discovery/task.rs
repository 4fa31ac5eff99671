//! The DNS discovery loop: looks up each discovering pool's name at its interval and hands what
//! it found to the registry, which rebuilds the snapshot when the set changed.

use super::lookup;
use crate::config::DiscoverConfig;
use crate::routing::Registry;
use async_trait::async_trait;
use futures_util::future::join_all;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::time::Instant;

/// Background service running DNS discovery for the pools of the current config.
pub struct DnsDiscovery {
    registry: Arc<Registry>,
}

impl DnsDiscovery {
    /// Discovery for `registry`'s pools.
    pub fn new(registry: Arc<Registry>) -> Self {
        DnsDiscovery { registry }
    }

    /// Looks up every group that is due; returns when each is due next.
    async fn look_up_due(&self, due: &mut HashMap<(String, String), Instant>) {
        let snapshot = self.registry.load();
        let groups: Vec<(String, DiscoverConfig)> = snapshot
            .config
            .pools
            .iter()
            .filter_map(|p| Some((p.name.clone(), p.discover.clone()?)))
            .collect();
        due.retain(|(pool, dns), _| groups.iter().any(|(p, d)| p == pool && d.dns == *dns));
        let now = Instant::now();
        let lookups = groups
            .iter()
            .filter(|(pool, d)| {
                due.get(&(pool.clone(), d.dns.clone()))
                    .is_none_or(|t| *t <= now)
            })
            .map(|(pool, discover)| async move {
                let result = match discover.host_port() {
                    Ok((host, _)) => lookup(host, discover.resolver, discover.timeout).await,
                    Err(message) => Err(super::DnsError::Other {
                        name: discover.dns.clone(),
                        message,
                    }),
                };
                (pool, discover, result)
            });
        for (pool, discover, result) in join_all(lookups).await {
            self.registry.discovered(pool, &discover.dns, result);
            due.insert(
                (pool.clone(), discover.dns.clone()),
                Instant::now() + discover.interval,
            );
        }
    }
}

#[async_trait]
impl BackgroundService for DnsDiscovery {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut changes = self.registry.subscribe();
        let mut due = HashMap::new();
        loop {
            self.look_up_due(&mut due).await;
            let next = due.values().min().copied();
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                changed = changes.changed() => if changed.is_err() { return },
                () = sleep => {}
            }
        }
    }
}
