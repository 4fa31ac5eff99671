//! Load figures from a model server's own `/metrics`: vLLM, SGLang, TGI, Triton, llama.cpp.
//!
//! Several series of one metric (engines, data-parallel ranks, models) are combined: counts
//! are summed, usage ratios take the maximum. A series the server does not expose stays `None`.

use std::collections::BTreeMap;

use super::prom_text::{self, Scrape};
use super::{GpuReading, Reading, ServerLoad, TelemetryError};
pub use crate::config::ServerKind;

/// Parses a model server's metrics page into its load (and, for Triton, its GPUs).
pub fn parse_server_load(kind: ServerKind, text: &str) -> Result<Reading, TelemetryError> {
    let scrape = prom_text::parse(text)?;
    server_load(kind, &scrape)
}

/// Reads one kind's series out of a parsed scrape; none of them present is an error.
pub fn server_load(kind: ServerKind, s: &Scrape) -> Result<Reading, TelemetryError> {
    let load = |running: &str, waiting: &str, kv: &[&str]| ServerLoad {
        running: sum(s, running),
        waiting: sum(s, waiting),
        kv_cache_usage: kv.iter().find_map(|name| max_ratio(s, name)),
        kv_capacity_tokens: None,
        prefix_cache_hit_ratio: None,
    };
    let (server, gpus) = match kind {
        ServerKind::Vllm => (
            ServerLoad {
                kv_capacity_tokens: vllm_kv_capacity(s),
                prefix_cache_hit_ratio: vllm_prefix_hit_ratio(s),
                ..load(
                    "vllm:num_requests_running",
                    "vllm:num_requests_waiting",
                    &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
                )
            },
            Vec::new(),
        ),
        ServerKind::Sglang => (
            ServerLoad {
                prefix_cache_hit_ratio: max_ratio(s, "sglang:cache_hit_rate"),
                ..load(
                    "sglang:num_running_reqs",
                    "sglang:num_queue_reqs",
                    &["sglang:token_usage"],
                )
            },
            Vec::new(),
        ),
        ServerKind::Tgi => (
            load("tgi_batch_current_size", "tgi_queue_size", &[]),
            Vec::new(),
        ),
        ServerKind::Llamacpp => (
            load(
                "llamacpp:requests_processing",
                "llamacpp:requests_deferred",
                &["llamacpp:kv_cache_usage_ratio"],
            ),
            Vec::new(),
        ),
        ServerKind::Triton => {
            let server = ServerLoad {
                running: None,
                waiting: sum(s, "nv_inference_pending_request_count"),
                kv_cache_usage: None,
                kv_capacity_tokens: None,
                prefix_cache_hit_ratio: None,
            };
            (server, triton_gpus(s))
        }
    };
    if server == ServerLoad::default() && gpus.is_empty() {
        return Err(TelemetryError::NoSeries {
            what: format!("{kind} load"),
        });
    }
    Ok(Reading {
        gpus,
        server: Some(server),
    })
}

/// Triton's per-GPU gauges, keyed by the `gpu_uuid` label.
fn triton_gpus(s: &Scrape) -> Vec<GpuReading> {
    let mut by_uuid: BTreeMap<&str, GpuReading> = BTreeMap::new();
    for sample in &s.samples {
        let Some(uuid) = sample.label("gpu_uuid") else {
            continue;
        };
        let Some(value) = usable(sample.value) else {
            continue;
        };
        let gpu = by_uuid.entry(uuid).or_insert_with(|| GpuReading {
            uuid: Some(uuid.to_string()),
            ..GpuReading::default()
        });
        match sample.name.as_str() {
            "nv_gpu_utilization" => gpu.utilization = Some(value.min(1.0)),
            "nv_gpu_memory_used_bytes" => gpu.memory_used_bytes = Some(value as u64),
            "nv_gpu_memory_total_bytes" => gpu.memory_total_bytes = Some(value as u64),
            "nv_gpu_power_usage" => gpu.power_watts = Some(value),
            _ => {}
        }
    }
    by_uuid.into_values().collect()
}

/// A value fit for a load figure: finite and not negative (vLLM prints -1 for "n/a").
pub(crate) fn usable(v: f64) -> Option<f64> {
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// Sum of the usable values of `name`; `None` when there are none.
fn sum(s: &Scrape, name: &str) -> Option<f64> {
    s.series(name)
        .filter_map(|x| usable(x.value))
        .reduce(|a, b| a + b)
}

/// vLLM's KV-cache capacity in tokens: `num_gpu_blocks` x `block_size` of each engine's
/// `vllm:cache_config_info`, summed.
fn vllm_kv_capacity(s: &Scrape) -> Option<f64> {
    s.series("vllm:cache_config_info")
        .filter_map(|x| {
            let blocks: f64 = x.label("num_gpu_blocks")?.parse().ok()?;
            let size: f64 = x.label("block_size")?.parse().ok()?;
            usable(blocks * size)
        })
        .reduce(|a, b| a + b)
}

/// vLLM's prefix-cache hit ratio since it started: cached tokens over tokens looked up, summed
/// over engines; `None` before any lookup.
fn vllm_prefix_hit_ratio(s: &Scrape) -> Option<f64> {
    let queries = sum(s, "vllm:prefix_cache_queries_total")?;
    let hits = sum(s, "vllm:prefix_cache_hits_total")?;
    (queries > 0.0).then(|| (hits / queries).clamp(0.0, 1.0))
}

/// Largest usable value of `name`, capped at 1.
fn max_ratio(s: &Scrape, name: &str) -> Option<f64> {
    s.series(name)
        .filter_map(|x| usable(x.value))
        .reduce(f64::max)
        .map(|v| v.min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::tests::load;

    #[test]
    fn prefix_cache_hit_ratio_from_vllm_counters_and_sglang_gauge() {
        let vllm = "vllm:prefix_cache_queries_total{engine=\"0\"} 300.0\n\
                    vllm:prefix_cache_hits_total{engine=\"0\"} 60.0\n\
                    vllm:prefix_cache_queries_total{engine=\"1\"} 100.0\n\
                    vllm:prefix_cache_hits_total{engine=\"1\"} 40.0\n\
                    vllm:num_requests_running{engine=\"0\"} 1.0\n";
        let r = parse_server_load(ServerKind::Vllm, vllm).unwrap();
        assert_eq!(r.server.unwrap().prefix_cache_hit_ratio, Some(0.25));
        let sglang = "sglang:num_running_reqs 2\nsglang:cache_hit_rate 0.75\n";
        let r = parse_server_load(ServerKind::Sglang, sglang).unwrap();
        assert_eq!(r.server.unwrap().prefix_cache_hit_ratio, Some(0.75));
    }

    #[test]
    fn sums_counts_and_takes_max_ratio_over_engines() {
        let text = "vllm:num_requests_running{engine=\"0\"} 3.0\n\
                    vllm:num_requests_running{engine=\"1\"} 4.0\n\
                    vllm:num_requests_waiting{engine=\"0\"} 2.0\n\
                    vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n\
                    vllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n\
                    vllm:gpu_cache_usage_perc{engine=\"1\"} 0.9\n";
        let r = parse_server_load(ServerKind::Vllm, text).expect("reads");
        assert_eq!(r.server, load(Some(7.0), Some(2.0), Some(0.75)));
        assert!(r.gpus.is_empty());
    }

    #[test]
    fn missing_series_stay_none_and_none_at_all_is_an_error() {
        let r = parse_server_load(ServerKind::Vllm, "vllm:num_requests_waiting 5\n").expect("ok");
        assert_eq!(r.server, load(None, Some(5.0), None));
        let e = parse_server_load(ServerKind::Sglang, "vllm:num_requests_waiting 5\n");
        assert_eq!(
            e,
            Err(TelemetryError::NoSeries {
                what: "sglang load".into()
            })
        );
        assert!(matches!(
            parse_server_load(ServerKind::Tgi, "tgi_queue_size{"),
            Err(TelemetryError::Parse(_))
        ));
    }

    #[test]
    fn ignores_nan_and_negative_values() {
        let text =
            "sglang:num_running_reqs NaN\nsglang:num_queue_reqs -1\nsglang:token_usage 0.5\n";
        let r = parse_server_load(ServerKind::Sglang, text).expect("reads");
        assert_eq!(r.server, load(None, None, Some(0.5)));
    }

    #[test]
    fn server_kind_names() {
        for (name, kind) in [
            ("vllm", ServerKind::Vllm),
            ("sglang", ServerKind::Sglang),
            ("tgi", ServerKind::Tgi),
            ("triton", ServerKind::Triton),
            ("llamacpp", ServerKind::Llamacpp),
        ] {
            assert_eq!(serde_yaml::from_str::<ServerKind>(name).ok(), Some(kind));
            assert_eq!(kind.to_string(), name);
        }
        assert!(serde_yaml::from_str::<ServerKind>("vLLM").is_err());
    }
}
