//! Checks of the health, telemetry, guard and admission settings, and reading the admin token.

use super::Report;
use crate::config::{read_token, ClassConfig, Config, TokenError};
use std::collections::HashSet;
use std::time::Duration;

impl Config {
    pub(super) fn validate_health(&self, report: &mut Report) {
        check_health(&self.health_check, "health_check", report);
        for (i, backend) in self.backends.iter().enumerate() {
            if backend.health_check != Default::default() {
                let resolved = self.health_check.with(&backend.health_check);
                check_health(&resolved, &format!("backends[{i}].health_check"), report);
            }
        }
        for (i, backend) in self.backends.iter().enumerate() {
            for (j, source) in backend.telemetry.iter().enumerate() {
                if let Err(problem) = source.validate() {
                    let at = format!("backends[{i}].telemetry[{j}].{}", problem.path);
                    report.error(at, problem.message);
                }
            }
        }
        report.check(
            !self.telemetry.stale_after.is_zero(),
            "telemetry.stale_after",
            "must be > 0",
        );
        report.check(
            !self.telemetry.others_max_age.is_zero(),
            "telemetry.others_max_age",
            "must be > 0",
        );
        report.check(
            self.telemetry
                .waiting_interval
                .is_none_or(|d| d >= Duration::from_millis(10)),
            "telemetry.waiting_interval",
            "must be at least 10ms (or off): each read costs the model server a /metrics page",
        );
        for (i, pool) in self.pools.iter().enumerate() {
            check_guards(&pool.guards, &format!("pools[{i}].guards"), report);
        }
        for (i, class) in self.classes.iter().enumerate() {
            if let Some(guards) = &class.guards {
                check_guards(guards, &format!("classes[{i}].guards"), report);
            }
        }
        let o = &self.outlier_detection;
        if o.consecutive_failures > 0 {
            report.check(
                !o.base_ejection.is_zero(),
                "outlier_detection.base_ejection",
                "must be > 0",
            );
            report.check(
                o.max_ejection >= o.base_ejection,
                "outlier_detection.max_ejection",
                "must be >= base_ejection",
            );
        }
        report.check(
            o.max_ejected_percent <= 100,
            "outlier_detection.max_ejected_percent",
            "must be between 0 and 100",
        );
    }
}

pub(super) fn validate_admission(
    class: &ClassConfig,
    at: &str,
    pools: &HashSet<&str>,
    report: &mut Report,
) {
    let queue = &class.queue;
    report.check(
        queue.max_depth <= 1_000_000,
        format!("{at}.queue.max_depth"),
        "must be at most 1000000",
    );
    if queue.max_depth > 0 {
        report.check(
            !queue.max_wait.is_zero(),
            format!("{at}.queue.max_wait"),
            "must be > 0",
        );
    }
    let fairness = &class.fairness;
    let fixed = fairness.policy == crate::config::FairnessPolicy::FixedShare;
    if !fixed && (!fairness.weights.is_empty() || !fairness.min_share.is_empty()) {
        report.error(
            format!("{at}.fairness"),
            "weights and min_share need policy: fixed_share",
        );
    }
    for (tenant, weight) in &fairness.weights {
        report.check(
            *weight >= 1,
            format!("{at}.fairness.weights.{tenant}"),
            "must be >= 1",
        );
    }
    report.check(
        fairness.default_weight >= 1,
        format!("{at}.fairness.default_weight"),
        "must be >= 1",
    );
    for (tenant, share) in &fairness.min_share {
        report.check(
            (0.0..=1.0).contains(share),
            format!("{at}.fairness.min_share.{tenant}"),
            "must be between 0 and 1",
        );
    }
    let total: f64 = fairness.min_share.values().sum();
    report.check(
        total <= 1.0 + 1e-9,
        format!("{at}.fairness.min_share"),
        format!("shares add up to {total}, more than 1"),
    );
    if class.tenant_max_outstanding == Some(0) {
        report.error(format!("{at}.tenant_max_outstanding"), "must be >= 1");
    }
    if let Some(fallback) = &class.fallback_pool {
        if !pools.contains(fallback.as_str()) {
            report.error(
                format!("{at}.fallback_pool"),
                format!("unknown pool {fallback:?}"),
            );
        } else if *fallback == class.pool {
            report.error(format!("{at}.fallback_pool"), "must differ from pool");
        }
    }
    if let Some(share) = class.backend_share {
        report.check(
            share > 0.0 && share <= 1.0,
            format!("{at}.backend_share"),
            "must be in (0, 1]",
        );
    }
    if let Some(batching) = &class.batching {
        check_batching(batching, &format!("{at}.batching"), report);
    }
    if let (Some(min), Some(max)) = (
        class.matcher.min_content_length,
        class.matcher.max_content_length,
    ) {
        report.check(
            min < max,
            format!("{at}.match.max_content_length"),
            "must be greater than min_content_length",
        );
    }
}

fn check_guards(guards: &crate::config::Guards, at: &str, report: &mut Report) {
    for (name, value, max) in guards.limits() {
        if let Some(v) = value {
            report.check(
                (0.0..=max).contains(&v),
                format!("{at}.{name}"),
                if max.is_finite() {
                    format!("must be between 0 and {max}")
                } else {
                    "must be >= 0".into()
                },
            );
        }
    }
}

fn check_health(h: &crate::config::HealthCheck, at: &str, report: &mut Report) {
    report.check(
        h.path.starts_with('/'),
        format!("{at}.path"),
        "must start with '/'",
    );
    let least = crate::config::defaults::MIN_POLL_INTERVAL;
    report.check(
        h.interval >= least,
        format!("{at}.interval"),
        format!("must be at least {least:?}"),
    );
    report.check(!h.timeout.is_zero(), format!("{at}.timeout"), "must be > 0");
    report.check(h.rise >= 1, format!("{at}.rise"), "must be >= 1");
    report.check(h.fall >= 1, format!("{at}.fall"), "must be >= 1");
}

impl Config {
    /// Checks `request_body`, `models`, backends' model lists and body-aware class rules.
    pub(super) fn validate_requests(&self, report: &mut Report) {
        let body = &self.request_body;
        for (i, path) in body.paths.iter().enumerate() {
            report.check(
                path.starts_with('/'),
                format!("request_body.paths[{i}]"),
                "must start with '/'",
            );
        }
        report.check(
            body.max_bytes >= 1,
            "request_body.max_bytes",
            "must be >= 1",
        );
        report.check(
            body.held_limit() >= body.max_bytes,
            "request_body.max_held_bytes",
            format!(
                "must be at least request_body.max_bytes ({}), or a body of that size is never read",
                body.max_bytes
            ),
        );
        let models = &self.models;
        let least = crate::config::defaults::MIN_POLL_INTERVAL;
        report.check(
            models.interval >= least,
            "models.interval",
            format!("must be at least {least:?}"),
        );
        report.check(!models.timeout.is_zero(), "models.timeout", "must be > 0");
        for (alias, model) in &models.aliases {
            let at = format!("models.aliases.{alias}");
            if model.is_empty() || model == alias {
                report.error(at, "must name another model");
            } else if models.aliases.contains_key(model) {
                report.error(at, format!("{model:?} is an alias itself; name the model"));
            }
        }
        if let Some(model) = &models.default {
            report.check(!model.is_empty(), "models.default", "must name a model");
        }
        for (i, backend) in self.backends.iter().enumerate() {
            let Some(list) = &backend.models else {
                continue;
            };
            report.check(
                !list.is_empty() && list.iter().all(|m| !m.is_empty()),
                format!("backends[{i}].models"),
                "must list at least one model, none empty (omit the key to discover them)",
            );
        }
        for (i, class) in self.classes.iter().enumerate() {
            let m = &class.matcher;
            let reads_body = m.model.is_some()
                || m.stream.is_some()
                || m.max_tokens.is_some()
                || m.prompt_tokens.is_some();
            if let (true, Some(prefix)) = (reads_body, &m.path_prefix) {
                report.check(
                    body.paths.iter().any(|p| p.starts_with(prefix.as_str())),
                    format!("classes[{i}].match"),
                    format!(
                        "looks at the request body, but no path in request_body.paths starts with {prefix:?}"
                    ),
                );
            }
        }
    }
}

impl crate::config::AdminConfig {
    /// The admin bearer token from `token_env` or `token_file`; `None` when neither is set.
    pub fn token(&self) -> Result<Option<String>, TokenError> {
        read_token(self.token_env.as_deref(), self.token_file.as_deref())
    }
}

/// Most items one batch may be configured to hold.
const MAX_BATCH_ITEMS: usize = 4096;
/// Longest a batch may be configured to wait for members.
const MAX_BATCH_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn check_batching(b: &crate::config::BatchingConfig, at: &str, report: &mut Report) {
    report.check(
        (1..=MAX_BATCH_ITEMS).contains(&b.max_batch),
        format!("{at}.max_batch"),
        format!("must be between 1 and {MAX_BATCH_ITEMS}"),
    );
    report.check(
        !b.max_wait.is_zero() && b.max_wait <= MAX_BATCH_WAIT,
        format!("{at}.max_wait"),
        "must be > 0 and at most 10s (it is added to the latency of every batched request)",
    );
    if b.max_batch_tokens == Some(0) {
        report.error(format!("{at}.max_batch_tokens"), "must be >= 1");
    }
}
