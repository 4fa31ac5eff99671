//! Checks of the TLS keys: the listener's certificate files, and each https backend's trust
//! settings (its own `tls` over its pool's), with the CA files they name read.

use super::Report;
use crate::config::{BackendTls, CaBundle, Config, ServingCert, Upstream};
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

    /// The `tls` of the pools listing backend `name` (and the key it was found at); two pools
    /// saying different things about one backend are an error.
    fn pool_tls(&self, name: &str, report: &mut Report) -> (String, BackendTls) {
        let mut found: Option<(usize, &BackendTls)> = None;
        for (j, pool) in self.pools.iter().enumerate() {
            let Some(tls) = &pool.tls else { continue };
            if !pool.backends.iter().any(|b| b == name) {
                continue;
            }
            match found {
                None => found = Some((j, tls)),
                Some((first, seen)) if seen != tls => report.error(
                    format!("pools[{j}].tls"),
                    format!(
                        "backend {name:?} is also in pool {:?}, whose tls differs; set tls on the backend instead",
                        self.pools[first].name
                    ),
                ),
                Some(_) => {}
            }
        }
        found.map_or_else(
            || (String::new(), BackendTls::default()),
            |(j, tls)| (format!("pools[{j}].tls"), tls.clone()),
        )
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
