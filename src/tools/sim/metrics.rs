//! Prometheus text exposition of the engine state in vLLM's metric names and format.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use super::engine::EngineState;

/// Content type of the exposition.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Formats a value the way Python's prometheus_client does for floats (`3.0`, `0.25`).
fn fmt_value(v: f64) -> String {
    format!("{v:?}")
}

/// Renders the vLLM-style metrics for one engine.
pub(crate) fn render(model_name: &str, st: &EngineState, kv_budget: usize) -> String {
    let labels = format!("engine=\"0\",model_name=\"{}\"", escape_label(model_name));
    let running = st.running.load(Ordering::Relaxed) as f64;
    let waiting = st.waiting.load(Ordering::Relaxed) as f64;
    let kv = if kv_budget == 0 {
        0.0
    } else {
        (st.kv_used.load(Ordering::Relaxed) as f64 / kv_budget as f64).clamp(0.0, 1.0)
    };
    let prompt = st.prompt_tokens_total.load(Ordering::Relaxed) as f64;
    let gen = st.generation_tokens_total.load(Ordering::Relaxed) as f64;
    let finished = st.finished_total.load(Ordering::Relaxed) as f64;
    let queries = st.prefix_queries_total.load(Ordering::Relaxed) as f64;
    let hits = st.prefix_hits_total.load(Ordering::Relaxed) as f64;
    let mut out = String::with_capacity(2048);
    let metrics: [(&str, &str, &str, f64); 7] = [
        (
            "num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            running,
        ),
        (
            "num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            waiting,
        ),
        (
            "kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            kv,
        ),
        (
            "prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            queries,
        ),
        (
            "prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            hits,
        ),
        (
            "prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            prompt,
        ),
        (
            "generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            gen,
        ),
    ];
    for (name, typ, help, value) in metrics {
        let _ = writeln!(out, "# HELP vllm:{name} {help}");
        let _ = writeln!(out, "# TYPE vllm:{name} {typ}");
        let _ = writeln!(out, "vllm:{name}{{{labels}}} {}", fmt_value(value));
    }
    // The KV budget as vLLM states its cache: blocks of 16 tokens.
    let _ = writeln!(
        out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0",
        kv_budget / 16
    );
    let _ = writeln!(
        out,
        "# HELP vllm:request_success_total Count of successfully processed requests."
    );
    let _ = writeln!(out, "# TYPE vllm:request_success_total counter");
    let model = escape_label(model_name);
    for (reason, v) in [("stop", 0.0), ("length", finished), ("abort", 0.0)] {
        let _ = writeln!(
            out,
            "vllm:request_success_total{{engine=\"0\",finished_reason=\"{reason}\",model_name=\"{model}\"}} {}",
            fmt_value(v)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_format() {
        let st = EngineState::default();
        st.running.store(3, Ordering::Relaxed);
        st.kv_used.store(25, Ordering::Relaxed);
        let text = render("w\"1", &st, 100);
        assert!(text.contains("# TYPE vllm:num_requests_running gauge\n"));
        assert!(
            text.contains("vllm:num_requests_running{engine=\"0\",model_name=\"w\\\"1\"} 3.0\n")
        );
        assert!(
            text.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"w\\\"1\"} 0.0\n")
        );
        assert!(
            text.contains("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"w\\\"1\"} 0.25\n")
        );
        assert!(text.contains("# TYPE vllm:generation_tokens_total counter\n"));
    }

    #[test]
    fn renders_prefix_cache_counters_like_vllm() {
        let st = EngineState::default();
        st.prefix_queries_total.store(96, Ordering::Relaxed);
        st.prefix_hits_total.store(64, Ordering::Relaxed);
        let text = render("w", &st, 100);
        for (name, help, value) in [
            (
                "queries",
                "queries, in terms of number of queried tokens.",
                "96.0",
            ),
            ("hits", "hits, in terms of number of cached tokens.", "64.0"),
        ] {
            let series = format!("vllm:prefix_cache_{name}_total");
            assert!(text.contains(&format!("# HELP {series} Prefix cache {help}\n")));
            assert!(text.contains(&format!("# TYPE {series} counter\n")));
            let line = format!("{series}{{engine=\"0\",model_name=\"w\"}} {value}\n");
            assert!(text.contains(&line), "{line} missing from\n{text}");
        }
    }
}
