//! What gpulb reads from request bodies, and which models the fleet serves: `request_body`,
//! `models`, and the body-aware parts of a class's `match`.

use super::{defaults, duration};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::time::Duration;

/// `request_body`: which request bodies are read (JSON, before a backend is chosen) and how big
/// they may be.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RequestBodyConfig {
    /// Paths (exact) whose JSON bodies are read for `model`, `stream`, `max_tokens` and the
    /// prompt's size; other requests are classified by their envelope only.
    #[serde(default = "defaults::body_paths")]
    pub paths: Vec<String>,
    /// Largest body read, bytes.
    #[serde(default = "defaults::body_max_bytes")]
    pub max_bytes: usize,
    /// What a body over `max_bytes` gets: `reject` (413) or `forward` (routed by its envelope).
    #[serde(default)]
    pub over_limit: OverLimit,
    /// Most body bytes all requests together may hold in memory; a body that would go over it
    /// gets 503 `body_memory_full` (with `Retry-After`) before it is read. Absent: 256 MiB, or
    /// `max_bytes` where that is more ([`RequestBodyConfig::held_limit`]).
    #[serde(default)]
    pub max_held_bytes: Option<usize>,
}

impl RequestBodyConfig {
    /// The budget in force for all held bodies together.
    pub fn held_limit(&self) -> usize {
        self.max_held_bytes
            .unwrap_or_else(|| defaults::body_max_held_bytes().max(self.max_bytes))
    }
}

impl Default for RequestBodyConfig {
    fn default() -> Self {
        RequestBodyConfig {
            paths: defaults::body_paths(),
            max_bytes: defaults::body_max_bytes(),
            over_limit: OverLimit::default(),
            max_held_bytes: None,
        }
    }
}

/// What a request body over `request_body.max_bytes` gets.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OverLimit {
    /// `413` with an OpenAI-shaped error.
    #[default]
    Reject,
    /// Streamed to a backend unread, classified by path, method and headers only.
    Forward,
}

/// `models`: where each backend's served models come from, and aliases.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelsConfig {
    /// Poll each backend without a `models` list at `GET /v1/models`.
    #[serde(default = "defaults::discover_models")]
    pub discover: bool,
    /// Time between two polls of a backend's `/v1/models`.
    #[serde(default = "defaults::discover_interval", with = "duration")]
    pub interval: Duration,
    /// Longest a poll may take.
    #[serde(default = "defaults::discover_timeout", with = "duration")]
    pub timeout: Duration,
    /// Other names for served models (`gpt-4o-mini: llama-3.1-8b`): a request naming the alias
    /// is routed as the model; its body is forwarded untouched unless `rewrite_aliases`.
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    /// Replace an alias in the forwarded body's `model` with the model it names (only that
    /// value changes), for servers that know the model by its own name only.
    #[serde(default)]
    pub rewrite_aliases: bool,
    /// The model a request whose body names none is routed as (its body forwarded untouched).
    /// Unset, such a request goes to any backend of its class while they all serve the same
    /// models, and gets `400 model_required` when they do not.
    #[serde(default)]
    pub default: Option<String>,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        ModelsConfig {
            discover: defaults::discover_models(),
            interval: defaults::discover_interval(),
            timeout: defaults::discover_timeout(),
            aliases: BTreeMap::new(),
            rewrite_aliases: false,
            default: None,
        }
    }
}

/// A class's `match.model`: one pattern or a list; `*` in a pattern matches any run of
/// characters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelPatterns(pub Vec<String>);

impl<'de> Deserialize<'de> for ModelPatterns {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(match OneOrMany::deserialize(deserializer)? {
            OneOrMany::One(p) => ModelPatterns(vec![p]),
            OneOrMany::Many(ps) => ModelPatterns(ps),
        })
    }
}

impl ModelPatterns {
    /// Whether `model` matches one of the patterns.
    pub fn matches(&self, model: &str) -> bool {
        self.0.iter().any(|p| glob_matches(p, model))
    }
}

/// `*`-only glob: `llama-*` matches `llama-3.1-8b`; no other character is special.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// A range of counts: at least `min`, below `max`; either may be absent.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CountRange {
    /// Inclusive lower bound.
    #[serde(default)]
    pub min: Option<u64>,
    /// Exclusive upper bound.
    #[serde(default)]
    pub max: Option<u64>,
}

impl CountRange {
    /// Whether `value` lies in the range.
    pub fn contains(&self, value: u64) -> bool {
        self.min.is_none_or(|min| value >= min) && self.max.is_none_or(|max| value < max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_stars_only() {
        assert!(glob_matches("llama-*", "llama-3.1-8b"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("*8b", "llama-3.1-8b"));
        assert!(glob_matches("l*3*b", "llama-3.1-8b"));
        assert!(glob_matches("qwen2.5-32b", "qwen2.5-32b"));
        assert!(!glob_matches("qwen2.5-32b", "qwen2.5-32b-instruct"));
        assert!(!glob_matches("llama-*", "qwen"));
        assert!(!glob_matches("a*a", "a"));
        assert!(!glob_matches("*.", "x"));
    }

    #[test]
    fn ranges_are_half_open() {
        let r = CountRange {
            min: Some(10),
            max: Some(20),
        };
        assert!(!r.contains(9) && r.contains(10) && r.contains(19) && !r.contains(20));
        assert!(CountRange::default().contains(u64::MAX));
    }

    #[test]
    fn model_patterns_take_one_or_many() {
        let one: ModelPatterns = serde_yaml::from_str("llama-*").unwrap();
        let many: ModelPatterns = serde_yaml::from_str("[a, b]").unwrap();
        assert!(one.matches("llama-3") && !one.matches("a"));
        assert!(many.matches("a") && many.matches("b") && !many.matches("c"));
    }
}
