//! What changed between two configs, in words an operator reads in the reload log.

use super::Config;
use std::collections::BTreeMap;

/// One line per added, removed or changed backend, pool or class, and per changed global key.
pub fn describe_changes(old: &Config, new: &Config) -> Vec<String> {
    let mut changes = Vec::new();
    for (key, restart, changed) in [
        ("listen", true, old.listen != new.listen),
        // TLS on or off needs a new listener; other files are read again on reload.
        (
            "listen_tls",
            true,
            old.listen_tls.is_some() != new.listen_tls.is_some(),
        ),
        (
            "listen_tls",
            false,
            old.listen_tls.is_some()
                && new.listen_tls.is_some()
                && old.listen_tls != new.listen_tls,
        ),
        ("threads", true, old.threads != new.threads),
        ("admin", true, old.admin != new.admin),
        ("timeouts", false, old.timeouts != new.timeouts),
        (
            "connect_retries",
            false,
            old.connect_retries != new.connect_retries,
        ),
        (
            "retry_statuses",
            false,
            old.retry_statuses != new.retry_statuses,
        ),
        (
            "shutdown_timeout",
            true,
            old.shutdown_timeout != new.shutdown_timeout,
        ),
        ("drain_delay", true, old.drain_delay != new.drain_delay),
        (
            "request_id_header",
            false,
            old.request_id_header != new.request_id_header,
        ),
        (
            "preserve_header_case",
            false,
            old.preserve_header_case != new.preserve_header_case,
        ),
        (
            "default_class",
            false,
            old.default_class != new.default_class,
        ),
        ("reload", true, old.reload != new.reload),
        ("access_log", true, old.access_log != new.access_log),
        ("metrics", true, old.metrics != new.metrics),
        (
            "tenant_header",
            false,
            old.tenant_header != new.tenant_header,
        ),
        ("telemetry", false, old.telemetry != new.telemetry),
        ("request_body", false, old.request_body != new.request_body),
        ("models", false, old.models != new.models),
        ("health_check", false, old.health_check != new.health_check),
        (
            "outlier_detection",
            false,
            old.outlier_detection != new.outlier_detection,
        ),
    ] {
        match (changed, restart) {
            (true, true) => changes.push(format!("{key} changed (takes effect on restart)")),
            (true, false) => changes.push(format!("{key} changed")),
            _ => {}
        }
    }
    let sections = [
        (
            "backend",
            keyed(&old.backends, |b| &b.name),
            keyed(&new.backends, |b| &b.name),
        ),
        (
            "pool",
            keyed(&old.pools, |p| &p.name),
            keyed(&new.pools, |p| &p.name),
        ),
        (
            "class",
            keyed(&old.classes, |c| &c.name),
            keyed(&new.classes, |c| &c.name),
        ),
    ];
    for (kind, before, after) in sections {
        for (name, old_item) in &before {
            match after.get(name) {
                None => changes.push(format!("{kind} {name} removed")),
                Some(new_item) if new_item != old_item => {
                    changes.push(format!("{kind} {name} changed"))
                }
                Some(_) => {}
            }
        }
        for name in after.keys().filter(|n| !before.contains_key(*n)) {
            changes.push(format!("{kind} {name} added"));
        }
    }
    let old_order: Vec<&str> = old.classes.iter().map(|c| c.name.as_str()).collect();
    let new_order: Vec<&str> = new.classes.iter().map(|c| c.name.as_str()).collect();
    if old_order != new_order && changes.iter().all(|c| !c.starts_with("class ")) {
        changes.push("class order changed".to_string());
    }
    changes
}

/// Items by name, each with a comparable rendering of all its fields.
fn keyed<T: std::fmt::Debug>(items: &[T], name: impl Fn(&T) -> &String) -> BTreeMap<&str, String> {
    items
        .iter()
        .map(|item| (name(item).as_str(), format!("{item:?}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "
backends:
  - {name: a, url: 'http://127.0.0.1:9001'}
  - {name: b, url: 'http://127.0.0.1:9002'}
";

    #[test]
    fn identical_configs_have_no_changes() {
        let c = Config::from_yaml(BASE).unwrap();
        assert!(describe_changes(&c, &c.clone()).is_empty());
    }

    #[test]
    fn names_added_removed_and_changed_items() {
        let old = Config::from_yaml(BASE).unwrap();
        let new = Config::from_yaml(
            "listen: 127.0.0.1:9999\nbackends:\n  - {name: a, url: 'http://127.0.0.1:9001', weight: 2}\n  - {name: c, url: 'http://127.0.0.1:9003'}\n",
        )
        .unwrap();
        assert_eq!(
            describe_changes(&old, &new),
            [
                "listen changed (takes effect on restart)",
                "backend a changed",
                "backend b removed",
                "backend c added",
                "pool default changed",
            ]
        );
    }
}
