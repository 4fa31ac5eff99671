//! Who a request is for: the tenant header's value, or the tenant its API key maps to. A
//! credential never becomes a tenant name as it is: it would be written to the access log and
//! to metrics labels.

use super::heads::Heads;
use crate::config::{Compiled, TenantSource, TenantsConfig};
use crate::error::ProxyError;
use http::{HeaderName, HeaderValue};
use std::borrow::Cow;

/// Tenant of requests that name none.
const DEFAULT_TENANT: &str = "default";
/// Tenant of requests whose API key is missing or unknown, when they are served anyway.
const UNKNOWN_TENANT: &str = "unknown";
/// Longest tenant header value taken as a tenant name.
const MAX_TENANT_LEN: usize = 64;

/// Headers that carry credentials: their values are replaced by a hashed id.
fn is_credential(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "authorization" | "proxy-authorization" | "x-api-key" | "api-key" | "cookie"
    )
}

/// A stable id for a credential that does not reveal it: `key-` and 12 hex digits of its hash.
pub fn hashed_id(secret: &str) -> String {
    format!("key-{}", &crate::reload::text_hash(secret)[..12])
}

/// The API key of a request whose `Authorization` is `authorization`: `Bearer <key>`.
fn bearer(authorization: Option<&HeaderValue>) -> Option<&str> {
    let value = authorization?.to_str().ok()?;
    let (scheme, key) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim())
        .filter(|k| !k.is_empty())
}

/// The tenant of `req`, or the 401 to answer when tenants come from API keys and `req` has no
/// known key while `tenants.reject_unknown` is set.
pub fn identify(
    heads: &Heads,
    compiled: &Compiled,
    tenants: &TenantsConfig,
) -> Result<Cow<'static, str>, ProxyError> {
    if tenants.from == TenantSource::ApiKey {
        let known = compiled
            .api_keys
            .as_ref()
            .zip(bearer(heads.authorization))
            .and_then(|(keys, key)| keys.tenant(key));
        return match known {
            Some(tenant) => Ok(Cow::Owned(tenant.to_string())),
            None if tenants.reject_unknown => Err(ProxyError::Unauthorized),
            None => Ok(Cow::Borrowed(UNKNOWN_TENANT)),
        };
    }
    let value = heads
        .tenant
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    Ok(match value {
        Some(secret) if is_credential(&compiled.tenant_header) => Cow::Owned(hashed_id(secret)),
        Some(name) if name.len() <= MAX_TENANT_LEN => Cow::Owned(name.to_string()),
        _ => Cow::Borrowed(DEFAULT_TENANT),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ApiKeys;
    use pingora::http::RequestHeader;

    /// `identify` as the proxy calls it, on the fields of `req`.
    fn identify(
        req: &RequestHeader,
        compiled: &Compiled,
        tenants: &TenantsConfig,
    ) -> Result<String, ProxyError> {
        super::identify(&Heads::of(req, compiled), compiled, tenants).map(Cow::into_owned)
    }

    fn request(headers: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("POST", b"/v1/completions", None).unwrap();
        for (name, value) in headers {
            req.insert_header(name.to_string(), *value).unwrap();
        }
        req
    }

    fn compiled(header: &'static str) -> Compiled {
        Compiled {
            tenant_header: HeaderName::from_static(header),
            ..Compiled::default()
        }
    }

    #[test]
    fn a_credential_header_gives_a_hashed_tenant_never_the_secret() {
        let req = request(&[("authorization", "Bearer sk-very-secret")]);
        let tenant = identify(&req, &compiled("authorization"), &TenantsConfig::default());
        let tenant = tenant.unwrap();
        assert!(
            tenant.starts_with("key-") && !tenant.contains("secret"),
            "{tenant}"
        );
        let again = identify(&req, &compiled("authorization"), &TenantsConfig::default());
        assert_eq!(again.unwrap(), tenant, "stable");
        let plain = request(&[("x-tenant", "team-a")]);
        let tenant = identify(&plain, &compiled("x-tenant"), &TenantsConfig::default());
        assert_eq!(tenant.unwrap(), "team-a");
    }

    #[test]
    fn api_keys_map_to_tenants_and_unknown_keys_are_refused_or_pooled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.yaml");
        std::fs::write(&path, "sk-a: team-a\n").unwrap();
        let compiled = Compiled {
            api_keys: Some(ApiKeys::load(&path).unwrap()),
            ..compiled("x-tenant")
        };
        let mut tenants = TenantsConfig {
            from: TenantSource::ApiKey,
            keys_file: Some(path),
            reject_unknown: false,
        };
        let known = request(&[("authorization", "Bearer sk-a"), ("x-tenant", "evil")]);
        assert_eq!(identify(&known, &compiled, &tenants).unwrap(), "team-a");
        let stranger = request(&[("authorization", "Bearer sk-rotated-1")]);
        assert_eq!(identify(&stranger, &compiled, &tenants).unwrap(), "unknown");
        tenants.reject_unknown = true;
        assert_eq!(
            identify(&stranger, &compiled, &tenants),
            Err(ProxyError::Unauthorized)
        );
        assert_eq!(
            identify(&request(&[]), &compiled, &tenants),
            Err(ProxyError::Unauthorized)
        );
    }
}
