use super::*;
use crate::config::Config;

const YAML: &str = "backends:\n  - {name: a, url: 'http://127.0.0.1:9001'}\n";

fn registry() -> Arc<Registry> {
    Arc::new(Registry::new(Config::from_yaml(YAML).unwrap()))
}

#[test]
fn the_ring_is_bounded_and_paged_by_seq() {
    let (history, registry, metrics) = (History::default(), registry(), Metrics::new(20));
    for _ in 0..CAPACITY + 5 {
        history.record(&registry.load(), &metrics, None);
    }
    let all = history.since(0).samples;
    assert_eq!(all.len(), CAPACITY);
    assert_eq!(all[0].seq, 6);
    assert_eq!(all[CAPACITY - 1].seq, (CAPACITY + 5) as u64);
    let tail = history.since((CAPACITY + 3) as u64).samples;
    assert_eq!(tail.iter().map(|s| s.seq).collect::<Vec<_>>(), [604, 605]);
    let s = &all[0];
    assert_eq!(s.backends[0].name, "a");
    assert_eq!(s.backends[0].state, "unknown");
    assert_eq!(s.classes[0].name, "default");
    assert!(s.gpus.is_empty());
}

#[test]
fn rates_and_latency_come_from_the_class_metrics() {
    let (history, registry, metrics) = (History::default(), registry(), Metrics::new(20));
    history.record(&registry.load(), &metrics, None);
    std::thread::sleep(Duration::from_millis(20));
    for _ in 0..4 {
        metrics.class("default").shed("t", "queue_full");
        metrics
            .class("default")
            .request_finished(None, 429, Duration::from_millis(2), None);
    }
    metrics
        .class("default")
        .request_finished(Some("a"), 200, Duration::from_secs(2), None);
    history.record(&registry.load(), &metrics, None);
    let page = history.since(1);
    let c = &page.samples[0].classes[0];
    assert!(
        c.sheds_per_s > 0.0 && c.requests_per_s > c.sheds_per_s,
        "{c:?}"
    );
    assert!(c.duration.p99.is_some_and(|p| p > 1.5), "{c:?}");
    let json = serde_json::to_value(&page).unwrap();
    assert!(json["samples"][0]["classes"][0]["ttfb"]["p50"].is_null());
}

#[tokio::test(start_paused = true)]
async fn the_sampler_ticks_every_second_and_stops_on_shutdown() {
    let history = Arc::new(History::default());
    let sampler = HistorySampler::new(Arc::clone(&history), registry(), Arc::new(Metrics::new(20)));
    let (stop, watch) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move { sampler.run(watch).await });
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(history.since(0).samples.len(), 4); // at 0, 1, 2 and 3 s
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("sampler stops on shutdown")
        .unwrap();
}
