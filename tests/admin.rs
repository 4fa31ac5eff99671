//! Admin listener end to end: `/metrics` follows the fleet, `/status` and `/history` reflect it,
//! auth failures are counted. The real binary, simulated workers, bounded waits.

mod common;

use common::{eventually, served_by, start_fleet, start_workers, Config, Proxy, Req, WAIT};
use std::time::Duration;

/// `GET /metrics` text.
async fn scrape(proxy: &Proxy) -> String {
    let resp = reqwest::get(format!("{}/metrics", proxy.admin))
        .await
        .expect("metrics request");
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    resp.text().await.expect("metrics body")
}

/// The value of the series written exactly as `series` (name and sorted labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Sum of every series of metric `name` whose labels contain `filter`.
fn sum(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sends `n` completions of four tokens, one after the other, each answered 200.
async fn send(proxy: &Proxy, n: usize) {
    served_by(&proxy.send_n(n, &Req::completion(4)).await);
}

#[tokio::test]
async fn scrape_time_metrics_follow_the_fleet() {
    let workers = start_workers(2, |_| {}).await;
    let proxy = Proxy::start(Config::telemetry_fleet(&workers)).await;
    send(&proxy, 6).await;
    proxy.wait_idle().await;

    let text = eventually(WAIT, "GPU telemetry and host CPU in /metrics", || async {
        let text = scrape(&proxy).await;
        let ready = ["w0", "w1"].iter().all(|b| {
            text.contains(&format!(
                "gpulb_gpu_utilization_ratio{{backend=\"{b}\",gpu=\"0\"}}"
            ))
        }) && text.contains("gpulb_host_cpu_busy_ratio ");
        ready.then_some(text)
    })
    .await;
    let v = |s: &str| value(&text, s).unwrap_or_else(|| panic!("no {s} in\n{text}"));
    for b in ["w0", "w1"] {
        let l = format!("{{backend=\"{b}\"}}");
        assert_eq!(v(&format!("gpulb_backend_outstanding{l}")), 0.0);
        assert_eq!(v(&format!("gpulb_backend_healthy{l}")), 1.0);
        assert_eq!(v(&format!("gpulb_backend_eligible{l}")), 1.0);
        assert_eq!(v(&format!("gpulb_backend_ejections_total{l}")), 0.0);
        assert!(v(&format!("gpulb_telemetry_age_seconds{l}")) < 5.0);
        v(&format!("gpulb_telemetry_errors_total{l}"));
        v(&format!("gpulb_backend_server_running{l}"));
        v(&format!("gpulb_backend_server_waiting{l}"));
        let kv = v(&format!("gpulb_backend_kv_cache_usage_ratio{l}"));
        assert!((0.0..=1.0).contains(&kv));
        let g = format!("{{backend=\"{b}\",gpu=\"0\"}}");
        assert!((0.0..=1.0).contains(&v(&format!("gpulb_gpu_utilization_ratio{g}"))));
        let used = v(&format!("gpulb_gpu_memory_used_bytes{g}"));
        assert!(used <= v(&format!("gpulb_gpu_memory_total_bytes{g}")));
    }
    assert_eq!(sum(&text, "gpulb_backend_attempts_total", ""), 6.0);
    assert_eq!(v("gpulb_queue_depth{class=\"default\"}"), 0.0);
    assert_eq!(v("gpulb_config_generation"), 1.0);
    assert_eq!(sum(&text, "gpulb_config_info", "hash=\""), 1.0);
    assert_eq!(v("gpulb_config_reloads_total{result=\"applied\"}"), 0.0);
    assert_eq!(v("gpulb_admin_auth_failures_total"), 0.0);
    assert!(v("process_cpu_seconds_total") > 0.0);
    assert!(v("process_resident_memory_bytes") > 1e6);
    assert!((0.0..=1.0).contains(&v("gpulb_host_cpu_busy_ratio")));
    assert!((0.0..=1.0).contains(&v("gpulb_host_cpu_iowait_ratio")));
    for counter in [
        "gpulb_backend_ejections_total",
        "gpulb_telemetry_errors_total",
        "gpulb_config_reloads_total",
        "process_cpu_seconds_total",
        "gpulb_admin_auth_failures_total",
    ] {
        assert!(
            text.contains(&format!("# TYPE {counter} counter")),
            "{counter}"
        );
        assert!(text.contains(&format!("# HELP {counter} ")), "{counter}");
    }

    // A backend dies: it turns unhealthy in /metrics and /status, and its telemetry fails.
    workers[1].kill_and_wait().await;
    let text = eventually(WAIT, "w1 unhealthy in /metrics", || async {
        let text = scrape(&proxy).await;
        (value(&text, "gpulb_backend_healthy{backend=\"w1\"}") == Some(0.0)).then_some(text)
    })
    .await;
    assert_eq!(
        value(&text, "gpulb_backend_eligible{backend=\"w1\"}"),
        Some(0.0)
    );
    assert_eq!(
        value(&text, "gpulb_backend_healthy{backend=\"w0\"}"),
        Some(1.0)
    );
    eventually(WAIT, "w1 telemetry errors counted", || async {
        let text = scrape(&proxy).await;
        let errors = value(&text, "gpulb_telemetry_errors_total{backend=\"w1\"}")?;
        (errors > 0.0).then_some(())
    })
    .await;
    let status = proxy.status().await;
    let w1 = status["backends"]
        .as_array()
        .and_then(|bs| bs.iter().find(|b| b["name"] == "w1"))
        .expect("w1 in status")
        .clone();
    assert_eq!(w1["health"], "unhealthy", "{w1}");
    assert_eq!(w1["eligible"], false);
    assert!(
        w1["telemetry"]["errors_total"].as_u64().unwrap() > 0,
        "{w1}"
    );
}

#[tokio::test]
async fn status_shows_telemetry_queues_and_latency() {
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start(Config::telemetry_fleet(&workers)).await;
    let status = eventually(WAIT, "telemetry in /status", || async {
        let status = proxy.status().await;
        let t = &status["backends"][0]["telemetry"];
        (t["age_seconds"].is_number() && t["gpus"][0]["utilization"].is_number()).then_some(status)
    })
    .await;
    let t = &status["backends"][0]["telemetry"];
    assert_eq!(t["stale"], false, "{t}");
    assert_eq!(t["gpus"][0]["gpu"], "0");
    assert!(
        t["gpus"][0]["memory_total_bytes"].as_u64().unwrap() > 0,
        "{t}"
    );
    assert!(t["gpus"][0]["uuid"].as_str().unwrap().starts_with("GPU-"));
    assert!(t["server"]["kv_cache_usage"].is_number(), "{t}");
    let class = &status["classes"][0];
    assert_eq!(class["name"], "default");
    assert_eq!(class["queue_depth"], 0);
    assert!(class["queue_by_tenant"].as_object().unwrap().is_empty());
    assert_eq!(class["latency"]["window_seconds"], 60);
    assert!(class["latency"]["ttfb"].get("p50").is_some(), "{class}");
    assert!(class["latency"]["duration"].get("p99").is_some(), "{class}");
}

#[tokio::test]
async fn outstanding_rises_during_a_stream_and_returns_to_zero() {
    let workers = start_workers(1, |p| p.decode_step = Duration::from_millis(20)).await;
    let proxy = Proxy::start(Config::fleet(&workers)).await;
    let stream = proxy.spawn(Req::completion_stream(100));
    eventually(WAIT, "outstanding 1 while streaming", || async {
        let text = scrape(&proxy).await;
        (value(&text, "gpulb_backend_outstanding{backend=\"w0\"}") == Some(1.0)).then_some(())
    })
    .await;
    tokio::time::timeout(WAIT, stream)
        .await
        .expect("stream ends")
        .unwrap();
    eventually(WAIT, "outstanding back to 0", || async {
        let text = scrape(&proxy).await;
        let idle = value(&text, "gpulb_backend_outstanding{backend=\"w0\"}") == Some(0.0)
            && value(&text, "gpulb_class_outstanding{class=\"default\"}") == Some(0.0);
        idle.then_some(())
    })
    .await;
}

#[tokio::test]
async fn auth_failures_are_counted_and_reloads_too() {
    let workers = start_workers(2, |_| {}).await;
    let proxy = Proxy::start_with_token(Config::fleet(&workers), "s3cret").await;
    assert_eq!(proxy.post_reload(None).await.status(), 401);
    let wrong = proxy.post_reload(Some("nope")).await;
    assert_eq!(wrong.status(), 401);
    let text = scrape(&proxy).await;
    assert_eq!(value(&text, "gpulb_admin_auth_failures_total"), Some(2.0));

    let right = proxy.post_reload(Some("s3cret")).await;
    assert_eq!(right.status(), 200);
    // Drop w1 and break nothing: applied; then a broken file: rejected, w0 keeps serving.
    proxy.rewrite_config(Config::fleet(&workers[..1]));
    proxy.wait_generation(2).await;
    let text = scrape(&proxy).await;
    assert!(!text.contains("backend=\"w1\""), "{text}");
    assert_eq!(value(&text, "gpulb_config_generation"), Some(2.0));
    // The file watcher may see one save as two events; the second finds nothing new.
    let unchanged = value(&text, "gpulb_config_reloads_total{result=\"unchanged\"}");
    assert!(unchanged.is_some_and(|n| n >= 1.0), "{text}");
    assert_eq!(
        value(&text, "gpulb_config_reloads_total{result=\"applied\"}"),
        Some(1.0)
    );
    // Raw YAML: the unsupported scheme is the point.
    proxy.rewrite_config("backends: [{name: w0, url: 'ftp://x'}]\n");
    let text = eventually(WAIT, "a rejected reload counted", || async {
        let text = scrape(&proxy).await;
        (value(&text, "gpulb_config_reloads_total{result=\"rejected\"}") == Some(1.0))
            .then_some(text)
    })
    .await;
    assert_eq!(value(&text, "gpulb_config_generation"), Some(2.0));
    assert!(proxy.status().await["reload"]["last_error"].is_string());
}

#[tokio::test]
async fn history_grows_and_pages_by_seq() {
    let (_workers, proxy) = start_fleet(2).await;
    let get = |since: u64| {
        let url = format!("{}/history?since={since}", proxy.admin);
        async move {
            reqwest::get(url)
                .await
                .expect("history")
                .json::<serde_json::Value>()
                .await
                .expect("history json")
        }
    };
    let page = eventually(WAIT, "two samples", || async {
        let page = get(0).await;
        (page["samples"].as_array()?.len() >= 2).then_some(page)
    })
    .await;
    let samples = page["samples"].as_array().unwrap();
    let names: Vec<&str> = samples[0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["name"].as_str())
        .collect();
    assert_eq!(names, ["w0", "w1"]);
    assert_eq!(samples[0]["classes"][0]["name"], "default");
    let last = samples.last().unwrap()["seq"].as_u64().unwrap();
    assert_eq!(page["latest"], last);
    let later = eventually(WAIT, "a newer sample", || async {
        let page = get(last).await;
        (!page["samples"].as_array()?.is_empty()).then_some(page)
    })
    .await;
    assert!(later["samples"][0]["seq"].as_u64().unwrap() > last);
}

#[tokio::test]
async fn reads_answer_head_and_a_method_an_endpoint_does_not_take_gets_405() {
    let workers = start_workers(1, |_| {}).await;
    let proxy = Proxy::start_with_token(Config::fleet(&workers), "s3cret").await;
    let client = reqwest::Client::new();
    let ask = |method: reqwest::Method, path: &str| {
        client
            .request(method, format!("{}{path}", proxy.admin))
            .send()
    };
    // A load balancer's health check may send HEAD: the GET's status and headers, no body.
    eventually(WAIT, "HEAD /readyz to answer 200", || async {
        (ask(reqwest::Method::HEAD, "/readyz").await.ok()?.status() == 200).then_some(())
    })
    .await;
    for path in ["/livez", "/status", "/metrics", "/history"] {
        let answer = ask(reqwest::Method::HEAD, path).await.expect("HEAD");
        assert_eq!(answer.status(), 200, "HEAD {path}");
        assert!(answer.headers().contains_key("content-type"), "HEAD {path}");
        assert!(answer.bytes().await.unwrap().is_empty(), "HEAD {path}");
    }
    // A known endpoint asked with a method it does not take: 405 naming what it takes, before
    // (and so without counting) any token check.
    for (method, path, allow) in [
        (reqwest::Method::POST, "/status", "GET, HEAD"),
        (reqwest::Method::DELETE, "/metrics", "GET, HEAD"),
        (reqwest::Method::GET, "/reload", "POST"),
    ] {
        let answer = ask(method.clone(), path).await.expect("request");
        assert_eq!(answer.status(), 405, "{method} {path}");
        assert_eq!(answer.headers()["allow"], allow, "{method} {path}");
        let error: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(error["error"]["code"], "method_not_allowed", "{error}");
    }
    let text = scrape(&proxy).await;
    assert_eq!(value(&text, "gpulb_admin_auth_failures_total"), Some(0.0));
    // A `since` that is not a sample number is refused, not read as "everything".
    for since in ["abc", "-1", "99999999999999999999"] {
        let answer = ask(reqwest::Method::GET, &format!("/history?since={since}"))
            .await
            .expect("history");
        assert_eq!(answer.status(), 400, "since={since}");
    }
}

/// Request-path metrics: these pass once the proxy calls `Metrics::request_finished`,
/// `Metrics::queue_wait` and `Metrics::shed` (see the metrics module).
#[tokio::test]
async fn request_path_metrics_move_with_traffic() {
    let (workers, proxy) = start_fleet(1).await;
    send(&proxy, 3).await;
    let text = eventually(WAIT, "requests counted", || async {
        let text = scrape(&proxy).await;
        let n = value(
            &text,
            "gpulb_requests_total{backend=\"w0\",class=\"default\",status=\"200\"}",
        )?;
        (n == 3.0).then_some(text)
    })
    .await;
    let count = |name: &str| value(&text, &format!("{name}_count{{class=\"default\"}}"));
    assert_eq!(count("gpulb_request_duration_seconds"), Some(3.0));
    assert_eq!(count("gpulb_time_to_first_byte_seconds"), Some(3.0));
    assert_eq!(count("gpulb_queue_wait_seconds"), Some(3.0));
    for le in ["0.005", "1", "60", "600"] {
        let bucket =
            format!("gpulb_request_duration_seconds_bucket{{class=\"default\",le=\"{le}\"}}");
        assert!(value(&text, &bucket).is_some(), "no bucket {le}");
    }
    let status = proxy.status().await;
    let class = &status["classes"][0];
    assert_eq!(class["requests_total"], 3);
    assert!(class["latency"]["ttfb"]["p50"].is_number(), "{class}");
    assert!(class["latency"]["duration"]["p99"].is_number(), "{class}");

    // A dead fleet: requests answered without a backend count under backend "none".
    workers[0].kill_and_wait().await;
    proxy.wait_idle().await;
    eventually(WAIT, "unrouted requests counted", || async {
        // Only its being counted matters, not how it ends.
        let _ = Req::completion(1)
            .request(&proxy.client, &proxy.url)
            .send()
            .await;
        let text = scrape(&proxy).await;
        (sum(&text, "gpulb_requests_total", "backend=\"none\"") > 0.0).then_some(())
    })
    .await;
}
