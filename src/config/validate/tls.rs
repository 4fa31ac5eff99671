//! Checks of how gpulb speaks to each backend: the listener's certificate files, each https
//! backend's trust settings (its own `tls` over its pool's), with the CA files they name read,
//! and the API key its `auth` (or its pool's) names.

use super::Report;
use crate::config::{BackendTls, CaBundle, Config, PoolConfig, ServingCert, Upstream};
use std::collections::HashMap;
use std::path::PathBuf;

impl Config {
    /// `listen_tls`'s certificate and key, read and checked, when it is set.
    pub(super) fn validate_listen_tls(&self, report: &mut Report) -> Option<ServingCert> {
        match ServingCert::load(self.listen_tls.as_ref()?) {
            Ok(cert) => Some(cert),
            Err(e) => {
                report.error(e.file.key(), e.message);
                None
            }
        }
    }

    /// Settles how each https backend is spoken to, from its `tls` and its pools'; `upstreams`
    /// are the backends' parsed URLs, in config order.
    pub(super) fn validate_backend_tls(&self, upstreams: &mut [Upstream], report: &mut Report) {
        let mut cas = CaFiles::default();
        for (i, (backend, upstream)) in self.backends.iter().zip(upstreams).enumerate() {
            let at = format!("backends[{i}].tls");
            let Some(tls) = &mut upstream.tls else {
                report.check(
                    backend.tls.is_none(),
                    at,
                    "applies to https:// backends only; this url is http://",
                );
                continue;
            };
            let (pool_at, pool_tls) = self.pool_tls(&backend.name, report);
            let own = backend.tls.clone().unwrap_or_default();
            let settings = own.or(&pool_tls);
            if let Some(verify) = settings.verify {
                tls.verify = verify;
            }
            if let Some(path) = settings.ca_file {
                let field = if own.ca_file.is_some() {
                    format!("{at}.ca_file")
                } else {
                    format!("{pool_at}.ca_file")
                };
                tls.ca = cas.load(path, &field, report);
            }
        }
    }

    /// The `tls` of the pools listing backend `name` (and the key it was found at).
    fn pool_tls(&self, name: &str, report: &mut Report) -> (String, BackendTls) {
        let found = self.pool_setting(name, "tls", |p| p.tls.as_ref(), report);
        found.map_or_else(
            || (String::new(), BackendTls::default()),
            |(at, tls)| (at, tls.clone()),
        )
    }

    /// The `key` setting (`get`) of the pools listing backend `name`, and the key it was found
    /// at; two pools saying different things about one backend are an error.
    pub(super) fn pool_setting<'a, T: PartialEq>(
        &'a self,
        name: &str,
        key: &str,
        get: impl Fn(&'a PoolConfig) -> Option<&'a T>,
        report: &mut Report,
    ) -> Option<(String, &'a T)> {
        let mut found: Option<(usize, &T)> = None;
        for (j, pool) in self.pools.iter().enumerate() {
            let Some(setting) = get(pool) else { continue };
            if !pool.backends.iter().any(|b| b == name) {
                continue;
            }
            match found {
                None => found = Some((j, setting)),
                Some((first, seen)) if seen != setting => report.error(
                    format!("pools[{j}].{key}"),
                    format!(
                        "backend {name:?} is also in pool {:?}, whose {key} differs; set {key} on the backend instead",
                        self.pools[first].name
                    ),
                ),
                Some(_) => {}
            }
        }
        found.map(|(j, setting)| (format!("pools[{j}].{key}"), setting))
    }

    /// Reads the API key each backend's `auth` (else its pool's) names into its upstream;
    /// `upstreams` are the backends' parsed URLs, in config order.
    pub(super) fn validate_backend_auth(&self, upstreams: &mut [Upstream], report: &mut Report) {
        for (i, (backend, upstream)) in self.backends.iter().zip(upstreams).enumerate() {
            let own = backend
                .auth
                .as_ref()
                .map(|a| (format!("backends[{i}].auth"), a));
            let pool = || self.pool_setting(&backend.name, "auth", |p| p.auth.as_ref(), report);
            let Some((at, auth)) = own.or_else(pool) else {
                continue;
            };
            match auth.credential() {
                Ok(credential) => upstream.auth = Some(credential),
                Err(e) => report.error(at, e.to_string()),
            }
        }
    }
}

/// CA files read once per validation, each problem reported once.
#[derive(Default)]
struct CaFiles(HashMap<PathBuf, Option<CaBundle>>);

impl CaFiles {
    fn load(&mut self, path: PathBuf, field: &str, report: &mut Report) -> Option<CaBundle> {
        self.0
            .entry(path)
            .or_insert_with_key(|path| match CaBundle::load(path) {
                Ok(bundle) => Some(bundle),
                Err(problem) => {
                    report.error(field, problem);
                    None
                }
            })
            .clone()
    }
}
