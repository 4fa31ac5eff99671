//! Prefix affinity: a prompt goes back to the backend that got its prefix before, and two
//! gpulb replicas that never talk agree on where a new prompt goes (rendezvous hashing).

mod common;

use common::{served_by, start_workers, Class, Config, Proxy, Req};

/// A chat whose messages share a long system prompt `topic` and end with `question`.
fn chat(topic: usize, question: &str) -> Req {
    let system = format!("You answer questions about topic {topic}. ").repeat(8);
    let body = serde_json::json!({
        "model": "m",
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    });
    Req::post("/v1/chat/completions", body.to_string())
}

fn affinity_config(workers: &[gpulb::tools::sim::SimWorker]) -> Config {
    Config::fleet(workers)
        .set("models", "{discover: false}")
        .class(Class::new("chat", "default").placement("prefix_affinity"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_agree_on_new_prompts_and_prompts_return_home() {
    let workers = start_workers(4, |_| {}).await;
    let first = Proxy::start(affinity_config(&workers)).await;
    let second = Proxy::start(affinity_config(&workers)).await;
    let mut homes = Vec::new();
    for topic in 0..8 {
        let a = served_by(&[first.send(&chat(topic, "first question?")).await]);
        let b = served_by(&[second.send(&chat(topic, "first question?")).await]);
        assert_eq!(a, b, "topic {topic}: the replicas chose differently");
        homes.push(a[0].clone());
    }
    let mut distinct = homes.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() > 1,
        "every topic went to one backend: {homes:?}"
    );
    // A follow-up sharing the system prompt goes where the prompt went before.
    for (topic, home) in homes.iter().enumerate() {
        let again = served_by(&[first.send(&chat(topic, "and a follow-up, please?")).await]);
        assert_eq!(&again[0], home, "topic {topic}");
    }
    let status = first.status().await;
    let entries = status["prefix_index"]["entries"].as_u64().unwrap();
    assert!(entries >= 8, "{status}");
    assert!(status["prefix_index"]["capacity"].as_u64().unwrap() >= entries);
}
