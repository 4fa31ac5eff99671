//! Telemetry tests: every source against the real samples in `tests/data/metrics`, merging,
//! freshness and the config shape.

use super::*;
use std::time::{Duration, Instant};

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/data/metrics/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A server load with these figures.
pub(super) fn load(
    running: Option<f64>,
    waiting: Option<f64>,
    kv: Option<f64>,
) -> Option<ServerLoad> {
    Some(ServerLoad {
        running,
        waiting,
        kv_cache_usage: kv,
        kv_capacity_tokens: None,
        prefix_cache_hit_ratio: None,
    })
}

#[test]
fn vllm_v1_fixture() {
    let r = parse_server_load(ServerKind::Vllm, &fixture("vllm.prom")).expect("parses");
    let with_capacity = load(Some(0.0), Some(0.0), Some(0.0)).map(|l| ServerLoad {
        // num_gpu_blocks="101625" x block_size="16" in vllm:cache_config_info.
        kv_capacity_tokens: Some(1_626_000.0),
        ..l
    });
    assert_eq!(r.server, with_capacity);
    assert!(r.gpus.is_empty());
}

#[test]
fn vllm_v0_fixture_falls_back_to_gpu_cache_usage() {
    let text = fixture("vllm-v0.prom");
    assert!(!text.contains("kv_cache_usage_perc"));
    let r = parse_server_load(ServerKind::Vllm, &text).expect("parses");
    assert_eq!(r.server, load(Some(0.0), Some(0.0), Some(0.0)));
}

#[test]
fn sglang_fixture() {
    let r = parse_server_load(ServerKind::Sglang, &fixture("sglang.prom")).expect("parses");
    let with_hits = load(Some(162.0), Some(2826.0), Some(0.28)).map(|l| ServerLoad {
        // sglang:cache_hit_rate in the sample.
        prefix_cache_hit_ratio: Some(0.007507552643049313),
        ..l
    });
    assert_eq!(r.server, with_hits);
}

#[test]
fn tgi_fixture_has_no_kv_figure() {
    let r = parse_server_load(ServerKind::Tgi, &fixture("tgi.prom")).expect("parses");
    assert_eq!(r.server, load(Some(0.0), Some(0.0), None));
}

#[test]
fn llamacpp_fixture() {
    let r = parse_server_load(ServerKind::Llamacpp, &fixture("llamacpp.prom")).expect("parses");
    assert_eq!(r.server, load(Some(0.0), Some(0.0), Some(0.491063)));
}

#[test]
fn triton_fixture_sums_pending_and_reads_its_gpu() {
    let r = parse_server_load(ServerKind::Triton, &fixture("triton.prom")).expect("parses");
    assert_eq!(r.server, load(None, Some(0.0), None));
    assert_eq!(
        r.gpus,
        vec![GpuReading {
            index: None,
            uuid: Some("GPU-951eeeeb-d284-d263-688e-d98a5306389b".into()),
            utilization: Some(0.0),
            memory_used_bytes: Some(266_338_304),
            memory_total_bytes: Some(16_106_127_360),
            temperature_celsius: None,
            power_watts: Some(32.09),
        }]
    );
    let fraction = r.gpus[0].memory_fraction().expect("known");
    assert!((fraction - 266_338_304.0 / 16_106_127_360.0).abs() < 1e-12);
}

#[test]
fn dcgm_fixture() {
    let text = fixture("dcgm-exporter.prom");
    let expected = GpuReading {
        index: Some(0),
        uuid: Some("GPU-c2f76b33-7953-256e-8f33-1343419b1a1c".into()),
        utilization: Some(0.0),
        memory_used_bytes: Some(0),
        // FREE 22563 + USED 0 + RESERVED 470 MiB.
        memory_total_bytes: Some(23_033 * 1024 * 1024),
        temperature_celsius: Some(31.0),
        power_watts: Some(16.365),
    };
    for selectors in [
        vec![],
        vec![GpuSelector::Index(0)],
        vec![GpuSelector::Uuid(
            "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c".into(),
        )],
    ] {
        let r = parse_dcgm(&text, &selectors).expect("parses");
        assert_eq!(r.gpus, vec![expected.clone()], "{selectors:?}");
        assert_eq!(r.server, None);
    }
    assert_eq!(expected.memory_fraction(), Some(0.0));
    assert_eq!(
        parse_dcgm(&text, &[GpuSelector::Index(1)]),
        Err(TelemetryError::GpuNotFound("1".into()))
    );
}

#[test]
fn wrong_server_kind_is_an_error_not_zeros() {
    let e = parse_server_load(ServerKind::Vllm, &fixture("sglang.prom"));
    assert!(matches!(e, Err(TelemetryError::NoSeries { .. })), "{e:?}");
    let e = parse_dcgm(&fixture("vllm.prom"), &[]);
    assert!(matches!(e, Err(TelemetryError::NoSeries { .. })), "{e:?}");
}

#[test]
fn merge_joins_same_gpu_and_keeps_server_figures() {
    let mut a = parse_server_load(ServerKind::Triton, &fixture("triton.prom")).expect("triton");
    let b = Reading {
        gpus: vec![
            GpuReading {
                index: Some(3),
                uuid: Some("gpu-951eeeeb-d284-d263-688e-d98a5306389b".into()),
                utilization: Some(0.9),
                temperature_celsius: Some(50.0),
                ..GpuReading::default()
            },
            GpuReading {
                index: Some(4),
                ..GpuReading::default()
            },
        ],
        server: load(Some(2.0), Some(7.0), Some(0.5)),
    };
    a.merge(&b);
    assert_eq!(a.gpus.len(), 2);
    assert_eq!(a.gpus[0].index, Some(3), "gap filled");
    assert_eq!(a.gpus[0].utilization, Some(0.0), "earlier source wins");
    assert_eq!(a.gpus[0].temperature_celsius, Some(50.0));
    assert_eq!(a.server, load(Some(2.0), Some(0.0), Some(0.5)));
    assert_eq!(a.max_memory_fraction(), a.gpus[0].memory_fraction());
}

#[test]
fn freshness_is_judged_from_taken_at() {
    let now = Instant::now();
    let t = Telemetry {
        reading: Reading::default(),
        taken_at: now,
        server_sample: None,
    };
    let max = Duration::from_secs(3);
    assert!(is_fresh(&t, max, now));
    assert!(is_fresh(&t, max, now + max));
    assert!(!is_fresh(&t, max, now + max + Duration::from_millis(1)));
    assert!(
        is_fresh(&t, max, now - Duration::from_secs(1)),
        "clock order"
    );
}

fn with_server(running: Option<f64>, waiting: Option<f64>, own: u32, at: Instant) -> Telemetry {
    Telemetry {
        reading: Reading {
            gpus: vec![],
            server: Some(ServerLoad {
                running,
                waiting,
                ..ServerLoad::default()
            }),
        },
        taken_at: at,
        server_sample: Some(ServerSample {
            taken_at: at,
            own_in_flight: own,
            others_share: 0.0,
        }),
    }
}

#[test]
fn others_in_flight_is_the_servers_count_less_our_own() {
    let now = Instant::now();
    let max = Duration::from_secs(2);
    let t = with_server(Some(6.0), Some(3.0), 4, now);
    assert_eq!(t.others_in_flight(max, now), Some(5));
    // The server saw fewer than we had sent (ours still on the wire): nobody else.
    let t = with_server(Some(2.0), None, 4, now);
    assert_eq!(t.others_in_flight(max, now), Some(0));
    // Too old to say.
    assert_eq!(t.others_in_flight(max, now + max * 2), None);
    // No counts, or no server reading at all: unknown, not zero.
    let t = with_server(None, None, 0, now);
    assert_eq!(t.others_in_flight(max, now), None);
    let mut t = with_server(Some(1.0), None, 0, now);
    t.server_sample = None;
    assert_eq!(t.others_in_flight(max, now), None);
}

#[test]
fn the_others_share_is_remembered_through_readings_of_an_idle_backend() {
    let start = Instant::now();
    let mut share = super::poll::OthersShare::default();
    let mut seen = |running: f64, own: u32, after_ms: u64| {
        let mut t = with_server(
            Some(running),
            None,
            own,
            start + Duration::from_millis(after_ms),
        );
        share.observe(&mut t);
        t.others_at_read(Duration::MAX, t.taken_at)
            .unwrap()
            .others_share
    };
    // Half of the load is someone else's: the share moves an eighth of the way there.
    assert_eq!(seen(8.0, 4, 0), 0.0625);
    let mut last = 0.0625;
    for i in 1..40 {
        last = seen(8.0, 4, i * 200);
    }
    assert!((last - 0.5).abs() < 0.01, "{last}");
    // An idle backend says nothing about who sends there: the share is kept.
    assert_eq!(seen(0.0, 0, 9_000), last);
    // The same sample read again (its source failed this round) does not count twice.
    assert_eq!(seen(0.0, 0, 9_000), last);
    // Only our own requests there: the share decays toward none.
    let after = seen(4.0, 4, 9_200);
    assert!(after < last && after > 0.4, "{after}");
}

#[test]
fn source_config_yaml() {
    let yaml = "- {kind: nvml, gpus: [0, \"GPU-abc\"]}\n\
                - {kind: dcgm, url: \"http://h:9400/metrics\", gpus: [1], interval: 2s, timeout: 250ms}\n\
                - {kind: model_server, server: sglang}\n";
    let s: Vec<SourceConfig> = serde_yaml::from_str(yaml).expect("parses");
    assert_eq!(
        s[0].kind,
        SourceKind::Nvml {
            gpus: vec![GpuSelector::Index(0), GpuSelector::Uuid("GPU-abc".into())]
        }
    );
    assert_eq!(s[0].interval, Duration::from_secs(1));
    assert_eq!(s[0].timeout, Duration::from_millis(500));
    assert_eq!(s[1].interval, Duration::from_secs(2));
    assert_eq!(s[1].timeout, Duration::from_millis(250));
    assert_eq!(s[1].url("http://b:1"), Some("http://h:9400/metrics".into()));
    assert_eq!(s[2].url("http://b:1/"), Some("http://b:1/metrics".into()));
    assert_eq!(s[0].url("http://b:1"), None);
    assert!(s.iter().all(|c| c.validate().is_ok()));
    assert_eq!(
        (s[0].label(), s[2].label()),
        ("nvml".into(), "sglang".into())
    );
}

#[test]
fn source_config_refuses_mistakes() {
    for (yaml, needle) in [
        ("{kind: nvml, gpu: [0]}", "unknown field `gpu`"),
        ("{kind: dcgm}", "missing field `url`"),
        (
            "{kind: model_server, server: vllm2}",
            "unknown variant `vllm2`",
        ),
        ("{kind: snmp}", "unknown variant `snmp`"),
        ("{kind: nvml, gpus: [-1]}", "negative"),
        ("{kind: nvml, gpus: [\"\"]}", "empty GPU selector"),
        ("{kind: nvml, gpus: [\"-2\"]}", "negative"),
        ("{kind: nvml, gpus: [4294967296]}", "out of range"),
        ("{kind: nvml, interval: \"5\"}", "with a unit"),
    ] {
        let e = serde_yaml::from_str::<SourceConfig>(yaml).expect_err(yaml);
        assert!(e.to_string().contains(needle), "{yaml}: {e}");
    }
    let zero: SourceConfig = serde_yaml::from_str("{kind: nvml, interval: 0s}").expect("parses");
    assert_eq!(
        zero.validate().unwrap_err().to_string(),
        "interval: must be at least 100ms"
    );
    let ftp: SourceConfig =
        serde_yaml::from_str("{kind: dcgm, url: \"ftp://h/metrics\"}").expect("parses");
    assert_eq!(ftp.validate().unwrap_err().path, "url");
    let https: SourceConfig =
        serde_yaml::from_str("{kind: dcgm, url: \"https://h/metrics\"}").expect("parses");
    assert!(https.validate().is_ok());
}
