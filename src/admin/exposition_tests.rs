//! Unit tests of the `/metrics` exposition: request-path collectors and live state.

use super::*;
use crate::config::defaults::MAX_TENANTS;
use crate::config::Config;
use crate::routing::Snapshot;
use crate::telemetry::{GpuReading, Reading, ServerLoad, Telemetry};
use crate::view::STATUS_LATENCY_SPAN_S;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TWO: &str = "backends:\n  - {name: a, url: 'http://127.0.0.1:9001'}\n  - {name: b, url: 'http://127.0.0.1:9002'}\n";

fn snapshot(yaml: &str, previous: Option<&Snapshot>) -> Snapshot {
    Snapshot::build(Config::from_yaml(yaml).unwrap(), 1, previous)
}

/// Scrapes `m` with the live state of `snap`, as `GET /metrics` does.
fn render(e: &Exposition, m: &Metrics, snap: &Snapshot, reload: Option<&ReloadStatus>) -> String {
    e.render(m, &FleetView::read(snap, m, STATUS_LATENCY_SPAN_S), reload)
}

/// The value of the series written exactly as `series` (name and labels), if present.
pub(crate) fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn request_path_metrics_count_and_use_llm_buckets() {
    let (m, e) = (Metrics::new(MAX_TENANTS), Exposition::default());
    let snap = snapshot(TWO, None);
    let ms = Duration::from_millis;
    m.class("default")
        .request_finished(Some("a"), 200, ms(1500), Some(ms(80)));
    m.class("default")
        .request_finished(Some("a"), 200, ms(300), None);
    m.class("default").request_finished(None, 503, ms(1), None);
    m.class("default").queue_wait(ms(40));
    m.class("default").shed("acme", "queue_full");
    let text = render(&e, &m, &snap, None);
    let req = |b: &str, s: &str| {
        value(
            &text,
            &format!("gpulb_requests_total{{backend=\"{b}\",class=\"default\",status=\"{s}\"}}"),
        )
    };
    assert_eq!(req("a", "200"), Some(2.0), "{text}");
    assert_eq!(req("none", "503"), Some(1.0));
    let count = |name: &str| value(&text, &format!("{name}_count{{class=\"default\"}}"));
    assert_eq!(count("gpulb_request_duration_seconds"), Some(3.0));
    assert_eq!(count("gpulb_time_to_first_byte_seconds"), Some(1.0));
    assert_eq!(count("gpulb_queue_wait_seconds"), Some(1.0));
    for le in ["0.005", "0.1", "60", "600", "+Inf"] {
        let bucket =
            format!("gpulb_request_duration_seconds_bucket{{class=\"default\",le=\"{le}\"}}");
        assert!(value(&text, &bucket).is_some(), "no bucket {le}:\n{text}");
    }
    assert_eq!(
        value(
            &text,
            "gpulb_request_duration_seconds_bucket{class=\"default\",le=\"1\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &text,
            "gpulb_shed_total{class=\"default\",reason=\"queue_full\",tenant=\"acme\"}"
        ),
        Some(1.0)
    );
    let class = m.class("default");
    assert_eq!((class.finished_total(), class.shed_total()), (3, 1));
    assert!(class.percentiles(60).0.p99.is_some());
}

#[test]
fn every_family_has_help_and_type() {
    let (m, e) = (Metrics::new(MAX_TENANTS), Exposition::default());
    m.class("default")
        .request_finished(Some("a"), 200, Duration::from_millis(5), None);
    let text = render(&e, &m, &snapshot(TWO, None), None);
    let samples: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for name in samples {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| text.contains(&format!("# TYPE {f} histogram")))
            .unwrap_or(name);
        assert!(text.contains(&format!("# HELP {family} ")), "{family}");
        assert!(text.contains(&format!("# TYPE {family} ")), "{family}");
    }
}

#[test]
fn tenants_past_the_cap_fold_into_other() {
    let (m, e) = (Metrics::new(2), Exposition::default());
    for t in ["t1", "t2", "t3", "t1", "", &"x".repeat(100)] {
        m.class("bulk").shed(t, "wait_timeout");
    }
    let text = render(&e, &m, &snapshot(TWO, None), None);
    let shed = |t: &str| {
        value(
            &text,
            &format!("gpulb_shed_total{{class=\"bulk\",reason=\"wait_timeout\",tenant=\"{t}\"}}"),
        )
    };
    assert_eq!(shed("t1"), Some(2.0));
    assert_eq!(shed("t2"), Some(1.0));
    assert_eq!(shed("t3"), None);
    assert_eq!(shed("other"), Some(2.0));
    assert_eq!(shed("none"), Some(1.0));
}

#[test]
fn live_state_is_read_from_the_snapshot() {
    let (m, e) = (Metrics::new(MAX_TENANTS), Exposition::default());
    let snap = snapshot(TWO, None);
    let a = &snap.backends[0];
    let _slot = a.state.outstanding.try_acquire(10).unwrap();
    a.state
        .health
        .observe_check("a", Ok(()), &a.health_check, crate::health::now_ms());
    a.state.telemetry.store(Some(Arc::new(Telemetry {
        reading: Reading {
            gpus: vec![GpuReading {
                index: Some(3),
                utilization: Some(0.75),
                memory_used_bytes: Some(1 << 30),
                memory_total_bytes: Some(80 << 30),
                ..GpuReading::default()
            }],
            server: Some(ServerLoad {
                running: Some(5.0),
                waiting: Some(2.0),
                kv_cache_usage: Some(0.5),
                kv_capacity_tokens: None,
                prefix_cache_hit_ratio: None,
            }),
        },
        taken_at: Instant::now(),
        server_sample: None,
    })));
    a.state.telemetry_errors.fetch_add(4, Ordering::Relaxed);
    let reload = ReloadStatus {
        hash: "abc".into(),
        applied_total: 2,
        rejected_total: 1,
        ..ReloadStatus::default()
    };
    let text = render(&e, &m, &snap, Some(&reload));
    let v = |s: &str| value(&text, s);
    assert_eq!(
        v("gpulb_backend_outstanding{backend=\"a\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(v("gpulb_backend_healthy{backend=\"a\"}"), Some(1.0));
    assert_eq!(v("gpulb_backend_healthy{backend=\"b\"}"), Some(0.0));
    assert_eq!(v("gpulb_backend_eligible{backend=\"a\"}"), Some(1.0));
    assert_eq!(v("gpulb_backend_ejections_total{backend=\"a\"}"), Some(0.0));
    assert!(text.contains("# TYPE gpulb_backend_ejections_total counter"));
    assert_eq!(
        v("gpulb_gpu_utilization_ratio{backend=\"a\",gpu=\"3\"}"),
        Some(0.75)
    );
    assert_eq!(
        v("gpulb_gpu_memory_total_bytes{backend=\"a\",gpu=\"3\"}"),
        Some((80u64 << 30) as f64)
    );
    assert_eq!(v("gpulb_backend_server_waiting{backend=\"a\"}"), Some(2.0));
    assert_eq!(
        v("gpulb_backend_kv_cache_usage_ratio{backend=\"a\"}"),
        Some(0.5)
    );
    assert!(v("gpulb_telemetry_age_seconds{backend=\"a\"}").is_some_and(|a| a < 5.0));
    assert_eq!(v("gpulb_telemetry_age_seconds{backend=\"b\"}"), None);
    assert_eq!(v("gpulb_telemetry_errors_total{backend=\"a\"}"), Some(4.0));
    assert_eq!(v("gpulb_queue_depth{class=\"default\"}"), Some(0.0));
    assert_eq!(
        v("gpulb_config_reloads_total{result=\"applied\"}"),
        Some(2.0)
    );
    assert_eq!(
        v("gpulb_config_reloads_total{result=\"rejected\"}"),
        Some(1.0)
    );
    assert_eq!(v("gpulb_config_generation"), Some(1.0));
    assert_eq!(v("gpulb_config_info{hash=\"abc\"}"), Some(1.0));
    #[cfg(target_os = "linux")]
    {
        assert!(v("process_resident_memory_bytes").is_some_and(|r| r > 0.0));
        assert!(text.contains("# TYPE process_cpu_seconds_total counter"));
    }

    // A reload that drops backend b: its series go with it.
    let next = snapshot(
        "backends:\n  - {name: a, url: 'http://127.0.0.1:9001'}\n",
        Some(&snap),
    );
    let text = render(&e, &m, &next, None);
    assert!(!text.contains("backend=\"b\""), "{text}");
    assert_eq!(
        value(&text, "gpulb_backend_outstanding{backend=\"a\"}"),
        Some(1.0)
    );
}

#[test]
fn auth_failures_count() {
    let (m, e) = (Metrics::new(MAX_TENANTS), Exposition::default());
    m.auth_failure();
    let text = render(&e, &m, &snapshot(TWO, None), None);
    assert_eq!(value(&text, "gpulb_admin_auth_failures_total"), Some(1.0));
    assert_eq!(m.auth_failures_total(), 1);
}

#[test]
fn the_grafana_example_uses_only_metrics_that_exist() {
    let (m, e) = (Metrics::new(MAX_TENANTS), Exposition::default());
    let snap = snapshot(TWO, None);
    m.class("default").request_finished(
        Some("a"),
        200,
        Duration::from_millis(5),
        Some(Duration::ZERO),
    );
    m.class("default").queue_wait(Duration::ZERO);
    m.class("default").shed("t", "queue_full");
    snap.backends[0]
        .state
        .telemetry
        .store(Some(Arc::new(Telemetry {
            reading: Reading {
                gpus: vec![GpuReading {
                    utilization: Some(0.5),
                    memory_used_bytes: Some(1),
                    memory_total_bytes: Some(2),
                    ..GpuReading::default()
                }],
                server: Some(ServerLoad {
                    running: Some(1.0),
                    waiting: Some(0.0),
                    kv_cache_usage: Some(0.1),
                    kv_capacity_tokens: None,
                    prefix_cache_hit_ratio: None,
                }),
            },
            taken_at: Instant::now(),
            server_sample: None,
        })));
    let reload = ReloadStatus::default();
    let text = render(&e, &m, &snap, Some(&reload));
    // Host CPU ratios need two reads of the counters some ticks apart.
    std::thread::sleep(Duration::from_millis(50));
    let text = text + &render(&e, &m, &snap, Some(&reload));
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../examples/grafana-dashboard.json")).unwrap();
    let json = dashboard.to_string();
    let mut names: Vec<&str> = json
        .match_indices("gpulb_")
        .chain(json.match_indices("process_"))
        .map(|(i, _)| {
            let rest = &json[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() > 20, "{names:?}");
    for name in names {
        let family = name.strip_suffix("_bucket").unwrap_or(name);
        if family.starts_with("gpulb_host_") && !cfg!(target_os = "linux") {
            continue;
        }
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} not exported"
        );
    }
}
