//! Telemetry guards: which readings break a class's limits.

use super::{GpuReading, Reading, ServerLoad};
use crate::config::Guards;

fn reading(mem_used: u64, kv: f64, waiting: f64) -> Reading {
    Reading {
        gpus: vec![GpuReading {
            memory_used_bytes: Some(mem_used),
            memory_total_bytes: Some(100),
            ..Default::default()
        }],
        server: Some(ServerLoad {
            running: Some(1.0),
            waiting: Some(waiting),
            kv_cache_usage: Some(kv),
            kv_capacity_tokens: None,
            prefix_cache_hit_ratio: None,
        }),
    }
}

#[test]
fn each_limit_excludes_only_above_it() {
    let g = Guards {
        max_gpu_memory: Some(0.95),
        max_kv_cache: Some(0.9),
        max_server_queue: Some(4.0),
    };
    assert!(!reading(95, 0.9, 4.0).breaks(&g));
    assert!(reading(96, 0.1, 0.0).breaks(&g));
    assert!(reading(10, 0.91, 0.0).breaks(&g));
    assert!(reading(10, 0.1, 5.0).breaks(&g));
}

#[test]
fn unknown_figures_and_no_limits_exclude_nothing() {
    assert!(!reading(100, 1.0, 99.0).breaks(&Guards::default()));
    let g = Guards {
        max_gpu_memory: Some(0.5),
        max_kv_cache: Some(0.5),
        max_server_queue: Some(0.0),
    };
    assert!(!Reading::default().breaks(&g));
}
