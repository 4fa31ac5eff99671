//! Class match rules compiled from config, checked against a request's method, path and headers.

use crate::config::MatchRule;
use http::{HeaderMap, Method};

/// A class's rule as validation compiled it; every part given must hold.
#[derive(Debug, Clone, Default)]
pub struct ClassRule(MatchRule);

impl ClassRule {
    /// The rule of a class, from its compiled match rules.
    pub fn new(rule: MatchRule) -> Self {
        ClassRule(rule)
    }

    /// Whether a request with this method, path and headers belongs to the class.
    pub fn matches(&self, method: &Method, path: &str, headers: &HeaderMap) -> bool {
        let rule = &self.0;
        if let Some(prefix) = &rule.path_prefix {
            if !path.starts_with(prefix.as_str()) {
                return false;
            }
        }
        if !rule.methods.is_empty() && !rule.methods.contains(method) {
            return false;
        }
        if rule.min_content_length.is_some() || rule.max_content_length.is_some() {
            let length = headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if rule.min_content_length.is_some_and(|min| length < min)
                || rule.max_content_length.is_some_and(|max| length >= max)
            {
                return false;
            }
        }
        rule.headers.iter().all(|(name, wanted)| {
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
    use crate::config::Config;
    use http::HeaderName;

    /// The compiled rule of a one-class config whose `match` is `yaml`.
    fn rule(yaml: &str) -> ClassRule {
        let text = format!(
            "backends: [{{name: a, url: 'http://127.0.0.1:1'}}]\nclasses: [{{name: c, pool: default, match: {yaml}}}]\n"
        );
        let config = Config::from_yaml(&text).unwrap();
        ClassRule::new(config.compiled.class_rules[0].clone())
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
