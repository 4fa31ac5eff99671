//! Class match rules compiled from config, checked against a request's method, path and headers.

use crate::config::MatchRule;
use crate::request::{BodyError, BodyFacts};
use http::{HeaderMap, Method};

/// A request's envelope: what classification reads before the body.
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path.
    pub path: &'a str,
    /// The headers.
    pub headers: &'a HeaderMap,
}

/// What classification knows of a request's body.
#[derive(Debug, Clone, Copy)]
pub enum BodyView<'a> {
    /// Not read (not a body path, or over the limit and forwarded).
    Unread,
    /// Read, and not a JSON request.
    Invalid(&'a BodyError),
    /// Read: its facts, and its model after aliases.
    Read {
        /// What it says.
        facts: &'a BodyFacts,
        /// Its model, aliases resolved.
        model: Option<&'a str>,
    },
}

/// A class's rule as validation compiled it; every part given must hold.
#[derive(Debug, Clone, Default)]
pub struct ClassRule(MatchRule);

impl ClassRule {
    /// The rule of a class, from its compiled match rules.
    pub fn new(rule: MatchRule) -> Self {
        ClassRule(rule)
    }

    /// Whether a request with this envelope and body belongs to the class; the body's error
    /// when the rule needs the body and it is not a JSON request.
    pub fn matches<'a>(
        &self,
        req: &Envelope<'_>,
        body: BodyView<'a>,
    ) -> Result<bool, &'a BodyError> {
        if !self.matches_envelope(req.method, req.path, req.headers) {
            return Ok(false);
        }
        let Some(rule) = &self.0.body else {
            return Ok(true);
        };
        let (facts, model) = match body {
            BodyView::Unread => return Ok(false),
            BodyView::Invalid(e) => return Err(e),
            BodyView::Read { facts, model } => (facts, model),
        };
        Ok(rule
            .model
            .as_ref()
            .is_none_or(|m| model.is_some_and(|model| m.matches(model)))
            && rule.stream.is_none_or(|s| s == facts.stream)
            && rule
                .max_tokens
                .is_none_or(|r| r.contains(facts.max_tokens.unwrap_or(0)))
            && rule
                .prompt_tokens
                .is_none_or(|r| r.contains(facts.prompt_tokens)))
    }

    /// Whether a request with this method, path and headers passes the rule's envelope parts.
    fn matches_envelope(&self, method: &Method, path: &str, headers: &HeaderMap) -> bool {
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
        assert!(rule("{}").matches_envelope(&Method::GET, "/", &HeaderMap::new()));
    }

    #[test]
    fn all_parts_must_hold() {
        let r =
            rule("{path_prefix: /v1/chat/, methods: [post], headers: {x-priority: interactive}}");
        let h = headers(&[("x-priority", "interactive")]);
        assert!(r.matches_envelope(&Method::POST, "/v1/chat/completions", &h));
        assert!(!r.matches_envelope(&Method::GET, "/v1/chat/completions", &h));
        assert!(!r.matches_envelope(&Method::POST, "/v1/completions", &h));
        assert!(!r.matches_envelope(
            &Method::POST,
            "/v1/chat/completions",
            &headers(&[("x-priority", "bulk")])
        ));
        assert!(!r.matches_envelope(&Method::POST, "/v1/chat/completions", &HeaderMap::new()));
    }

    #[test]
    fn content_length_bounds() {
        let long = rule("{min_content_length: 1000}");
        let short = rule("{max_content_length: 1000}");
        let len = |n: &str| headers(&[("content-length", n)]);
        assert!(long.matches_envelope(&Method::POST, "/", &len("1000")));
        assert!(!long.matches_envelope(&Method::POST, "/", &len("999")));
        assert!(
            !long.matches_envelope(&Method::POST, "/", &HeaderMap::new()),
            "no length counts as 0"
        );
        assert!(short.matches_envelope(&Method::POST, "/", &len("999")));
        assert!(!short.matches_envelope(&Method::POST, "/", &len("1000")));
    }

    #[test]
    fn star_means_present() {
        let r = rule("{headers: {x-tenant: '*'}}");
        assert!(r.matches_envelope(&Method::GET, "/", &headers(&[("x-tenant", "a")])));
        assert!(!r.matches_envelope(&Method::GET, "/", &HeaderMap::new()));
    }

    #[test]
    fn any_repeated_header_value_may_match() {
        let r = rule("{headers: {x-priority: interactive}}");
        let h = headers(&[("x-priority", "bulk"), ("x-priority", "interactive")]);
        assert!(r.matches_envelope(&Method::GET, "/", &h));
    }

    fn read<'a>(facts: &'a BodyFacts, model: Option<&'a str>) -> BodyView<'a> {
        BodyView::Read { facts, model }
    }

    #[test]
    fn body_parts_match_what_the_body_says() {
        let r = rule("{model: [\"llama-*\"], stream: true, max_tokens: {max: 256}, prompt_tokens: {min: 10}}");
        let (map, method) = (HeaderMap::new(), Method::POST);
        let req = Envelope {
            method: &method,
            path: "/v1/chat/completions",
            headers: &map,
        };
        let facts = BodyFacts {
            model: Some("gpt".into()),
            stream: true,
            max_tokens: Some(64),
            n: 1,
            prompt_tokens: 10,
            prefix: Vec::new(),
            previous_response_id: None,
        };
        assert_eq!(r.matches(&req, read(&facts, Some("llama-3"))), Ok(true));
        assert_eq!(r.matches(&req, read(&facts, Some("qwen"))), Ok(false));
        assert_eq!(r.matches(&req, read(&facts, None)), Ok(false));
        let long = BodyFacts {
            max_tokens: Some(256),
            ..facts.clone()
        };
        assert_eq!(r.matches(&req, read(&long, Some("llama-3"))), Ok(false));
        let batch = BodyFacts {
            stream: false,
            ..facts.clone()
        };
        assert_eq!(r.matches(&req, read(&batch, Some("llama-3"))), Ok(false));
        assert_eq!(r.matches(&req, BodyView::Unread), Ok(false));
        let bad = crate::request::parse(b"nope").unwrap_err();
        assert_eq!(r.matches(&req, BodyView::Invalid(&bad)), Err(&bad));
        // A rule without body parts never looks at the body, even a bad one.
        assert_eq!(rule("{}").matches(&req, BodyView::Invalid(&bad)), Ok(true));
    }
}
