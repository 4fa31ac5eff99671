//! Class match rules compiled from config, checked against a request's method, path and headers.

use crate::config::MatchConfig;
use http::{HeaderMap, HeaderName, HeaderValue, Method};

/// A compiled class rule; every part given must hold.
#[derive(Debug, Clone, Default)]
pub struct ClassRule {
    path_prefix: Option<String>,
    methods: Vec<Method>,
    /// Header name and the exact value wanted (`None`: present with any value).
    headers: Vec<(HeaderName, Option<HeaderValue>)>,
    /// `Content-Length` bounds: at least the first, below the second.
    min_content_length: Option<u64>,
    max_content_length: Option<u64>,
}

impl ClassRule {
    /// Compiles validated match rules (invalid names were refused by validation and are skipped).
    pub fn compile(rules: &MatchConfig) -> Self {
        ClassRule {
            path_prefix: rules.path_prefix.clone(),
            methods: rules
                .methods
                .iter()
                .filter_map(|m| Method::from_bytes(m.to_ascii_uppercase().as_bytes()).ok())
                .collect(),
            headers: rules
                .headers
                .iter()
                .filter_map(|(name, value)| {
                    let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
                    let value = match value.as_str() {
                        "*" => None,
                        v => Some(HeaderValue::from_str(v).ok()?),
                    };
                    Some((name, value))
                })
                .collect(),
            min_content_length: rules.min_content_length,
            max_content_length: rules.max_content_length,
        }
    }

    /// Whether a request with this method, path and headers belongs to the class.
    pub fn matches(&self, method: &Method, path: &str, headers: &HeaderMap) -> bool {
        if let Some(prefix) = &self.path_prefix {
            if !path.starts_with(prefix.as_str()) {
                return false;
            }
        }
        if !self.methods.is_empty() && !self.methods.contains(method) {
            return false;
        }
        if self.min_content_length.is_some() || self.max_content_length.is_some() {
            let length = headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if self.min_content_length.is_some_and(|min| length < min)
                || self.max_content_length.is_some_and(|max| length >= max)
            {
                return false;
            }
        }
        self.headers.iter().all(|(name, wanted)| {
            let mut values = headers.get_all(name).iter();
            match wanted {
                None => values.next().is_some(),
                Some(wanted) => values.any(|v| v == wanted),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(yaml: &str) -> ClassRule {
        ClassRule::compile(&serde_yaml::from_str::<MatchConfig>(yaml).unwrap())
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn empty_rule_matches_everything() {
        assert!(rule("{}").matches(&Method::GET, "/", &HeaderMap::new()));
    }

    #[test]
    fn all_parts_must_hold() {
        let r =
            rule("{path_prefix: /v1/chat/, methods: [post], headers: {x-priority: interactive}}");
        let h = headers(&[("x-priority", "interactive")]);
        assert!(r.matches(&Method::POST, "/v1/chat/completions", &h));
        assert!(!r.matches(&Method::GET, "/v1/chat/completions", &h));
        assert!(!r.matches(&Method::POST, "/v1/completions", &h));
        assert!(!r.matches(
            &Method::POST,
            "/v1/chat/completions",
            &headers(&[("x-priority", "bulk")])
        ));
        assert!(!r.matches(&Method::POST, "/v1/chat/completions", &HeaderMap::new()));
    }

    #[test]
    fn content_length_bounds() {
        let long = rule("{min_content_length: 1000}");
        let short = rule("{max_content_length: 1000}");
        let len = |n: &str| headers(&[("content-length", n)]);
        assert!(long.matches(&Method::POST, "/", &len("1000")));
        assert!(!long.matches(&Method::POST, "/", &len("999")));
        assert!(
            !long.matches(&Method::POST, "/", &HeaderMap::new()),
            "no length counts as 0"
        );
        assert!(short.matches(&Method::POST, "/", &len("999")));
        assert!(!short.matches(&Method::POST, "/", &len("1000")));
    }

    #[test]
    fn star_means_present() {
        let r = rule("{headers: {x-tenant: '*'}}");
        assert!(r.matches(&Method::GET, "/", &headers(&[("x-tenant", "a")])));
        assert!(!r.matches(&Method::GET, "/", &HeaderMap::new()));
    }

    #[test]
    fn any_repeated_header_value_may_match() {
        let r = rule("{headers: {x-priority: interactive}}");
        let h = headers(&[("x-priority", "bulk"), ("x-priority", "interactive")]);
        assert!(r.matches(&Method::GET, "/", &h));
    }
}
