//! Unit tests of config parsing, implied defaults and validation messages.

use super::*;

const MINIMAL: &str = "
backends:
  - name: gpu0
    url: http://127.0.0.1:9001
  - name: gpu1
    url: http://127.0.0.1:9002/
";

/// Every validation error of `yaml`, as printed (empty when it loads).
pub(super) fn errors_of(yaml: &str) -> Vec<String> {
    match Config::from_yaml(yaml) {
        Err(LoadError::Invalid(errors)) => errors.0.iter().map(ToString::to_string).collect(),
        Err(other) => vec![other.to_string()],
        Ok(_) => vec![],
    }
}

#[test]
fn minimal_file_gets_defaults_and_implied_pool_and_class() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(config.threads, 2);
    assert_eq!(config.timeouts.connect, Duration::from_secs(2));
    assert_eq!(config.backends[0].weight, 1);
    assert_eq!(config.backends[0].max_outstanding, 256);
    assert_eq!(config.pools.len(), 1);
    assert_eq!(config.pools[0].backends, vec!["gpu0", "gpu1"]);
    assert_eq!(config.classes[0].pool, "default");
    assert_eq!(config.default_class.as_deref(), Some("default"));
}

#[test]
fn durations_parse_with_units() {
    let yaml = format!("{MINIMAL}\ntimeouts: {{connect: 250ms, read: 1m}}\nshutdown_timeout: 5s\n");
    let config = Config::from_yaml(&yaml).unwrap();
    assert_eq!(config.timeouts.connect, Duration::from_millis(250));
    assert_eq!(config.timeouts.first_byte(), Duration::from_secs(60));
    assert_eq!(config.timeouts.idle(), Duration::from_secs(60));
    assert!(config.timeouts.per_read());
    assert_eq!(config.shutdown_timeout, Duration::from_secs(5));
}

#[test]
fn first_byte_and_idle_default_apart_and_override_read() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.timeouts.first_byte(), Duration::from_secs(300));
    assert_eq!(config.timeouts.idle(), Duration::from_secs(60));
    assert!(!config.timeouts.per_read());
    let yaml = format!("{MINIMAL}\ntimeouts: {{read: 1m, first_byte: 2m}}\n");
    let config = Config::from_yaml(&yaml).unwrap();
    assert_eq!(config.timeouts.first_byte(), Duration::from_secs(120));
    assert_eq!(config.timeouts.idle(), Duration::from_secs(60));
    let errors = errors_of(&format!("{MINIMAL}\ntimeouts: {{idle: 0s}}\n"));
    assert!(errors[0].starts_with("timeouts.idle"), "{errors:?}");
}

#[test]
fn unknown_key_is_an_error_naming_its_path() {
    let yaml = "backends:\n  - name: a\n    url: http://127.0.0.1:1\n    wieght: 2\n";
    let errors = errors_of(yaml);
    assert_eq!(errors.len(), 1);
    assert!(errors[0].starts_with("backends[0]"), "{errors:?}");
    assert!(errors[0].contains("unknown field `wieght`"), "{errors:?}");
}

#[test]
fn a_value_of_the_wrong_type_names_its_path_once() {
    for (yaml, path) in [
        (
            "backends:\n  - {name: a, url: \"http://127.0.0.1:1\", max_outstanding: -3}\n",
            "backends[0].max_outstanding",
        ),
        (
            "listen: 127.0.0.1:99999\nbackends:\n  - {name: a, url: \"http://127.0.0.1:1\"}\n",
            "listen",
        ),
    ] {
        let errors = errors_of(yaml);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with(&format!("{path}: ")), "{errors:?}");
        assert_eq!(errors[0].matches(path).count(), 1, "{errors:?}");
    }
}

#[test]
fn bad_duration_names_the_field() {
    let yaml = format!("{MINIMAL}timeouts:\n  read: 5\n");
    let errors = errors_of(&yaml);
    assert!(errors[0].starts_with("timeouts.read"), "{errors:?}");
    assert!(errors[0].contains("with a unit"), "{errors:?}");
}

#[test]
fn every_validation_error_is_reported_with_its_path() {
    let yaml = r#"
threads: 0
backends:
  - name: gpu0
    url: ftp://127.0.0.1:9001
    weight: 0
  - name: gpu0
    url: http://127.0.0.1:9002/v1
pools:
  - name: interactive
    backends: [gpu0, gpu9]
  - name: bulk
    backends: []
classes:
  - name: chat
    pool: interactive
    match: {path_prefix: v1, methods: ["PO ST"]}
  - name: batch
    pool: bluk
default_class: nope
"#;
    let errors = errors_of(yaml);
    let expected = [
        "threads: must be between 1 and 1024",
        "backends[0].url: \"ftp://127.0.0.1:9001\": expected http://host:port or https://host:port",
        "backends[0].weight: must be >= 1",
        "backends[1].name: duplicate backend name \"gpu0\"",
        "backends[1].url: \"http://127.0.0.1:9002/v1\": expected http(s)://host:port with no path, query or credentials",
        "pools[0].backends[1]: unknown backend \"gpu9\"",
        "pools[1].backends: a pool needs at least one backend",
        "classes[0].match.path_prefix: must start with '/'",
        "classes[0].match.methods[0]: \"PO ST\" is not an HTTP method",
        "classes[1].pool: unknown pool \"bluk\"",
        "default_class: unknown class \"nope\"",
    ];
    assert_eq!(errors, expected);
}

#[test]
fn several_classes_need_a_default_class() {
    let yaml = format!(
        "{MINIMAL}classes:\n  - {{name: a, pool: default}}\n  - {{name: b, pool: default}}\n"
    );
    assert_eq!(
        errors_of(&yaml),
        vec!["default_class: required when several classes are defined"]
    );
}

#[test]
fn several_pools_need_classes() {
    let yaml = format!(
        "{MINIMAL}pools:\n  - {{name: a, backends: [gpu0]}}\n  - {{name: b, backends: [gpu1]}}\n"
    );
    assert_eq!(
        errors_of(&yaml),
        vec!["classes: required when more than one pool is defined"]
    );
}

#[test]
fn backend_urls_parse_to_host_and_port_and_resolve() {
    let resolve = |url: &str| Upstream::parse(url).unwrap().resolve().unwrap();
    assert_eq!(
        resolve("http://127.0.0.1:9001"),
        "127.0.0.1:9001".parse().unwrap()
    );
    assert_eq!(resolve("http://[::1]:9001/"), "[::1]:9001".parse().unwrap());
    assert_eq!(resolve("http://localhost").port(), 80);
    assert!(Upstream::parse("127.0.0.1:9001").is_err());
    assert!(Upstream::parse("http://host:port").is_err());
    let unresolvable = Upstream::parse("http://no-such-host.invalid:8000").unwrap();
    assert_eq!(unresolvable.to_string(), "no-such-host.invalid:8000");
    assert!(unresolvable.resolve().is_err());
}

#[test]
fn shipped_example_config_is_valid() {
    let text = include_str!("../../conf/gpulb.yaml");
    Config::from_yaml(text).unwrap();
}

#[test]
fn placement_defaults_to_least_loaded_and_a_bad_one_names_the_choices() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.classes[0].placement, PlacementKind::LeastLoaded);
    let classes = |placement: &str| {
        format!("{MINIMAL}classes:\n  - {{name: c, pool: default, placement: {placement}}}\n")
    };
    let config = Config::from_yaml(&classes("earliest_finish")).unwrap();
    assert_eq!(config.classes[0].placement, PlacementKind::EarliestFinish);
    let errors = errors_of(&classes("fastest"));
    assert!(errors[0].starts_with("classes[0].placement"), "{errors:?}");
    assert!(
        errors[0].contains("least_loaded, speed_weighted, earliest_finish")
            || errors[0].contains("`least_loaded`, `speed_weighted`, `earliest_finish`"),
        "{errors:?}"
    );
}

#[test]
fn header_names_are_compiled_from_the_keys_the_file_sets() {
    let config = Config::from_yaml(&format!(
        "{MINIMAL}tenant_header: X-Org\nrequest_id_header: x-trace-id\n"
    ))
    .unwrap();
    assert_eq!(config.compiled.tenant_header, "x-org");
    assert_eq!(config.compiled.request_id_header, "x-trace-id");
    let defaults = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(defaults.compiled.tenant_header, "x-tenant");
    assert_eq!(defaults.compiled.request_id_header, "x-request-id");
}

#[test]
fn batching_is_off_unless_configured_and_its_limits_are_checked() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.classes[0].batching, None);
    let class = |batching: &str| {
        format!("{MINIMAL}classes:\n  - {{name: c, pool: default, batching: {batching}}}\n")
    };
    let config = Config::from_yaml(&class("{}")).unwrap();
    let batching = config.classes[0].batching.unwrap();
    assert_eq!(
        (
            batching.max_batch,
            batching.max_wait,
            batching.max_batch_tokens
        ),
        (32, std::time::Duration::from_millis(5), None)
    );
    let config = Config::from_yaml(&class(
        "{max_batch: 8, max_wait: 2ms, max_batch_tokens: 4096}",
    ))
    .unwrap();
    assert_eq!(
        config.classes[0].batching.unwrap().max_batch_tokens,
        Some(4096)
    );
    let errors = errors_of(&class("{max_batch: 0, max_wait: 0ms, max_batch_tokens: 0}"));
    assert_eq!(
        errors,
        [
            "classes[0].batching.max_batch: must be between 1 and 4096",
            "classes[0].batching.max_wait: must be > 0 and at most 10s (it is added to the latency of every batched request)",
            "classes[0].batching.max_batch_tokens: must be >= 1",
        ]
    );
    let errors = errors_of(&class("{max_size: 8}"));
    assert!(errors[0].contains("unknown field `max_size`"), "{errors:?}");
}

#[test]
fn the_held_body_budget_defaults_to_256_mib_and_holds_one_largest_body() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.request_body.held_limit(), 256 << 20);
    // Absent, it holds at least one body of the largest size.
    let big = format!("{MINIMAL}\nrequest_body: {{max_bytes: 1000000000}}\n");
    let config = Config::from_yaml(&big).unwrap();
    assert_eq!(config.request_body.held_limit(), 1_000_000_000);
    let errors = errors_of(&format!(
        "{MINIMAL}\nrequest_body: {{max_bytes: 1000, max_held_bytes: 999}}\n"
    ));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("request_body.max_held_bytes")
            && errors[0].contains("request_body.max_bytes (1000)"),
        "{errors:?}"
    );
    let fits = format!("{MINIMAL}\nrequest_body: {{max_bytes: 1000, max_held_bytes: 1000}}\n");
    assert!(errors_of(&fits).is_empty());
}

#[test]
fn a_default_model_must_name_one() {
    let errors = errors_of(&format!("{MINIMAL}\nmodels: {{default: ''}}\n"));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("models.default"), "{errors:?}");
    let named = format!("{MINIMAL}\nmodels: {{default: llama-3.1-8b}}\n");
    assert!(errors_of(&named).is_empty());
    let config = Config::from_yaml(&named).unwrap();
    assert_eq!(config.models.default.as_deref(), Some("llama-3.1-8b"));
}

#[test]
fn retry_statuses_default_to_429_and_take_refusals_only() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.retry_statuses, [429]);
    let errors = errors_of(&format!("{MINIMAL}\nretry_statuses: [503, 200, 404]\n"));
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].starts_with("retry_statuses[1]"), "{errors:?}");
    assert!(errors[1].starts_with("retry_statuses[2]"), "{errors:?}");
}

#[test]
fn a_backend_in_two_pools_whose_auth_differs_must_say_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    std::fs::write(&one, "k1").unwrap();
    std::fs::write(&two, "k2").unwrap();
    let pools = |own: &str| {
        format!(
            "backends:\n  - {{name: gpu0, url: 'http://127.0.0.1:9001'{own}}}\n\
             pools:\n  - {{name: a, backends: [gpu0], auth: {{token_file: {:?}}}}}\n  \
             - {{name: b, backends: [gpu0], auth: {{token_file: {:?}}}}}\n\
             classes:\n  - {{name: c, pool: a}}\n  - {{name: d, pool: b}}\ndefault_class: c\n",
            one.display().to_string(),
            two.display().to_string()
        )
    };
    let errors = errors_of(&pools(""));
    assert_eq!(
        errors,
        ["pools[1].auth: backend \"gpu0\" is also in pool \"a\", whose auth differs; set auth on the backend instead"]
    );
    let own = format!(", auth: {{token_file: {:?}}}", one.display().to_string());
    let config = Config::from_yaml(&pools(&own)).unwrap();
    let auth = config.compiled.upstreams[0].auth.as_ref().unwrap();
    assert_eq!(auth.header(), "Bearer k1");
}
