//! `tenants`: where a request's tenant comes from — a header the client sets, or its API key
//! looked up in a keys file — and the keys file itself.

use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the tenant of a request is read.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TenantSource {
    /// The value of `tenant_header` (client-chosen: fine behind an authenticating gateway).
    #[default]
    Header,
    /// The `Authorization: Bearer <key>` API key, mapped to a tenant by `keys_file`.
    ApiKey,
}

/// `tenants`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantsConfig {
    /// Where the tenant comes from.
    #[serde(default)]
    pub from: TenantSource,
    /// `from: api_key`: a YAML map of API key -> tenant name.
    #[serde(default)]
    pub keys_file: Option<PathBuf>,
    /// `from: api_key`: answer 401 to a request with no key or an unknown one (else it is
    /// served as tenant `unknown`).
    #[serde(default)]
    pub reject_unknown: bool,
}

/// The API keys of a keys file, by key; compared whole, never logged.
#[derive(Clone, PartialEq, Default)]
pub struct ApiKeys(Arc<HashMap<String, String>>);

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.0.len())
    }
}

impl ApiKeys {
    /// The tenant of `key`, when the file names it.
    pub fn tenant(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Reads a keys file: a YAML map of key -> tenant name (1 to 64 characters).
    pub fn load(path: &Path) -> Result<ApiKeys, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let keys: HashMap<String, String> = serde_yaml::from_str(&text).map_err(|e| {
            // serde_yaml may quote the offending text, which may be a key: keep the place only.
            let place = e
                .location()
                .map_or_else(String::new, |l| format!(" at line {}", l.line()));
            format!(
                "{} is not a YAML map of API key to tenant{place}",
                path.display()
            )
        })?;
        if keys.is_empty() {
            return Err(format!("{} holds no keys", path.display()));
        }
        if let Some(bad) = keys.values().find(|t| t.is_empty() || t.len() > 64) {
            return Err(format!(
                "{}: tenant name {bad:?} must be 1 to 64 characters",
                path.display()
            ));
        }
        Ok(ApiKeys(Arc::new(keys)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_files_load_and_their_errors_never_quote_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.yaml");
        std::fs::write(&path, "sk-alpha: team-a\nsk-beta: team-b\n").unwrap();
        let keys = ApiKeys::load(&path).unwrap();
        assert_eq!(keys.tenant("sk-alpha"), Some("team-a"));
        assert_eq!(keys.tenant("sk-gamma"), None);
        assert!(!format!("{keys:?}").contains("sk-alpha"));
        std::fs::write(&path, "- sk-secret-in-a-list\n").unwrap();
        let error = ApiKeys::load(&path).unwrap_err();
        assert!(!error.contains("sk-secret"), "{error}");
        assert!(ApiKeys::load(&dir.path().join("none.yaml")).is_err());
    }
}
